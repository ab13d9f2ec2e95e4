//! Observation records of the GPU admission lifecycle.
//!
//! # Projections, not a second state machine
//!
//! The query service's state is its queue and ledgers; an [`Observation`]
//! is a flat record of one thing that happened to them (a submission, a
//! rejection, a protection, a grant, an envelope failure, a release, a
//! quarantine), stamped with the queue depth at that moment. Records are
//! built under the service's lock, so each one is consistent with the
//! ledger transaction it describes, and delivered to the observer *after*
//! the lock is released, so a slow observer never holds up admission.
//!
//! The observer is called on whichever thread made the change: a tokio
//! worker, or a device worker thread for a release that follows a teardown.
//! It must not block. A panic in it is caught (the `gpu_observer`
//! boundary): the record is dropped, and nothing else changes. With the
//! `config` feature, [`jsonl_observer`] writes one JSON object per line;
//! the authoritative current state remains
//! [`QueryService::ledger_snapshots`](super::service::QueryService::ledger_snapshots).
//!
//! # One vocabulary
//!
//! The core's scheduling decisions and the service's own steps are one
//! crate-private event type (`GpuEvent`): the core returns the events it
//! caused, the service adds its own, and each becomes exactly one record
//! through one projection (`GpuEvent::observation`), so no call site fills
//! a record's fields by hand and a new event cannot be reported without a
//! kind.

use std::fmt;
use std::time::Duration;

use super::backend::DeviceOrdinal;
use super::envelope::Disposition;
use super::ledger::{GrantId, WaiterId};
use super::outcome::GpuAdmitError;

/// What happened. `Display` writes a short, stable snake_case name
/// (`admitted`, `protection_dropped`...).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "config", derive(serde::Serialize))]
#[cfg_attr(feature = "config", serde(rename_all = "snake_case"))]
#[non_exhaustive]
pub enum ObservationKind {
    /// A submission reserved a pending slot and its sequence number.
    Submitted,
    /// A submission was refused without being queued (queue full, closed,
    /// capability, configuration, preflight, deadline already passed).
    Rejected,
    /// A submission resolved and joined the queue.
    Queued,
    /// An overtaken waiter protected a slot and bytes on a device.
    Protected,
    /// A waiter's protection was dropped (device lost, admitted elsewhere,
    /// withdrawn).
    ProtectionDropped,
    /// A waiter was granted a slot and bytes on a device.
    Admitted,
    /// The envelope of a grant could not be built; the grant was released.
    EnvelopeFailed,
    /// A handle was published: its envelope validated.
    Published,
    /// A queued or granted waiter left without a handle (cancel, deadline,
    /// close, no healthy device).
    Removed,
    /// An attempt's report was sealed at its release: the synchronization
    /// fixed its disposition and health, before any resource was destroyed.
    Sealed,
    /// An attempt's resources were torn down and its grant released.
    Released,
    /// A device was quarantined after a proven device-local fault.
    Quarantined,
    /// A ledger was closed (fault of unknown reach, or service close).
    LedgerClosed,
    /// An operator reinstated a quarantined device after its health probe
    /// passed.
    Reinstated,
    /// A device's evictor was asked for bytes (in `grant_bytes`).
    EvictionRequested,
}

// The same snake_case names the `config` feature's serialization writes.
impl fmt::Display for ObservationKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            ObservationKind::Submitted => "submitted",
            ObservationKind::Rejected => "rejected",
            ObservationKind::Queued => "queued",
            ObservationKind::Protected => "protected",
            ObservationKind::ProtectionDropped => "protection_dropped",
            ObservationKind::Admitted => "admitted",
            ObservationKind::EnvelopeFailed => "envelope_failed",
            ObservationKind::Published => "published",
            ObservationKind::Removed => "removed",
            ObservationKind::Sealed => "sealed",
            ObservationKind::Released => "released",
            ObservationKind::Quarantined => "quarantined",
            ObservationKind::LedgerClosed => "ledger_closed",
            ObservationKind::Reinstated => "reinstated",
            ObservationKind::EvictionRequested => "eviction_requested",
        })
    }
}

