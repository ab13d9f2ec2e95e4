//! Parsing JSON bodies through the CPU pool, against parsing them inline in
//! async handlers.
//!
//! ```text
//! cargo run --release --example cpu_pool
//! ```
//!
//! A two-worker runtime receives a burst of large "bulk import" bodies
//! (tenant 1, `BULK_NORMAL`) and, while it parses them, a steady trickle of
//! small "interactive" bodies (tenant 2, `USER_HIGH`). `serde_json` parses
//! in one call, without an `.await`: a handler that parses inline holds its
//! worker for the whole body, so interactive requests wait in tokio's FIFO
//! run queue behind the bulk. Through a [`CpuPool`] the same parse waits in
//! the pool's admission queue instead, where the interactive tenant and
//! priority go first, and the workers stay free to accept requests.
//!
//! Requests arrive from a thread outside the runtime, as from a network.
//! Prints, for each mode, when the last bulk body was parsed and the
//! interactive requests' latency (from arrival to parsed). Runs in a few
//! seconds on an idle machine. On a 2-core VM (load average 7, measured
//! under contention) a run printed:
//!
//! ```text
//! mode      bulk done    interactive p50    interactive p99
//! inline       2675ms          2234.49ms          2450.67ms
//! pool         2043ms             6.46ms            40.11ms
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use admission::pool::CpuPool;
use admission::{Priority, TenantId, WorkInfo};
use serde_json::Value;

const WORKERS: usize = 2;
const BULK_BODIES: usize = 80;
const BULK_RECORDS: usize = 4_000;
const INTERACTIVE: usize = 150;
const INTERACTIVE_EVERY: Duration = Duration::from_millis(2);

/// A JSON array of `records` objects, as a client would send it.
fn body(records: usize) -> Arc<Vec<u8>> {
    let items: Vec<Value> = (0..records)
        .map(|i| {
            serde_json::json!({
                "id": i,
                "name": format!("item-{i:06}"),
                "tags": ["a", "b", "c"],
                "values": [i as f64 * 0.5, 1.25, 2.5, 3.75, 5.0, 6.25, 7.5, 8.75],
            })
        })
        .collect();
    Arc::new(serde_json::to_vec(&Value::Array(items)).expect("a Value always serializes"))
}

/// The handler's work: parse, and add up the values.
fn parse_and_sum(body: &[u8]) -> f64 {
    let parsed: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    parsed
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter_map(|item| item["values"].as_array())
                .flatten()
                .filter_map(Value::as_f64)
                .sum()
        })
        .unwrap_or(0.0)
}

#[derive(Clone, Copy)]
enum Mode {
    Inline,
    Pool,
}

struct Outcome {
    bulk: Duration,
    interactive: Vec<Duration>,
}

fn run(mode: Mode, bulk: &Arc<Vec<u8>>, small: &Arc<Vec<u8>>) -> Outcome {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKERS)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    // Sized to the work the workers leave: they only accept and hand over.
    let pool = Arc::new(
        CpuPool::builder()
            .threads(WORKERS)
            .build()
            .expect("valid pool settings"),
    );
    let parse = {
        let pool = pool.clone();
        move |work: WorkInfo, body: Arc<Vec<u8>>| {
            let pool = pool.clone();
            async move {
                match mode {
                    Mode::Inline => parse_and_sum(&body),
                    Mode::Pool => pool
                        .spawn(work, move || parse_and_sum(&body))
                        .await
                        .unwrap_or(0.0),
                }
            }
        }
    };
    // Requests arrive from a thread of their own, as from a network: a
    // generator inside the runtime would be starved of timer ticks by the
    // very parsing it is measuring.
    let start = Instant::now();
    let handle = runtime.handle().clone();
    let bulk_tasks: Vec<_> = (0..BULK_BODIES)
        .map(|_| {
            let work = WorkInfo::new(TenantId::new(1), Priority::BULK_NORMAL);
            let request = parse(work, bulk.clone());
            handle.spawn(async move {
                request.await;
                start.elapsed()
            })
        })
        .collect();
    let interactive_tasks: Vec<_> = (0..INTERACTIVE)
        .map(|_| {
            std::thread::sleep(INTERACTIVE_EVERY);
            let arrived = Instant::now();
            let work = WorkInfo::new(TenantId::new(2), Priority::USER_HIGH);
            let request = parse(work, small.clone());
            handle.spawn(async move {
                request.await;
                arrived.elapsed()
            })
        })
        .collect();
    let outcome = runtime.block_on(async {
        let mut interactive = Vec::with_capacity(INTERACTIVE);
        for task in interactive_tasks {
            interactive.push(task.await.unwrap_or(Duration::MAX));
        }
        let mut bulk = Duration::ZERO;
        for task in bulk_tasks {
            bulk = bulk.max(task.await.unwrap_or(Duration::MAX));
        }
        Outcome { bulk, interactive }
    });
    drop(runtime);
    outcome
}

fn percentile(sorted: &[Duration], q: f64) -> Duration {
    let rank = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn main() {
    let bulk = body(BULK_RECORDS);
    let small = body(20);
    let started = Instant::now();
    parse_and_sum(&bulk);
    println!(
        "bulk body: {} KiB, parsed in {:.2} ms; interactive body: {} bytes; \
         {BULK_BODIES} bulk bodies at once, {INTERACTIVE} interactive ones every {:?}; \
         {WORKERS} workers, pool of {WORKERS} threads",
        bulk.len() / 1024,
        started.elapsed().as_secs_f64() * 1e3,
        small.len(),
        INTERACTIVE_EVERY,
    );
    println!(
        "{:<8} {:>10} {:>18} {:>18}",
        "mode", "bulk done", "interactive p50", "interactive p99"
    );
    for (name, mode) in [("inline", Mode::Inline), ("pool", Mode::Pool)] {
        let mut outcome = run(mode, &bulk, &small);
        outcome.interactive.sort();
        println!(
            "{name:<8} {:>8.0}ms {:>16.2}ms {:>16.2}ms",
            outcome.bulk.as_secs_f64() * 1e3,
            percentile(&outcome.interactive, 0.5).as_secs_f64() * 1e3,
            percentile(&outcome.interactive, 0.99).as_secs_f64() * 1e3,
        );
    }
    println!(
        "inline: a parse holds its worker, so interactive requests queue behind the bulk in \
         tokio's FIFO;\npool: they wait in the pool's admission queue, where tenant 2 and \
         USER_HIGH go first."
    );
}
