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
//! it, the total binds and a worker has nothing to do (below), and not at
//! all in between (additive increase, additive decrease, with a dead band).
//! The total binds when every slot is in use, or when requests wait that a
//! larger total would admit: an elastic share is a fraction of the total,
//! so bulk work it holds back waits for the total while the slots it may
//! not take stand free. Behind the HTTP layer with bulk routes at
//! `USER_LOW` beside a few high-priority connections, counting only full
//! slots left the total at 9 with 8 in use and the workers half busy
//! (`examples/io_service`); counting waiting requests lets it follow. When slots free up, the
//! queue hands out at most `workers × max(1, threshold / 4)` grants before
//! those tasks have actually started running (grant pacing), so a sampled
//! signal cannot be outrun by a burst of admissions. When the node is idle
//! the sampler slows to 250 ms and stops enforcing ([`Mode`]); the first
//! admission past the total while idle wakes it and enforcement resumes.
//!
//! # A second signal, measured on admitted work
//!
//! Runnable tasks are only what the runtime shows, and it does not show a
//! task parked on a worker's defer list, where `tokio::task::yield_now` and
//! an exhausted cooperative budget put it, nor one waiting on a contended
//! async mutex; on stable tokio (every crate that depends on this one) the
//! signal is a probe that sees even less. Handlers written the way tokio's
//! docs teach then hide their own backlog, the total climbs, and admitted
//! work queues in tokio's FIFO run queues, where priority no longer exists.
//! So the controller also reads admitted work itself ([`inflation`]): how
//! much longer each priority's work holds its slot than it does with a
//! worker to itself. Holds inflated twofold cut the total in proportion at
//! once (a spike is absorbed in one window: 32 completions, or as few as 8
//! when the inflation leaves no doubt); by 40%, or a
//! higher priority finishing late while a lower one completes, take one
//! slot; and the runnable rule may add a slot only after two windows in a
//! row near the unloaded hold. Holds are trusted only while the workers are
//! busy: when they are not, longer holds are waits on IO or locks, which
//! more slots do not worsen. [`ControllerSnapshot::inflation`] and
//! [`hold_baselines`](ControllerSnapshot::hold_baselines) show the inputs
//! and the verdict of the latest window.
//!
//! # An increase needs a worker with nothing to do
//!
//! Holds are not trusted while the workers are not busy, so at light load
//! neither signal sees yielding handlers share a worker, and every burst
//! that filled the slots added one: at 0.5x C the total drifted to about 5
//! on 2 workers, and bursts of `yield_now` handlers then took turns on the
//! workers, their priority lost there. So an increase also needs a worker
//! parked at the moment of the sample ([`Hold::WorkersBusy`] otherwise):
//! the only state in which another admitted task can start at once. A
//! parked worker is read from tokio's park/unpark counts (stable metrics,
//! published as a worker parks and as it wakes), before the signal samples,
//! since the stable probe wakes a worker. Work waiting on IO or on a lock
//! leaves its workers parked and still gets slots; work that computes, or
//! yields (a worker with a task in its defer list polls the driver instead
//! of parking), does not. [`ControllerSnapshot::worker_idled`] shows the
//! reading. Measured on this 2-core VM, stable tokio, against the same run
//! of the code without it (`--scenario w1`, `--scenario matrix`):
//!
//! | scenario | without | with |
//! |---|---|---|
//! | W1 0.5x, `yield_now`: mean total, p99 (fixed total: 4.5 ms) | 5.1, 6.2 ms | 2.5, 4.7 ms |
//! | W1 1x: late, p99 (fixed: 1.1–1.3%, 5.1–5.2 ms) | 3.3%, 6.7 ms | 1.2%, 5.2 ms |
//! | W2 3x, `yield_now`, goodput − fixed total's (two runs each) | +1.7, +1.1 points | +2.7, −2.8 points |
//! | W2 3x, IO handlers, goodput / fixed total's | 2.1x | 2.0x |
//! | W2 3x, IO handlers, configured runtime: mean total, completions/s (two runs each) | 5.3–5.5, 1,669–1,772 | 4.3–4.6, 1,616–1,681 |
//! | W9 (IO), goodput / fixed total's | 2.2x | 2.1x |
//! | W8 (mutex), goodput − fixed total's | −1.8 points | −2.3 points |
//! | W5 (0.5x foreground beside a bulk job): bulk's share of the leftover, foreground p99 / alone (three runs each) | 79.9–93.2%, 1.02–1.18x | 75.0–77.6%, 0.99–1.27x |
//!
//! The cost showed in W5. Without the gate, the total had wandered above 2
//! beside a light foreground (a mean of 2.9–3.0). At 4, the elastic share
//! (half the total) lets the bulk job use two workers; a fixed total of 3
//! gives it no more than 2 does. At 2 it has one worker: 74–80% of the
//! leftover CPU, the same as a fixed total of 2 in the same runs. The
//! foreground's tail moved within the runs' spread. A bulk job that offers
//! its slot between chunks ([`SlotPermit::give_way`](crate::SlotPermit::give_way))
//! is not held to the share, and got 80–97% beside a foreground at
//! 0.75–0.96x its p99 alone (`docs/OVERLOAD.md`).
//!
//! Tried first: taking a park at any time since the previous tick as the
//! evidence. The total still drifted to 4.3 at 0.5x: a worker often parks
//! just before a burst fills the slots.
//!
//! # The runtime: arrivals before admitted work
//!
//! No slot total reaches a task that has not asked for admission yet.
//! With handlers that wake themselves between chunks (an await whose
//! value is ready), each worker always has local work and takes tokio's
//! global queue, where tasks spawned from outside the runtime arrive, one
//! task every ~200 µs of polling: at 3x overload arrivals wait there past
//! their deadlines, and a fixed total shows the same loss as an adaptive
//! one. Two things reach them:
//!
//! * **Arrivals first** ([`ControllerBuilder::arrivals_first`], on by
//!   default): a slot returned on a worker while the global queue holds a
//!   task a worker or more is kept back for the next request to ask, so
//!   the worker runs out of local work, takes a batch of arrivals from the
//!   global queue, and the queue orders them before the slot is given out. One slot at a
//!   time, given out by the next grant loop at the latest on the next
//!   tick.
//! * [`configure_runtime`] has workers look at the global queue first, on
//!   every tick; it needs the application to build its runtime.
//!
//! [`ControllerSnapshot::global_queue`] and a warning report a backlog
//! there. See [`tuning`] for the measurements.
//!
//! # Failure model
//!
//! **The signal** (component `cpu_signal`) is user code, called on the
//! sampler thread every period and once at build (for the worker count).
//! A panic is caught, logged and counted, and the controller **fails
//! closed**: it enforces (leaving idle mode if it was there: an idle
//! controller admits everything, and a controller that cannot see the load
//! must not), holds the slot total where it is (no adjustment in either
//! direction: the last total is the best estimate it has) and retries
//! every idle period (250 ms by default) rather than every period, so a
//! signal that always panics costs four caught panics a second, not a
//! thousand. The first sample that returns resumes the normal rule; idle
//! mode needs a fresh quiet second. A failure at build counts the runtime
//! as one worker (the smallest defaults: one slot, a grant burst of one).
//! [`ControllerSnapshot::signal`] shows the signal's health, and
//! [`ticks`](ControllerSnapshot::ticks) and
//! [`last_tick`](ControllerSnapshot::last_tick) show that the sampler is
//! alive, failing or not.
//!
//! **The sampler thread** (component `cpu_sampler`) catches a panic of a
//! whole tick as a last resort (it should have none: the signal is the only
//! user code in a tick), counts it in [`ControllerSnapshot::sampler`] and
//! tries again after the idle period; the thread never ends before the
//! controller does.
//!
//! # The threshold on tokio
//!
//! Upstream uses 32 runnable goroutines per CPU. Tokio tasks are not
//! goroutines: an admitted handler that yields between chunks of
//! computation is itself a run-queue entry each time it yields, so every
//! slot beyond one per worker adds an entry to a run queue, and every entry
//! stretches every admitted handler's latency by another chunk. A
//! goroutine-sized threshold lets dozens of handlers interleave.
//!
//! `cargo run --release --example cpu_hunt -- --sweep` measures it: 64
//! closed-loop clients on a 2-worker runtime, handlers of ten 50 µs chunks
//! with a yield between (2-core VM; service time is admission to completion,
//! which is what a request first in line still pays):
//!
//! | threshold | completed/s | service p50 | service p99 | mean total |
//! |---|---|---|---|---|
//! | 1  | 3,844 | 1.8 ms  | 3.4 ms  | 7.2  |
//! | 2  | 3,863 | 3.1 ms  | 5.1 ms  | 11.9 |
//! | 4  | 3,896 | 5.6 ms  | 9.0 ms  | 22.1 |
//! | 8  | 3,909 | 9.2 ms  | 13.9 ms | 36.2 |
//! | 32 | 3,907 | 16.1 ms | 25.7 ms | 65.0 |
//!
//! Throughput is flat (within 2%) while tails grow with the threshold, so
//! the default is the lowest integer threshold, [`DEFAULT_THRESHOLD`] = 1.
//! The total still settles above one slot per worker because `yield_now`
//! parks a yielding task in the worker's defer list, which queue depth does
//! not count. Handlers that wait on IO are not runnable while they wait, and
//! for them the total climbs as far as the CPU allows (about 50 slots for
//! the example's 200 µs waits). With the stable probe instead of queue
//! depths, threshold 1 settles at 16 slots (service p99 8.1 ms), still well
//! below an unlimited 65 (25 ms).
//!
//! [`DEFAULT_THRESHOLD`]: ControllerBuilder::DEFAULT_THRESHOLD

mod adjuster;
mod controller;
mod idle;
pub mod inflation;
mod probe;
mod signal;
pub mod tuning;

pub use adjuster::{Adjustment, Hold, SlotAdjuster};
pub use controller::{
    Controller, ControllerBuilder, ControllerSnapshot, Decision, RuntimeSummary, Tick,
};
pub use idle::Mode;
pub use signal::{CpuLoad, CpuSignal, RuntimeSignal, SignalSource};
pub use tuning::{configure_runtime, GlobalQueueBacklog};
