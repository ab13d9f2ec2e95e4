//! The synchronous core of the GPU query service: the one bounded queue, the
//! per-device ledgers, and every scheduling decision over them.
//!
//! # Why a plain struct
//!
//! `AdmissionCore` holds no lock, spawns nothing, calls no backend and never
//! awaits. The [`QueryService`](super::service::QueryService) keeps it behind
//! its one mutex, so each `&mut self` call is one transaction over the queue
//! and all the ledgers together: a decision and its commit cannot be split by
//! another thread, and a grant released by one thread is visible to the next
//! scheduling pass of any other. Keeping the async glue (preflights, timers,
//! envelopes, wakers) outside is what lets the loom models and the property
//! tests drive exactly the code the service runs.
//!
//! # Life of a waiter
//!
//! ```text
//! reserve ──▶ pending ──resolve──▶ queued ──schedule──▶ granted ──take_outcome──▶ caller
//!    │           │                    │                    │
//!    └─ QueueFull└─ cancel            └─ cancel/close/     └─ cancel releases
//!       Closed                           no healthy device     the grant
//! ```
//!
//! * `reserve` takes a FIFO sequence number and a
//!   pending slot before anything device-specific is known: the bound
//!   `max_pending` counts pending and queued requests together, so a burst
//!   of slow preflights cannot overflow it.
//! * **Pending submissions are an ordering barrier**: no waiter younger than
//!   the oldest pending submission is admitted, so a slow preflight is never
//!   bypassed by younger work.
//! * `schedule` scans the queue in sequence
//!   order and admits every waiter that some compatible ledger can take now,
//!   on the device `placement::rank_devices` ranks first. A waiter blocked on all its
//!   devices is skipped, so it does not idle another device that can run
//!   younger work.
//! * A granted waiter's grant is parked until its future takes it; a future
//!   dropped in between has the grant released by
//!   `cancel`, so nothing is lost.
//!
//! # Overtaking and protection
//!
//! Each time a younger waiter is admitted on a device that an older, blocked
//! waiter could also use, the older waiter's overtake count rises. Once it
//! reaches the queue's `overtake_budget` (at once for a budget of 0, before
//! any younger admission on such a device), the older waiter
//! protects one future slot and released bytes up
//! to its floor on one compatible healthy ledger that holds no other
//! protection: the one with the fewest running attempts, then the most
//! unclaimed bytes, then the lowest ordinal, so the protection completes
//! soonest. Its own commit consumes the protection in the same transaction;
//! when it is admitted on another device instead, the protection is dropped.
//! When the protected ledger is quarantined or closed, the ledger drops the
//! protection and the core retargets it to another compatible healthy
//! ledger. Protection is not priority: it only stops younger work from
//! passing the older waiter on the protected device (the scheduler ranks a
//! younger waiter only among its other devices), so a budget of 0 on one
//! device is strict FIFO; other devices keep running younger work.
//!
//! A waiter whose every compatible device is quarantined or closed leaves
//! the queue with [`GpuAdmitError::NoHealthyDevice`].

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use super::backend::DeviceOrdinal;
use super::ledger::{
    Decision, DeviceLedger, ForeignGrant, GrantRequest, LaterReason, LedgerError, LedgerSnapshot,
    LedgerState, MemoryGrant, ReleaseOutcome, WaiterId,
};
use super::observe::GpuEvent;
use super::outcome::GpuAdmitError;
use crate::health::ComponentHealth;

/// A change to a device's resident cache, as the ledger accounts it: the
/// cache domain's bytes sit beside grants in the same arithmetic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheChange {
    /// Newly resident, evictable bytes (within the cache cap and the bytes
    /// nobody has claimed).
    Charge(u64),
    /// Evictable bytes dropped from the device.
    Evict(u64),
    /// Evictable bytes now in use by running work.
    Pin(u64),
    /// Pinned bytes no longer in use, evictable again.
    Unpin(u64),
}
use super::placement::{rank_devices, DeviceLoad};
use super::profile::{DeviceSet, QueueBounds};

/// Where a withdrawn request was when [`AdmissionCore::cancel`] removed it.
#[derive(Debug, PartialEq, Eq)]
#[non_exhaustive]
pub(crate) enum Withdrawn {
    /// Reserved, its resolution (capabilities, preflights) not finished.
    Pending,
    /// Queued; the device its protection was dropped from, if it held one.
    Queued {
        /// The device whose protection was returned.
        unprotected: Option<DeviceOrdinal>,
    },
    /// Granted but not yet taken: the grant went back to its ledger.
    Granted(ReleaseOutcome),
    /// Already failed; the failure was discarded.
    Failed,
}

