//! Byte tokens through the IO controller and its token queues: intervals
//! and drips under a paused clock, waiters granted in order, corrections,
//! the elastic queue, and the flush-backlog hold. (The load rule itself, on
//! a simulated LSM, is tested in the crate: `src/io/tests.rs`.)

use std::task::Poll;

use admission::grant::TokenClass;
use std::time::Duration;

use admission::io::{Controller, LsmStats, Tokens};
use admission::TokenQueues;
use admission::{Priority, TenantId, WorkInfo, WorkQueue};

const MIB: u64 = 1 << 20;
/// The controller's documented ticks: 250 ms while the store has never
/// been limited, every millisecond once it has.
const UNLOADED_TICK: Duration = Duration::from_millis(250);
const LOADED_TICK: Duration = Duration::from_millis(1);

#[tokio::test(start_paused = true)]
async fn tokens_go_to_waiters_in_order_and_corrections_settle_without_blocking() {
    let queue = WorkQueue::tokens(1_000).unwrap();
    queue.set_token_limit(Some(1_000)).unwrap();
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
    use std::sync::{Arc, Mutex};

    let engine = Arc::new(Mutex::new(LsmStats::default()));
    let reading = engine.clone();
    let controller = Controller::builder(move || *reading.lock().unwrap())
        .interval(Duration::from_millis(100))
        .manual()
        .build()
        .unwrap();

    let first = controller.step();
    assert_eq!(first.new_interval.unwrap().regular, Tokens::Unlimited);
    assert_eq!((first.added, first.next_tick), (None, UNLOADED_TICK));
    assert!(
        controller
            .queues()
            .queue(TokenClass::Regular)
            .snapshot()
            .granter
            .unlimited
    );

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
    assert_eq!(
        decision.elastic,
        Tokens::Limited(1),
        "elastic work is all but stopped long before regular work"
    );
    assert_eq!(limited.next_tick, LOADED_TICK);

    let mut total = limited.added.unwrap();
    let mut elastic = limited.added_elastic.unwrap();
    for _ in 1..100 {
        tokio::time::advance(LOADED_TICK).await;
        let tick = controller.step();
        assert!(tick.new_interval.is_none());
        total += tick.added.unwrap();
        elastic += tick.added_elastic.unwrap();
    }
    assert_eq!(total, 200 * MIB, "the interval's tokens, exactly");
    assert_eq!(elastic, 1);
    assert!(
        !controller
            .queues()
            .queue(TokenClass::Regular)
            .snapshot()
            .granter
            .unlimited
    );
    controller.close();
    assert!(controller.queues().queue(TokenClass::Regular).is_closed());
    assert!(controller.queues().queue(TokenClass::Elastic).is_closed());
}

fn work(tenant: u64, priority: Priority, bytes: u64) -> WorkInfo {
    WorkInfo::builder()
        .tenant(TenantId::new(tenant))
        .priority(priority)
        .requested(bytes)
        .build()
}

/// Regular and elastic writers in their own queues over one bucket: an
/// elastic writer blocked on its budget holds no regular writer back,
/// refills reach regular work first, and every admission is paid from both
/// budgets.
#[tokio::test]
async fn elastic_work_waits_in_its_own_queue_and_gets_what_regular_work_leaves() {
    let queues = TokenQueues::new(10_000, 10_000).unwrap();
    queues.set_limits(Some(10_000), Some(10_000)).unwrap();

    // Nothing banked: one writer of each class waits.
    let mut bulk = tokio_test::task::spawn(queues.admit(work(1, Priority::BULK_NORMAL, 300)));
    let mut foreground = tokio_test::task::spawn(queues.admit(work(2, Priority::NORMAL, 300)));
    assert!(bulk.poll().is_pending());
    assert!(foreground.poll().is_pending());
    assert_eq!(
        (queues.regular().waiting(), queues.elastic().waiting()),
        (1, 1)
    );

    // A tick with regular tokens only: the regular writer goes first and
    // its bytes come out of the elastic budget too.
    queues.add_tokens(100, 0);
    assert!(foreground.is_woken());
    assert!(matches!(foreground.poll(), Poll::Ready(Ok(_))));
    assert!(bulk.poll().is_pending());
    assert_eq!(queues.regular().snapshot().granter.available, -200);
    assert_eq!(queues.elastic().snapshot().granter.available, -300);

    // Elastic tokens alone do not admit elastic work while regular work is
    // in debt.
    queues.add_tokens(0, 1_000);
    assert!(bulk.poll().is_pending());
    // Once the regular debt is paid, elastic work gets what is left.
    queues.add_tokens(201, 0);
    assert!(matches!(bulk.poll(), Poll::Ready(Ok(_))));
    assert_eq!(queues.regular().snapshot().granter.available, 1 - 300);
    assert_eq!(queues.elastic().snapshot().granter.available, 700 - 300);

    // A regular writer arriving behind a blocked elastic one is not held
    // back by it: the elastic budget is now in debt.
    queues.add_tokens(0, 0);
    let mut more_bulk = tokio_test::task::spawn(queues.admit(work(1, Priority::BULK_LOW, 10_000)));
    queues.add_tokens(400, 0);
    assert!(matches!(more_bulk.poll(), Poll::Ready(Ok(_))));
    assert_eq!(queues.elastic().snapshot().granter.available, 400 - 10_000);
    let mut blocked_bulk = tokio_test::task::spawn(queues.admit(work(1, Priority::BULK_NORMAL, 1)));
    assert!(blocked_bulk.poll().is_pending(), "elastic budget in debt");
    queues.add_tokens(20_000, 0);
    assert!(
        blocked_bulk.poll().is_pending(),
        "regular tokens alone do not help"
    );
    let mut fg = tokio_test::task::spawn(queues.admit(work(2, Priority::HIGH, 1)));
    assert!(
        matches!(fg.poll(), Poll::Ready(Ok(_))),
        "regular work is not held back by the blocked elastic writer"
    );

    // Corrections settle both budgets: the bulk write turned out empty, so
    // its whole estimate comes back to the elastic budget as well, and that
    // credit admits the blocked elastic writer.
    queues.correct_tokens(&work(1, Priority::BULK_LOW, 10_000), 10_000, 0);
    assert!(blocked_bulk.is_woken());
    assert!(matches!(blocked_bulk.poll(), Poll::Ready(Ok(_))));
    assert_eq!(queues.elastic().snapshot().granter.available, 400 - 1 - 1);

    // Lifting the regular limit alone does not lift the elastic one.
    queues.set_limits(None, Some(10_000)).unwrap();
    assert!(queues.regular().snapshot().granter.unlimited);
    assert!(!queues.elastic().snapshot().granter.unlimited);
}

