//! Every path that returns a grant to its ledger, in one place: the admit
//! future (its guard, the deadline path of `wait`, and `admit`'s hand-off
//! of a failed build), the unpublished-grant release and the published
//! handle's release callback.
//!
//! # Who releases a grant, and when
//!
//! A grant is committed by the scheduler under the service's lock and
//! returned exactly once, by whichever of these holds it at the time:
//!
//! | the grant is                                   | released by                                               | when, and in which order |
//! |------------------------------------------------|-----------------------------------------------------------|--------------------------|
//! | parked for a waiter that has not taken it      | `AdmissionCore::cancel`, called by the admit future's guard ([`AdmitGuard`], dropped or failing) or by [`wait`] at the deadline | in that transaction, which also reschedules |
//! | taken, its envelope building, future alive     | [`Inner::release_unpublished`], from [`admit`] when the build failed | after the build rolled itself back on the worker; a fault isolated in the same transaction |
//! | taken, its envelope building, future dropped   | the build's duty ([`envelope`](super::envelope)'s `Unreceived`): its callback calls [`Inner::release_unpublished`] | on the worker, after the rollback (of a cancelled build, or of a `Built` sent and never received) |
//! | in a published handle                          | the envelope's release callback, armed by [`publish`], calling [`Inner::finish_attempt`] | on the worker, after the seal and the destruction, whether the handle was released or dropped |
//!
//! Each path is one transaction: the fault's isolation (quarantine or
//! close), then the ledger's release, then the scheduling pass, and the
//! queued work it admits is woken after the lock is released. No `Drop`
//! waits for any of it: drops only queue work on the device worker.

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::{Instant, Sleep};

use super::backend::{BackendError, DeviceOrdinal, FaultIsolation};
use super::envelope::{
    AdmissionEnvelope, AttemptBounds, BuildError, DeviceFinding, EnvelopeSpec, TeardownCallback,
    TeardownReport,
};
use super::handle::{AttemptReport, QueryHandle, Sealing};
use super::ledger::{MemoryGrant, WaiterId};
use super::observe::GpuEvent;
use super::outcome::GpuAdmitError;
use super::placement::compatible_devices;
use super::proof::CapabilityProof;
use super::scheduler::{AdmissionCore, Withdrawn};
use super::service::{AdmissionTicket, Inner, PreflightHook, PreflightRequest};
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
    match report.finding {
        DeviceFinding::Faulted { code, .. } => code,
        _ => 0,
    }
}

// ---------------------------------------------------------------------------
// The admit future: its guard and the deadline path withdraw a parked grant
// (`AdmissionCore::cancel`); a failed build hands its grant to
// `release_unpublished` above.

/// What the admit future holds, and what its guard undoes on drop.
enum Stage {
    /// Pending, queued, or granted but not yet taken: withdraw it.
    Waiting,
    /// Grant taken, envelope building: the build answers for the grant
    /// (see `AdmissionEnvelope::build_with`), nothing is left to the guard.
    Building,
    /// Nothing left to undo.
    Done,
}

struct AdmitGuard {
    inner: StdArc<Inner>,
    waiter: WaiterId,
    stage: Stage,
}

impl AdmitGuard {
    /// Ends the submission with `error`: withdraws whatever the core holds.
    fn fail(&mut self, error: GpuAdmitError, rejected: bool) -> GpuAdmitError {
        let waiter = self.waiter;
        self.stage = Stage::Done;
        self.inner.transact(|core, recorder| {
            let withdrawn = core.cancel(waiter);
            if !rejected && withdrawn.is_some() {
                recorder.record(&GpuEvent::Removed {
                    waiter,
                    error: error.clone(),
                    released: None,
                });
            }
        });
        if rejected {
            self.inner.observe_rejection(Some(waiter), &error);
        }
        error
    }
}

