//! IO admission on a real LSM: a fjall database under a bulk ingest beside a
//! latency-sensitive foreground writer, without and with IO admission.
//!
//! ```text
//! cargo run --release --features fjall --example lsm_ingest              # 25 s per mode
//! cargo run --release --features fjall --example lsm_ingest -- --seconds 40
//! cargo run --release --features fjall --example lsm_ingest -- --quick   # 8 s per mode
//! cargo run --release --features fjall --example lsm_ingest -- --paced-mb 5,10,20,40
//! ```
//!
//! Four runs, one after the other, each on a fresh database in a
//! temporary directory:
//!
//! 1. the foreground writer alone (200 writes/s of 256 B at
//!    `Priority::NORMAL`): the unloaded baseline;
//! 2. the foreground beside three bulk writers (`Priority::BULK_NORMAL`,
//!    256-row batches of ~1 KiB values, as fast as they can) writing
//!    straight into fjall, whose own write stalls (from 20 L0 runs) and
//!    halts (from 30) are the only brake;
//! 3. the same through an `io::Controller`: every write is admitted for its
//!    estimated bytes, written, then settled with the bytes it wrote;
//! 4. the control for run 3: the bulk paced to the byte rate admission gave
//!    it, straight into fjall. Whatever the foreground suffers here, fjall
//!    charges for ingesting at that rate, with or without admission, so the
//!    gap between runs 3 and 4 is admission's own doing. `--paced-mb`
//!    adds paced runs at other rates: the foreground's latency against the
//!    bulk rate, the engine's trade-off that admission moves along.
//!
//! Every second it prints L0 tables and runs, the foreground p99 so far and
//! the bulk throughput; at the end, a table side by side, whole runs and
//! after a 2 s warmup (the first admission interval is always unlimited).
//! fjall runs with 2 MiB memtables and four worker threads, so that L0
//! builds up into fjall's stall range within seconds on a small machine;
//! admission reads L0 every 500 ms and treats 20 runs as fully overloaded (see `Settings::full` in
//! `examples/overload/ingest.rs`, shared with scenario W6 of the overload
//! suite). Foreground latency counts from each write's intended time.

#[path = "overload/ingest.rs"]
mod ingest;

use std::time::Duration;

use ingest::{Mode, Outcome, Second, Settings};

/// L0 runs from which fjall slows every writer down, and from which it
/// halts them (fjall's own thresholds, which the `io::fjall` module
/// documentation gives).
const FJALL_STALL_RUNS: u64 = 20;
const FJALL_HALT_RUNS: u64 = 30;

const USAGE: &str = "options: --seconds N | --quick, --fjall-workers N, --memtable-kib N, \
                     --bulk-writers N, --interval-ms N, --sublevel-threshold N, \
                     --paced-mb MB/s[,MB/s...]";

/// What the command line asks for.
struct Options {
    settings: Settings,
    /// Extra paced runs, bulk MB/s (10^6 bytes).
    paced_mb: Vec<f64>,
}

fn rates(flag: &str, value: Option<&String>) -> Result<Vec<f64>, String> {
    let value = value.ok_or_else(|| format!("{flag} needs a comma-separated list of MB/s"))?;
    value
        .split(',')
        .map(|rate| {
            rate.trim()
                .parse()
                .ok()
                .filter(|&mb: &f64| mb.is_finite() && mb > 0.0)
                .ok_or_else(|| format!("{flag} takes positive MB/s, not {rate:?}"))
        })
        .collect()
}

fn positive(flag: &str, value: Option<&String>) -> Result<u64, String> {
    let value = value.ok_or_else(|| format!("{flag} needs a number"))?;
    value
        .parse()
        .ok()
        .filter(|&n: &u64| n > 0)
        .ok_or_else(|| format!("{flag} takes a positive number, not {value}"))
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut settings = Settings::full(Duration::from_secs(25));
    let mut paced_mb = Vec::new();
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let flag = arg.as_str();
        match flag {
            "--quick" => {
                settings.run = Duration::from_secs(8);
                settings.baseline = Duration::from_secs(2);
            }
            "--seconds" => settings.run = Duration::from_secs(positive(flag, args.next())?),
            "--fjall-workers" => settings.fjall_workers = positive(flag, args.next())? as usize,
            "--memtable-kib" => settings.memtable_bytes = positive(flag, args.next())? * 1024,
            "--bulk-writers" => settings.bulk_writers = positive(flag, args.next())? as usize,
            "--interval-ms" => {
                settings.io.interval = Duration::from_millis(positive(flag, args.next())?)
            }
            "--sublevel-threshold" => {
                settings.io.l0_sublevel_threshold = positive(flag, args.next())?
            }
            "--paced-mb" => paced_mb = rates(flag, args.next())?,
            other => return Err(format!("unknown argument {other}; {USAGE}")),
        }
    }
    Ok(Options { settings, paced_mb })
}

fn progress(second: &Second) {
    let tokens = second.tokens.map_or(String::new(), |tokens| {
        format!(
            "  score {:.2}, tokens regular {} / elastic {}",
            tokens.score,
            ingest::tokens_mb(tokens.regular),
            ingest::tokens_mb(tokens.elastic)
        )
    });
    println!(
        "  {:>3.0}s  L0 tables {:>3}  runs {:>3}  fg p99 {:>8.2} ms  bulk {:>6.1} MB/s{tokens}",
        second.at.as_secs_f64(),
        second.l0_tables,
        second.l0_runs,
        second.foreground_p99_so_far_ms,
        second.bulk_mb_per_sec,
    );
}

