//! The IO controller: reads the engine every interval, drips the interval's
//! tokens into a token queue tick by tick.
//!
//! Its failure model is in the [module documentation](super#failure-model).

use std::fmt;
use std::num::NonZeroU64;
use std::time::Duration;

use tokio::time::Instant;

use super::drip::TokenDrip;
use super::listener::{IntervalTokens, IoLoadConfig, IoLoadListener, Tokens};
use super::stats::{LsmStats, LsmStatsSource};
use crate::error::ConfigError;
use crate::grant::TokenGranter;
use crate::health::{Boundary, ComponentHealth};
use crate::queue::{Admit, TokenQueues};
use crate::sync::{Arc, Mutex};
use crate::ticker::Ticker;
use crate::work::WorkInfo;

/// Ticks while the store has never been limited (upstream: flushes take
/// about half a second, so coarser drips would allow bursts).
pub(crate) const UNLOADED_TICK: Duration = Duration::from_millis(250);
/// Ticks once the store has been limited: high-priority work waits at most
/// a millisecond for the next tokens.
pub(crate) const LOADED_TICK: Duration = Duration::from_millis(1);
/// Failed interval readings in a row after which the controller leaves the
/// previous interval's budgets for the safe budget; see the
/// [failure model](crate::io#failure-model).
pub(crate) const STATS_FAILURES_BEFORE_FALLBACK: u64 = 4;

/// The interval reading's fallback, for health records.
const SOURCE_ON_FAILURE: &str =
    "the previous interval's budgets, then a safe budget after 4 failed intervals";
/// The tick reading's fallback, for health records.
const TICK_ON_FAILURE: &str = "the previous tick's elastic hold decision, until the interval ends";
/// The ticker thread's component name.
const TICKER: &str = "io_ticker";

/// Byte-token admission for one store: regular and elastic token queues
/// whose budgets follow the engine's L0 debt.
///
/// Every interval (15 s by default) it reads the [`LsmStatsSource`],
/// computes the next interval's regular and elastic tokens (see the
/// [module documentation](super)), and hands each class's total to its
/// queue in ticks, exactly: 250 ms ticks until the store is first limited,
/// 1 ms ticks from then on (a one-way switch, as upstream). A dedicated thread drives
/// it (in tests, the `test-util` feature's `step`). Writers call
/// [`admit`](Self::admit) with their estimated bytes (the work's priority
/// picks the class) and settle with [`correct_tokens`](Self::correct_tokens)
/// once the actual bytes are known.
pub struct Controller {
    core: Arc<IoCore>,
    ticker: Ticker,
}

struct IoCore {
    queues: TokenQueues,
    interval: Duration,
    /// The regular budget per interval once the safe budget is on, before
    /// the compaction throughput is considered.
    failure_budget: u64,
    /// The panic boundary around the stats source's interval reading.
    source_boundary: Boundary,
    /// The panic boundary around its tick reading: a separate record, so
    /// that a tick reading that works (or the default that returns `None`)
    /// does not hide an interval reading that keeps failing.
    tick_boundary: Boundary,
    ticking: Mutex<Ticking>,
}

struct Ticking {
    source: Box<dyn LsmStatsSource>,
    listener: IoLoadListener,
    drips: [Option<TokenDrip>; 2],
    loaded: bool,
    /// The interval's elastic decision was unlimited, but a flush backlog
    /// made this controller limit elastic work until it clears.
    elastic_limited_for_backlog: bool,
    interval_started: Option<Instant>,
    last: Option<IntervalTokens>,
    /// The latest decision made from a reading (not a fallback): its
    /// compaction throughput sizes the safe budget.
    last_measured: Option<IntervalTokens>,
    /// Interval readings that failed since the last one that returned.
    failed_intervals: u64,
    /// Whether the latest tick held elastic tokens: kept by a tick whose
    /// reading failed; false at the start of every interval.
    elastic_held: bool,
    /// When the tick reading last panicked.
    tick_reading_failed_at: Option<Instant>,
    ticks: u64,
}

