//! An [`LsmStatsSource`] for [`fjall`], a pure-Rust LSM-tree key-value store.
//!
//! fjall exposes less than Pebble or RocksDB, so part of [`LsmStats`] is
//! derived rather than read:
//!
//! * **L0 files** are the keyspace's L0 table count, and **sub-levels** are
//!   L0's *runs*: every flush adds an overlapping run, which is what a
//!   sub-level is, and what fjall itself throttles on (a write stall from
//!   20 runs, the controller's default
//!   [`l0_sublevel_threshold`](super::ControllerBuilder::l0_sublevel_threshold);
//!   a halt from 30).
//! * **L0 bytes** are L0's on-disk size.
//! * **Flushed and compacted bytes** are not counted by fjall. The adapter
//!   keeps the id and on-disk size of every L0 table of its previous
//!   reading: a table it has not seen before was flushed into L0 (or
//!   ingested), a table that is gone was compacted out of it (merged or
//!   moved down), each at its file size. A table flushed *and* compacted
//!   away between two readings is never seen, so both counters are lower
//!   bounds and admission errs on the cautious side; read at least as often
//!   as L0 turns over (the controller reads it every tick). fjall's own
//!   intra-L0 work, if any, would count on both sides alike and leave the
//!   debt arithmetic unchanged.
//! * **Write stalls** count readings that found L0 in fjall's stall range
//!   (one reading per tick under the controller).
//! * **Unflushed memtables** are the keyspace's sealed memtables: fjall
//!   halts every writer from 4 of them, the value for
//!   [`memtable_stop_threshold`](super::ControllerBuilder::memtable_stop_threshold).
//!
//! The adapter answers [`LsmStatsSource::tick_stats`] too, so the
//! controller reads it every tick; the table ids are then compared a
//! millisecond apart and the derived counters miss little.
//!
//! [`FjallStats::snapshot`] adds what fjall reports about compaction progress
//! and disk growth, for observability; it is not an admission input.
//!
//! fjall 3 needs Rust 1.90, above this crate's 1.85, so the adapter is
//! behind the `fjall` feature.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use fjall::{AbstractTree, Database, Keyspace};

use super::stats::{LsmStats, LsmStatsSource};

/// L0 runs from which fjall slows every writer down: a reading from here
/// counts as a write stall. Crate-private: the module documentation gives
/// fjall's thresholds for the builder, and a user's copy would not follow
/// fjall anyway.
const FJALL_STALL_RUNS: u64 = 20;

/// Reads one fjall keyspace's L0 as [`LsmStats`]; see the
/// [module documentation](self) for what is derived and how.
pub struct FjallStats {
    database: Database,
    keyspace: Keyspace,
    /// L0 table ids and file sizes at the previous reading.
    previous_tables: HashMap<u64, u64>,
    flushed_bytes: u64,
    compacted_bytes: u64,
    write_stalls: u64,
}

/// What fjall reports about a keyspace beyond [`LsmStats`]: compaction
/// progress and disk growth.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FjallSnapshot {
    /// The admission inputs, as of this reading.
    pub stats: LsmStats,
    /// The keyspace's size on disk, all levels.
    pub disk_bytes: u64,
    /// Tables in every level.
    pub tables: u64,
    /// Compactions completed since the database opened.
    pub compactions_completed: u64,
    /// Compactions running now.
    pub active_compactions: u64,
    /// Time spent compacting since the database opened.
    pub time_compacting: Duration,
}

impl FjallStats {
    /// Reads `keyspace` of `database`. The first reading counts the L0 it
    /// finds as flushed, so deltas start from there.
    pub fn new(database: Database, keyspace: Keyspace) -> Self {
        FjallStats {
            database,
            keyspace,
            previous_tables: HashMap::new(),
            flushed_bytes: 0,
            compacted_bytes: 0,
            write_stalls: 0,
        }
    }

    /// Takes a reading, updating the derived counters: what
    /// [`LsmStatsSource::stats`] returns (the one public way to read it).
    fn read(&mut self) -> LsmStats {
        let version = self.keyspace.tree.current_version();
        let l0 = version.l0();
        let tables: HashMap<u64, u64> = l0
            .iter()
            .flat_map(|run| run.iter())
            .map(|table| (table.id(), table.metadata.file_size))
            .collect();
        let l0_bytes = tables
            .values()
            .fold(0u64, |sum, &size| sum.saturating_add(size));
        let l0_files = u64::try_from(tables.len()).unwrap_or(u64::MAX);
        let runs = u64::try_from(l0.run_count()).unwrap_or(u64::MAX);

        let sum_absent = |these: &HashMap<u64, u64>, from: &HashMap<u64, u64>| {
            these
                .iter()
                .filter(|(id, _)| !from.contains_key(id))
                .fold(0u64, |sum, (_, &size)| sum.saturating_add(size))
        };
        let flushed = sum_absent(&tables, &self.previous_tables);
        let compacted = sum_absent(&self.previous_tables, &tables);
        self.flushed_bytes = self.flushed_bytes.saturating_add(flushed);
        self.compacted_bytes = self.compacted_bytes.saturating_add(compacted);
        self.previous_tables = tables;
        if runs >= FJALL_STALL_RUNS {
            self.write_stalls = self.write_stalls.saturating_add(1);
        }
        LsmStats {
            l0_files,
            l0_sublevels: Some(runs),
            l0_bytes,
            flushed_bytes: self.flushed_bytes,
            ingested_bytes: 0,
            compacted_bytes: Some(self.compacted_bytes),
            write_stalls: self.write_stalls,
            unflushed_memtables: self.flush_backlog(),
        }
    }

    /// Sealed memtables waiting to be flushed now: the reading's
    /// `unflushed_memtables`.
    fn flush_backlog(&self) -> Option<u64> {
        Some(u64::try_from(self.keyspace.sealed_memtable_count()).unwrap_or(u64::MAX))
    }

    /// Takes a reading and adds fjall's compaction and disk figures.
    pub fn snapshot(&mut self) -> FjallSnapshot {
        let stats = self.read();
        let to_u64 = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
        FjallSnapshot {
            stats,
            disk_bytes: self.keyspace.disk_space(),
            tables: to_u64(self.keyspace.table_count()),
            compactions_completed: to_u64(self.database.compactions_completed()),
            active_compactions: to_u64(self.database.active_compactions()),
            time_compacting: self.database.time_compacting(),
        }
    }
}

impl LsmStatsSource for FjallStats {
    fn stats(&mut self) -> LsmStats {
        self.read()
    }

    fn tick_stats(&mut self) -> Option<LsmStats> {
        // A reading is a version clone and a walk of L0's tables: cheap
        // enough every millisecond, and every reading also tracks the L0
        // table ids, so few tables are flushed and compacted unseen.
        Some(self.read())
    }
}

impl fmt::Debug for FjallStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FjallStats")
            .field("l0_tables", &self.previous_tables.len())
            .field("flushed_bytes", &self.flushed_bytes)
            .field("write_stalls", &self.write_stalls)
            .finish_non_exhaustive()
    }
}
