//! The LSM ingest experiment: a fjall database under a bulk ingest beside a
//! latency-sensitive foreground writer, with and without IO admission.
//!
//! Shared by `examples/lsm_ingest.rs` (the full experiment, with a report
//! every second) and scenario W6 of the overload suite (a smaller run),
//! so that both measure the same thing the same way.
//!
//! * **Bulk**: several writer threads at [`Priority::BULK_NORMAL`], each
//!   committing large write batches of random keys as fast as it is
//!   allowed. Random keys make every flushed table overlap every other, so
//!   each flush adds an L0 *run* (a sub-level), the thing fjall stalls on.
//! * **Foreground**: one writer at [`Priority::NORMAL`], small writes on a
//!   fixed open-loop schedule. Latency counts from each write's *intended*
//!   time, so a writer held up by a stall is charged for every write it
//!   should have made meanwhile (no coordinated omission).
//! * **Modes**: the foreground alone (the unloaded baseline), both writers
//!   straight into fjall (its own write stalls are the only brake), both
//!   through an [`io::Controller`](Controller) (`admit` with the estimated bytes, write,
//!   `correct_tokens` with the bytes actually written), and the control for
//!   that last one: the bulk paced to a fixed byte rate, without admission.
//!   Paced at the rate admission ended up giving the bulk, it shows what
//!   the engine alone costs the foreground at that ingest rate, so the
//!   difference between the two is what admission itself adds or removes.
//!
//! Writers are OS threads because fjall's writes block (and fjall's own
//! stall sleeps in the writing thread); they wait for admission with
//! `futures::executor::block_on`, since an admission without a deadline
//! needs no tokio timer. A tokio service would `admit().await` in its task
//! and hand the write to `spawn_blocking`.

// W6 uses part of this module, `lsm_ingest` all of it.
#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use admission::io::fjall::FjallStats;
use admission::io::{Controller, IntervalTokens, Tokens};
use admission::{Priority, TenantId, WorkInfo};
use fjall::{AbstractTree, Database, Keyspace, KeyspaceCreateOptions};
use hdrhistogram::Histogram;

/// L0 runs from which fjall slows every writer down (fjall's own
/// threshold, which the `io::fjall` module documentation gives).
const FJALL_STALL_RUNS: u64 = 20;
/// L0 runs from which fjall halts every writer until compactions catch up.
const FJALL_HALT_RUNS: u64 = 30;
/// Sealed memtables from which fjall halts every writer until flushes
/// catch up.
const FJALL_MEMTABLE_STOP: u64 = 4;

const FOREGROUND_TENANT: TenantId = TenantId::new(1);
const BULK_TENANT: TenantId = TenantId::new(2);
/// Keys are 16 random bytes.
const KEY_BYTES: usize = 16;
/// How often L0 is sampled for the maxima and the time in the stall range.
const SAMPLE_EVERY: Duration = Duration::from_millis(50);

/// The experiment's knobs; [`Settings::full`] and [`Settings::smoke`] are
/// the two sizes used.
#[derive(Clone, Debug)]
pub struct Settings {
    /// How long each loaded mode runs.
    pub run: Duration,
    /// How long the foreground runs alone for the baseline.
    pub baseline: Duration,
    /// Foreground writes intended before this point of a run also go into
    /// the whole-run figures only: the first admission interval is always
    /// unlimited (the listener has no history yet), so the start of a run
    /// shows the transient, the rest the steady state.
    pub warmup: Duration,
    /// Bulk writer threads.
    pub bulk_writers: usize,
    /// Rows per bulk write batch.
    pub bulk_batch_rows: usize,
    /// Mean bulk value size; values are uniform in 0.5x..1.5x of it, so the
    /// estimate (rows × mean) is corrected by the actual bytes.
    pub bulk_value_bytes: usize,
    /// Foreground writes per second.
    pub foreground_rate: f64,
    /// Foreground value size.
    pub foreground_value_bytes: usize,
    /// fjall's memtable size: each flush writes at most this into L0.
    pub memtable_bytes: u64,
    /// fjall's worker threads (flushes and compactions share them).
    pub fjall_workers: usize,
    /// The IO controller's settings.
    pub io: IoSettings,
}