/// The IO controller's state at one moment.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Snapshot {
    /// The health of the stats source's interval reading
    /// ([`LsmStatsSource::stats`], component `lsm_stats_source`).
    pub source: ComponentHealth,
    /// The health of its tick reading ([`LsmStatsSource::tick_stats`],
    /// component `lsm_stats_source_tick`).
    pub tick_source: ComponentHealth,
    /// The ticker thread's health: ticks that panicked as a whole (none
    /// expected; always healthy for a manual controller).
    pub ticker: ComponentHealth,
    /// Interval readings that failed in a row (0 while the source works).
    pub failed_intervals: u64,
    /// Whether the safe budget is on (after 4 failed readings in a row).
    pub on_safe_budget: bool,
    /// The latest interval's budgets, measured or fallen back to.
    pub last_interval: Option<IntervalTokens>,
    /// Ticks run: while it grows, the ticker is alive.
    pub ticks: u64,
}

/// What one tick did, as [`Controller::step`] returns it. Public only with
/// `test-util`, as the hook is; the snapshot keeps what a running
/// controller decided.
#[cfg_attr(
    not(any(test, loom, feature = "test-util")),
    allow(dead_code, unreachable_pub)
)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tick {
    /// The interval's decision, when this tick started a new interval.
    pub new_interval: Option<IntervalTokens>,
    /// Regular tokens added by this tick (`None` while unlimited).
    pub added: Option<u64>,
    /// Elastic tokens added by this tick (`None` while unlimited).
    pub added_elastic: Option<u64>,
    /// Whether this tick's reading (a flush backlog of at least half the
    /// engine's memtable stop threshold, or L0 at the score where elastic
    /// tokens run out) withheld elastic tokens (or, when the reading
    /// failed, the previous tick's did).
    pub elastic_held: bool,
    /// Whether a call of the stats source panicked during this tick (the
    /// interval's or the tick's reading; a failing tick reading is retried
    /// every 250 ms, not called in between); see the
    /// [failure model](crate::io#failure-model).
    pub source_failed: bool,
    /// How long until the next tick.
    pub next_tick: Duration,
}

impl Controller {
    /// A builder of a controller reading `source`.
    pub fn builder(source: impl LsmStatsSource) -> ControllerBuilder {
        ControllerBuilder {
            source: Box::new(source),
            config: IoLoadConfig::default(),
            manual: false,
        }
    }

    fn new(
        source: Box<dyn LsmStatsSource>,
        config: IoLoadConfig,
        manual: bool,
    ) -> Result<Self, ConfigError> {
        let listener = IoLoadListener::new(config)?;
        // Placeholder bursts: every limit this controller turns on comes
        // with its own burst (`set_limits`), and both start unlimited.
        let queues = TokenQueues::new(1, 1)?;
        let core = Arc::new(IoCore {
            queues,
            interval: config.interval,
            failure_budget: per_interval(config.stats_failure_bytes_per_second, config.interval),
            source_boundary: Boundary::new("lsm_stats_source", SOURCE_ON_FAILURE),
            tick_boundary: Boundary::new("lsm_stats_source_tick", TICK_ON_FAILURE),
            ticking: Mutex::new(Ticking {
                source,
                listener,
                drips: [None, None],
                loaded: false,
                elastic_limited_for_backlog: false,
                interval_started: None,
                last: None,
                last_measured: None,
                failed_intervals: 0,
                elastic_held: false,
                tick_reading_failed_at: None,
                ticks: 0,
            }),
        });
        let ticker = if manual {
            Ticker::manual(TICKER)
        } else {
            let core = core.clone();
            Ticker::spawn("admission-io-ticker", TICKER, UNLOADED_TICK, move || {
                core.tick(Instant::now()).next_tick
            })
            .map_err(|error| {
                ConfigError::new("ticker", format!("cannot start the ticker thread: {error}"))
            })?
        };
        Ok(Controller { core, ticker })
    }

    /// The regular and elastic token queues writers admit through.
    pub fn queues(&self) -> &TokenQueues {
        &self.core.queues
    }

