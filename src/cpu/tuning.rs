//! The runtime admission needs, and a watch on the queue it cannot order.
//!
//! Admission orders work only once the work has asked for admission: a
//! request task that has not yet been polled waits wherever tokio put it.
//! Tasks spawned or woken from outside the runtime (a listener thread, a
//! channel fed by another thread) wait in tokio's global (inject) queue,
//! and a worker
//! that always has local work looks there only once every
//! `global_queue_interval` ticks, for one task. Tokio tunes that interval
//! to about 200 µs of polling. With handlers that wake themselves between
//! chunks of computation, each worker always has local work: it takes in
//! about five arrivals a millisecond, fewer than a 2-core node at 3x its
//! capacity receives. The rest wait, unordered, until their deadlines
//! pass; admission sees a high-priority request only after it has spent
//! most of its SLO in that queue.
//!
//! [`configure_runtime`] sets the interval to 1, tokio's own setting for
//! "prioritizing getting started on new work, especially if tasks
//! frequently yield": every tick looks at the global queue first, so
//! arrivals reach admission within a poll, and admission (not tokio's FIFO)
//! decides what runs. Measured by the overload suite (W2 at 3x, 2-core VM,
//! both signals; six to ten runs a row, from `--scenario matrix` and
//! `--scenario w2 --handler self-wake --runtime configured`; the last
//! column from 1 ms samples of one run):
//!
//! | handler | runtime | high served within the SLO | high p99 vs alone | global queue ≥ 4 tasks |
//! |---|---|---|---|---|
//! | self-wake | tokio's defaults | 97.6–99.1% | 1.59–1.80x | 58% of samples |
//! | self-wake | `configure_runtime` | 99.7–99.9% | 1.10–1.28x | 1% |
//! | `yield_now` | tokio's defaults | 99.8–99.9% | 1.16–1.25x | 3% |
//! | `yield_now` | `configure_runtime` | 99.6–99.8% | 0.93–1.21x | 1% |
//!
//! It is not free: in most side-by-side runs with `yield_now` and
//! self-waking handlers, goodput was 2–7 points lower on the configured
//! runtime (a fixed total's too). Every arrival now reaches admission and
//! is queued, timed and woken, where on tokio's defaults those that
//! outwaited their deadline in the global queue were refused at their
//! first poll. Handlers that call `yield_now` need it less: `yield_now`
//! parks the task on the worker's defer list, so the local queue empties
//! and the worker takes the global queue in batches. So it is a knob, and
//! the watch below says when to turn it: when windows are backlogged.
//!
//! A controller's queue does most of it without the application's help:
//! with [`arrivals_first`](super::ControllerBuilder::arrivals_first) (on
//! by default), a slot returned on a worker while the global queue holds a
//! task a worker or more is kept back for the next request to ask. That
//! worker then has nothing local to run, tokio has it take a batch from
//! the global queue, and the first arrival to ask runs the grant loop,
//! which gives the slot to whoever is first in the queue's order, the
//! newcomer included if it queued. On tokio's default runtime with self-waking handlers
//! (W2 at 3x through the defaults, four runs of each build, alternated;
//! the last column divides by the fixed total's goodput in the same run,
//! which takes out most of this VM's swings):
//!
//! | arrivals first | high served within the SLO | high p99 | goodput / the fixed total's |
//! |---|---|---|---|
//! | off | 96.1–98.9% | 4.5–5.4 ms | 0.99–1.01 |
//! | on | 99.5–99.8% | 3.5–4.2 ms | 0.95–1.03 (mean 0.99) |
//!
//! The slot first went out only once an arrival queued; most arrivals
//! taken in under overload are refused at the door instead (their deadline
//! spent in the global queue, early rejection), and the slot sat idle
//! meanwhile. Now the first arrival to ask gives it out, whatever its
//! answer. Nine pairs of runs, alternated, on a later day (the high class
//! reads lower on both: the VM's hour):
//!
//! | slot given out by | high served within the SLO | high p99 | goodput / the fixed total's | workers busy (fixed total's) |
//! |---|---|---|---|---|
//! | an arrival that queues | 98.8–99.5% | 4.2–4.8 ms | 0.91–1.01 (median 0.97) | 95.6–96.7% (97.1–98.4%) |
//! | any arrival | 99.1–99.6% | 4.0–4.6 ms | 0.90–1.11 (median 0.99) | 97.4–98.1% (97.6–98.1%) |
//!
//! The goodput columns swing with the VM; the busy column is where the
//! change acts. On the unstable signal (four pairs) the same: busy
//! 96.1–96.7% before, 97.6–98.2% after (the fixed total 97.7–98.5%).
//!
//! The fixed total, a plain queue without it, served the high class
//! within the SLO 94.1–99.8% in the same runs. At one task in the
//! global queue instead of a task a worker, the high class read the same
//! and goodput 0.91–0.99 of the fixed total's (mean 0.95, four runs, and
//! about 4 points below it in two matrices): a slot was also kept for a
//! lone task that was not a request. With `yield_now` handlers, whose
//! workers empty their local queue on every yield and take the global
//! queue in batches anyway, it changed nothing beyond the runs' spread.
//! `configure_runtime` still does more where the application can build
//! its runtime: it reaches arrivals on every tick, not only when a slot
//! comes back.
//!
//! Arrivals from the network take another road. A socket's readiness is
//! found by tokio's IO driver, and the tasks it wakes go to the local queue
//! of the worker that polled it, not to the global queue, so
//! [`configure_runtime`] does not reach them. A worker with local work
//! polls the driver once every `event_interval` ticks (61 by default):
//! about every 3 ms with handlers that compute in 50 µs polls, while the
//! requests wait, unseen, in the kernel's socket buffers. The suite's
//! W2-socket (W2's requests as frames on 16 loopback TCP connections, a
//! spawned task per request) measured, on a runtime built through
//! [`configure_runtime`], two runs each:
//!
//! | handler | `event_interval` | goodput / C | high served within the SLO | high p50 |
//! |---|---|---|---|---|
//! | self-wake | 61 (tokio's) | 85.7 / 87.3% | 98.3 / 98.9% | 1.86 / 1.94 ms |
//! | self-wake | 8 | 89.0 / 90.3% | 99.1 / 99.6% | 1.07 / 1.09 ms |
//! | `yield_now` | 61 (tokio's) | 76.2 / 79.5% | 99.0 / 99.3% | 1.17 / 1.24 ms |
//! | `yield_now` | 8 | 86.1 / 87.6% | 99.4 / 99.4% | 0.98 / 0.99 ms |
//!
//! A third pair, run with the suite's `--runtime configured-events`, read
//! for self-waking handlers 98.6% against 99.6% within the SLO (p50 1.98
//! against 1.15 ms); for `yield_now` handlers 87.6% goodput without the
//! interval against 78.0% with it, in a run flagged invalid (C fell 10%).
//! The self-wake tail is the robust result; the `yield_now` gain is not.
//!
//! `event_interval` is left to the application
//! (`builder.event_interval(8)` beside [`configure_runtime`]), not set
//! here, because it did not help every service: with handlers that wait on
//! a timer as long as they compute, the controller settled at a lower total
//! (a mean of 3.8–6.3 slots against 6.5–7.2) and goodput read 49.5% and
//! 62.8% (two valid runs) against 61.4–68.0% (four). A later pair with
//! the decisions printed read 58.5% against 57.2%: on both the total went
//! up and down by one slot some 1,400–1,800 times, every decrease called
//! by the inversion rule, so the difference may be the runs' spread; such
//! handlers should give their slot back for the wait instead
//! ([`SlotPermit::release_during`](crate::SlotPermit::release_during)).
//! Nor lower than 8: at 1, with `yield_now` handlers, the high
//! class was served within its SLO 40–42% of the time (two runs). Reading
//! tokio 1.54's worker (not instrumented): every driver poll wakes the
//! tasks `yield_now` deferred as ordinary wakes, into the LIFO slot, so at
//! 1 a yielding task runs again at once instead of after the queue.
//!
//! A runtime the application built without it is not changed (tokio has no
//! way to): the controller watches the global queue instead
//! ([`GlobalQueueBacklog`], in
//! [`ControllerSnapshot::global_queue`](super::ControllerSnapshot::global_queue))
//! and logs a warning when tasks keep waiting there.

