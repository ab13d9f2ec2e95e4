use std::time::Duration;

use tokio::time::Instant;

use super::{Priority, TenantId};

/// What the queue needs to know about one piece of work to order it.
///
/// Build one with [`WorkInfo::new`] for the common case or
/// [`WorkInfo::builder`] for the rest:
///
/// ```
/// use std::time::Duration;
/// use admission::{Priority, TenantId, WorkInfo};
///
/// let work = WorkInfo::builder()
///     .tenant(TenantId::new(7))
///     .priority(Priority::USER_HIGH)
///     .timeout(Duration::from_millis(5))
///     .build();
/// assert_eq!(work.tenant(), TenantId::new(7));
/// assert!(work.deadline().is_some());
/// ```
///
/// Times are [`tokio::time::Instant`]s so that tests can control them with
/// `tokio::time::pause`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkInfo {
    tenant: TenantId,
    priority: Priority,
    create_time: Instant,
    deadline: Option<Instant>,
    bypass: bool,
    requested: u64,
}

impl WorkInfo {
    /// Work for `tenant` at `priority`, created now, with no deadline.
    pub fn new(tenant: TenantId, priority: Priority) -> Self {
        WorkInfo {
            tenant,
            priority,
            create_time: Instant::now(),
            deadline: None,
            bypass: false,
            requested: 1,
        }
    }

    /// A builder starting from the system tenant at [`Priority::NORMAL`].
    pub fn builder() -> WorkInfoBuilder {
        WorkInfoBuilder {
            tenant: TenantId::SYSTEM,
            priority: Priority::NORMAL,
            create_time: None,
            deadline: None,
            bypass: false,
            requested: 1,
        }
    }

    /// The tenant the work is done for.
    pub fn tenant(&self) -> TenantId {
        self.tenant
    }

    /// The work's priority.
    pub fn priority(&self) -> Priority {
        self.priority
    }

    /// When the work was created; among equal priorities, older goes first.
    ///
    /// For a request that fans out into several admissions, pass the
    /// request's start time to every one of them so they order together.
    pub fn create_time(&self) -> Instant {
        self.create_time
    }

    /// The instant after which the work is worthless, if any.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// Whether the work skips admission (it is still counted).
    pub fn is_bypass(&self) -> bool {
        self.bypass
    }

    /// How many units of the granter's resource the work asks for: slots
    /// (1 by default), or an estimate of bytes for a token granter.
    pub fn requested(&self) -> u64 {
        self.requested
    }
}

/// Builds a [`WorkInfo`]; see there.
#[derive(Clone, Debug)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct WorkInfoBuilder {
    tenant: TenantId,
    priority: Priority,
    create_time: Option<Instant>,
    deadline: Option<Instant>,
    bypass: bool,
    requested: u64,
}

impl WorkInfoBuilder {
    /// The tenant the work is done for (default [`TenantId::SYSTEM`]).
    pub fn tenant(mut self, tenant: TenantId) -> Self {
        self.tenant = tenant;
        self
    }

    /// The work's priority (default [`Priority::NORMAL`]).
    pub fn priority(mut self, priority: Priority) -> Self {
        self.priority = priority;
        self
    }

    /// When the work was created (default: when [`build`](Self::build) runs).
    pub fn create_time(mut self, create_time: Instant) -> Self {
        self.create_time = Some(create_time);
        self
    }

    /// An absolute deadline: admission fails once it has passed.
    pub fn deadline(mut self, deadline: Instant) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// A deadline `timeout` after the create time. A timeout too large to
    /// represent means no deadline.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        let start = self.create_time.unwrap_or_else(Instant::now);
        self.create_time = Some(start);
        self.deadline = start.checked_add(timeout);
        self
    }

    /// Admit at once without waiting or asking the granter: for work that
    /// must not queue (for example work that other admitted work waits on).
    /// Bypassed work still takes capacity and is counted as taken without
    /// permission, so slots in use may exceed the total for a while.
    pub fn bypass(mut self, bypass: bool) -> Self {
        self.bypass = bypass;
        self
    }

    /// How many units of the resource the work asks for (default 1; zero
    /// counts as one). A request is granted only when all of them are
    /// available at once, and it holds its place in line meanwhile: a large
    /// request at the head waits for capacity rather than being overtaken.
    pub fn requested(mut self, units: u64) -> Self {
        self.requested = units.max(1);
        self
    }

    /// The finished [`WorkInfo`].
    pub fn build(self) -> WorkInfo {
        WorkInfo {
            tenant: self.tenant,
            priority: self.priority,
            create_time: self.create_time.unwrap_or_else(Instant::now),
            deadline: self.deadline,
            bypass: self.bypass,
            requested: self.requested,
        }
    }
}