    /// Asks for admission for `work`'s [`requested`](WorkInfo::requested)
    /// bytes in the queue of its class (elastic below priority zero).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future at any point loses no capacity: a queued request
    /// leaves the queue, and a grant it had not yet seen goes to the next
    /// waiter.
    ///
    /// # Errors
    ///
    /// As [`WorkQueue::admit`](crate::WorkQueue::admit): an
    /// [`AdmitError`](crate::AdmitError) for a full or closed queue, the
    /// request's deadline, or more bytes than one burst can ever hold.
    ///
    /// # Examples
    ///
    /// ```
    /// use admission::io::{Controller, LsmStats};
    /// use admission::{Priority, TenantId, WorkInfo};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // An engine whose L0 is empty (an adapter such as `io::fjall` reads
    /// // a real one).
    /// let controller = Controller::builder(LsmStats::default).build()?;
    /// let write = WorkInfo::builder()
    ///     .tenant(TenantId::new(7))
    ///     .priority(Priority::NORMAL)
    ///     .requested(64 << 10) // the write's estimated bytes
    ///     .build();
    /// let permit = controller.admit(write.clone()).await?;
    /// // ... the write ...
    /// drop(permit); // tokens are spent at admission: nothing goes back here
    ///
    /// // It wrote less than estimated: the difference is credited back.
    /// controller.correct_tokens(&write, 64 << 10, 40 << 10);
    /// # Ok(())
    /// # }
    /// ```
    pub fn admit(&self, work: WorkInfo) -> Admit<TokenGranter> {
        self.core.queues.admit(work)
    }

    /// Settles admitted `work`'s estimate against the bytes it actually
    /// wrote; see [`TokenQueues::correct_tokens`] (a charge leaves at most
    /// one burst of debt, however large `actual` is).
    pub fn correct_tokens(&self, work: &WorkInfo, estimated: u64, actual: u64) {
        self.core.queues.correct_tokens(work, estimated, actual);
    }

    test_hook! {
        /// Runs one tick now, the ticker thread's job, and says what it
        /// did: for a controller built
        /// [`manual`](ControllerBuilder::manual). A test hook (feature
        /// `test-util`).
        fn step(&self) -> Tick {
            self.core.tick(Instant::now())
        }
    }

    /// The controller's state: the source's and the ticker's health, the
    /// fallback in force and the latest budgets.
    pub fn snapshot(&self) -> Snapshot {
        let ticking = self.core.ticking.lock();
        Snapshot {
            source: self.core.source_boundary.health(),
            tick_source: self.core.tick_boundary.health(),
            ticker: self.ticker.health(),
            failed_intervals: ticking.failed_intervals,
            on_safe_budget: ticking.failed_intervals >= STATS_FAILURES_BEFORE_FALLBACK,
            last_interval: ticking.last,
            ticks: ticking.ticks,
        }
    }

    /// Stops and joins the ticker thread and closes the queue. Idempotent;
    /// also done on drop. Called from the ticker thread itself (by a
    /// source), it stops the thread without joining it: the thread ends
    /// when its tick returns.
    pub fn close(&self) {
        self.ticker.stop();
        self.core.queues.close();
    }
}

/// Settings for a [`Controller`], validated by [`build`](Self::build).
///
/// The defaults are upstream's: 15 s intervals, 1,000 L0 files or 20
/// sub-levels counted as fully overloaded, no flush-backlog rule, and a safe
/// budget of 16 MiB/s while the stats source fails.
#[must_use = "a builder does nothing until `build` is called"]
pub struct ControllerBuilder {
    source: Box<dyn LsmStatsSource>,
    config: IoLoadConfig,
    manual: bool,
}

impl ControllerBuilder {
    /// How often tokens are recomputed: 1 ms to an hour (default 15 s).
    pub fn interval(mut self, interval: Duration) -> Self {
        self.config.interval = interval;
        self
    }

    /// L0 files counted as fully overloaded: 1 to 1,000,000 (default
    /// 1,000). A threshold no engine reaches would silently turn the limit
    /// off, hence the bound.
    pub fn l0_file_threshold(mut self, files: u64) -> Self {
        self.config.l0_file_threshold = files;
        self
    }

    /// L0 sub-levels counted as fully overloaded: 1 to 10,000 (default 20).
    pub fn l0_sublevel_threshold(mut self, sublevels: u64) -> Self {
        self.config.l0_sublevel_threshold = sublevels;
        self
    }

    /// Unflushed memtables at which the engine stops all writes (Pebble and
    /// fjall: 4): 1 to 10,000 (default: the flush backlog is ignored). From
    /// half of it, elastic work is held back: its tokens for the next
    /// interval are capped at the bytes compactions removed (upstream's
    /// rule), and the controller pauses its elastic drip on every tick that
    /// sees the backlog there.
    pub fn memtable_stop_threshold(mut self, memtables: u64) -> Self {
        self.config.memtable_stop_threshold = Some(memtables);
        self
    }