/// One queued waiter as
/// [`QueryService::admission_snapshot`](super::service::QueryService::admission_snapshot)
/// shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct WaiterSnapshot {
    /// The waiter (its FIFO sequence number).
    pub waiter: WaiterId,
    /// How long it has been waiting since it reserved its slot.
    pub age: Duration,
    /// Whether it is still pending resolution (preflight) rather than
    /// queued.
    pub pending: bool,
    /// How often younger work was admitted past it.
    pub overtakes: u32,
    /// The device where it holds a protection.
    pub protected_on: Option<DeviceOrdinal>,
    /// Its compatible devices (empty while pending).
    pub candidates: Vec<DeviceOrdinal>,
    /// Its required phase floor (before the attempt floor).
    pub phase_floor: u64,
}

/// One device as
/// [`QueryService::admission_snapshot`](super::service::QueryService::admission_snapshot)
/// summarizes it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceSummary {
    /// The device.
    pub device: DeviceOrdinal,
    /// Whether the device's ledger admits.
    pub state: LedgerState,
    /// Attempts running.
    pub active_attempts: u32,
    /// The active-attempt limit.
    pub max_active_attempts: u32,
    /// Bytes committed to running attempts.
    pub live_grants_bytes: u64,
    /// Bytes held for a protected waiter.
    pub protected_bytes: u64,
    /// The protected waiter, if any.
    pub protected_for: Option<WaiterId>,
    /// Jobs queued on the device's worker thread.
    pub worker_depth: u64,
}

/// A point-in-time view of the queue and devices. See
/// [`QueryService::admission_snapshot`](super::service::QueryService::admission_snapshot).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct AdmissionSnapshot {
    /// Waiters queued (resolved, waiting for a device).
    pub queued: usize,
    /// Submissions reserved and still resolving (preflights).
    pub pending_preflights: usize,
    /// Granted waiters whose futures have not taken the grant yet.
    pub granted_unobserved: usize,
    /// The bound on `queued + pending_preflights`.
    pub max_pending: usize,
    /// Whether the service is closed.
    pub closed: bool,
    /// Every pending and queued waiter, oldest first.
    pub waiters: Vec<WaiterSnapshot>,
    /// Every device, in ordinal order.
    pub devices: Vec<DeviceSummary>,
    /// The health of each component that calls user code (see the GPU
    /// module's failure model), filled in by
    /// [`QueryService::admission_snapshot`](super::service::QueryService::admission_snapshot);
    /// empty from `AdmissionCore::snapshot`, which calls none.
    pub health: Vec<ComponentHealth>,
}

#[derive(Debug)]
struct Waiter {
    request: GrantRequest,
    candidates: Vec<DeviceOrdinal>,
    submitted_at: Instant,
    overtakes: u32,
    protected_on: Option<DeviceOrdinal>,
}

#[derive(Debug)]
enum Outcome {
    Granted(MemoryGrant),
    Failed(GpuAdmitError),
}

/// The queue, the ledgers and the scheduler, as one plain value. See the
/// [module documentation](self).
#[derive(Debug)]
pub(crate) struct AdmissionCore {
    ledgers: Vec<DeviceLedger>,
    bounds: QueueBounds,
    next_seq: u64,
    pending: BTreeMap<u64, Instant>,
    queued: BTreeMap<u64, Waiter>,
    outcomes: BTreeMap<u64, Outcome>,
    closed: bool,
    /// Streams each device's envelopes hold now, as the service last read
    /// them from the device workers (`None` until read): the live input to
    /// ranking by stream availability.
    live_streams: Vec<Option<u64>>,
    /// Per device: whether a cache owner registered an evictor, and the
    /// bytes it was asked for and has not evicted yet.
    evictors: Vec<Option<u64>>,
}

impl AdmissionCore {
    /// One empty ledger per installed device and an empty queue.
    pub(crate) fn new(devices: &DeviceSet, bounds: QueueBounds) -> Self {
        AdmissionCore {
            ledgers: devices
                .profiles()
                .map(|p| DeviceLedger::new(p.clone()))
                .collect(),
            bounds,
            next_seq: 1,
            pending: BTreeMap::new(),
            queued: BTreeMap::new(),
            outcomes: BTreeMap::new(),
            closed: false,
            live_streams: vec![None; devices.len()],
            evictors: vec![None; devices.len()],
        }
    }

    /// The queue bounds.
    pub(crate) fn bounds(&self) -> QueueBounds {
        self.bounds
    }

    /// The ledger of `device`.
    pub(crate) fn ledger(&self, device: DeviceOrdinal) -> Option<&DeviceLedger> {
        self.index(device).and_then(|i| self.ledgers.get(i))
    }

    /// A snapshot of every ledger, in ordinal order.
    pub(crate) fn ledger_snapshots(&self) -> Vec<LedgerSnapshot> {
        self.ledgers.iter().map(DeviceLedger::snapshot).collect()
    }

