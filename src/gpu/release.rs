//! Every path that returns a grant to its ledger, in one place.
//!
//! # Who releases a grant, and when
//!
//! A grant is committed by the scheduler under the service's lock and
//! returned exactly once, by whichever of these holds it at the time:
//!
//! | the grant is                                   | released by                                               | when, and in which order |
//! |------------------------------------------------|-----------------------------------------------------------|--------------------------|
//! | parked for a waiter that has not taken it      | `AdmissionCore::cancel`, called by the admit future's guard (`AdmitGuard`, dropped or failing) or by `wait` at the deadline | in that transaction, which also reschedules |
//! | taken, its envelope building, future alive     | [`Inner::release_unpublished`], from `admit` when the build failed | after the build rolled itself back on the worker; a fault isolated in the same transaction |
//! | taken, its envelope building, future dropped   | the build's duty ([`envelope`](super::envelope)'s `Unreceived`): its callback calls [`Inner::release_unpublished`] | on the worker, after the rollback (of a cancelled build, or of a `Built` sent and never received) |
//! | in a published handle                          | the envelope's release callback, armed by [`publish`], calling [`Inner::finish_attempt`] | on the worker, after the seal and the destruction, whether the handle was released or dropped |
//!
//! Each path is one transaction: the fault's isolation (quarantine or
//! close), then the ledger's release, then the scheduling pass, and the
//! queued work it admits is woken after the lock is released. No `Drop`
//! waits for any of it: drops only queue work on the device worker.

use std::time::Duration;

use tokio::sync::oneshot;

use super::backend::FaultIsolation;
use super::envelope::{AdmissionEnvelope, DeviceHealth, TeardownReport};
use super::handle::{AttemptReport, QueryHandle, Sealing};
use super::ledger::{MemoryGrant, WaiterId};
use super::observe::GpuEvent;
use super::outcome::GpuAdmitError;
use super::proof::CapabilityProof;
use super::scheduler::AdmissionCore;
use super::service::Inner;
use crate::sync::{Mutex, StdArc};

/// Publishes a handle over a validated envelope: binds the proof to its
/// device and grant, and moves the grant into the envelope's release
/// callback, beside the seal callback.
pub(crate) fn publish(
    inner: StdArc<Inner>,
    envelope: AdmissionEnvelope,
    grant: MemoryGrant,
    waiter: WaiterId,
    proof: Option<CapabilityProof>,
    waited: Duration,
) -> QueryHandle {
    // The admitted proof names its device and grant from here on.
    let proof = proof.map(|p| p.bound_to(grant.device(), grant.id()));
    let (tx, rx) = oneshot::channel();
    let sealing = Sealing {
        waiter,
        device: grant.device(),
        grant: grant.id(),
        grant_bytes: grant.bytes(),
        required_floor: grant.required_floor(),
        plan: proof.as_ref().map(CapabilityProof::fingerprint),
        waited,
    };
    let published_at = std::time::Instant::now();
    let handle = QueryHandle::new_published(envelope, rx, proof, &sealing, published_at);
    let sealed = StdArc::new(Mutex::new(None));
    let (seal_inner, seal_slot) = (inner.clone(), sealed.clone());
    handle.envelope().set_callbacks(
        move |before_destruction| {
            let report = sealing.seal(published_at.elapsed(), before_destruction);
            seal_inner.observe_sealed(&report);
            *seal_slot.lock() = Some(report);
        },
        move |teardown| {
            // Sealed already: `Callbacks::run` seals first when the
            // teardown never reached its synchronization.
            let sealed = sealed.lock().take();
            let report = inner.finish_attempt(grant, sealed, teardown);
            // Nobody awaits the report of a dropped handle.
            let _ = tx.send(report);
        },
    );
    handle
}

impl Inner {
    /// Applies a fault's isolation: quarantine the device, or close every
    /// ledger when its reach is unknown.
    fn isolate(core: &mut AdmissionCore, isolation: FaultIsolation, code: u32) -> Vec<GpuEvent> {
        match isolation {
            FaultIsolation::Device(device) => core.quarantine(device, code),
            FaultIsolation::Unknown => core.close_ledgers(),
        }
    }

    /// The attempt's report is sealed: its disposition and health are
    /// fixed, nothing is destroyed yet.
    pub(crate) fn observe_sealed(&self, report: &AttemptReport) {
        self.observe_outside_transaction(&GpuEvent::Sealed {
            waiter: report.waiter,
            device: report.device,
            grant_bytes: report.grant_bytes,
            disposition: report.disposition,
        });
    }

    /// The end of an attempt, on the device worker after its report was
    /// sealed and its resources destroyed: isolate a fault, then release
    /// the grant (queued work is woken after that transaction commits).
    /// `sealed` is `None` only if the seal callback itself was lost.
    pub(crate) fn finish_attempt(
        &self,
        grant: MemoryGrant,
        sealed: Option<AttemptReport>,
        teardown: &TeardownReport,
    ) -> AttemptReport {
        let mut report = sealed.unwrap_or_else(|| {
            tracing::error!(target: "admission", device = %teardown.device, "a GPU attempt report was not sealed before destruction");
            AttemptReport::unsealed(&grant, teardown)
        });
        // The destruction's own record; the sealed disposition and health
        // stay what the synchronization showed.
        report.teardown = teardown.clone();
        let waiter = report.waiter;
        let released = self.transact(|core, recorder| {
            // Recorded here rather than returned, so that the records read
            // in transaction order: the quarantine, then the release.
            if let Some(isolation) = teardown.fault_isolation() {
                for event in Self::isolate(core, isolation, fault_code(teardown)) {
                    recorder.record(&event);
                }
            }
            let released = core.release(grant);
            recorder.record(&GpuEvent::Released {
                waiter,
                device: teardown.device,
                grant_bytes: teardown.grant_bytes,
                disposition: teardown.disposition,
            });
            if let Err(foreign) = &released {
                tracing::error!(target: "admission", %foreign, "cannot release a GPU grant");
            }
            released.is_ok()
        });
        report.ledger_released = released;
        report
    }

    /// Releases a grant whose envelope was never published: rolled back
    /// already (`fault` from the build), or about to be (a cancelled build).
    pub(crate) fn release_unpublished(
        &self,
        grant: MemoryGrant,
        waiter: WaiterId,
        isolation: Option<(FaultIsolation, u32)>,
        error: Option<&GpuAdmitError>,
    ) {
        self.transact(|core, recorder| {
            if let Some((isolation, code)) = isolation {
                for event in Self::isolate(core, isolation, code) {
                    recorder.record(&event);
                }
            }
            let device = grant.device();
            let bytes = grant.bytes();
            if let Err(foreign) = core.release(grant) {
                tracing::error!(target: "admission", %foreign, "cannot release a GPU grant");
            }
            recorder.record(&match error {
                Some(error) => GpuEvent::EnvelopeFailed {
                    waiter,
                    device,
                    grant_bytes: bytes,
                    error: error.clone(),
                },
                None => GpuEvent::Removed {
                    waiter,
                    error: GpuAdmitError::Cancelled,
                    released: Some((device, bytes)),
                },
            });
        });
    }
}

/// The driver code of a teardown's fault, for the quarantine record.
pub(crate) fn fault_code(report: &TeardownReport) -> u32 {
    match report.health {
        DeviceHealth::Faulted { code, .. } => code,
        _ => 0,
    }
}
