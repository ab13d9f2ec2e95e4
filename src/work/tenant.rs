use std::fmt;

use crate::error::ConfigError;

/// The tenant a piece of work is done for.
///
/// Tenants are the unit of fairness: when several tenants wait, the queue
/// serves the one with the least capacity in use relative to its
/// [`TenantWeight`]. A single-tenant service can put all its work under
/// [`TenantId::SYSTEM`], the default.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TenantId(u64);

impl TenantId {
    /// The system tenant: the node's own work, and the default tenant of a
    /// [`WorkInfo`](crate::WorkInfo) built without one.
    pub const SYSTEM: TenantId = TenantId(1);

    /// Callers that name no tenant, or whose tenant is not believed: the
    /// HTTP classifier's default, so that anonymous traffic competes as one
    /// tenant of its own, beside named tenants, and never as the node's own
    /// [`SYSTEM`](Self::SYSTEM) work.
    pub const ANONYMOUS: TenantId = TenantId(0);

    /// A tenant from its numeric id.
    pub const fn new(id: u64) -> Self {
        TenantId(id)
    }

    /// The numeric id.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl Default for TenantId {
    fn default() -> Self {
        TenantId::SYSTEM
    }
}

impl From<u64> for TenantId {
    fn from(id: u64) -> Self {
        TenantId(id)
    }
}

impl fmt::Debug for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TenantId({})", self.0)
    }
}

impl fmt::Display for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// A tenant's share of capacity relative to other waiting tenants.
///
/// Between 1 (the default) and 1,000. Under sustained backlog a tenant of weight 5 holds five slots for every
/// two held by a tenant of weight 2. The bound keeps the fairness arithmetic
/// exact (`used * weight` never overflows) and keeps one tenant from being
/// configured into owning the node.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TenantWeight(u32);

impl TenantWeight {
    /// The smallest and default weight (what [`Default`] gives).
    const MIN: TenantWeight = TenantWeight(1);
    /// The largest weight accepted: a validation rule, which `new`'s error
    /// states.
    const MAX: TenantWeight = TenantWeight(1_000);

    /// A weight, or a [`ConfigError`] naming `tenant_weight` if it lies
    /// outside `1..=1000`.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming `tenant_weight` if it is outside `1..=1000`
    /// (the message states the range).
    ///
    /// # Examples
    ///
    /// ```
    /// use admission::{TenantId, TenantWeight, WorkQueue};
    ///
    /// let queue = WorkQueue::new(8)?;
    /// // Under backlog, tenant 1 gets five slots for every one of tenant 2's.
    /// queue.set_tenant_weight(TenantId::new(1), TenantWeight::new(5)?)?;
    ///
    /// let err = TenantWeight::new(0).unwrap_err();
    /// assert_eq!(err.field(), "tenant_weight");
    /// # Ok::<(), admission::ConfigError>(())
    /// ```
    pub fn new(weight: u32) -> Result<Self, ConfigError> {
        if (Self::MIN.0..=Self::MAX.0).contains(&weight) {
            Ok(TenantWeight(weight))
        } else {
            Err(ConfigError::out_of_range(
                "tenant_weight",
                weight,
                Self::MIN.0,
                Self::MAX.0,
            ))
        }
    }

    /// The weight as an integer.
    pub const fn get(self) -> u32 {
        self.0
    }
}

impl Default for TenantWeight {
    fn default() -> Self {
        TenantWeight::MIN
    }
}

impl fmt::Debug for TenantWeight {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TenantWeight({})", self.0)
    }
}

impl fmt::Display for TenantWeight {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}