    /// Queued plus pending submissions: what `max_pending` bounds.
    pub(crate) fn depth(&self) -> usize {
        self.pending.len().saturating_add(self.queued.len())
    }

    /// Submissions still resolving.
    pub(crate) fn pending_preflights(&self) -> usize {
        self.pending.len()
    }

    /// Reserves a pending slot and the next FIFO sequence number. Refused
    /// at once when the service is closed or `max_pending` submissions are
    /// already pending or queued.
    pub(crate) fn reserve(&mut self, now: Instant) -> Result<WaiterId, GpuAdmitError> {
        if self.closed {
            return Err(GpuAdmitError::Closed);
        }
        if self.depth() >= self.bounds.max_pending() {
            return Err(GpuAdmitError::QueueFull {
                max_pending: self.bounds.max_pending(),
            });
        }
        let seq = self.next_seq;
        // 2^64 submissions cannot happen in one process; refusing is still
        // better than reusing a sequence number.
        self.next_seq = seq.checked_add(1).ok_or(GpuAdmitError::QueueFull {
            max_pending: self.bounds.max_pending(),
        })?;
        self.pending.insert(seq, now);
        Ok(WaiterId::new(seq))
    }

    /// Moves a pending submission into the queue with its request and the
    /// compatible devices that passed preflight. The request is bound to the
    /// waiter ([`GrantRequest::for_waiter`]) here. Fails (and forgets the
    /// submission) when it was withdrawn, the service closed meanwhile, or
    /// none of `candidates` is healthy.
    pub(crate) fn resolve(
        &mut self,
        waiter: WaiterId,
        request: GrantRequest,
        candidates: Vec<DeviceOrdinal>,
    ) -> Result<(), GpuAdmitError> {
        let Some(submitted_at) = self.pending.remove(&waiter.get()) else {
            return Err(if self.closed {
                GpuAdmitError::Closed
            } else {
                GpuAdmitError::Cancelled
            });
        };
        if self.closed {
            return Err(GpuAdmitError::Closed);
        }
        let healthy = candidates.iter().any(|d| {
            self.ledger(*d)
                .is_some_and(|l| l.state() == LedgerState::Admitting)
        });
        if !healthy {
            return Err(GpuAdmitError::NoHealthyDevice {
                devices: candidates,
            });
        }
        self.queued.insert(
            waiter.get(),
            Waiter {
                request: request.for_waiter(waiter),
                candidates,
                submitted_at,
                overtakes: 0,
                protected_on: None,
            },
        );
        Ok(())
    }

    /// Takes the outcome of a waiter once the scheduler has granted or
    /// failed it; `None` while it is pending or queued.
    pub(crate) fn take_outcome(
        &mut self,
        waiter: WaiterId,
    ) -> Option<Result<MemoryGrant, GpuAdmitError>> {
        self.outcomes.remove(&waiter.get()).map(|o| match o {
            Outcome::Granted(grant) => Ok(grant),
            Outcome::Failed(error) => Err(error),
        })
    }

    /// Withdraws a waiter wherever it is (pending, queued, granted but not
    /// taken, failed): a protection it holds is returned and an untaken
    /// grant goes back to its ledger. `None` if the core does not know it.
    pub(crate) fn cancel(&mut self, waiter: WaiterId) -> Option<Withdrawn> {
        let seq = waiter.get();
        if self.pending.remove(&seq).is_some() {
            return Some(Withdrawn::Pending);
        }
        if let Some(w) = self.queued.remove(&seq) {
            let unprotected = w.protected_on.filter(|d| self.unprotect(waiter, *d));
            return Some(Withdrawn::Queued { unprotected });
        }
        match self.outcomes.remove(&seq)? {
            Outcome::Failed(_) => Some(Withdrawn::Failed),
            Outcome::Granted(grant) => match self.release(grant) {
                Ok(released) => Some(Withdrawn::Granted(released)),
                // The grant came from one of these ledgers; a refusal is an
                // accounting bug. The grant is dropped rather than re-parked.
                Err(foreign) => {
                    tracing::error!(target: "admission", %foreign, "cannot release a parked GPU grant");
                    Some(Withdrawn::Failed)
                }
            },
        }
    }

    /// Returns a grant to the ledger that issued it (every health state:
    /// in-flight grants of a quarantined or closed ledger drain normally).
    pub(crate) fn release(&mut self, grant: MemoryGrant) -> Result<ReleaseOutcome, ForeignGrant> {
        match self.index(grant.device()) {
            Some(i) => match self.ledgers.get_mut(i) {
                Some(ledger) => ledger.release(grant),
                None => Err(self.foreign(grant)),
            },
            None => Err(self.foreign(grant)),
        }
    }