impl Drop for AdmitGuard {
    fn drop(&mut self) {
        match std::mem::replace(&mut self.stage, Stage::Done) {
            Stage::Done => {}
            Stage::Waiting => {
                let waiter = self.waiter;
                self.inner.transact(|core, recorder| {
                    if let Some(withdrawn) = core.cancel(waiter) {
                        if !matches!(withdrawn, Withdrawn::Failed) {
                            recorder.record(&GpuEvent::Removed {
                                waiter,
                                error: GpuAdmitError::Cancelled,
                                released: None,
                            });
                        }
                    }
                });
                self.inner.state.lock().wakers.remove(&waiter.get());
            }
            // The build future answers for the grant: its job, or the
            // outcome it sent that nobody received, rolls the envelope back
            // on the worker and only then returns the grant.
            Stage::Building => {}
        }
    }
}

pub(crate) async fn admit(ticket: AdmissionTicket) -> Result<QueryHandle, GpuAdmitError> {
    let AdmissionTicket {
        inner,
        proof,
        request,
        deadline,
    } = ticket;
    let now = Instant::now();
    let max_wait = inner.state.lock().core.bounds().max_wait();
    let queue_deadline = now.checked_add(max_wait);
    let deadline = match (deadline, queue_deadline) {
        (Some(own), Some(queue)) => Some(own.min(queue)),
        (own, queue) => own.or(queue),
    };
    if deadline.is_some_and(|d| d <= now) {
        let error = GpuAdmitError::DeadlinePassed;
        inner.observe_rejection(None, &error);
        return Err(error);
    }

    // 1. A pending slot and a FIFO sequence, before anything else.
    let reserved = inner.transact(|core, recorder| {
        let reserved = core.reserve(now);
        if let Ok(waiter) = &reserved {
            recorder.record(&GpuEvent::Submitted { waiter: *waiter });
        }
        reserved
    });
    let waiter = match reserved {
        Ok(waiter) => waiter,
        Err(error) => {
            inner.observe_rejection(None, &error);
            return Err(error);
        }
    };
    let mut guard = AdmitGuard {
        inner: inner.clone(),
        waiter,
        stage: Stage::Waiting,
    };

    // 2. Resolution outside the lock: capabilities, the floor, preflights.
    let candidates = match compatible_devices(&request, inner.devices.profiles()) {
        Ok(candidates) => candidates,
        Err(error) => return Err(guard.fail(error, true)),
    };
    if let Some(preflight) = &inner.preflight {
        for device in &candidates {
            let request = PreflightRequest {
                waiter,
                device: *device,
                proof: proof.clone(),
            };
            match run_preflight(&inner, preflight, &request, deadline).await {
                Preflight::Passed => {}
                Preflight::Failed(message) => {
                    let error = GpuAdmitError::PreflightFailed {
                        device: Some(*device),
                        message,
                    };
                    return Err(guard.fail(error, true));
                }
                Preflight::Expired => {
                    let error = GpuAdmitError::DeadlineExceeded {
                        waited: Instant::now().saturating_duration_since(now),
                    };
                    return Err(guard.fail(error, false));
                }
                Preflight::NoTimer(error) => return Err(guard.fail(error, true)),
            }
        }
    }

    // 3. Into the queue; the scheduling pass may admit it at once.
    let resolved = inner.transact(|core, recorder| {
        let resolved = core.resolve(waiter, request, candidates);
        if resolved.is_ok() {
            recorder.record(&GpuEvent::Queued { waiter });
        }
        resolved
    });
    if let Err(error) = resolved {
        return Err(guard.fail(error, true));
    }

    // 4. Wait for the scheduler's outcome or the deadline.
    let grant = match wait(&inner, waiter, deadline, now).await {
        Ok(grant) => grant,
        Err(error) => {
            guard.stage = Stage::Done;
            return Err(error);
        }
    };
    let waited = Instant::now().saturating_duration_since(now);

    // 5. The envelope, outside the lock. From here the grant sits in a
    // slot shared with the build's duty: whichever of the two ends the
    // build (this future receiving its outcome, or the rollback of an
    // outcome nobody received) takes it, and only once.
    let device = grant.device();
    let grant_bytes = grant.bytes();
    let slot = StdArc::new(Mutex::new(Some(grant)));
    let (Some(profile), Some(worker)) = (inner.devices.profile(device), inner.workers.get(&device))
    else {
        // The core only grants on installed devices; refuse rather than
        // build on an unknown one.
        let error = GpuAdmitError::EnvelopeInvalid {
            message: format!("{device} has no profile or worker"),
        };
        guard.stage = Stage::Done;
        if let Some(grant) = slot.lock().take() {
            inner.release_unpublished(grant, waiter, None, Some(&error));
        }
        return Err(error);
    };
    let spec = EnvelopeSpec {
        device,
        grant_bytes,
        bounds: AttemptBounds {
            max_streams: profile.streams_per_attempt(),
            max_workers: profile.workers_per_attempt(),
            max_lanes: profile.lanes_per_attempt(),
            source_work_allowance: profile.source_work_allowance(),
        },
        report_sink: None,
    };
    let on_unreceived: TeardownCallback = {
        let (inner, slot) = (inner.clone(), slot.clone());
        Box::new(move |report: &TeardownReport| {
            let grant = slot.lock().take();
            if let Some(grant) = grant {
                let isolation = report
                    .fault_isolation()
                    .map(|isolation| (isolation, super::release::fault_code(report)));
                inner.release_unpublished(grant, waiter, isolation, None);
            }
        })
    };
    guard.stage = Stage::Building;
    let built = AdmissionEnvelope::build_with(
        inner.backend.clone(),
        worker.clone(),
        spec,
        Some(on_unreceived),
    )
    .await;
    guard.stage = Stage::Done;
    let grant = slot.lock().take();
    match (built, grant) {
        (Ok(envelope), Some(grant)) => {
            let handle =
                super::release::publish(inner.clone(), envelope, grant, waiter, proof, waited);
            inner.observe_published(waiter, device, grant_bytes);
            Ok(handle)
        }
        (Err(build_error), Some(grant)) => {
            let (error, isolation) = build_failure(device, &build_error);
            inner.release_unpublished(grant, waiter, isolation, Some(&error));
            Err(error)
        }
        // The duty answered already: the build job was dropped unrun (the
        // worker is gone) and the grant went back as an abandoned clean-up.
        (Err(build_error), None) => Err(build_failure(device, &build_error).0),
        // A received outcome disarms the duty before anything can take the
        // grant; refuse rather than publish a handle without one.
        (Ok(envelope), None) => {
            drop(envelope);
            Err(GpuAdmitError::EnvelopeInvalid {
                message: format!("the grant of {waiter} on {device} was already returned"),
            })
        }
    }
}

