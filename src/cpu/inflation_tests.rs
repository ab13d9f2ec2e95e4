//! The CPU controller's second signal, driven deterministically: an
//! injected runnable signal that says "underloaded" throughout (as the
//! stable probe does when handlers park on tokio's defer list), paused time,
//! and permits held for exactly as long as each test says. Only admitted
//! work's holds can tell the controller that it is over-admitting. In the
//! crate because the test decides the concurrency itself, admitting past the
//! total with the queue's enforcement switched off (crate-private).

use std::time::Duration;

use super::inflation::InflationVerdict;
use super::{Adjustment, Controller, CpuLoad, Hold};
use crate::{Priority, SlotPermit, TenantId, WorkInfo};

/// A manual controller over two workers whose runnable signal always reads
/// zero: the runnable rule alone would keep adding slots.
fn blind_controller(initial: u64) -> Controller {
    Controller::with_signal(|| CpuLoad::new(0, 2))
        .initial_slots(initial)
        .min_slots(1)
        .max_slots(16)
        .manual()
        .build()
        .unwrap()
}

fn work(priority: Priority, deadline_in: Option<Duration>) -> WorkInfo {
    let mut work = WorkInfo::builder()
        .tenant(TenantId::new(1))
        .priority(priority);
    if let Some(timeout) = deadline_in {
        work = work.timeout(timeout);
    }
    work.build()
}

/// `rounds` rounds of `concurrency` permits of `priority`, each held for
/// `hold`; the controller ticks at the end of every round, while the
/// permits are still held (so the runnable rule sees every slot in use, and
/// the completions it reads are the previous round's). Returns every
/// tick's adjustment.
async fn rounds(
    controller: &Controller,
    rounds: usize,
    concurrency: usize,
    priority: Priority,
    hold: Duration,
) -> Vec<Adjustment> {
    let mut adjustments = Vec::new();
    for _ in 0..rounds {
        // Admitted past the total on purpose: the test decides concurrency.
        controller.queue().set_enforcing(false);
        let mut permits: Vec<SlotPermit> = Vec::new();
        for _ in 0..concurrency {
            permits.push(controller.admit(work(priority, None)).await.unwrap());
        }
        controller.queue().set_enforcing(true);
        tokio::time::advance(hold).await;
        adjustments.push(controller.step().adjustment);
        drop(permits);
    }
    adjustments
}

#[tokio::test(start_paused = true)]
async fn holds_inflated_fourfold_cut_the_total_after_eight_completions() {
    let controller = blind_controller(2);
    // The baseline: two at a time (the workers), 1 ms each; one more tick
    // reads the last round, closing a window of exactly 32 completions.
    rounds(
        &controller,
        16,
        2,
        Priority::NORMAL,
        Duration::from_millis(1),
    )
    .await;
    controller.step();
    let baselines = controller.snapshot().hold_baselines;
    assert_eq!(
        baselines,
        vec![(Priority::NORMAL, Duration::from_millis(1))]
    );

    // A spike: eight at a time, each holding four times as long (what eight
    // tasks sharing two workers look like). The second round's tick reads
    // the first round's eight completions: a spike beyond doubt, so the
    // window closes early rather than at 32.
    controller.queue().set_total_slots(8).unwrap();
    let adjustments = rounds(
        &controller,
        2,
        8,
        Priority::NORMAL,
        Duration::from_millis(4),
    )
    .await;
    let reading = controller.snapshot().inflation.unwrap();
    assert_eq!(reading.inflation, Some(4.0), "{reading:?}");
    assert_eq!(reading.completions, 8, "{reading:?}");
    assert_eq!(
        adjustments,
        [Adjustment::Hold(Hold::Inflated), Adjustment::Cut(2)],
    );
    assert_eq!(controller.queue().granter_snapshot().total, 2);
    assert_eq!(reading.verdict, InflationVerdict::Cut { to: 2 });
}

#[tokio::test(start_paused = true)]
async fn the_total_grows_only_after_two_good_windows_in_a_row() {
    let controller = blind_controller(2);
    // Every slot in use and the runnable signal at zero: the runnable rule
    // asks for a slot on every tick. Before any window has closed there is
    // no evidence either way, and the first tick grows the total.
    let first = rounds(
        &controller,
        16,
        2,
        Priority::NORMAL,
        Duration::from_millis(1),
    )
    .await;
    assert_eq!(first[0], Adjustment::Increase, "{first:?}");
    controller.step();
    assert_eq!(controller.queue().granter_snapshot().total, 3);
    // The first window has closed (and set the baseline): from now on a
    // slot more needs two good windows in a row, 64 completions of three
    // permits a round, read a round late.
    let adjustments = rounds(
        &controller,
        24,
        3,
        Priority::NORMAL,
        Duration::from_millis(1),
    )
    .await;
    let increase = adjustments
        .iter()
        .position(|a| *a == Adjustment::Increase)
        .expect("an increase after two good windows");
    assert!(
        adjustments[..increase]
            .iter()
            .all(|a| *a == Adjustment::Hold(Hold::Inflated)),
        "{adjustments:?}"
    );
    assert!((20..=23).contains(&increase), "{increase}: {adjustments:?}");
}

#[tokio::test(start_paused = true)]
async fn late_high_priority_work_beside_completing_low_priority_work_takes_a_slot() {
    let controller = blind_controller(4);
    // Baselines for both priorities, at their unloaded holds.
    for _ in 0..20 {
        rounds(
            &controller,
            1,
            1,
            Priority::USER_HIGH,
            Duration::from_millis(1),
        )
        .await;
        rounds(
            &controller,
            1,
            1,
            Priority::USER_LOW,
            Duration::from_millis(1),
        )
        .await;
    }
    assert_eq!(controller.snapshot().hold_baselines.len(), 2);
    let total = controller.queue().granter_snapshot().total;
    // Now high-priority work finishes past its deadline (its hold is as
    // usual: the time went elsewhere) while low-priority work completes.
    let mut adjustments = Vec::new();
    for _ in 0..20 {
        controller.queue().set_enforcing(false);
        let high = controller
            .admit(work(Priority::USER_HIGH, Some(Duration::from_micros(500))))
            .await
            .unwrap();
        let low = controller
            .admit(work(Priority::USER_LOW, None))
            .await
            .unwrap();
        controller.queue().set_enforcing(true);
        tokio::time::advance(Duration::from_millis(1)).await;
        adjustments.push(controller.step().adjustment);
        drop((high, low));
    }
    let decreased = adjustments
        .iter()
        .position(|a| *a == Adjustment::Decrease)
        .expect("a decrease for the inversion");
    assert!(controller
        .snapshot()
        .recent
        .iter()
        .any(|d| d.adjustment == Adjustment::Decrease));
    let reading = controller.snapshot().inflation.unwrap();
    assert!(reading.inversion, "{reading:?}");
    assert!(decreased > 0 && controller.queue().granter_snapshot().total < total);
}