/// A writer granted tokens but dropped before it saw the grant never wrote:
/// its tokens go back to both budgets and its tenant is not charged, so the
/// next writer gets them.
#[tokio::test]
async fn a_grant_dropped_unseen_returns_its_tokens() {
    let queues = TokenQueues::new(1_000, 1_000).unwrap();
    queues.set_limits(Some(1_000), Some(1_000)).unwrap();
    let mut gone = tokio_test::task::spawn(queues.admit(work(1, Priority::NORMAL, 50)));
    assert!(gone.poll().is_pending());
    queues.add_tokens(10, 10);
    assert_eq!(queues.regular().snapshot().granter.available, -40);
    drop(gone);
    assert_eq!(queues.regular().snapshot().granter.available, 10);
    assert_eq!(queues.elastic().snapshot().granter.available, 10);
    let tenant = queues
        .regular()
        .snapshot()
        .tenant(TenantId::new(1))
        .map(|t| t.used);
    assert!(matches!(tenant, None | Some(0)), "{tenant:?}");
    let mut next = tokio_test::task::spawn(queues.admit(work(2, Priority::NORMAL, 5)));
    assert!(matches!(next.poll(), Poll::Ready(Ok(_))));
}

/// An engine whose flush backlog the test sets; L0 stays healthy.
struct Backlogged {
    unflushed: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl admission::io::LsmStatsSource for Backlogged {
    fn stats(&mut self) -> LsmStats {
        LsmStats {
            unflushed_memtables: Some(self.unflushed.load(std::sync::atomic::Ordering::SeqCst)),
            ..LsmStats::default()
        }
    }

    fn tick_stats(&mut self) -> Option<LsmStats> {
        Some(self.stats())
    }
}

/// A flush backlog is read on every tick: from half the engine's stop
/// threshold, elastic writers are held back at once (even while the
/// interval left them unlimited) and regular writers are not; when it
/// clears, elastic work flows again.
#[tokio::test(start_paused = true)]
async fn a_flush_backlog_holds_elastic_writers_back_on_the_next_tick() {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    let unflushed = Arc::new(AtomicU64::new(0));
    let source = Backlogged {
        unflushed: unflushed.clone(),
    };
    let controller = Controller::builder(source)
        .memtable_stop_threshold(4)
        .manual()
        .build()
        .unwrap();
    let first = controller.step();
    assert!(!first.elastic_held);
    assert!(
        controller
            .queues()
            .queue(TokenClass::Elastic)
            .snapshot()
            .granter
            .unlimited
    );

    unflushed.store(2, Ordering::SeqCst);
    let held = controller.step();
    assert!(held.elastic_held);
    assert_eq!(
        held.next_tick, LOADED_TICK,
        "a backlog switches to fast ticks"
    );
    let mut bulk = tokio_test::task::spawn(controller.admit(work(1, Priority::BULK_NORMAL, 10)));
    let mut foreground = tokio_test::task::spawn(controller.admit(work(2, Priority::NORMAL, 10)));
    assert!(
        bulk.poll().is_pending(),
        "elastic work waits out the backlog"
    );
    assert!(matches!(foreground.poll(), Poll::Ready(Ok(_))));

    tokio::time::advance(LOADED_TICK).await;
    assert!(controller.step().elastic_held);
    assert!(bulk.poll().is_pending());

    unflushed.store(1, Ordering::SeqCst);
    tokio::time::advance(LOADED_TICK).await;
    assert!(!controller.step().elastic_held);
    assert!(bulk.is_woken());
    assert!(matches!(bulk.poll(), Poll::Ready(Ok(_))));
}