    /// The regular budget, in bytes per second, once the stats source has
    /// failed for four intervals in a row, unless compactions were last
    /// seen removing more (then half of that); at least 1 (default 16 MiB/s:
    /// what an LSM on any disk compacts, so a store whose state is unknown
    /// neither stops nor floods). See the [failure model](super#failure-model).
    pub fn stats_failure_bytes_per_second(mut self, bytes: u64) -> Self {
        self.config.stats_failure_bytes_per_second = bytes;
        self
    }

    test_hook! {
        /// No ticker thread: the controller moves only when
        /// [`Controller::step`] is called. A test hook (feature
        /// `test-util`): a test drives the budgets one tick at a time.
        fn manual(mut self) -> Self {
            self.manual = true;
            self
        }
    }

    /// Validates the settings, starts the ticker thread (unless manual) and
    /// returns the controller.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the setting that is out of its range, or
    /// `ticker` if the thread cannot be started.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission::io::{Controller, LsmStats};
    ///
    /// // An engine whose L0 is empty: no limit on writes.
    /// let controller = Controller::builder(LsmStats::default)
    ///     .interval(Duration::from_secs(15))
    ///     .memtable_stop_threshold(4)
    ///     .build()?;
    /// assert!(controller.queues().regular().snapshot().granter.unlimited);
    ///
    /// let err = Controller::builder(LsmStats::default)
    ///     .l0_file_threshold(0)
    ///     .build()
    ///     .unwrap_err();
    /// assert_eq!(err.field(), "l0_file_threshold");
    /// # Ok::<(), admission::ConfigError>(())
    /// ```
    pub fn build(self) -> Result<Controller, ConfigError> {
        Controller::new(self.source, self.config, self.manual)
    }
}

impl fmt::Debug for ControllerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("io::ControllerBuilder")
            .field("config", &self.config)
            .field("manual", &self.manual)
            .finish_non_exhaustive()
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        self.close();
    }
}

impl fmt::Debug for Controller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("io::Controller")
            .field("queues", &self.core.queues)
            .field("interval", &self.core.interval)
            .finish_non_exhaustive()
    }
}

impl IoCore {
    fn tick(&self, now: Instant) -> Tick {
        let mut ticking = self.ticking.lock();
        ticking.ticks = ticking.ticks.saturating_add(1);
        let due = ticking
            .interval_started
            .is_none_or(|started| now.saturating_duration_since(started) >= self.interval);
        let mut new_interval = None;
        let mut source_failed = false;
        if due {
            let reading = self.source_boundary.call(|| ticking.source.stats());
            source_failed = reading.is_none();
            let tokens = self.next_budgets(&mut ticking, reading);
            self.start_interval(&mut ticking, tokens, now);
            new_interval = Some(tokens);
        }
        // A cheap reading every tick: a flush backlog or an L0 pile-up
        // builds up within a fraction of an interval, and the engine then
        // stalls every writer. While it fails it is retried every
        // UNLOADED_TICK, not every millisecond: a reader that always panics
        // then costs four caught panics a second, not a thousand.
        let retry_due = self.tick_boundary.consecutive_panics() == 0
            || ticking
                .tick_reading_failed_at
                .is_none_or(|failed| now.saturating_duration_since(failed) >= UNLOADED_TICK);
        let reading = if retry_due {
            self.tick_boundary.call(|| ticking.source.tick_stats())
        } else {
            None
        };
        let elastic_held = match reading {
            Some(Some(reading)) => ticking.listener.holds_elastic(&reading),
            Some(None) => false,
            // No reading: this tick makes no decision of its own.
            None => {
                if retry_due {
                    source_failed = true;
                    ticking.tick_reading_failed_at = Some(now);
                }
                ticking.elastic_held
            }
        };
        ticking.elastic_held = elastic_held;
        if elastic_held {
            ticking.loaded = true;
            // No elastic drip: the interval left elastic work unlimited.
            let elastic_unlimited = ticking.drips[1].is_none();
            if elastic_unlimited && !ticking.elastic_limited_for_backlog {
                ticking.elastic_limited_for_backlog = true;
                let burst = self.queues.elastic().granter().burst();
                self.queues.elastic().apply_token_limit(Some(burst));
            }
        } else if ticking.elastic_limited_for_backlog {
            ticking.elastic_limited_for_backlog = false;
            self.queues.elastic().apply_token_limit(None);
        }
        // Ticks left from the time left, so a ticker running late still
        // hands out the whole interval's tokens.
        let started = ticking.interval_started.unwrap_or(now);
        let left = self
            .interval
            .saturating_sub(now.saturating_duration_since(started));
        let ticks_left = ticks_in(left);
        let [regular, elastic] = &mut ticking.drips;
        let added = regular.as_mut().map(|drip| drip.take(ticks_left));
        // A held tick's elastic tokens are withheld for good, not saved
        // for later ticks: handing them out once the backlog clears would
        // refill the memtables at once.
        let added_elastic = elastic
            .as_mut()
            .map(|drip| drip.take(ticks_left))
            .map(|tokens| if elastic_held { 0 } else { tokens });
        if added.is_some() || added_elastic.is_some() {
            self.queues
                .add_tokens(added.unwrap_or(0), added_elastic.unwrap_or(0));
        }
        // Gauges as this tick leaves them, as the CPU controller does on
        // its ticks: nobody has to call `record_metrics` on a timer.
        self.queues.record_metrics();
        Tick {
            new_interval,
            added,
            added_elastic,
            elastic_held,
            source_failed,
            next_tick: if ticking.loaded {
                LOADED_TICK
            } else {
                UNLOADED_TICK
            },
        }
    }

