//! The IO signal: LSM debt turned into byte tokens.
//!
//! Writes to an LSM are cheap when they happen and expensive later, when
//! compactions rewrite their bytes; the debt shows up as files and
//! sub-levels piling up in L0, and when it grows far enough the engine
//! stalls every writer alike. Admission control instead turns the debt into
//! a budget of **byte tokens** per interval, sized so that compactions can
//! pay the debt down, and lets the queue spend it by tenant and priority.
//!
//! This module has the pieces that do not depend on the queue:
//!
//! * [`LsmStats`] and [`LsmStatsSource`]: what an engine reports.
//! * the load listener (upstream's `ioLoadListener`): every interval (15 s),
//!   the next interval's tokens
//!   for regular and elastic work from L0's state and the smoothed
//!   compaction throughput: the bytes
//!   compacted out of L0 are smoothed (EWMA, α = 0.5) into `C`; the score
//!   `s = 2 · max(files / file threshold, sub-levels / sub-level threshold)`
//!   sets regular tokens (unlimited below 0.5, then `C·(3 − 2s)` to 1,
//!   `C/2·(3 − s)` to 2, `C/2` beyond, smoothed) and elastic tokens
//!   (unlimited below 0.2, then `C·(1.25 − 1.25·(s − 0.2))`, at least 1,
//!   never above regular). Deltas are clamped at zero and arithmetic
//!   saturates, whatever the engine reports.
//! * the token drip: hands an interval's total out in ticks, exactly.
//!
//! The tokens are spent through [`TokenQueues`](crate::queue::TokenQueues):
//! a regular queue (priority zero and above) and an elastic queue (below
//! zero) over one bucket ([`TokenGranter::pair`](crate::grant::TokenGranter::pair))
//! with a balance per class. Every admission pays from both balances and elastic work also
//! needs the regular balance positive, so elastic work gets what regular
//! work leaves and is throttled first, while each class waits in its own
//! queue. Requests carry their estimated bytes
//! ([`WorkInfoBuilder::requested`](crate::work::WorkInfoBuilder::requested));
//! each tick's drip goes in with `add_tokens`, and `correct_tokens` settles
//! an estimate once the write's real size is known, charging or crediting
//! both balances and the tenant's usage without blocking.
//! The [`Controller`] ties listener, drips and queues together on a ticker
//! thread. Between intervals it also takes a cheap reading every tick
//! ([`LsmStatsSource::tick_stats`], where the engine offers one) and holds
//! elastic tokens back while the flush backlog is at half the engine's
//! memtable stop threshold or L0 is where the elastic formula runs out
//! (a doubled score of 2.2): a pile-up forms within a fraction of an
//! interval, and the engine would then stall every writer.
//!
//! A stats source that panics does not stop the tokens: the controller
//! keeps the previous interval's budgets, then a safe budget, and reports
//! the source's health (see the [failure model](#failure-model)).
//!
//! Engines plug in through [`LsmStatsSource`]; with the `fjall` feature,
//! [`fjall::FjallStats`] reads a [fjall](https://docs.rs/fjall) keyspace
//! (L0 tables, runs as sub-levels, L0 bytes, and flushed and compacted
//! bytes from the L0 tables it sees come and go; see its documentation for
//! the approximations).
//!
//! # Failure model
//!
//! **The stats source** is user code, called under the controller's tick
//! lock on its ticker thread: [`LsmStatsSource::stats`] (component
//! `lsm_stats_source`, [`Snapshot::source`]) and
//! [`LsmStatsSource::tick_stats`] (component `lsm_stats_source_tick`, in
//! [`Snapshot::tick_source`]). A panic is caught, logged and counted, and:
//!
//! * a failed **interval reading** starts the next interval with the
//!   previous interval's budgets (the same regular and elastic tokens,
//!   dripped the same way): writers keep being admitted at the last rate
//!   known to suit the store, never zero. The reading is retried at the
//!   next interval. A controller that has no previous budget (its first
//!   reading failed) takes the safe budget below at once.
//! * after 4 failed readings in a row
//!   (a minute at the default 15 s interval), the controller stops trusting
//!   the old budgets (the last one may have been unlimited) and switches to
//!   a **safe budget**: regular work gets half the compaction throughput
//!   last seen, or [`ControllerBuilder::stats_failure_bytes_per_second`] over the
//!   interval if that is more; elastic work gets one token an interval (it
//!   is the work meant to yield when the store's state is in doubt). Never
//!   zero, never unlimited, until a reading returns.
//! * the first reading that returns is measured against the last good one,
//!   averaged over the intervals between, so the gap does not read as one
//!   interval's throughput.
//! * a failed **tick reading** skips that tick's hold decision: elastic
//!   tokens stay held if the previous tick held them and flow if it did
//!   not, until the interval ends (a new interval starts unheld). While it
//!   fails, the tick reading is retried every 250 ms rather
//!   than every tick, so one that always panics costs four caught panics a
//!   second, not a thousand.
//!
//! [`Controller::snapshot`] shows the source's health, the failed
//! readings in a row, whether the safe budget is on and how many ticks ran.
//!
//! **The ticker thread** (component `io_ticker`) catches a panic of a whole
//! tick as a last resort (none expected: the source is the only user code
//! in a tick), counts it in [`Snapshot::ticker`] and tries again after
//! 250 ms; a tick that runs late still hands out the whole
//! interval's tokens, so the drip survives it.

mod controller;
mod drip;
#[cfg(feature = "fjall")]
#[cfg_attr(docsrs, doc(cfg(feature = "fjall")))]
pub mod fjall;
mod listener;
mod stats;
#[cfg(test)]
mod tests;

#[cfg(any(test, loom, feature = "test-util"))]
pub use controller::Tick;
pub use controller::{Controller, ControllerBuilder, Snapshot};
pub use listener::{IntervalTokens, Tokens};
pub use stats::{LsmStats, LsmStatsSource};