/// The admission error of a failed build, and the fault to isolate.
fn build_failure(
    device: DeviceOrdinal,
    error: &BuildError,
) -> (GpuAdmitError, Option<(FaultIsolation, u32)>) {
    let code = match error {
        BuildError::Step {
            error, rollback, ..
        } => std::iter::once(error)
            .chain(rollback.errors())
            .find_map(|e| match e {
                BackendError::Fault { code, .. } => Some(*code),
                _ => None,
            })
            .unwrap_or(0),
        _ => 0,
    };
    let isolation = error.fault().map(|i| (i, code));
    let admit_error = match error {
        BuildError::Step { step, error, .. } => GpuAdmitError::EnvelopeStepFailed {
            step: step.op(),
            error: error.clone(),
        },
        BuildError::WorkerGone(_) => GpuAdmitError::WorkerGone { device },
        // No driver code: the build job itself panicked part-way.
        BuildError::Interrupted { .. } => GpuAdmitError::DeviceFault { device, code: 0 },
        BuildError::InvalidBounds { .. } | BuildError::WrongWorker { .. } => {
            GpuAdmitError::EnvelopeInvalid {
                message: error.to_string(),
            }
        }
    };
    (admit_error, isolation)
}

/// How one candidate's preflight ended.
enum Preflight {
    Passed,
    /// The hook said no, or panicked (when called, polled or dropped).
    Failed(String),
    /// The deadline came first.
    Expired,
    /// It had to wait for a deadline, and there is no timer to keep it.
    NoTimer(GpuAdmitError),
}