use tokio::runtime::Builder;

/// The global queue interval [`configure_runtime`] sets: every scheduler
/// tick looks at the global queue first.
pub const GLOBAL_QUEUE_INTERVAL: u32 = 1;

/// Configures a tokio runtime builder for admission control: arrivals
/// queued in tokio's global queue are polled before work already admitted,
/// so they reach admission (which orders them) instead of waiting in
/// tokio's FIFO. See the [module documentation](self) for the
/// measurements.
///
/// ```
/// let runtime = admission::cpu::configure_runtime(
///     &mut tokio::runtime::Builder::new_multi_thread(),
/// )
/// .worker_threads(2)
/// .enable_all()
/// .build()
/// .unwrap();
/// let controller = admission::cpu::Controller::for_runtime(runtime.handle())
///     .build()
///     .unwrap();
/// # drop(controller);
/// ```
pub fn configure_runtime(builder: &mut Builder) -> &mut Builder {
    builder.global_queue_interval(GLOBAL_QUEUE_INTERVAL)
}

/// Active ticks in one window of the global-queue watch: about a second at
/// the default 1 ms period.
pub const BACKLOG_WINDOW_TICKS: u32 = 1_000;

/// Tasks per worker in the global queue at which a tick counts as
/// backlogged. Two a worker: the stable probe's own task is one, and a
/// runtime built with [`configure_runtime`] read 4 or more on a 2-worker
/// node in 1% of samples under 3x overload, against 58% without it.
pub const BACKLOG_PER_WORKER: usize = 2;