    /// Applies a resident-cache change to `device`'s ledger. Call
    /// [`schedule`](Self::schedule) next: evicted bytes may admit waiters or
    /// top up a protection.
    pub(crate) fn change_cache(
        &mut self,
        device: DeviceOrdinal,
        change: CacheChange,
    ) -> Result<(), LedgerError> {
        let ledger = self
            .index(device)
            .and_then(|i| self.ledgers.get_mut(i))
            .ok_or(LedgerError::NoSuchDevice { device })?;
        match change {
            CacheChange::Charge(bytes) => ledger.charge_cache(bytes),
            CacheChange::Evict(bytes) => {
                ledger.evict_cache(bytes)?;
                // Evicted bytes settle what the evictor was asked for.
                if let Some(Some(asked)) = self.index(device).and_then(|i| self.evictors.get_mut(i))
                {
                    *asked = asked.saturating_sub(bytes);
                }
                Ok(())
            }
            CacheChange::Pin(bytes) => ledger.pin_cache(bytes),
            CacheChange::Unpin(bytes) => ledger.unpin_cache(bytes),
        }
    }

    /// Quarantines `device` after a proven device-local fault and retargets
    /// the protection it held. Call [`schedule`](Self::schedule) next, so
    /// waiters left without a healthy device get their outcome.
    pub(crate) fn quarantine(&mut self, device: DeviceOrdinal, code: u32) -> Vec<GpuEvent> {
        let mut events = Vec::new();
        let Some(ledger) = self.index(device).and_then(|i| self.ledgers.get_mut(i)) else {
            return events;
        };
        let was_admitting = ledger.state() == LedgerState::Admitting;
        let holder = ledger.quarantine(code);
        if was_admitting {
            events.push(GpuEvent::Quarantined { device, code });
        }
        self.retarget(holder, device, &mut events);
        events
    }

    /// Marks `device` as having an evictor: when the oldest runnable waiter
    /// is blocked there only by evictable cache, scheduling asks for the
    /// bytes it needs ([`GpuEvent::EvictionRequested`]).
    pub(crate) fn enable_eviction(&mut self, device: DeviceOrdinal) {
        if let Some(slot) = self.index(device).and_then(|i| self.evictors.get_mut(i)) {
            slot.get_or_insert(0);
        }
    }

    /// After one pass: if the oldest runnable waiter is still queued and
    /// some candidate device with an evictor has a slot for it and lacks
    /// only bytes that evictable cache holds, asks that device (the one
    /// needing the fewest bytes, then the lowest ordinal) for exactly the
    /// missing bytes, less what it was asked for already.
    fn request_eviction(&mut self, events: &mut Vec<GpuEvent>) {
        let barrier = self.pending.keys().next().copied().unwrap_or(u64::MAX);
        let Some((_, w)) = self.queued.range(..barrier).next() else {
            return;
        };
        let mut best: Option<(u64, DeviceOrdinal, usize)> = None;
        for device in &w.candidates {
            let Some(i) = self.index(*device) else {
                continue;
            };
            let (Some(ledger), Some(Some(_))) = (self.ledgers.get(i), self.evictors.get(i)) else {
                continue;
            };
            let Decision::Later {
                reason:
                    LaterReason::InsufficientBytes {
                        required_floor,
                        max_new,
                    },
            } = ledger.decide(&w.request)
            else {
                continue;
            };
            let needed = required_floor.saturating_sub(max_new);
            if needed <= ledger.snapshot().cache_evictable_bytes
                && best.is_none_or(|(b, d, _)| (needed, *device) < (b, d))
            {
                best = Some((needed, *device, i));
            }
        }
        let Some((needed, device, i)) = best else {
            return;
        };
        let Some(Some(asked)) = self.evictors.get_mut(i) else {
            return;
        };
        let more = needed.saturating_sub(*asked);
        if more > 0 {
            *asked = asked.saturating_add(more);
            events.push(GpuEvent::EvictionRequested {
                device,
                bytes: more,
            });
        }
    }

    /// Records the streams `device`'s envelopes hold now (roots and forks),
    /// read by the service from the device's worker before each scheduling
    /// pass; ranking then uses it instead of a figure derived from open
    /// slots.
    pub(crate) fn observe_streams(&mut self, device: DeviceOrdinal, in_use: u64) {
        if let Some(slot) = self
            .index(device)
            .and_then(|i| self.live_streams.get_mut(i))
        {
            *slot = Some(in_use);
        }
    }

    /// Returns a quarantined `device` to service; whether it was
    /// quarantined. Call [`schedule`](Self::schedule) next: queued work may
    /// now fit there.
    pub(crate) fn reinstate(&mut self, device: DeviceOrdinal) -> bool {
        self.index(device)
            .and_then(|i| self.ledgers.get_mut(i))
            .is_some_and(DeviceLedger::reinstate)
    }