/// The IO controller's settings that the experiment sets.
#[derive(Clone, Copy, Debug)]
pub struct IoSettings {
    pub interval: Duration,
    pub l0_file_threshold: u64,
    pub l0_sublevel_threshold: u64,
    pub memtable_stop_threshold: u64,
}

impl IoSettings {
    /// A controller reading `source` with these settings.
    fn controller(&self, source: FjallStats) -> Result<Controller, admission::ConfigError> {
        Controller::builder(source)
            .interval(self.interval)
            .l0_file_threshold(self.l0_file_threshold)
            .l0_sublevel_threshold(self.l0_sublevel_threshold)
            .memtable_stop_threshold(self.memtable_stop_threshold)
            .build()
    }
}

impl Settings {
    /// The full experiment at `run` per loaded mode.
    ///
    /// fjall is set up so that L0 builds up on a small (2-core) machine:
    /// 2 MiB memtables flush often, so runs arrive quickly, and four worker
    /// threads (more than the cores) keep flushing while a long L0 → L1
    /// compaction (all of L0 merged with all of L1 under random keys, a
    /// rewrite that grows with L1) runs, so flushes out-pace compactions
    /// and runs pile up. With one worker, flushes queue behind compactions
    /// instead, and fjall halts writers on its sealed-memtable limit (4)
    /// long before L0 reaches 20 runs; with larger memtables L0 stays
    /// below 10 runs within a short run.
    ///
    /// Admission reads L0 every 500 ms (instead of 15 s): L0 turns over in
    /// about a second here, and the fjall adapter counts only the tables it
    /// sees, so a slower reading misses tables flushed and compacted in
    /// between, under-estimates compaction throughput and starves writers
    /// (at 1 s, some intervals came out at one token). The sub-level
    /// threshold is [`FJALL_STALL_RUNS`]: the listener's score reaches 1 at
    /// half the threshold (10 runs), where regular tokens drop to the
    /// compaction rate, so admission aims at about half of fjall's stall
    /// point, and elastic (bulk) tokens shrink from 2 runs.
    pub fn full(run: Duration) -> Settings {
        Settings {
            run,
            baseline: Duration::from_secs(5),
            warmup: Duration::from_secs(2),
            bulk_writers: 3,
            bulk_batch_rows: 256,
            bulk_value_bytes: 1_024,
            foreground_rate: 200.0,
            foreground_value_bytes: 256,
            memtable_bytes: 2 << 20,
            fjall_workers: 4,
            io: IoSettings {
                interval: Duration::from_millis(500),
                // Files never decide here: fjall's L0 tables are at most a
                // few per run, so runs reach the threshold first.
                l0_file_threshold: 1_000,
                l0_sublevel_threshold: FJALL_STALL_RUNS,
                // fjall halts every writer from four sealed memtables; bulk
                // writes are held back from two.
                memtable_stop_threshold: FJALL_MEMTABLE_STOP,
            },
        }
    }

    /// A CI-sized run for the smoke test: the same setup for well under a
    /// second per mode, to check that every mode runs and reports.
    pub fn smoke() -> Settings {
        Settings {
            run: Duration::from_millis(800),
            baseline: Duration::from_millis(300),
            warmup: Duration::from_millis(300),
            bulk_writers: 2,
            bulk_batch_rows: 64,
            ..Settings::full(Duration::ZERO)
        }
    }

    fn bulk_estimate(&self) -> u64 {
        (self.bulk_batch_rows * (KEY_BYTES + self.bulk_value_bytes)) as u64
    }
}

/// Who writes, and how.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The foreground writer alone: the unloaded baseline.
    Alone,
    /// Bulk and foreground straight into fjall.
    FjallAlone,
    /// Bulk and foreground through IO admission.
    Admission,
    /// Bulk writers paced to a fixed total rate (bytes per second, shared
    /// evenly), straight into fjall: the ingest rate without the controller.
    Paced {
        /// The bulk writers' combined rate, bytes per second.
        bytes_per_sec: u64,
    },
}

impl Mode {
    /// The bulk paced to `mb_per_sec` (10^6 bytes), at least a byte a
    /// second: a control for a bulk that admission starved entirely paces
    /// at a trickle rather than not at all.
    pub fn paced_mb(mb_per_sec: f64) -> Mode {
        Mode::Paced {
            bytes_per_sec: (mb_per_sec * 1e6).max(1.0) as u64,
        }
    }

