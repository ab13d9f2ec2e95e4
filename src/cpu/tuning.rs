//! The runtime admission needs ([`configure_runtime`]), and a watch on the
//! queue it cannot order ([`GlobalQueueWatch`], read every tick by the
//! controller).
//!
//! Admission orders work only once the work has asked for admission: a
//! request task that has not yet been polled waits wherever tokio put it.
//! Tasks spawned or woken from outside the runtime wait in tokio's global
//! (inject) queue, which a worker that always has local work looks at only
//! once every `global_queue_interval` ticks, for one task. The watch counts
//! the windows of [`BACKLOG_WINDOW_TICKS`] ticks in which at least
//! [`BACKLOGGED_SHARE`] of the samples saw [`BACKLOG_PER_WORKER`] tasks a
//! worker waiting there, and the controller logs a warning while they
//! last. The measurements that chose these settings, and `configure_runtime`
//! against tokio's defaults, are in `docs/OVERLOAD.md` ("The runtime").

use tokio::runtime::Builder;

/// The global queue interval [`configure_runtime`] sets: every scheduler
/// tick looks at the global queue first.
pub(crate) const GLOBAL_QUEUE_INTERVAL: u32 = 1;

/// Configures a tokio runtime builder for admission control: arrivals
/// queued in tokio's global queue are polled before work already admitted,
/// so they reach admission (which orders them) instead of waiting in
/// tokio's FIFO.
///
/// It sets `global_queue_interval` to 1, tokio's own setting for
/// "prioritizing getting started on new work, especially if tasks
/// frequently yield". Tasks spawned or woken from outside the runtime (a
/// listener thread, a channel fed by another thread) wait in tokio's global
/// queue, which a worker with local work otherwise reads once every ~200 µs
/// of polling: with handlers that wake themselves between chunks, arrivals
/// wait there, unordered, past their deadlines, before admission sees
/// them. With it, W2 at 3x with such handlers served the high class within
/// its SLO 99.7–99.9% of the time against 97.6–99.1% on tokio's defaults.
/// It is not free (2–7 points of goodput in most runs: every arrival now
/// reaches admission and is queued, timed and woken), and a controller's
/// queue already keeps a returned slot for arrivals waiting there
/// ([`arrivals_first`](super::ControllerBuilder::arrivals_first)), so use
/// it where the controller reports a backlog
/// ([`Snapshot::global_queue`](super::Snapshot::global_queue)).
/// Arrivals from sockets are woken by the IO driver onto a worker's own
/// queue instead; tokio's `event_interval` governs those, and is left to
/// the application. The runs: `docs/OVERLOAD.md`, "The runtime".
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
pub(crate) const BACKLOG_WINDOW_TICKS: u32 = 1_000;

/// Tasks per worker in the global queue at which a tick counts as
/// backlogged. Two a worker: the stable probe's own task is one, and a
/// runtime built with [`configure_runtime`] read 4 or more on a 2-worker
/// node in 1% of samples under 3x overload, against 58% without it.
pub(crate) const BACKLOG_PER_WORKER: usize = 2;

/// The share of a window's ticks that must be backlogged for the window to
/// count (a quarter: well above the 1–11% a configured runtime read with
/// every handler style, well below the 58% of an unconfigured one with
/// self-waking handlers).
pub(crate) const BACKLOGGED_SHARE: f64 = 0.25;

/// How often a persisting backlog is logged again: once in this many
/// backlogged windows (about a minute).
const WARN_EVERY: u64 = 60;

/// What the controller saw of tokio's global queue, where tasks wait before
/// admission can order them.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GlobalQueueBacklog {
    /// Windows of 1,000 active ticks (a second at the default period)
    /// completed so far.
    pub windows: u64,
    /// Of those, windows in which at least a quarter of the ticks found two
    /// tasks a worker or more waiting in the global queue.
    pub backlogged_windows: u64,
    /// The share of the latest completed window's ticks that were
    /// backlogged (0 before the first window completes).
    pub latest_share: f64,
    /// The deepest global queue seen in the latest completed window.
    pub latest_max_depth: usize,
    /// Whether the latest completed window was backlogged (its
    /// `latest_share` at least a quarter; false before the first window
    /// completes).
    pub latest_backlogged: bool,
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
        self.reading.latest_backlogged = share >= BACKLOGGED_SHARE;
        (self.ticks, self.backlogged_ticks, self.max_depth) = (0, 0, 0);
        if !self.reading.latest_backlogged {
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
            assert_eq!(reading.latest_backlogged, counted);
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
        assert!(!watch.reading().latest_backlogged);
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
        assert!(watch.reading().latest_backlogged);
        assert_eq!(window(&mut watch, 0, 0), WatchVerdict::Quiet);
        let reading = watch.reading();
        assert!(!reading.latest_backlogged);
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
