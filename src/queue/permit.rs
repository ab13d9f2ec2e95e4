//! The permit that holds admitted capacity until the work completes.

use std::fmt;

use super::state::Charge;
use super::Shared;
use crate::grant::{Granter, SlotGranter};
use crate::sync::Arc;
use crate::work::TenantId;

/// Proof of admission: holds the slots it was granted (one, unless the
/// work asked for more with [`WorkInfoBuilder::requested`](crate::work::WorkInfoBuilder::requested))
/// until dropped.
///
/// Dropping the permit, or calling [`done`](Self::done), returns them; the
/// first waiter in order gets them at once. Because the return happens in
/// `Drop`, a handler that panics or is cancelled while holding the permit
/// still gives its slot back.
#[must_use = "dropping the permit at once returns the slot: hold it while the work runs"]
pub struct SlotPermit<G: Granter = SlotGranter> {
    shared: Arc<Shared<G>>,
    tenant: TenantId,
    charge: Charge,
}

impl<G: Granter> SlotPermit<G> {
    pub(super) fn new(shared: Arc<Shared<G>>, tenant: TenantId, charge: Charge) -> Self {
        SlotPermit {
            shared,
            tenant,
            charge,
        }
    }

    /// The metric keys of the queue this permit's slot belongs to.
    pub(super) fn keys(&self) -> &crate::export::QueueKeys {
        &self.shared.keys
    }

    /// The tenant the slot is charged to.
    pub fn tenant(&self) -> TenantId {
        self.tenant
    }

    /// Declares the work complete and returns the slot; the same as dropping
    /// the permit, spelled out where that reads better.
    pub fn done(self) {}
}

impl<G: Granter> Drop for SlotPermit<G> {
    fn drop(&mut self) {
        self.shared.release(self.tenant, self.charge);
    }
}

impl<G: Granter> fmt::Debug for SlotPermit<G> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlotPermit")
            .field("tenant", &self.tenant)
            .finish_non_exhaustive()
    }
}