    /// Closes every ledger (a fault whose isolation cannot be established):
    /// nothing new is issued anywhere, in-flight grants drain. Queued
    /// waiters fail at the next [`schedule`](Self::schedule).
    pub(crate) fn close_ledgers(&mut self) -> Vec<GpuEvent> {
        let mut events = Vec::new();
        for i in 0..self.ledgers.len() {
            let Some(ledger) = self.ledgers.get_mut(i) else {
                continue;
            };
            let device = ledger.device();
            if ledger.state() != LedgerState::Closed {
                events.push(GpuEvent::LedgerClosed { device });
            }
            let holder = ledger.close();
            self.retarget(holder, device, &mut events);
        }
        events
    }

    /// Closes the service: new submissions are refused, every queued waiter
    /// fails with [`GpuAdmitError::Closed`], every ledger closes. Pending
    /// submissions fail when they try to [`resolve`](Self::resolve).
    /// In-flight grants drain normally.
    pub(crate) fn close(&mut self) -> Vec<GpuEvent> {
        self.closed = true;
        let mut events = self.close_ledgers();
        for seq in std::mem::take(&mut self.queued).into_keys() {
            // Closing every ledger dropped every protection: nothing is
            // left to return.
            self.outcomes
                .insert(seq, Outcome::Failed(GpuAdmitError::Closed));
            events.push(GpuEvent::Removed {
                waiter: WaiterId::new(seq),
                error: GpuAdmitError::Closed,
                released: None,
            });
        }
        events
    }

    /// One scheduling pass: admits, oldest first, every queued waiter some
    /// compatible ledger can take now, up to the oldest pending submission;
    /// counts overtakes and protects overtaken waiters; fails waiters with
    /// no healthy device left. `worker_depth` reports each device worker's
    /// queued jobs, a ranking input.
    pub(crate) fn schedule(
        &mut self,
        worker_depth: &dyn Fn(DeviceOrdinal) -> u64,
    ) -> Vec<GpuEvent> {
        let mut events = Vec::new();
        if self.closed {
            return events;
        }
        // A protection dropped during a pass (its holder admitted elsewhere
        // or removed) frees bytes that a waiter scanned earlier in the pass
        // may fit in: scan again. Each rescan follows an admission or a
        // removal, so this ends.
        loop {
            let before = events.len();
            self.pass(worker_depth, &mut events);
            let dropped = events
                .get(before..)
                .unwrap_or_default()
                .iter()
                .any(|e| matches!(e, GpuEvent::ProtectionDropped { .. }));
            if !dropped {
                self.request_eviction(&mut events);
                return events;
            }
        }
    }

    fn pass(&mut self, worker_depth: &dyn Fn(DeviceOrdinal) -> u64, events: &mut Vec<GpuEvent>) {
        let barrier = self.pending.keys().next().copied().unwrap_or(u64::MAX);
        let order: Vec<u64> = self.queued.range(..barrier).map(|(seq, _)| *seq).collect();
        // Older waiters found blocked in this pass, oldest first.
        let mut blocked: Vec<u64> = Vec::new();
        // Each ledger's `max_new` for a request holding no protection there
        // (`None`: no slot), refreshed after every admission: most waiters
        // of a long queue are refuted by one comparison per device instead
        // of a full decision and ranking.
        let mut room = self.room();
        for seq in order {
            let waiter = WaiterId::new(seq);
            // Decided again after a protection made for an older waiter
            // below: the protection changes what this one may take. Each
            // repetition follows a new protection of a waiter in `blocked`,
            // and no protection is dropped in between, so this ends.
            while let Some(w) = self.queued.get(&seq) {
                if self.surely_blocked(w, &room) {
                    blocked.push(seq);
                    break;
                }
                // A device where an older blocked waiter holds a protection
                // is that waiter's to fill: its budget is spent, so younger
                // work may not pass it there, not even through bytes the
                // protection has not reached yet. Other devices stay open.
                let fenced: Vec<DeviceOrdinal> = blocked
                    .iter()
                    .filter_map(|older| self.queued.get(older)?.protected_on)
                    .collect();
                let ranked = {
                    let candidates = w
                        .candidates
                        .iter()
                        .filter(|d| !fenced.contains(d))
                        .filter_map(|d| {
                            let ledger = self.ledger(*d)?;
                            Some((ledger, self.load(ledger, worker_depth)))
                        });
                    rank_devices(&w.request, candidates)
                };
                let Some(best) = ranked.first() else {
                    if self.may_wait(seq) {
                        blocked.push(seq);
                    } else {
                        self.fail_unhealthy(seq, events);
                    }
                    break;
                };
                let device = best.device;
                // An older waiter whose budget is spent protects before it
                // is passed once more, not after: budget B allows exactly B
                // overtakes, and budget 0 none.
                if self.protect_exhausted(&blocked, device, events) {
                    room = self.room();
                    continue;
                }
                let Some(w) = self.queued.get(&seq) else {
                    break;
                };
                let committed = self
                    .index(device)
                    .and_then(|i| self.ledgers.get_mut(i))
                    .map(|ledger| ledger.commit(&w.request));
                let Some(Ok(grant)) = committed else {
                    // Admit was decided under this same borrow of the core, so
                    // a refused commit is an accounting bug; wait rather than
                    // lose the waiter.
                    blocked.push(seq);
                    break;
                };
                let Some(w) = self.queued.remove(&seq) else {
                    break;
                };
                if let Some(p) = w.protected_on.filter(|p| *p != device) {
                    if self.unprotect(waiter, p) {
                        events.push(GpuEvent::ProtectionDropped { waiter, device: p });
                    }
                }
                events.push(GpuEvent::Admitted {
                    waiter,
                    device,
                    grant: grant.id(),
                    grant_bytes: grant.bytes(),
                });
                self.outcomes.insert(seq, Outcome::Granted(grant));
                self.count_overtakes(&blocked, device, events);
                room = self.room();
                break;
            }
        }
    }