fn table(outcomes: &[Outcome]) -> String {
    let baseline = &outcomes[0];
    let base_p50 = baseline.foreground_ms(0.5).max(1e-3);
    let base_p99 = baseline.foreground_ms(0.99).max(1e-3);
    let base_steady_p99 = baseline.steady_ms(0.99).max(1e-3);
    let header = [
        "mode",
        "fg p50 ms",
        "fg p99 ms",
        "fg max ms",
        "p50 x base",
        "p99 x base",
        "steady p99 ms",
        "x base",
        "fg writes",
        "admit p99 us",
        "insert p99 ms",
        "bulk MB/s",
        "max L0 runs",
        "max L0 tables",
        "stall s",
        "halt s",
    ];
    let mut lines = vec![header.map(String::from).to_vec()];
    for outcome in outcomes {
        lines.push(vec![
            outcome.mode.name().to_string(),
            format!("{:.2}", outcome.foreground_ms(0.5)),
            format!("{:.2}", outcome.foreground_ms(0.99)),
            format!("{:.2}", outcome.foreground_max_ms()),
            format!("{:.1}", outcome.foreground_ms(0.5) / base_p50),
            format!("{:.1}", outcome.foreground_ms(0.99) / base_p99),
            format!("{:.2}", outcome.steady_ms(0.99)),
            format!("{:.1}", outcome.steady_ms(0.99) / base_steady_p99),
            outcome.foreground.len().to_string(),
            format!(
                "{:.1}",
                outcome.foreground_admission.value_at_quantile(0.99) as f64 / 1e3
            ),
            format!(
                "{:.2}",
                outcome.foreground_insert.value_at_quantile(0.99) as f64 / 1e3
            ),
            format!("{:.1}", outcome.bulk_mb_per_sec()),
            outcome.max_l0_runs.to_string(),
            outcome.max_l0_tables.to_string(),
            format!("{:.1}", outcome.stall_time.as_secs_f64()),
            format!("{:.1}", outcome.halt_time.as_secs_f64()),
        ]);
    }
    let mut widths = vec![0; header.len()];
    for line in &lines {
        for (width, cell) in widths.iter_mut().zip(line) {
            *width = (*width).max(cell.len());
        }
    }
    let mut text = String::new();
    for line in &lines {
        for (column, (cell, width)) in line.iter().zip(&widths).enumerate() {
            if column == 0 {
                text.push_str(&format!("{cell:<width$}"));
            } else {
                text.push_str(&format!("  {cell:>width$}"));
            }
        }
        text.push('\n');
    }
    text
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Options { settings, paced_mb } = match parse(&args) {
        Ok(options) => options,
        Err(message) => {
            eprintln!("{message}");
            std::process::exit(2);
        }
    };
    println!(
        "fjall: {} KiB memtables, {} worker thread(s); stall from {FJALL_STALL_RUNS} L0 runs",
        settings.memtable_bytes / 1024,
        settings.fjall_workers,
    );
    println!(
        "admission: interval {:?}, L0 thresholds {} runs / {} tables; bulk: {} writers x {} rows",
        settings.io.interval,
        settings.io.l0_sublevel_threshold,
        settings.io.l0_file_threshold,
        settings.bulk_writers,
        settings.bulk_batch_rows,
    );
    let run = |mode: Mode| {
        match mode {
            Mode::Paced { bytes_per_sec } => {
                println!(
                    "\n{} at {:.1} MB/s ...",
                    mode.name(),
                    bytes_per_sec as f64 / 1e6
                )
            }
            _ => println!("\n{} ...", mode.name()),
        }
        ingest::run(&settings, mode, progress).unwrap_or_else(|message| {
            eprintln!("{}: {message}", mode.name());
            std::process::exit(1);
        })
    };
    let mut outcomes: Vec<Outcome> = [Mode::Alone, Mode::FjallAlone, Mode::Admission]
        .into_iter()
        .map(run)
        .collect();
    let admitted_rate = outcomes[2].bulk_mb_per_sec();
    for mb in std::iter::once(admitted_rate).chain(paced_mb) {
        outcomes.push(run(Mode::paced_mb(mb)));
    }
    let errors: u64 = outcomes.iter().map(|o| o.foreground_errors).sum();
    println!(
        "\nforeground latency from the intended send time; stall/halt: time with L0 runs \
         >= {FJALL_STALL_RUNS} / >= {}; steady: writes intended after the first {:?};\n\
         admit / insert: the foreground write's time in admission and inside fjall's insert;\n\
         paced: the bulk held to a fixed rate without admission (the first at admission's rate)",
        FJALL_HALT_RUNS, settings.warmup,
    );
    print!("{}", table(&outcomes));
    if errors > 0 {
        println!("foreground writes that failed: {errors}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<String> {
        line.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn paced_rates_are_a_list_of_positive_megabytes() {
        let options = parse(&args("--quick --paced-mb 5,10.5, 20")).map(|o| o.paced_mb);
        // The list ends at the space, and its empty last entry is refused
        // rather than skipped.
        assert!(options.is_err(), "{options:?}");
        let options = parse(&args("--paced-mb 5,10.5,20 --quick")).unwrap();
        assert_eq!(options.paced_mb, [5.0, 10.5, 20.0]);
        assert_eq!(options.settings.run, Duration::from_secs(8));
        assert!(parse(&args("")).unwrap().paced_mb.is_empty());
    }

    #[test]
    fn bad_paced_rates_are_refused_with_the_flag_named() {
        for bad in [
            "--paced-mb",
            "--paced-mb 0",
            "--paced-mb -3",
            "--paced-mb 5,x",
            "--paced-mb inf",
        ] {
            let error = parse(&args(bad)).map(|o| o.paced_mb).unwrap_err();
            assert!(error.contains("--paced-mb"), "{bad}: {error}");
        }
    }
}
