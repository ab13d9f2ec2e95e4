//! The IO controller: reads the engine every interval, drips the interval's
//! tokens into a token queue tick by tick.

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use super::drip::TokenDrip;
use super::listener::{IoLoadConfig, IoLoadListener, IoTokens, Tokens};
use super::stats::LsmStatsSource;
use crate::error::ConfigError;
use crate::grant::{TokenClass, TokenGranter};
use crate::queue::{Admit, TokenQueues};
use crate::sync::{Arc, Mutex};
use crate::ticker::Ticker;
use crate::work::WorkInfo;

/// Ticks while the store has never been limited (upstream: flushes take
/// about half a second, so coarser drips would allow bursts).
pub const UNLOADED_TICK: Duration = Duration::from_millis(250);
/// Ticks once the store has been limited: high-priority work waits at most
/// a millisecond for the next tokens.
pub const LOADED_TICK: Duration = Duration::from_millis(1);

/// Byte-token admission for one store: regular and elastic token queues
/// whose budgets follow the engine's L0 debt.
///
/// Every interval (15 s by default) it reads the [`LsmStatsSource`], asks
/// the [`IoLoadListener`] for the next interval's regular and elastic
/// tokens, and hands each class's total to its queue in ticks through a
/// [`TokenDrip`]: 250 ms ticks until the store is first limited, 1 ms ticks
/// from then on (a one-way switch, as upstream). A dedicated thread drives
/// it, or [`step`](Self::step) does in tests. Writers call
/// [`admit`](Self::admit) with their estimated bytes (the work's priority
/// picks the class) and settle with [`correct_tokens`](Self::correct_tokens)
/// once the actual bytes are known.
pub struct IoController {
    core: Arc<IoCore>,
    ticker: Ticker,
}

struct IoCore {
    queues: TokenQueues,
    interval: Duration,
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
    last: Option<IoTokens>,
}

/// What one tick did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct IoTick {
    /// The interval's decision, when this tick started a new interval.
    pub new_interval: Option<IoTokens>,
    /// Regular tokens added by this tick (`None` while unlimited).
    pub added: Option<u64>,
    /// Elastic tokens added by this tick (`None` while unlimited).
    pub added_elastic: Option<u64>,
    /// Whether this tick's reading (a flush backlog of at least half the
    /// engine's memtable stop threshold, or L0 at the score where elastic
    /// tokens run out) withheld elastic tokens.
    pub elastic_held: bool,
    /// How long until the next tick.
    pub next_tick: Duration,
}

impl IoController {
    /// A controller reading `source`, with `config`, driven by its own
    /// thread unless `manual`.
    pub fn new(
        source: impl LsmStatsSource,
        config: IoLoadConfig,
        manual: bool,
    ) -> Result<Self, ConfigError> {
        let listener = IoLoadListener::new(config)?;
        let queues = TokenQueues::new(0, 0)?;
        let core = Arc::new(IoCore {
            queues,
            interval: config.interval,
            ticking: Mutex::new(Ticking {
                source: Box::new(source),
                listener,
                drips: [None, None],
                loaded: false,
                elastic_limited_for_backlog: false,
                interval_started: None,
                last: None,
            }),
        });
        let ticker = if manual {
            Ticker::manual("io_ticker")
        } else {
            let core = core.clone();
            Ticker::spawn("admission-io-ticker", "io_ticker", UNLOADED_TICK, move || {
                core.tick(Instant::now()).next_tick
            })
            .map_err(|error| {
                ConfigError::new("ticker", format!("cannot start the ticker thread: {error}"))
            })?
        };
        Ok(IoController { core, ticker })
    }

    /// The regular and elastic token queues writers admit through.
    pub fn queues(&self) -> &TokenQueues {
        &self.core.queues
    }

    /// The queue of one class.
    pub fn queue(&self, class: TokenClass) -> &crate::WorkQueue<TokenGranter> {
        self.core.queues.queue(class)
    }