/// The share of a window's ticks that must be backlogged for the window to
/// count (a quarter: well above the 1–11% a configured runtime read with
/// every handler style, well below the 58% of an unconfigured one with
/// self-waking handlers).
pub const BACKLOGGED_SHARE: f64 = 0.25;

/// How often a persisting backlog is logged again: once in this many
/// backlogged windows (about a minute).
const WARN_EVERY: u64 = 60;

/// What the controller saw of tokio's global queue, where tasks wait before
/// admission can order them.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GlobalQueueBacklog {
    /// Windows of [`BACKLOG_WINDOW_TICKS`] active ticks completed so far.
    pub windows: u64,
    /// Of those, windows in which at least [`BACKLOGGED_SHARE`] of the
    /// ticks found [`BACKLOG_PER_WORKER`] tasks a worker or more waiting in
    /// the global queue.
    pub backlogged_windows: u64,
    /// The share of the latest completed window's ticks that were
    /// backlogged (0 before the first window completes).
    pub latest_share: f64,
    /// The deepest global queue seen in the latest completed window.
    pub latest_max_depth: usize,
}

impl GlobalQueueBacklog {
    /// Whether the latest completed window was backlogged.
    pub fn is_backlogged(&self) -> bool {
        self.windows > 0 && self.latest_share >= BACKLOGGED_SHARE
    }
}

/// Counts backlogged ticks per window; see [`GlobalQueueBacklog`].
#[derive(Debug, Default)]
pub(crate) struct GlobalQueueWatch {
    ticks: u32,
    backlogged_ticks: u32,
    max_depth: usize,
    reading: GlobalQueueBacklog,
}

/// What one observation concluded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WatchVerdict {
    /// The window goes on, or ended without a backlog.
    Quiet,
    /// A window ended backlogged, and it is time to say so.
    Warn,
    /// A window ended backlogged, and the warning was given recently.
    Backlogged,
}

impl GlobalQueueWatch {
    /// Records one active tick's global queue depth on a runtime of
    /// `workers` workers.
    pub(crate) fn observe(&mut self, depth: usize, workers: usize) -> WatchVerdict {
        self.ticks += 1;
        if depth >= BACKLOG_PER_WORKER.saturating_mul(workers.max(1)) {
            self.backlogged_ticks += 1;
        }
        self.max_depth = self.max_depth.max(depth);
        if self.ticks < BACKLOG_WINDOW_TICKS {
            return WatchVerdict::Quiet;
        }
        let share = f64::from(self.backlogged_ticks) / f64::from(self.ticks);
        self.reading.windows = self.reading.windows.saturating_add(1);
        self.reading.latest_share = share;
        self.reading.latest_max_depth = self.max_depth;
        (self.ticks, self.backlogged_ticks, self.max_depth) = (0, 0, 0);
        if share < BACKLOGGED_SHARE {
            return WatchVerdict::Quiet;
        }
        self.reading.backlogged_windows = self.reading.backlogged_windows.saturating_add(1);
        if (self.reading.backlogged_windows - 1) % WARN_EVERY == 0 {
            WatchVerdict::Warn
        } else {
            WatchVerdict::Backlogged
        }
    }