    /// A short name for tables.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Alone => "foreground alone",
            Mode::FjallAlone => "fjall alone",
            Mode::Admission => "IO admission",
            Mode::Paced { .. } => "paced, no admission",
        }
    }
}

/// One second of a run, for the progress report.
#[derive(Clone, Debug)]
pub struct Second {
    /// Time into the run.
    pub at: Duration,
    /// L0 tables now.
    pub l0_tables: u64,
    /// L0 runs now.
    pub l0_runs: u64,
    /// Foreground p99 since the run started, in ms.
    pub foreground_p99_so_far_ms: f64,
    /// Bulk throughput over the last second, MB/s.
    pub bulk_mb_per_sec: f64,
    /// The admission controller's latest decision (admission mode).
    pub tokens: Option<IntervalTokens>,
}

/// What one mode measured.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The mode.
    pub mode: Mode,
    /// Foreground latency from the intended time, in µs.
    pub foreground: Histogram<u64>,
    /// The same for writes intended after the warmup.
    pub foreground_steady: Histogram<u64>,
    /// Foreground writes that failed (admission closed, fjall error).
    pub foreground_errors: u64,
    /// Time each foreground write spent in admission, in ns: where the
    /// latency is *not*, when it is in the engine.
    pub foreground_admission: Histogram<u64>,
    /// Time each foreground write spent inside fjall's `insert`, in µs.
    pub foreground_insert: Histogram<u64>,
    /// Bulk bytes (keys and values) committed within the run.
    pub bulk_bytes: u64,
    /// The run's length.
    pub length: Duration,
    /// Most L0 runs seen.
    pub max_l0_runs: u64,
    /// Most L0 tables seen.
    pub max_l0_tables: u64,
    /// Time with L0 in fjall's stall range (runs ≥ [`FJALL_STALL_RUNS`]).
    pub stall_time: Duration,
    /// Time with L0 at fjall's halt (runs ≥ [`FJALL_HALT_RUNS`]).
    pub halt_time: Duration,
    /// The admission controller's decisions, one per interval.
    pub intervals: Vec<IntervalTokens>,
}

impl Outcome {
    /// A foreground latency quantile in ms.
    pub fn foreground_ms(&self, quantile: f64) -> f64 {
        self.foreground.value_at_quantile(quantile) as f64 / 1e3
    }

    /// A foreground latency quantile after the warmup, in ms.
    pub fn steady_ms(&self, quantile: f64) -> f64 {
        self.foreground_steady.value_at_quantile(quantile) as f64 / 1e3
    }

    /// The largest foreground latency in ms.
    pub fn foreground_max_ms(&self) -> f64 {
        self.foreground.max() as f64 / 1e3
    }

    /// Bulk throughput over the run, MB/s (10^6 bytes).
    pub fn bulk_mb_per_sec(&self) -> f64 {
        self.bulk_bytes as f64 / 1e6 / self.length.as_secs_f64().max(1e-9)
    }
}

/// A small fast generator (SplitMix64): the keys and values need to be
/// spread and incompressible, not cryptographic.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn key(&mut self) -> [u8; KEY_BYTES] {
        let mut key = [0; KEY_BYTES];
        key[..8].copy_from_slice(&self.next().to_be_bytes());
        key[8..].copy_from_slice(&self.next().to_be_bytes());
        key
    }
}

/// Random bytes that values are cut from at random offsets, so they do not
/// compress (lz4 is on) without generating every byte of every value.
fn noise(bytes: usize, seed: u64) -> Vec<u8> {
    let mut rng = SplitMix(seed);
    (0..bytes.div_ceil(8))
        .flat_map(|_| rng.next().to_le_bytes())
        .take(bytes)
        .collect()
}

fn histogram() -> Histogram<u64> {
    // 1 µs to 10 min at 3 significant digits; larger values saturate.
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid histogram bounds")
}

/// Everything the writer threads share.
struct Shared {
    keyspace: Keyspace,
    database: Database,
    controller: Option<Controller>,
    stop: AtomicBool,
    bulk_bytes: AtomicU64,
    foreground: Mutex<Histogram<u64>>,
    foreground_steady: Mutex<Histogram<u64>>,
    foreground_errors: AtomicU64,
    foreground_admission: Mutex<Histogram<u64>>,
    foreground_insert: Mutex<Histogram<u64>>,
    noise: Vec<u8>,
}