    /// Before younger work is admitted on `device`: every older blocked
    /// waiter that could use `device` and has spent its overtake budget
    /// protects now, if it holds no protection yet. Whether one did (the
    /// younger waiter must then be decided again).
    fn protect_exhausted(
        &mut self,
        blocked: &[u64],
        device: DeviceOrdinal,
        events: &mut Vec<GpuEvent>,
    ) -> bool {
        let budget = self.bounds.overtake_budget();
        let due: Vec<u64> = blocked
            .iter()
            .copied()
            .filter(|seq| {
                self.queued.get(seq).is_some_and(|w| {
                    w.protected_on.is_none()
                        && w.overtakes >= budget
                        && w.candidates.contains(&device)
                })
            })
            .collect();
        let mut protected = false;
        for seq in due {
            self.protect(seq, events);
            protected |= self
                .queued
                .get(&seq)
                .is_some_and(|w| w.protected_on.is_some());
        }
        protected
    }

    fn room(&self) -> Vec<Option<u64>> {
        self.ledgers
            .iter()
            .map(|l| l.snapshot().max_new_bytes)
            .collect()
    }

    /// Whether `w` is certainly not admissible on any candidate now: it
    /// holds no protection, and on every candidate (healthy, capable, floor
    /// possible) no slot is open or `max_new` is below its floor. Anything
    /// else takes the full decision path, which also finds waiters left
    /// without a healthy device.
    fn surely_blocked(&self, w: &Waiter, room: &[Option<u64>]) -> bool {
        w.protected_on.is_none()
            && w.candidates.iter().all(|d| {
                let Some(i) = self.index(*d) else {
                    return false;
                };
                let (Some(ledger), Some(room)) = (self.ledgers.get(i), room.get(i)) else {
                    return false;
                };
                let floor = ledger.required_floor(&w.request);
                ledger.state() == LedgerState::Admitting
                    && ledger
                        .profile()
                        .capabilities()
                        .satisfies(w.request.required_capabilities())
                    && floor <= ledger.profile().largest_possible_grant()
                    && room.is_none_or(|max_new| max_new < floor)
            })
    }

    /// A view of the queue and devices at `now`.
    pub(crate) fn snapshot(
        &self,
        now: Instant,
        worker_depth: &dyn Fn(DeviceOrdinal) -> u64,
    ) -> AdmissionSnapshot {
        let pending = self.pending.iter().map(|(seq, at)| WaiterSnapshot {
            waiter: WaiterId::new(*seq),
            age: now.saturating_duration_since(*at),
            pending: true,
            overtakes: 0,
            protected_on: None,
            candidates: Vec::new(),
            phase_floor: 0,
        });
        let queued = self.queued.iter().map(|(seq, w)| WaiterSnapshot {
            waiter: WaiterId::new(*seq),
            age: now.saturating_duration_since(w.submitted_at),
            pending: false,
            overtakes: w.overtakes,
            protected_on: w.protected_on,
            candidates: w.candidates.clone(),
            phase_floor: w.request.phase_floor(),
        });
        let mut waiters: Vec<WaiterSnapshot> = pending.chain(queued).collect();
        waiters.sort_by_key(|w| w.waiter);
        AdmissionSnapshot {
            queued: self.queued.len(),
            pending_preflights: self.pending.len(),
            granted_unobserved: self
                .outcomes
                .values()
                .filter(|o| matches!(o, Outcome::Granted(_)))
                .count(),
            max_pending: self.bounds.max_pending(),
            closed: self.closed,
            waiters,
            devices: self
                .ledgers
                .iter()
                .map(|l| {
                    let r = l.snapshot();
                    DeviceSummary {
                        device: r.device,
                        state: r.state,
                        active_attempts: r.active_attempts,
                        max_active_attempts: r.max_active_attempts,
                        live_grants_bytes: r.live_grants_bytes,
                        protected_bytes: r.protected_bytes,
                        protected_for: r.protection.map(|p| p.waiter),
                        worker_depth: worker_depth(r.device),
                    }
                })
                .collect(),
            health: Vec::new(),
        }
    }

