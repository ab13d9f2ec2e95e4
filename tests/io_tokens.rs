//! Byte tokens end to end: a simulated LSM whose L0 debt rises with the
//! bytes admitted and drains at a compaction rate, driven through the load
//! listener, the token drip and a token queue full of backlogged writers.

use std::task::Poll;

use admission::io::{IoLoadConfig, IoLoadListener, LsmStats, TokenDrip, Tokens};
use admission::{Admit, Priority, TenantId, TokenGranter, WorkInfo, WorkQueue};
use tokio_test::task::Spawn;

const MIB: u64 = 1 << 20;
/// Compactions remove this much from L0 per interval.
const COMPACTION: u64 = 400 * MIB;
/// One sub-level per this much L0 data.
const SUBLEVEL: u64 = 32 * MIB;
const WRITE: u64 = MIB;

fn write(tenant: u64) -> WorkInfo {
    WorkInfo::builder()
        .tenant(TenantId::new(tenant))
        .priority(Priority::NORMAL)
        .requested(WRITE)
        .build()
}

#[tokio::test(start_paused = true)]
async fn l0_debt_stays_bounded_near_the_threshold_while_writers_are_backlogged() {
    let mut listener = IoLoadListener::new(IoLoadConfig::default()).unwrap();
    let queue = WorkQueue::tokens(0).unwrap();
    let mut stats = LsmStats::default();
    let mut waiting: Vec<Spawn<Admit<TokenGranter>>> = Vec::new();
    let mut sublevels_seen = Vec::new();

    for _interval in 0..40 {
        let tokens = listener.next_interval(&stats);
        let mut drip = match tokens.regular {
            Tokens::Unlimited => {
                queue.set_token_limit(None);
                None
            }
            Tokens::Limited(total) => {
                queue.set_token_limit(Some(total / 60 + WRITE));
                Some(TokenDrip::new(total, 60))
            }
        };
        let mut admitted_bytes = 0u64;
        for _tick in 0..60 {
            // Admission takes tokio's cooperative budget like any resource:
            // give the scheduler its turn each tick, as a real writer would.
            tokio::task::yield_now().await;
            if let Some(drip) = &mut drip {
                queue.add_tokens(drip.next_tick().unwrap_or(0));
            }
            // Writers are always backlogged: keep 50 waiting.
            while waiting.len() < 50 {
                let tenant = waiting.len() as u64 % 3 + 1;
                waiting.push(tokio_test::task::spawn(queue.admit(write(tenant))));
            }
            let mut admitted = 0u64;
            waiting.retain_mut(|admit| match admit.poll() {
                Poll::Ready(result) => {
                    // Tokens are consumed: the permit returns nothing.
                    drop(result.expect("writes are admitted, never refused"));
                    admitted += 1;
                    false
                }
                Poll::Pending => true,
            });
            admitted_bytes += admitted * WRITE;
            // Unlimited intervals admit whatever is asked; cap the offered
            // load there at twice what compactions can take.
            if drip.is_none() && admitted_bytes > 2 * COMPACTION {
                break;
            }
        }
        // The interval's writes land in L0; compactions take some out.
        stats.flushed_bytes += admitted_bytes;
        stats.l0_bytes = (stats.l0_bytes + admitted_bytes).saturating_sub(COMPACTION);
        let sublevels = stats.l0_bytes / SUBLEVEL;
        stats.l0_sublevels = Some(sublevels);
        stats.l0_files = sublevels;
        sublevels_seen.push(sublevels);
    }
    // Unlimited at first, the debt grows until the listener limits tokens;
    // from then on admission follows compaction and L0 settles between the
    // point where tokens start to bind (5 sub-levels) and the full
    // threshold (20), instead of growing without bound.
    let settled = &sublevels_seen[20..];
    assert!(
        settled.iter().all(|&n| (5..=20).contains(&n)),
        "{sublevels_seen:?}"
    );
    // And the first, unlimited interval did run L0 up past that point.
    assert!(sublevels_seen[0] > 10, "{sublevels_seen:?}");
    let snapshot = queue.snapshot();
    assert!(!snapshot.granter.unlimited, "{snapshot:?}");
}

