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
//! Every tick (1 ms) the adjuster moves the total by one: down when
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
//! So the controller also reads admitted work itself (the hold inflation): how
//! much longer each priority's work holds its slot than it does with a
//! worker to itself. Holds inflated twofold cut the total in proportion at
//! once (a spike is absorbed in one window: 32 completions, or as few as 8
//! when the inflation leaves no doubt); by 40%, or a
//! higher priority finishing late while a lower one completes, take one
//! slot; and the runnable rule may add a slot only after two windows in a
//! row near the unloaded hold. Holds are trusted only while the workers are
//! busy: when they are not, longer holds are waits on IO or locks, which
//! more slots do not worsen. [`hold_baselines`](Snapshot::hold_baselines)
//! shows the baselines, [`last_adjustment`](Snapshot::last_adjustment) what
//! the rules decided, and the snapshot's `Debug` the latest window's inputs
//! and verdict.
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
//! of parking), does not. [`Snapshot::worker_idled`] shows the
//! reading. At 0.5x C with `yield_now` handlers it halved the mean total
//! (5.1 to 2.5 slots on 2 workers) and cut the p99 from 6.2 to 4.7 ms; at
//! 3x it changed nothing measurable (the runs: `docs/OVERLOAD.md`, "The
//! idle-worker gate").
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
//! [`Snapshot::global_queue`] and a warning report a backlog
//! there. The measurements: `docs/OVERLOAD.md`, "Arrivals first" and "The
//! runtime".
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
//! [`Snapshot::signal`] shows the signal's health, and
//! [`ticks`](Snapshot::ticks) and
//! [`last_tick`](Snapshot::last_tick) show that the sampler is
//! alive, failing or not.
//!
//! **The sampler thread** (component `cpu_sampler`) catches a panic of a
//! whole tick as a last resort (it should have none: the signal is the only
//! user code in a tick), counts it in [`Snapshot::sampler`] and
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
//! `cargo run --release --example cpu_hunt -- --sweep` measures it (64
//! closed-loop clients on a 2-worker runtime, handlers of ten 50 µs chunks
//! with a yield between): throughput is flat across thresholds 1 to 32
//! while the service p99 grows from 3.4 to 25.7 ms, so the default is the
//! lowest integer threshold, 1 (the table: `docs/OVERLOAD.md`, "What chose
//! the defaults").

mod adjuster;
mod builder;
mod controller;
mod idle;
mod inflation;
#[cfg(test)]
mod inflation_tests;
mod probe;
mod signal;
mod snapshot;
mod tuning;

pub use adjuster::{Adjustment, Hold};
pub use builder::ControllerBuilder;
pub use controller::Controller;
pub use idle::Mode;
pub use signal::{CpuLoad, CpuSignal, RuntimeSignal, SignalSource};
#[cfg(any(test, loom, feature = "test-util"))]
pub use snapshot::Tick;
pub use snapshot::{RuntimeSummary, SlotChange, Snapshot};
pub use tuning::{configure_runtime, GlobalQueueBacklog};
