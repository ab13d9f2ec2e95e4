use std::fmt;

/// Where a piece of work stands on the priority ladder.
///
/// An `i8`, higher values first. The named rungs follow CockroachDB's
/// `admissionpb.WorkPriority`; anything in between is valid and orders
/// numerically. Everything **below zero is elastic**: background work
/// (bulk loads, backups, rebalancing) that is expected to yield to user
/// traffic when the node is overloaded. Zero and above is **regular** work.
///
/// Priority orders work *within* a tenant; it does not let one tenant take
/// another's share (see [`TenantWeight`](crate::TenantWeight)). High priority
/// work can starve lower priority work of the same tenant: that is the point.
///
/// ```
/// use admission::Priority;
///
/// assert!(Priority::USER_HIGH > Priority::NORMAL);
/// assert!(Priority::BULK_NORMAL.is_elastic());
/// assert!(!Priority::NORMAL.is_elastic());
/// assert_eq!(Priority::from(-30), Priority::BULK_NORMAL);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Priority(i8);

impl Priority {
    /// The lowest priority: work that may wait indefinitely.
    pub const LOW: Priority = Priority(i8::MIN);
    /// Low-priority bulk work (for example a backfill that nobody waits on).
    pub const BULK_LOW: Priority = Priority(-100);
    /// User work explicitly marked as low priority.
    pub const USER_LOW: Priority = Priority(-50);
    /// Ordinary bulk work (imports, backups): elastic, yields under overload.
    pub const BULK_NORMAL: Priority = Priority(-30);
    /// The default for user-facing work.
    pub const NORMAL: Priority = Priority(0);
    /// Normal work that holds locks: finishing it unblocks others.
    pub const LOCKING_NORMAL: Priority = Priority(10);
    /// User work explicitly marked as high priority.
    pub const USER_HIGH: Priority = Priority(50);
    /// The highest priority: work the node needs to stay healthy.
    pub const HIGH: Priority = Priority(i8::MAX);

    /// The named rungs, lowest first: the priorities metrics keep a series
    /// key of each for.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) const RUNGS: [Priority; 8] = [
        Priority::LOW,
        Priority::BULK_LOW,
        Priority::USER_LOW,
        Priority::BULK_NORMAL,
        Priority::NORMAL,
        Priority::LOCKING_NORMAL,
        Priority::USER_HIGH,
        Priority::HIGH,
    ];

    /// A priority from its raw ladder value.
    pub const fn new(value: i8) -> Self {
        Priority(value)
    }

    /// The raw ladder value.
    pub const fn get(self) -> i8 {
        self.0
    }

    /// Whether this is elastic (background) work: any priority below zero.
    pub const fn is_elastic(self) -> bool {
        self.0 < 0
    }

    /// The rung's name if this is one of the named rungs: what `Display`
    /// writes, and the metrics' priority label.
    pub(crate) const fn name(self) -> Option<&'static str> {
        Some(match self.0 {
            i8::MIN => "low",
            -100 => "bulk-low",
            -50 => "user-low",
            -30 => "bulk-normal",
            0 => "normal",
            10 => "locking-normal",
            50 => "user-high",
            i8::MAX => "high",
            _ => return None,
        })
    }
}

impl From<i8> for Priority {
    fn from(value: i8) -> Self {
        Priority(value)
    }
}

impl From<Priority> for i8 {
    fn from(priority: Priority) -> Self {
        priority.0
    }
}

impl fmt::Debug for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => write!(f, "Priority({}: {name})", self.0),
            None => write!(f, "Priority({})", self.0),
        }
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `pad` so that width and alignment flags work in tables.
        match self.name() {
            Some(name) => f.pad(name),
            None => f.pad(&self.0.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ladder_orders_numerically_and_splits_at_zero() {
        let ladder = Priority::RUNGS;
        assert!(ladder.iter().all(|rung| rung.name().is_some()));
        assert!(ladder.windows(2).all(|pair| pair[0] < pair[1]));
        let elastic: Vec<bool> = ladder.iter().map(|p| p.is_elastic()).collect();
        assert_eq!(
            elastic,
            [true, true, true, true, false, false, false, false]
        );
        assert_eq!(
            ladder.map(Priority::get),
            [-128, -100, -50, -30, 0, 10, 50, 127]
        );
    }

    #[test]
    fn unnamed_rungs_display_their_value() {
        assert_eq!(Priority::new(7).to_string(), "7");
        assert_eq!(Priority::USER_HIGH.to_string(), "user-high");
        assert_eq!(format!("{:?}", Priority::new(-1)), "Priority(-1)");
        assert_eq!(format!("[{:>8}]", Priority::NORMAL), "[  normal]");
        assert_eq!(format!("[{:<4}]", Priority::new(3)), "[3   ]");
    }
}
