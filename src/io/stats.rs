//! What an LSM engine reports about its L0 debt.

/// One reading of an LSM's state. Cumulative counters only ever grow in a
/// healthy engine; the listener clamps their deltas at zero, so an engine
/// that resets or reports garbage cannot produce negative or overflowing
/// budgets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LsmStats {
    /// Files (SSTables) in L0.
    pub l0_files: u64,
    /// L0 sub-levels, for engines that track them (Pebble does; engines
    /// without them report `None` and are judged by file count).
    pub l0_sublevels: Option<u64>,
    /// Bytes in L0.
    pub l0_bytes: u64,
    /// Cumulative bytes flushed from memtables into L0.
    pub flushed_bytes: u64,
    /// Cumulative bytes ingested directly into L0.
    pub ingested_bytes: u64,
    /// Cumulative bytes compactions moved out of L0, for engines that count
    /// them (`None` otherwise: the listener then derives them from the
    /// change in L0 bytes, as `previous + flushed + ingested − current`).
    pub compacted_bytes: Option<u64>,
    /// Cumulative write stalls the engine imposed.
    pub write_stalls: u64,
    /// Memtables that are full and waiting to be flushed, for engines that
    /// report them (`None` otherwise). Engines stop every writer once too
    /// many pile up, whatever L0 looks like.
    pub unflushed_memtables: Option<u64>,
}

/// A source of [`LsmStats`]: an adapter for a storage engine, or a test's.
///
/// The controller's ticker thread calls it holding the controller's own
/// lock, so it must not call
/// [`snapshot`](crate::io::Controller::snapshot) (nor, in a test, `step`)
/// on the controller it feeds: that would wait on itself.
/// [`close`](crate::io::Controller::close) is fine (the ticker ends after
/// the tick), as is anything on the controller's queues.
pub trait LsmStatsSource: Send + 'static {
    /// Reads the engine's current state (once an interval).
    fn stats(&mut self) -> LsmStats;

    /// A cheap reading taken on every tick (every millisecond once the
    /// store is loaded), or `None` (the default) for engines that can only
    /// be read once an interval. The interval's tokens come from
    /// [`stats`](Self::stats); a tick's reading only decides whether elastic
    /// work is held back *now*: a flush backlog or an L0 pile-up builds up
    /// within a fraction of an interval, and the engine then stalls every
    /// writer.
    fn tick_stats(&mut self) -> Option<LsmStats> {
        None
    }
}

impl<F: FnMut() -> LsmStats + Send + 'static> LsmStatsSource for F {
    fn stats(&mut self) -> LsmStats {
        self()
    }
}
