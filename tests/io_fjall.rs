//! The fjall adapter against a real fjall database: L0 tables, runs and
//! bytes as fjall has them, flushed and compacted bytes derived from table
//! ids, and the IO controller seeing compactions pay the debt down.

#![cfg(feature = "fjall")]

use std::sync::Arc;

use admission::io::fjall::FjallStats;
use std::time::Duration;

use admission::io::{Controller, LsmStatsSource, Tokens};
use fjall::compaction::Fifo;
use fjall::{Database, Keyspace, KeyspaceCreateOptions};

/// A database whose L0 is never compacted on its own (FIFO compaction with
/// no size limit keeps every table in L0), so every flush stays in L0 until
/// the test compacts.
fn open(dir: &tempfile::TempDir) -> (Database, Keyspace) {
    let database = Database::builder(dir.path()).open().unwrap();
    let keyspace = database
        .keyspace("writes", || {
            KeyspaceCreateOptions::default()
                .compaction_strategy(Arc::new(Fifo::new(u64::MAX, None)))
        })
        .unwrap();
    (database, keyspace)
}

/// Writes `rows` rows from `start` and flushes them into one L0 table. Keys
/// only grow (FIFO compaction needs disjoint tables), so the tables share
/// one L0 run, as non-overlapping files share a sub-level.
fn flush_rows(keyspace: &Keyspace, start: u64, rows: u64) {
    for key in start..start + rows {
        keyspace
            .insert(key.to_be_bytes(), [key as u8; 200])
            .unwrap();
    }
    keyspace.rotate_memtable_and_wait().unwrap();
}

#[test]
fn reads_l0_tables_runs_and_bytes_and_derives_flushed_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let (database, keyspace) = open(&dir);
    let mut source = FjallStats::new(database, keyspace.clone());
    assert_eq!(source.stats().l0_files, 0);

    for flush in 0..3 {
        flush_rows(&keyspace, flush * 1_000, 1_000);
    }
    let first = source.stats();
    assert_eq!(first.l0_files, 3);
    assert_eq!(first.l0_sublevels, Some(1), "disjoint tables share a run");
    assert!(first.l0_bytes > 0);
    assert_eq!(
        first.flushed_bytes, first.l0_bytes,
        "everything in L0 is new"
    );
    assert_eq!(first.compacted_bytes, Some(0));

    flush_rows(&keyspace, 3_000, 1_000);
    let second = source.stats();
    assert_eq!(second.l0_files, 4);
    // The new table, at its file size, and nothing else.
    assert_eq!(
        second.flushed_bytes - first.flushed_bytes,
        second.l0_bytes - first.l0_bytes
    );
    assert_eq!(second.compacted_bytes, Some(0));
    assert_eq!(
        second.write_stalls, 0,
        "fjall's stall, from 20 runs, is far away"
    );
}

/// The controller reads its own adapter each interval; a second adapter
/// over the same keyspace, read at the same moments, shows the test what it
/// saw. Intervals are stepped under a paused clock.
#[test]
fn a_compaction_shows_as_compacted_bytes_in_the_controller() {
    let dir = tempfile::tempdir().unwrap();
    let (database, keyspace) = open(&dir);
    let mut seen = FjallStats::new(database.clone(), keyspace.clone());
    let interval = Duration::from_millis(100);
    let controller = Controller::builder(FjallStats::new(database, keyspace.clone()))
        .interval(interval)
        .l0_file_threshold(4)
        .l0_sublevel_threshold(4)
        .manual()
        .build()
        .unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    runtime.block_on(async {
        controller.step();
        seen.stats();

        for flush in 0..4 {
            flush_rows(&keyspace, flush * 1_000, 1_000);
        }
        tokio::time::advance(interval).await;
        let decision = controller.step().new_interval.expect("a new interval");
        let loaded = seen.stats();
        assert_eq!(decision.added, loaded.l0_bytes);
        assert_eq!(decision.compacted, 0, "nothing left L0 yet");
        assert!(decision.score >= 2.0, "{decision:?}");
        assert!(matches!(decision.regular, Tokens::Limited(_)));

        keyspace.major_compact().unwrap();
        tokio::time::advance(interval).await;
        let decision = controller.step().new_interval.expect("a new interval");
        let drained = seen.stats();
        assert_eq!(drained.l0_files, 0);
        assert_eq!(drained.compacted_bytes, Some(loaded.l0_bytes));
        assert_eq!(
            decision.compacted, loaded.l0_bytes,
            "all of L0 compacted out"
        );
        assert_eq!(decision.regular, Tokens::Unlimited, "L0 is healthy again");
    });

    let report = seen.snapshot();
    assert!(report.compactions_completed >= 1);
    assert!(report.disk_bytes > 0);
}