    pub(crate) fn reading(&self) -> GlobalQueueBacklog {
        self.reading
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds one window in which `backlogged` ticks of
    /// [`BACKLOG_WINDOW_TICKS`] have `depth` tasks and the rest none.
    fn window(watch: &mut GlobalQueueWatch, backlogged: u32, depth: usize) -> WatchVerdict {
        let mut verdict = WatchVerdict::Quiet;
        for tick in 0..BACKLOG_WINDOW_TICKS {
            let depth = if tick < backlogged { depth } else { 0 };
            verdict = watch.observe(depth, 2);
        }
        verdict
    }

    #[test]
    fn a_window_is_judged_by_its_share_of_deep_ticks() {
        let quarter = BACKLOG_WINDOW_TICKS / 4;
        // (backlogged ticks, depth on them, verdict, counted)
        let cases = [
            (0, 100, WatchVerdict::Quiet, false),
            (quarter - 1, 100, WatchVerdict::Quiet, false),
            (quarter, 4, WatchVerdict::Warn, true),
            // Three tasks on two workers is under two a worker.
            (BACKLOG_WINDOW_TICKS, 3, WatchVerdict::Quiet, false),
            (BACKLOG_WINDOW_TICKS, 4, WatchVerdict::Warn, true),
        ];
        for (backlogged, depth, verdict, counted) in cases {
            let mut watch = GlobalQueueWatch::default();
            assert_eq!(
                window(&mut watch, backlogged, depth),
                verdict,
                "{backlogged} at {depth}"
            );
            let reading = watch.reading();
            assert_eq!(reading.windows, 1);
            assert_eq!(reading.backlogged_windows, u64::from(counted));
            assert_eq!(reading.is_backlogged(), counted);
            assert_eq!(
                reading.latest_max_depth,
                if backlogged > 0 { depth } else { 0 }
            );
        }
    }

    #[test]
    fn nothing_is_judged_before_a_window_completes() {
        let mut watch = GlobalQueueWatch::default();
        for _ in 1..BACKLOG_WINDOW_TICKS {
            assert_eq!(watch.observe(1_000, 2), WatchVerdict::Quiet);
        }
        assert_eq!(watch.reading(), GlobalQueueBacklog::default());
        assert!(!watch.reading().is_backlogged());
        assert_eq!(watch.observe(1_000, 2), WatchVerdict::Warn);
    }

    #[test]
    fn a_persisting_backlog_is_logged_once_a_minute() {
        let mut watch = GlobalQueueWatch::default();
        let verdicts: Vec<_> = (0..=WARN_EVERY)
            .map(|_| window(&mut watch, BACKLOG_WINDOW_TICKS, 10))
            .collect();
        assert_eq!(verdicts[0], WatchVerdict::Warn);
        assert!(verdicts[1..WARN_EVERY as usize]
            .iter()
            .all(|v| *v == WatchVerdict::Backlogged));
        assert_eq!(verdicts[WARN_EVERY as usize], WatchVerdict::Warn);
        assert_eq!(watch.reading().backlogged_windows, WARN_EVERY + 1);
    }

    #[test]
    fn a_quiet_window_clears_the_latest_reading() {
        let mut watch = GlobalQueueWatch::default();
        window(&mut watch, BACKLOG_WINDOW_TICKS, 10);
        assert!(watch.reading().is_backlogged());
        assert_eq!(window(&mut watch, 0, 0), WatchVerdict::Quiet);
        let reading = watch.reading();
        assert!(!reading.is_backlogged());
        assert_eq!((reading.windows, reading.backlogged_windows), (2, 1));
        assert_eq!(reading.latest_share, 0.0);
    }

    #[test]
    fn no_workers_counts_as_one() {
        let mut watch = GlobalQueueWatch::default();
        let mut verdict = WatchVerdict::Quiet;
        for _ in 0..BACKLOG_WINDOW_TICKS {
            verdict = watch.observe(BACKLOG_PER_WORKER, 0);
        }
        assert_eq!(verdict, WatchVerdict::Warn);
    }
}