impl Shared {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    fn value<'a>(&'a self, rng: &mut SplitMix, len: usize) -> &'a [u8] {
        let start = (rng.next() as usize) % (self.noise.len() - len);
        &self.noise[start..start + len]
    }

    /// Waits for admission of `bytes` at `priority`, if admission is on.
    /// `Err` once the controller is closed at the end of the run.
    fn admit(&self, work: &WorkInfo) -> Result<(), String> {
        match &self.controller {
            None => Ok(()),
            Some(controller) => futures::executor::block_on(controller.admit(work.clone()))
                // The permit is a token grant: tokens are spent once
                // granted, so nothing needs to be held during the write.
                .map(drop)
                .map_err(|error| error.to_string()),
        }
    }

    fn settle(&self, work: &WorkInfo, estimated: u64, actual: u64) {
        if let Some(controller) = &self.controller {
            controller.correct_tokens(work, estimated, actual);
        }
    }
}

/// Writes batches until the run stops: as fast as admission (or fjall)
/// lets it, or at `pace` bytes per second when given. Pacing is open-loop
/// from the writer's start, so a writer held up by fjall catches up after.
fn bulk_writer(
    shared: &Shared,
    settings: &Settings,
    pace: Option<f64>,
    deadline: Instant,
    seed: u64,
) {
    let mut rng = SplitMix(seed);
    let estimate = settings.bulk_estimate();
    let half = settings.bulk_value_bytes / 2;
    let started = Instant::now();
    let mut written = 0u64;
    while !shared.stopped() {
        if let Some(bytes_per_sec) = pace {
            let due = started + Duration::from_secs_f64(written as f64 / bytes_per_sec);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                // Short enough that the writer sees the end of the run.
                thread::sleep(wait.min(SAMPLE_EVERY));
                continue;
            }
        }
        let work = WorkInfo::builder()
            .tenant(BULK_TENANT)
            .priority(Priority::BULK_NORMAL)
            .requested(estimate)
            .build();
        if shared.admit(&work).is_err() {
            return;
        }
        let mut batch = shared.database.batch();
        let mut actual = 0;
        for _ in 0..settings.bulk_batch_rows {
            let len = half + (rng.next() as usize) % (settings.bulk_value_bytes + 1);
            batch.insert(&shared.keyspace, rng.key(), shared.value(&mut rng, len));
            actual += (KEY_BYTES + len) as u64;
        }
        if let Err(error) = batch.commit() {
            eprintln!("bulk write failed: {error}");
            return;
        }
        shared.settle(&work, estimate, actual);
        written += actual;
        // Only what was committed within the run counts as throughput.
        if Instant::now() <= deadline {
            shared.bulk_bytes.fetch_add(actual, Ordering::Relaxed);
        }
    }
}

/// Records `elapsed` in units of `1 / per_second` seconds.
fn record(histogram: &Mutex<Histogram<u64>>, elapsed: Duration, per_second: f64) {
    let units = (elapsed.as_secs_f64() * per_second) as u64;
    histogram
        .lock()
        .expect("no writer panics holding the histogram")
        .saturating_record(units);
}