/// Something the GPU admission path did: a scheduling decision of the core
/// (admitted, removed, protected, protection dropped, quarantined, ledger
/// closed, eviction requested) or a step of the service around it. Each
/// is reported as one [`Observation`]; the core's also wake the waiter
/// they [resolve](Self::resolves).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum GpuEvent {
    /// A submission reserved a pending slot and its sequence number.
    Submitted { waiter: WaiterId },
    /// A submission was refused without being queued.
    Rejected {
        waiter: Option<WaiterId>,
        error: GpuAdmitError,
    },
    /// A submission resolved and joined the queue.
    Queued { waiter: WaiterId },
    /// A waiter was granted a slot and bytes on a device; its grant is
    /// parked until the core's `take_outcome`.
    Admitted {
        waiter: WaiterId,
        device: DeviceOrdinal,
        grant: GrantId,
        grant_bytes: u64,
    },
    /// A waiter left without a handle (no healthy device, close, cancel,
    /// deadline); `released` is the grant it gave back, if it had taken one.
    Removed {
        waiter: WaiterId,
        error: GpuAdmitError,
        released: Option<(DeviceOrdinal, u64)>,
    },
    /// A waiter whose overtake budget is spent protected a slot and bytes
    /// (up to `target_bytes`, `accumulated_bytes` at once) on a device.
    Protected {
        waiter: WaiterId,
        device: DeviceOrdinal,
        target_bytes: u64,
        accumulated_bytes: u64,
        overtakes: u32,
    },
    /// A waiter's protection was dropped (its device closed or was
    /// quarantined, or the waiter was admitted elsewhere or left).
    ProtectionDropped {
        waiter: WaiterId,
        device: DeviceOrdinal,
    },
    /// A grant's envelope could not be built; the grant was released.
    EnvelopeFailed {
        waiter: WaiterId,
        device: DeviceOrdinal,
        grant_bytes: u64,
        error: GpuAdmitError,
    },
    /// A handle was published: its whole envelope validated.
    Published {
        waiter: WaiterId,
        device: DeviceOrdinal,
        grant_bytes: u64,
    },
    /// An attempt's report was sealed, before any resource was destroyed.
    Sealed {
        waiter: WaiterId,
        device: DeviceOrdinal,
        grant_bytes: u64,
        disposition: Disposition,
    },
    /// An attempt's resources were destroyed and its grant released.
    Released {
        waiter: WaiterId,
        device: DeviceOrdinal,
        grant_bytes: u64,
        disposition: Disposition,
    },
    /// A ledger was quarantined after a proven device-local fault.
    Quarantined { device: DeviceOrdinal, code: u32 },
    /// A ledger was closed (fault of unknown reach, or service close).
    LedgerClosed { device: DeviceOrdinal },
    /// An operator reinstated a quarantined device.
    Reinstated { device: DeviceOrdinal },
    /// The oldest runnable waiter is blocked on `device` only by evictable
    /// cache: its registered evictor is asked for exactly these bytes (on
    /// top of what it was asked for already and has not evicted yet).
    EvictionRequested { device: DeviceOrdinal, bytes: u64 },
}

impl GpuEvent {
    /// The waiter whose admit future is waiting to see this event, if any.
    pub(crate) fn resolves(&self) -> Option<WaiterId> {
        match self {
            GpuEvent::Admitted { waiter, .. } | GpuEvent::Removed { waiter, .. } => Some(*waiter),
            _ => None,
        }
    }

    /// The kind of record this event is reported as.
    pub(crate) fn kind(&self) -> ObservationKind {
        match self {
            GpuEvent::Submitted { .. } => ObservationKind::Submitted,
            GpuEvent::Rejected { .. } => ObservationKind::Rejected,
            GpuEvent::Queued { .. } => ObservationKind::Queued,
            GpuEvent::Admitted { .. } => ObservationKind::Admitted,
            GpuEvent::Removed { .. } => ObservationKind::Removed,
            GpuEvent::Protected { .. } => ObservationKind::Protected,
            GpuEvent::ProtectionDropped { .. } => ObservationKind::ProtectionDropped,
            GpuEvent::EnvelopeFailed { .. } => ObservationKind::EnvelopeFailed,
            GpuEvent::Published { .. } => ObservationKind::Published,
            GpuEvent::Sealed { .. } => ObservationKind::Sealed,
            GpuEvent::Released { .. } => ObservationKind::Released,
            GpuEvent::Quarantined { .. } => ObservationKind::Quarantined,
            GpuEvent::LedgerClosed { .. } => ObservationKind::LedgerClosed,
            GpuEvent::Reinstated { .. } => ObservationKind::Reinstated,
            GpuEvent::EvictionRequested { .. } => ObservationKind::EvictionRequested,
        }
    }