    fn index(&self, device: DeviceOrdinal) -> Option<usize> {
        self.ledgers
            .binary_search_by_key(&device, DeviceLedger::device)
            .ok()
    }

    fn foreign(&self, grant: MemoryGrant) -> ForeignGrant {
        ForeignGrant::new(grant, None)
    }

    fn load(
        &self,
        ledger: &DeviceLedger,
        worker_depth: &dyn Fn(DeviceOrdinal) -> u64,
    ) -> DeviceLoad {
        let profile = ledger.profile();
        let report = ledger.snapshot();
        let capacity = u64::from(report.max_active_attempts)
            .saturating_mul(u64::from(profile.streams_per_attempt()));
        let live = self
            .index(profile.ordinal())
            .and_then(|i| self.live_streams.get(i).copied().flatten());
        let available = match live {
            // What the device's envelopes hold now (roots and forks), out
            // of what its attempts may hold together.
            Some(in_use) => capacity.saturating_sub(in_use),
            // No live reading (the core driven on its own, by tests and
            // benchmarks): what the open slots could take.
            None => u64::from(
                report
                    .max_active_attempts
                    .saturating_sub(report.active_attempts),
            )
            .saturating_mul(u64::from(profile.streams_per_attempt())),
        };
        DeviceLoad {
            worker_depth: u32::try_from(worker_depth(profile.ordinal())).unwrap_or(u32::MAX),
            available_streams: u32::try_from(available).unwrap_or(u32::MAX),
        }
    }

    /// Whether some compatible ledger may still admit the waiter later.
    fn may_wait(&self, seq: u64) -> bool {
        let Some(w) = self.queued.get(&seq) else {
            return false;
        };
        w.candidates.iter().any(|d| {
            self.ledger(*d)
                .is_some_and(|l| !matches!(l.decide(&w.request), Decision::Never { .. }))
        })
    }

    fn fail_unhealthy(&mut self, seq: u64, events: &mut Vec<GpuEvent>) {
        let Some(w) = self.queued.remove(&seq) else {
            return;
        };
        let waiter = WaiterId::new(seq);
        if let Some(p) = w.protected_on {
            if self.unprotect(waiter, p) {
                events.push(GpuEvent::ProtectionDropped { waiter, device: p });
            }
        }
        let error = GpuAdmitError::NoHealthyDevice {
            devices: w.candidates,
        };
        self.outcomes.insert(seq, Outcome::Failed(error.clone()));
        events.push(GpuEvent::Removed {
            waiter,
            error,
            released: None,
        });
    }

    /// Returns `waiter`'s protection on `device`; whether it held one.
    fn unprotect(&mut self, waiter: WaiterId, device: DeviceOrdinal) -> bool {
        self.index(device)
            .and_then(|i| self.ledgers.get_mut(i))
            .is_some_and(|l| l.unprotect(waiter).is_ok())
    }

    fn count_overtakes(
        &mut self,
        blocked: &[u64],
        device: DeviceOrdinal,
        events: &mut Vec<GpuEvent>,
    ) {
        let budget = self.bounds.overtake_budget();
        for seq in blocked {
            let Some(w) = self.queued.get_mut(seq) else {
                continue;
            };
            if !w.candidates.contains(&device) {
                continue;
            }
            w.overtakes = w.overtakes.saturating_add(1);
            // The budget is spent with this overtake: protect at once, so
            // the next younger admission already faces the protection.
            if w.overtakes >= budget && w.protected_on.is_none() {
                self.protect(*seq, events);
            }
        }
    }