/// Writes on the open-loop schedule until `deadline`; writes intended after
/// `start + warmup` also count as steady.
fn foreground_writer(
    shared: &Shared,
    settings: &Settings,
    start: Instant,
    warmup: Duration,
    deadline: Instant,
) {
    let mut rng = SplitMix(0xf0f0);
    let period = Duration::from_secs_f64(1.0 / settings.foreground_rate);
    let bytes = (KEY_BYTES + settings.foreground_value_bytes) as u64;
    let mut intended = start;
    // Every write intended before the deadline is made, however late: a
    // writer that a stall held up past the deadline still owes them, and
    // dropping them would hide the worst latencies.
    while intended < deadline {
        if let Some(wait) = intended.checked_duration_since(Instant::now()) {
            thread::sleep(wait);
        }
        let work = WorkInfo::builder()
            .tenant(FOREGROUND_TENANT)
            .priority(Priority::NORMAL)
            .requested(bytes)
            .build();
        // The two steps are timed apart, so that a slow write shows
        // whether it waited in admission or inside the engine.
        let asked = Instant::now();
        let admitted = shared.admit(&work);
        let inserting = Instant::now();
        let written = admitted.and_then(|()| {
            let value = shared.value(&mut rng, settings.foreground_value_bytes);
            shared
                .keyspace
                .insert(rng.key(), value)
                .map_err(|error| error.to_string())
        });
        let done = Instant::now();
        record(&shared.foreground_admission, inserting - asked, 1e9);
        record(&shared.foreground_insert, done - inserting, 1e6);
        match written {
            Ok(()) => {
                shared.settle(&work, bytes, bytes);
                let micros = u64::try_from(intended.elapsed().as_micros()).unwrap_or(u64::MAX);
                shared
                    .foreground
                    .lock()
                    .expect("no writer panics holding the histogram")
                    .saturating_record(micros);
                if intended >= start + warmup {
                    shared
                        .foreground_steady
                        .lock()
                        .expect("no writer panics holding the histogram")
                        .saturating_record(micros);
                }
            }
            Err(_) => {
                shared.foreground_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        intended += period;
    }
}

fn open(settings: &Settings, dir: &tempfile::TempDir) -> Result<(Database, Keyspace), String> {
    let database = Database::builder(dir.path())
        .worker_threads(settings.fjall_workers)
        .open()
        .map_err(|error| format!("cannot open fjall in {}: {error}", dir.path().display()))?;
    let memtable = settings.memtable_bytes;
    let keyspace = database
        .keyspace("ingest", || {
            KeyspaceCreateOptions::default().max_memtable_size(memtable)
        })
        .map_err(|error| format!("cannot create the keyspace: {error}"))?;
    Ok((database, keyspace))
}

fn l0(keyspace: &Keyspace) -> (u64, u64) {
    let tables = u64::try_from(keyspace.l0_table_count()).unwrap_or(u64::MAX);
    let runs = u64::try_from(keyspace.tree.l0_run_count()).unwrap_or(u64::MAX);
    (tables, runs)
}

/// Runs one mode on a fresh database, calling `each_second` once a second.
pub fn run(
    settings: &Settings,
    mode: Mode,
    mut each_second: impl FnMut(&Second),
) -> Result<Outcome, String> {
    let dir = tempfile::Builder::new()
        .prefix("lsm-ingest-")
        .tempdir()
        .map_err(|error| format!("cannot create a temporary directory: {error}"))?;
    let (database, keyspace) = open(settings, &dir)?;
    let controller = match mode {
        Mode::Admission => Some(
            settings
                .io
                .controller(FjallStats::new(database.clone(), keyspace.clone()))
                .map_err(|error| format!("invalid admission settings: {error}"))?,
        ),
        Mode::Alone | Mode::FjallAlone | Mode::Paced { .. } => None,
    };
    let length = match mode {
        Mode::Alone => settings.baseline,
        Mode::FjallAlone | Mode::Admission | Mode::Paced { .. } => settings.run,
    };
    let shared = Arc::new(Shared {
        keyspace: keyspace.clone(),
        database,
        controller,
        stop: AtomicBool::new(false),
        bulk_bytes: AtomicU64::new(0),
        foreground: Mutex::new(histogram()),
        foreground_steady: Mutex::new(histogram()),
        foreground_errors: AtomicU64::new(0),
        foreground_admission: Mutex::new(histogram()),
        foreground_insert: Mutex::new(histogram()),
        noise: noise(4 << 20, 0x5eed),
    });
    let bulk_writers = if mode == Mode::Alone {
        0
    } else {
        settings.bulk_writers
    };
    let pace = match mode {
        Mode::Paced { bytes_per_sec } => Some(bytes_per_sec as f64 / bulk_writers as f64),
        Mode::Alone | Mode::FjallAlone | Mode::Admission => None,
    };
    // The baseline has no admission transient to leave out.
    let warmup = if mode == Mode::Alone {
        Duration::ZERO
    } else {
        settings.warmup
    };

    let start = Instant::now();
    let deadline = start + length;
    let mut bulk = Vec::new();
    for writer in 0..bulk_writers {
        let (shared, settings) = (shared.clone(), settings.clone());
        bulk.push(
            thread::Builder::new()
                .name(format!("bulk-{writer}"))
                .spawn(move || bulk_writer(&shared, &settings, pace, deadline, writer as u64 + 1))
                .map_err(|error| format!("cannot start a bulk writer: {error}"))?,
        );
    }
    let foreground = {
        let (shared, settings) = (shared.clone(), settings.clone());
        thread::Builder::new()
            .name("foreground".into())
            .spawn(move || foreground_writer(&shared, &settings, start, warmup, deadline))
            .map_err(|error| format!("cannot start the foreground writer: {error}"))?
    };

    // This thread samples L0 and reports every second until the deadline.
    let (mut max_runs, mut max_tables) = (0, 0);
    let (mut stall_time, mut halt_time) = (Duration::ZERO, Duration::ZERO);
    let mut intervals: Vec<IntervalTokens> = Vec::new();
    let mut next_second = start + Duration::from_secs(1);
    let mut bulk_at_last_second = 0;
    let mut last_sample = start;
    loop {
        let now = Instant::now();
        let (tables, runs) = l0(&keyspace);
        // Charge the time since the previous sample to the state now seen.
        let since = now - last_sample;
        last_sample = now;
        if runs >= FJALL_STALL_RUNS {
            stall_time += since;
        }
        if runs >= FJALL_HALT_RUNS {
            halt_time += since;
        }
        max_runs = max_runs.max(runs);
        max_tables = max_tables.max(tables);
        let tokens = shared
            .controller
            .as_ref()
            .and_then(|c| c.snapshot().last_interval);
        if let Some(tokens) = tokens {
            if intervals.last() != Some(&tokens) {
                intervals.push(tokens);
            }
        }
        if now >= next_second {
            let bulk = shared.bulk_bytes.load(Ordering::Relaxed);
            let p99 = shared
                .foreground
                .lock()
                .expect("no writer panics holding the histogram")
                .value_at_quantile(0.99) as f64
                / 1e3;
            each_second(&Second {
                at: now - start,
                l0_tables: tables,
                l0_runs: runs,
                foreground_p99_so_far_ms: p99,
                bulk_mb_per_sec: (bulk - bulk_at_last_second) as f64 / 1e6,
                tokens,
            });
            bulk_at_last_second = bulk;
            next_second += Duration::from_secs(1);
        }
        if now >= deadline {
            break;
        }
        thread::sleep(SAMPLE_EVERY.min(deadline - now));
    }

    // The bulk stops first, so the foreground catches up on the writes it
    // still owes without new load; then closing the queues lets bulk
    // writers blocked in admission out (writers inside a fjall stall leave
    // once it lets them go).
    shared.stop.store(true, Ordering::Relaxed);
    let joined = foreground.join();
    if let Some(controller) = &shared.controller {
        controller.close();
    }
    for thread in bulk {
        thread
            .join()
            .map_err(|_| "a bulk writer panicked".to_string())?;
    }
    joined.map_err(|_| "the foreground writer panicked".to_string())?;
    let foreground = shared
        .foreground
        .lock()
        .expect("no writer panics holding the histogram")
        .clone();
    let foreground_steady = shared
        .foreground_steady
        .lock()
        .expect("no writer panics holding the histogram")
        .clone();
    let snapshot = |h: &Mutex<Histogram<u64>>| {
        h.lock()
            .expect("no writer panics holding the histogram")
            .clone()
    };
    let foreground_admission = snapshot(&shared.foreground_admission);
    let foreground_insert = snapshot(&shared.foreground_insert);
    Ok(Outcome {
        mode,
        foreground,
        foreground_steady,
        foreground_errors: shared.foreground_errors.load(Ordering::Relaxed),
        foreground_admission,
        foreground_insert,
        bulk_bytes: shared.bulk_bytes.load(Ordering::Relaxed),
        length,
        max_l0_runs: max_runs,
        max_l0_tables: max_tables,
        stall_time,
        halt_time,
        intervals,
    })
}

/// A token budget for a progress line: "-" while unlimited, else MB.
pub fn tokens_mb(tokens: Tokens) -> String {
    match tokens {
        Tokens::Unlimited => "unlimited".into(),
        Tokens::Limited(bytes) => format!("{:.1} MB", bytes as f64 / 1e6),
    }
}