/// Runs the preflight hook for one candidate behind the `gpu_preflight`
/// boundary: the call that makes the future, every poll of it, and its
/// drop. A panic anywhere is that candidate's failed preflight, so the
/// caller withdraws the reservation like any other rejection.
async fn run_preflight(
    inner: &Inner,
    preflight: &PreflightHook,
    request: &PreflightRequest,
    deadline: Option<Instant>,
) -> Preflight {
    let boundary = &inner.boundaries.preflight;
    let panicked = || {
        Preflight::Failed(format!(
            "the preflight panicked ({} in a row; see the gpu_preflight health)",
            boundary.consecutive_panics()
        ))
    };
    let Some(mut check) = boundary.call(|| preflight(request)) else {
        return panicked();
    };
    let mut timer = None;
    let outcome = poll_fn(|cx| {
        match boundary.call(|| check.as_mut().poll(cx)) {
            Some(Poll::Ready(Ok(()))) => return Poll::Ready(Preflight::Passed),
            Some(Poll::Ready(Err(message))) => return Poll::Ready(Preflight::Failed(message)),
            Some(Poll::Pending) => {}
            None => return Poll::Ready(panicked()),
        }
        match poll_deadline(&mut timer, deadline, cx) {
            Ok(false) => Poll::Pending,
            Ok(true) => Poll::Ready(Preflight::Expired),
            Err(error) => Poll::Ready(Preflight::NoTimer(error)),
        }
    })
    .await;
    // The future is user code down to its destructor.
    if boundary.call(move || drop(check)).is_none() {
        return panicked();
    }
    outcome
}

/// Polls the timer of `deadline`, creating it on the first call: whether
/// the deadline has passed (`false` without a deadline). The timer is made
/// only when a wait is really needed, so admissions that never wait work on
/// any runtime; one that must wait on a runtime without a time driver gets
/// [`GpuAdmitError::TimerUnavailable`] instead of tokio's panic.
fn poll_deadline(
    timer: &mut Option<Pin<Box<Sleep>>>,
    deadline: Option<Instant>,
    cx: &mut std::task::Context<'_>,
) -> Result<bool, GpuAdmitError> {
    let Some(deadline) = deadline else {
        return Ok(false);
    };
    let timer = match timer {
        Some(timer) => timer,
        None => timer.insert(start_timer(deadline)?),
    };
    Ok(timer.as_mut().poll(cx).is_ready())
}

/// A tokio timer for `deadline`, or the typed error for a task that is not
/// on a runtime with timers (see `crate::timer`).
fn start_timer(deadline: Instant) -> Result<Pin<Box<Sleep>>, GpuAdmitError> {
    crate::timer::sleep_until(deadline)
        .map(Box::pin)
        .ok_or(GpuAdmitError::TimerUnavailable)
}

/// Waits for the waiter's outcome; at the deadline (or when a deadline
/// cannot be kept), withdraws it unless the outcome arrived first (checked
/// in the same transaction).
pub(crate) async fn wait(
    inner: &StdArc<Inner>,
    waiter: WaiterId,
    deadline: Option<Instant>,
    submitted: Instant,
) -> Result<MemoryGrant, GpuAdmitError> {
    let mut timer = None;
    poll_fn(|cx| {
        {
            let mut state = inner.state.lock();
            if let Some(outcome) = state.core.take_outcome(waiter) {
                state.wakers.remove(&waiter.get());
                return Poll::Ready(outcome);
            }
            state.wakers.insert(waiter.get(), cx.waker().clone());
        }
        let error = match poll_deadline(&mut timer, deadline, cx) {
            Ok(false) => return Poll::Pending,
            Ok(true) => GpuAdmitError::DeadlineExceeded {
                waited: Instant::now().saturating_duration_since(submitted),
            },
            Err(error) => error,
        };
        let outcome = inner.transact(|core, recorder| match core.take_outcome(waiter) {
            Some(outcome) => outcome,
            None => {
                core.cancel(waiter);
                recorder.record(&GpuEvent::Removed {
                    waiter,
                    error: error.clone(),
                    released: None,
                });
                Err(error)
            }
        });
        inner.state.lock().wakers.remove(&waiter.get());
        Poll::Ready(outcome)
    })
    .await
}
