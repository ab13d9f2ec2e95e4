//! The CPU signal: tokio's run-queue depth driving the slot total.
//!
//! Slots govern CPU: a handler holds one while it computes. How many slots
//! the node can sustain is not known in advance and changes with the work
//! (a handler that awaits a database call between chunks of computation
//! needs more slots to keep the CPU busy than one that only computes). The
//! [`Controller`] finds it by watching the one thing that shows overload
//! directly: **tasks that are ready to run but not running**, per worker
//! ([`CpuSignal`], [`RuntimeSignal`]). Not utilization: a CPU 100% busy with
//! an empty run queue is healthy; 100% busy with a deep one is overloaded.
//!
//! Every tick (1 ms) the [`SlotAdjuster`] moves the total by one: down when
//! runnable per worker reaches the threshold, up when it is at most half of
//! it and every slot is in use, and not at all in between (additive
//! increase, additive decrease, with a dead band). When slots free up, the
//! queue hands out at most `workers × max(1, threshold / 4)` grants before
//! those tasks have actually started running (grant pacing), so a sampled
//! signal cannot be outrun by a burst of admissions. When the node is idle
//! the sampler slows to 250 ms and stops enforcing ([`Mode`]).
//!
//! # The threshold on tokio
//!
//! Upstream uses 32 runnable goroutines per CPU. Tokio tasks are not
//! goroutines: an admitted handler that yields between chunks of
//! computation is itself a run-queue entry each time it yields, so with `k`
//! slots per worker the queues hold about `k − 1` entries per worker from
//! admitted work alone, and every extra entry stretches every handler's
//! latency by another chunk. A goroutine-sized threshold would let dozens of
//! handlers interleave. The default, [`DEFAULT_THRESHOLD`] = 2, keeps the
//! total hunting between about 1.5 and 3 slots per worker for handlers that
//! only compute and lets it climb as far as needed for handlers that wait
//! on IO (they are not runnable while they wait). `examples/cpu_hunt.rs`
//! shows the hunt; the numbers behind the default are in the README.
//!
//! [`DEFAULT_THRESHOLD`]: ControllerBuilder::DEFAULT_THRESHOLD

mod adjuster;
mod controller;
mod idle;
#[cfg(not(tokio_unstable))]
mod probe;
mod signal;

pub use adjuster::{Adjustment, Hold, SlotAdjuster};
pub use controller::{
    Controller, ControllerBuilder, ControllerSnapshot, Decision, RuntimeSummary, Tick,
};
pub use idle::Mode;
pub use signal::{CpuLoad, CpuSignal, RuntimeSignal, SignalSource};