    /// Protects a slot and bytes for waiter `seq` on its best compatible
    /// healthy ledger without a protection (see the module docs).
    fn protect(&mut self, seq: u64, events: &mut Vec<GpuEvent>) {
        let Some(w) = self.queued.get(&seq) else {
            return;
        };
        let waiter = WaiterId::new(seq);
        let floor = w.request.phase_floor();
        let overtakes = w.overtakes;
        let mut options: Vec<(u32, std::cmp::Reverse<u64>, DeviceOrdinal)> = w
            .candidates
            .iter()
            .filter_map(|d| self.ledger(*d))
            .filter(|l| l.state() == LedgerState::Admitting && l.protection_holder().is_none())
            .map(|l| {
                let r = l.snapshot();
                let claimed = r
                    .live_grants_bytes
                    .saturating_add(r.cache_evictable_bytes)
                    .saturating_add(r.cache_pinned_bytes);
                (
                    r.active_attempts,
                    std::cmp::Reverse(r.managed_capacity.saturating_sub(claimed)),
                    r.device,
                )
            })
            .collect();
        options.sort();
        for (_, _, device) in options {
            let Some(ledger) = self.index(device).and_then(|i| self.ledgers.get_mut(i)) else {
                continue;
            };
            if let Ok(report) = ledger.protect(waiter, floor) {
                if let Some(w) = self.queued.get_mut(&seq) {
                    w.protected_on = Some(device);
                }
                events.push(GpuEvent::Protected {
                    waiter,
                    device,
                    target_bytes: report.target_bytes,
                    accumulated_bytes: report.accumulated_bytes,
                    overtakes,
                });
                return;
            }
        }
    }

    /// After `device` dropped `holder`'s protection: forget it and protect
    /// again elsewhere if the waiter is still over its budget.
    fn retarget(
        &mut self,
        holder: Option<WaiterId>,
        device: DeviceOrdinal,
        events: &mut Vec<GpuEvent>,
    ) {
        let Some(waiter) = holder else {
            return;
        };
        events.push(GpuEvent::ProtectionDropped { waiter, device });
        let budget = self.bounds.overtake_budget();
        let over = match self.queued.get_mut(&waiter.get()) {
            Some(w) => {
                w.protected_on = None;
                w.overtakes >= budget
            }
            None => false,
        };
        if over {
            self.protect(waiter.get(), events);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    /// One 16 GiB device with two slots (2 GiB floor), the given budget.
    fn core(overtake_budget: u32) -> AdmissionCore {
        let devices = DeviceSet::one_16_gib_device(2);
        let bounds = QueueBounds::new(64, Duration::from_secs(60), overtake_budget).unwrap();
        AdmissionCore::new(&devices, bounds)
    }

    fn submit(core: &mut AdmissionCore, request: GrantRequest) -> WaiterId {
        let waiter = core.reserve(Instant::now()).unwrap();
        core.resolve(waiter, request, vec![DeviceOrdinal(0)])
            .unwrap();
        waiter
    }

    fn granted(core: &mut AdmissionCore, waiter: WaiterId) -> Option<MemoryGrant> {
        core.schedule(&|_| 0);
        core.take_outcome(waiter).map(|outcome| outcome.unwrap())
    }

    /// A 10 GiB attempt runs, so a 7 GiB floor waits (6 GiB are free) while
    /// 2 GiB requests fit. Each younger request that gets in is released
    /// before the next is submitted; the older waiter stays blocked
    /// throughout (until its protection is complete).
    #[test]
    fn an_overtake_budget_of_b_allows_exactly_b_overtakes() {
        for budget in 0..=3u32 {
            let mut core = core(budget);
            let big = submit(
                &mut core,
                GrantRequest::resource_only(0).with_working_set_hint(10 * GIB),
            );
            let big = granted(&mut core, big).unwrap();
            assert_eq!(big.bytes(), 10 * GIB);
            let old = submit(&mut core, GrantRequest::resource_only(7 * GIB));
            assert!(granted(&mut core, old).is_none());

            let mut overtakes = 0;
            let younger = loop {
                let young = submit(
                    &mut core,
                    GrantRequest::resource_only(2 * GIB).with_working_set_hint(2 * GIB),
                );
                match granted(&mut core, young) {
                    Some(grant) => {
                        overtakes += 1;
                        core.release(grant).unwrap();
                        assert!(
                            overtakes <= budget,
                            "budget {budget}: overtake {overtakes} happened"
                        );
                    }
                    None => break young,
                }
            };
            assert_eq!(overtakes, budget, "budget {budget}");
            let snapshot = core.snapshot(Instant::now(), &|_| 0);
            let waiter = &snapshot.waiters[0];
            assert_eq!(waiter.waiter, old);
            assert_eq!(waiter.overtakes, budget);
            assert_eq!(waiter.protected_on, Some(DeviceOrdinal(0)));

            // The older waiter comes first once the big attempt is gone,
            // then the younger one: FIFO from there on.
            core.release(big).unwrap();
            let old = granted(&mut core, old).expect("the protected waiter is admitted");
            assert!(old.bytes() >= 7 * GIB);
            let younger = granted(&mut core, younger).expect("the younger waiter follows");
            core.release(old).unwrap();
            core.release(younger).unwrap();
            let report = core.ledger_snapshots().remove(0);
            assert_eq!((report.live_grants_bytes, report.active_attempts), (0, 0));
            assert!(report.protection.is_none());
        }
    }
}

#[cfg(all(test, not(loom)))]
#[path = "scheduler_tests.rs"]
mod core_properties;