    /// The one projection of an event onto a record, `elapsed` after the
    /// service was built; the queue depth is stamped by the caller.
    pub(crate) fn observation(&self, elapsed: Duration) -> Observation {
        let mut r = Observation::new(self.kind(), elapsed);
        match self {
            GpuEvent::Submitted { waiter } | GpuEvent::Queued { waiter } => {
                r.waiter = Some(waiter.get());
            }
            GpuEvent::Rejected { waiter, error } => {
                r.waiter = waiter.map(WaiterId::get);
                r.set_error(error);
            }
            GpuEvent::Admitted {
                waiter,
                device,
                grant_bytes,
                ..
            }
            | GpuEvent::Published {
                waiter,
                device,
                grant_bytes,
            } => {
                r.waiter = Some(waiter.get());
                r.device = Some(device.0);
                r.grant_bytes = Some(*grant_bytes);
            }
            GpuEvent::Removed {
                waiter,
                error,
                released,
            } => {
                r.waiter = Some(waiter.get());
                if let Some((device, bytes)) = released {
                    r.device = Some(device.0);
                    r.grant_bytes = Some(*bytes);
                }
                r.set_error(error);
            }
            GpuEvent::EnvelopeFailed {
                waiter,
                device,
                grant_bytes,
                error,
            } => {
                r.waiter = Some(waiter.get());
                r.device = Some(device.0);
                r.grant_bytes = Some(*grant_bytes);
                r.set_error(error);
            }
            GpuEvent::Protected {
                waiter,
                device,
                target_bytes,
                overtakes,
                ..
            } => {
                r.waiter = Some(waiter.get());
                r.device = Some(device.0);
                r.grant_bytes = Some(*target_bytes);
                r.overtakes = Some(*overtakes);
            }
            GpuEvent::ProtectionDropped { waiter, device } => {
                r.waiter = Some(waiter.get());
                r.device = Some(device.0);
            }
            GpuEvent::Sealed {
                waiter,
                device,
                grant_bytes,
                disposition,
            }
            | GpuEvent::Released {
                waiter,
                device,
                grant_bytes,
                disposition,
            } => {
                r.waiter = Some(waiter.get());
                r.device = Some(device.0);
                r.grant_bytes = Some(*grant_bytes);
                r.detail = Some(format!("{disposition:?}"));
            }
            GpuEvent::Quarantined { device, code } => {
                r.device = Some(device.0);
                r.code = Some(*code);
            }
            GpuEvent::LedgerClosed { device } | GpuEvent::Reinstated { device } => {
                r.device = Some(device.0);
            }
            GpuEvent::EvictionRequested { device, bytes } => {
                r.device = Some(device.0);
                r.grant_bytes = Some(*bytes);
            }
        }
        r
    }
}

/// One record of the admission lifecycle. Fields that do not apply to the
/// kind are `None`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "config", derive(serde::Serialize))]
#[non_exhaustive]
pub struct Observation {
    /// Microseconds since the service was built.
    pub elapsed_us: u64,
    /// What happened.
    pub kind: ObservationKind,
    /// The waiter's sequence number.
    pub waiter: Option<u64>,
    /// The device ordinal.
    pub device: Option<u32>,
    /// The grant's bytes.
    pub grant_bytes: Option<u64>,
    /// Queued plus pending submissions after the event.
    pub queue_depth: usize,
    /// Of those, submissions still resolving (preflights).
    pub pending_preflights: usize,
    /// The error's stable reason ([`GpuAdmitError::reason`](super::GpuAdmitError::reason)).
    pub reason: Option<&'static str>,
    /// The error's policy-neutral outcome, as
    /// [`QueryAdmissionOutcome`](super::QueryAdmissionOutcome) displays it.
    pub outcome: Option<&'static str>,
    /// A fault code (quarantine).
    pub code: Option<u32>,
    /// The waiter's overtake count (protection).
    pub overtakes: Option<u32>,
    /// A human-readable detail (an error's message, a teardown's
    /// disposition).
    pub detail: Option<String>,
}

impl Observation {
    fn new(kind: ObservationKind, elapsed: Duration) -> Self {
        Observation {
            elapsed_us: u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX),
            kind,
            waiter: None,
            device: None,
            grant_bytes: None,
            queue_depth: 0,
            pending_preflights: 0,
            reason: None,
            outcome: None,
            code: None,
            overtakes: None,
            detail: None,
        }
    }

    fn set_error(&mut self, error: &GpuAdmitError) {
        self.reason = Some(error.reason());
        self.outcome = Some(error.outcome().name());
        self.detail = Some(error.to_string());
    }
}

/// An observer writing each [`Observation`] as one line of JSON to
/// `writer`. A write error is reported through `tracing` and the record is
/// dropped: observability must never fail an admission. The writer is
/// behind a lock of its own; give it a buffered or non-blocking sink.
#[cfg(feature = "config")]
pub fn jsonl_observer<W>(writer: W) -> impl Fn(&Observation) + Send + Sync + 'static
where
    W: std::io::Write + Send + 'static,
{
    let writer = crate::sync::Mutex::new(writer);
    move |observation: &Observation| {
        let mut writer = writer.lock();
        let written = serde_json::to_writer(&mut *writer, observation)
            .map_err(std::io::Error::from)
            .and_then(|()| writer.write_all(b"\n"));
        if let Err(error) = written {
            tracing::warn!(target: "admission", %error, "cannot write a GPU admission observation");
        }
    }
}