    /// The next interval's budgets: from the reading, or (it failed) the
    /// previous interval's, or the safe budget; see the module's failure
    /// model.
    fn next_budgets(&self, ticking: &mut Ticking, reading: Option<LsmStats>) -> IntervalTokens {
        if let Some(stats) = reading {
            let intervals = ticking.failed_intervals.saturating_add(1);
            ticking.failed_intervals = 0;
            let tokens = ticking.listener.next_interval_spanning(&stats, intervals);
            ticking.last_measured = Some(tokens);
            return tokens;
        }
        ticking.failed_intervals = ticking.failed_intervals.saturating_add(1);
        let failed = ticking.failed_intervals;
        let previous = ticking
            .last
            .filter(|_| failed < STATS_FAILURES_BEFORE_FALLBACK);
        let tokens = previous.unwrap_or_else(|| {
            // Half the compaction throughput last seen is the listener's
            // most conservative regular budget for a store it can read.
            let (compacted, score) = ticking
                .last_measured
                .map_or((0, 0.0), |tokens| (tokens.smoothed_compacted, tokens.score));
            IntervalTokens {
                regular: Tokens::Limited((compacted / 2).max(self.failure_budget)),
                elastic: Tokens::Limited(1),
                // The last measured: nothing newer is known.
                score,
                compacted: 0,
                smoothed_compacted: compacted,
                added: 0,
            }
        });
        tracing::warn!(
            target: "admission::io",
            failed_intervals = failed,
            safe_budget = previous.is_none(),
            regular = ?tokens.regular,
            elastic = ?tokens.elastic,
            "IO stats source failed; budgets for the next interval without a reading"
        );
        tokens
    }

    /// Starts an interval at `now` with `tokens`: new drips and limits.
    fn start_interval(&self, ticking: &mut Ticking, tokens: IntervalTokens, now: Instant) {
        ticking.interval_started = Some(now);
        ticking.last = Some(tokens);
        let ticks = ticks_in(self.interval);
        let mut limits = [None, None];
        for (class, budget) in [tokens.regular, tokens.elastic].into_iter().enumerate() {
            ticking.drips[class] = match budget {
                Tokens::Unlimited => None,
                Tokens::Limited(total) => {
                    ticking.loaded = true;
                    // Bank at most what 60 ticks of the interval give.
                    limits[class] = NonZeroU64::new((total / 60).max(1));
                    Some(TokenDrip::new(total, ticks))
                }
            };
        }
        ticking.elastic_limited_for_backlog = false;
        ticking.elastic_held = false;
        self.queues.apply_limits(limits[0], limits[1]);
    }
}

/// Loaded ticks in `span`, rounded up, at least one.
fn ticks_in(span: Duration) -> u64 {
    let ticks = span.as_nanos().div_ceil(LOADED_TICK.as_nanos()).max(1);
    u64::try_from(ticks).unwrap_or(u64::MAX)
}

/// `bytes_per_second` over `interval`, saturating.
fn per_interval(bytes_per_second: u64, interval: Duration) -> u64 {
    let bytes = u128::from(bytes_per_second) * interval.as_nanos() / 1_000_000_000;
    u64::try_from(bytes).unwrap_or(u64::MAX).max(1)
}