    /// Asks for admission for `work`'s [`requested`](WorkInfo::requested)
    /// bytes in the queue of its class (elastic below priority zero).
    pub fn admit(&self, work: WorkInfo) -> Admit<TokenGranter> {
        self.core.queues.admit(work)
    }

    /// Settles admitted `work`'s estimate against the bytes it actually
    /// wrote; see [`TokenQueues::correct_tokens`].
    pub fn correct_tokens(&self, work: &WorkInfo, estimated: u64, actual: u64) {
        self.core.queues.correct_tokens(work, estimated, actual);
    }

    /// Runs one tick now (the thread's job; for tests and manual driving).
    pub fn step(&self) -> IoTick {
        self.core.tick(Instant::now())
    }

    /// The latest interval's decision.
    pub fn last_interval(&self) -> Option<IoTokens> {
        self.core.ticking.lock().last
    }

    /// Stops and joins the ticker thread and closes the queue. Idempotent;
    /// also done on drop.
    pub fn close(&self) {
        self.ticker.stop();
        self.core.queues.close();
    }
}

impl Drop for IoController {
    fn drop(&mut self) {
        self.close();
    }
}

impl fmt::Debug for IoController {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IoController")
            .field("queues", &self.core.queues)
            .field("interval", &self.core.interval)
            .finish_non_exhaustive()
    }
}

impl IoCore {
    fn tick(&self, now: Instant) -> IoTick {
        let mut ticking = self.ticking.lock();
        let due = ticking
            .interval_started
            .is_none_or(|started| now.saturating_duration_since(started) >= self.interval);
        let mut new_interval = None;
        if due {
            let stats = ticking.source.stats();
            let tokens = ticking.listener.next_interval(&stats);
            ticking.interval_started = Some(now);
            ticking.last = Some(tokens);
            new_interval = Some(tokens);
            let ticks = (self.interval.as_nanos() / LOADED_TICK.as_nanos()).max(1);
            let ticks = u32::try_from(ticks).unwrap_or(u32::MAX);
            let mut limits = [None, None];
            for (class, budget) in [tokens.regular, tokens.elastic].into_iter().enumerate() {
                ticking.drips[class] = match budget {
                    Tokens::Unlimited => None,
                    Tokens::Limited(total) => {
                        ticking.loaded = true;
                        // Bank at most what 60 ticks of the interval give.
                        limits[class] = Some((total / 60).max(1));
                        Some(TokenDrip::new(total, ticks))
                    }
                };
            }
            ticking.elastic_limited_for_backlog = false;
            self.queues.set_limits(limits[0], limits[1]);
        }
        // A cheap reading every tick: a flush backlog or an L0 pile-up
        // builds up within a fraction of an interval, and the engine then
        // stalls every writer.
        let elastic_held = match ticking.source.tick_stats() {
            Some(reading) => ticking.listener.holds_elastic(&reading),
            None => false,
        };
        if elastic_held {
            ticking.loaded = true;
            // No elastic drip: the interval left elastic work unlimited.
            let elastic_unlimited = ticking.drips[1].is_none();
            if elastic_unlimited && !ticking.elastic_limited_for_backlog {
                ticking.elastic_limited_for_backlog = true;
                let burst = self.queues.elastic().granter().burst_or(1);
                self.queues.elastic().set_token_limit(Some(burst));
            }
        } else if ticking.elastic_limited_for_backlog {
            ticking.elastic_limited_for_backlog = false;
            self.queues.elastic().set_token_limit(None);
        }
        // Ticks left from the time left, so a ticker running late still
        // hands out the whole interval's tokens.
        let started = ticking.interval_started.unwrap_or(now);
        let left = self
            .interval
            .saturating_sub(now.saturating_duration_since(started));
        let ticks_left =
            u32::try_from(left.as_nanos().div_ceil(LOADED_TICK.as_nanos())).unwrap_or(u32::MAX);
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
        IoTick {
            new_interval,
            added,
            added_elastic,
            elastic_held,
            next_tick: if ticking.loaded {
                LOADED_TICK
            } else {
                UNLOADED_TICK
            },
        }
    }
}