#[tokio::test(start_paused = true)]
async fn tokens_go_to_waiters_in_order_and_corrections_settle_without_blocking() {
    let queue = WorkQueue::tokens(1_000).unwrap();
    queue.set_token_limit(Some(1_000));
    let mut first = tokio_test::task::spawn(queue.admit(write_of(1, 300)));
    let mut second = tokio_test::task::spawn(queue.admit(write_of(2, 300)));
    assert!(
        first.poll().is_pending() && second.poll().is_pending(),
        "no tokens yet"
    );

    queue.add_tokens(100);
    // A positive balance admits a whole request: the first goes into debt.
    let first = match first.poll() {
        Poll::Ready(result) => result.unwrap(),
        Poll::Pending => panic!("the first writer was not granted"),
    };
    assert!(second.poll().is_pending());
    assert_eq!(queue.snapshot().granter.available, -200);

    // The write turned out smaller: the 250-byte credit pays the debt and
    // leaves 50, so the second writer is granted at once (taking 300).
    queue.correct_tokens(TenantId::new(1), 300, 50);
    assert_eq!(queue.snapshot().granter.available, 50 - 300);
    assert!(second.poll().is_ready());
    drop(first);
    assert_eq!(
        queue.snapshot().granter.available,
        -250,
        "nothing comes back"
    );
    assert_eq!(queue.snapshot().tenant(TenantId::new(1)).unwrap().used, 50);
}

fn write_of(tenant: u64, bytes: u64) -> WorkInfo {
    WorkInfo::builder()
        .tenant(TenantId::new(tenant))
        .requested(bytes)
        .build()
}

/// The controller, stepped by hand under a paused clock with an injected
/// engine: unlimited and slow ticks while L0 is healthy; once the debt
/// shows, limited tokens dripped every millisecond, exactly the interval's
/// total over the interval.
#[tokio::test(start_paused = true)]
async fn the_io_controller_drips_each_intervals_tokens_into_the_queue() {
    use admission::io::{IoController, LOADED_TICK, UNLOADED_TICK};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    let engine = Arc::new(Mutex::new(LsmStats::default()));
    let reading = engine.clone();
    let config = IoLoadConfig {
        interval: Duration::from_millis(100),
        ..IoLoadConfig::default()
    };
    let controller = IoController::new(move || *reading.lock().unwrap(), config, true).unwrap();

    let first = controller.step();
    assert_eq!(first.new_interval.unwrap().regular, Tokens::Unlimited);
    assert_eq!((first.added, first.next_tick), (None, UNLOADED_TICK));
    assert!(controller.queue().snapshot().granter.unlimited);

    // During the first interval 600 MiB arrived in L0 and 400 MiB were
    // compacted out: 200 MiB and 40 sub-levels remain.
    *engine.lock().unwrap() = LsmStats {
        l0_files: 40,
        l0_sublevels: Some(40),
        l0_bytes: 200 * MIB,
        flushed_bytes: 600 * MIB,
        ..LsmStats::default()
    };
    tokio::time::advance(Duration::from_millis(100)).await;
    let limited = controller.step();
    let decision = limited.new_interval.unwrap();
    assert_eq!(decision.compacted, 400 * MIB);
    assert_eq!(
        decision.regular,
        Tokens::Limited(200 * MIB),
        "C/2 at 40 sub-levels"
    );
    assert_eq!(limited.next_tick, LOADED_TICK);

    let mut total = limited.added.unwrap();
    for _ in 1..100 {
        tokio::time::advance(LOADED_TICK).await;
        let tick = controller.step();
        assert!(tick.new_interval.is_none());
        total += tick.added.unwrap();
    }
    assert_eq!(total, 200 * MIB, "the interval's tokens, exactly");
    assert!(!controller.queue().snapshot().granter.unlimited);
    controller.close();
    assert!(controller.queue().is_closed());
}
