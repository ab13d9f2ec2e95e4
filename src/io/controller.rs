//! The IO controller: reads the engine every interval, drips the interval's
//! tokens into a token queue tick by tick.

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use super::drip::TokenDrip;
use super::listener::{IoLoadConfig, IoLoadListener, IoTokens, Tokens};
use super::stats::LsmStatsSource;
use crate::error::ConfigError;
use crate::grant::TokenGranter;
use crate::queue::WorkQueue;
use crate::sync::{Arc, Mutex};
use crate::ticker::Ticker;

/// Ticks while the store has never been limited (upstream: flushes take
/// about half a second, so coarser drips would allow bursts).
pub const UNLOADED_TICK: Duration = Duration::from_millis(250);
/// Ticks once the store has been limited: high-priority work waits at most
/// a millisecond for the next tokens.
pub const LOADED_TICK: Duration = Duration::from_millis(1);

/// Byte-token admission for one store: a token queue whose budget follows
/// the engine's L0 debt.
///
/// Every interval (15 s by default) it reads the [`LsmStatsSource`], asks
/// the [`IoLoadListener`] for the next interval's regular tokens, and hands
/// them to the queue in ticks through a [`TokenDrip`]: 250 ms ticks until
/// the store is first limited, 1 ms ticks from then on (a one-way switch, as
/// upstream). A dedicated thread drives it, or [`step`](Self::step) does in
/// tests. Writers call [`admit`](WorkQueue::admit) on [`queue`](Self::queue)
/// with their estimated bytes and settle with
/// [`correct_tokens`](WorkQueue::correct_tokens).
pub struct IoController {
    core: Arc<IoCore>,
    ticker: Ticker,
}

struct IoCore {
    queue: WorkQueue<TokenGranter>,
    interval: Duration,
    ticking: Mutex<Ticking>,
}

struct Ticking {
    source: Box<dyn LsmStatsSource>,
    listener: IoLoadListener,
    drip: Option<TokenDrip>,
    loaded: bool,
    interval_started: Option<Instant>,
    last: Option<IoTokens>,
}

/// What one tick did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct IoTick {
    /// The interval's decision, when this tick started a new interval.
    pub new_interval: Option<IoTokens>,
    /// Tokens added to the queue by this tick (`None` while unlimited).
    pub added: Option<u64>,
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
        let queue = WorkQueue::tokens(0)?;
        let core = Arc::new(IoCore {
            queue,
            interval: config.interval,
            ticking: Mutex::new(Ticking {
                source: Box::new(source),
                listener,
                drip: None,
                loaded: false,
                interval_started: None,
                last: None,
            }),
        });
        let ticker = if manual {
            Ticker::manual()
        } else {
            let core = core.clone();
            Ticker::spawn("admission-io-ticker", move || {
                core.tick(Instant::now()).next_tick
            })
            .map_err(|error| {
                ConfigError::new("ticker", format!("cannot start the ticker thread: {error}"))
            })?
        };
        Ok(IoController { core, ticker })
    }

    /// The token queue writers admit through.
    pub fn queue(&self) -> &WorkQueue<TokenGranter> {
        &self.core.queue
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
        self.core.queue.close();
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
            .field("queue", &self.core.queue)
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
            match tokens.regular {
                Tokens::Unlimited => {
                    ticking.drip = None;
                    self.queue.set_token_limit(None);
                }
                Tokens::Limited(total) => {
                    ticking.loaded = true;
                    let ticks = (self.interval.as_nanos() / LOADED_TICK.as_nanos()).max(1);
                    let ticks = u32::try_from(ticks).unwrap_or(u32::MAX);
                    ticking.drip = Some(TokenDrip::new(total, ticks));
                    // Bank at most what 60 ticks of the interval would give.
                    self.queue.set_token_limit(Some((total / 60).max(1)));
                }
            }
        }
        // Ticks left from the time left, so a ticker running late still
        // hands out the whole interval's tokens.
        let started = ticking.interval_started.unwrap_or(now);
        let left = self
            .interval
            .saturating_sub(now.saturating_duration_since(started));
        let ticks_left =
            u32::try_from(left.as_nanos().div_ceil(LOADED_TICK.as_nanos())).unwrap_or(u32::MAX);
        let added = ticking.drip.as_mut().map(|drip| drip.take(ticks_left));
        if let Some(tokens) = added {
            self.queue.add_tokens(tokens);
        }
        IoTick {
            new_interval,
            added,
            next_tick: if ticking.loaded {
                LOADED_TICK
            } else {
                UNLOADED_TICK
            },
        }
    }
}
