//! What every clone of the service shares: the core behind its one lock,
//! the workers and the hooks, and the one transaction (`transact`) that
//! reaches the core. Apart from the public type so that the locking rule
//! (nothing awaited, no backend or observer call under the lock) is kept in
//! one place.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::task::Waker;

use tokio::time::Instant;

use super::{EvictionRequest, EvictorHook, ObserverHook, PreflightHook};
use crate::gpu::backend::{DeviceOrdinal, SharedBackend};
use crate::gpu::guard::Boundaries;
use crate::gpu::ledger::WaiterId;
use crate::gpu::observe::{GpuEvent, Observation};
use crate::gpu::outcome::GpuAdmitError;
use crate::gpu::profile::DeviceSet;
use crate::gpu::proof::IssuerId;
use crate::gpu::scheduler::AdmissionCore;
use crate::gpu::worker::DeviceWorker;
use crate::sync::{Mutex, StdArc};

pub(crate) struct State {
    pub(crate) core: AdmissionCore,
    pub(crate) wakers: HashMap<u64, Waker>,
}

pub(crate) struct Inner {
    pub(crate) backend: SharedBackend,
    pub(crate) devices: DeviceSet,
    /// The id of the one issuer whose proofs tickets accept; the issuer
    /// itself went to the engine (`build_with_issuer`).
    pub(super) issuer: IssuerId,
    pub(crate) workers: BTreeMap<DeviceOrdinal, StdArc<DeviceWorker>>,
    pub(crate) state: Mutex<State>,
    pub(crate) preflight: Option<Box<PreflightHook>>,
    pub(super) observer: Option<Box<ObserverHook>>,
    pub(super) evictors: BTreeMap<DeviceOrdinal, Box<EvictorHook>>,
    pub(crate) boundaries: Boundaries,
    pub(super) epoch: Instant,
}

impl fmt::Debug for Inner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueryServiceInner")
            .field("backend", &self.backend.name())
            .finish()
    }
}

/// Collects observation records under the lock, stamped with the queue
/// depth of the transaction that produced them.
pub(crate) struct Recorder {
    epoch: Instant,
    records: Vec<Observation>,
    /// Core events the closure caused before the scheduling pass (a close,
    /// a quarantine): recorded and woken like the pass's own.
    events: Vec<GpuEvent>,
}

impl Recorder {
    /// Events the transaction's closure caused, to be recorded and woken
    /// with the scheduling pass's.
    pub(crate) fn caused(&mut self, events: Vec<GpuEvent>) {
        self.events.extend(events);
    }

    /// Records `event`, in transaction order.
    pub(crate) fn record(&mut self, event: &GpuEvent) {
        let elapsed = Instant::now().saturating_duration_since(self.epoch);
        self.records.push(event.observation(elapsed));
    }
}

impl Inner {
    /// Wakers kept for waiting admit futures.
    #[cfg(any(test, loom))]
    pub(crate) fn live_wakers(&self) -> usize {
        self.state.lock().wakers.len()
    }

    pub(super) fn worker_depth(&self, device: DeviceOrdinal) -> u64 {
        self.workers.get(&device).map_or(0, |w| w.depth())
    }

    /// One transaction: `f` over the core, then a scheduling pass; wakers
    /// of resolved waiters are woken and observations delivered after the
    /// lock is released.
    pub(crate) fn transact<R>(&self, f: impl FnOnce(&mut AdmissionCore, &mut Recorder) -> R) -> R {
        let mut recorder = Recorder {
            epoch: self.epoch,
            records: Vec::new(),
            events: Vec::new(),
        };
        let mut wake = Vec::new();
        let mut evictions = Vec::new();
        let result = {
            let mut state = self.state.lock();
            let state = &mut *state;
            let result = f(&mut state.core, &mut recorder);
            // Ranking reads each device's live stream count, not a figure
            // derived from open slots.
            for (device, worker) in &self.workers {
                state.core.observe_streams(*device, worker.streams_in_use());
            }
            let depth = |d| self.worker_depth(d);
            let mut events = std::mem::take(&mut recorder.events);
            events.extend(state.core.schedule(&depth));
            for event in &events {
                recorder.record(event);
                if let GpuEvent::EvictionRequested { device, bytes } = event {
                    evictions.push(EvictionRequest {
                        device: *device,
                        bytes: *bytes,
                    });
                }
                if let Some(waiter) = event.resolves() {
                    if let Some(waker) = state.wakers.remove(&waiter.get()) {
                        wake.push(waker);
                    }
                }
            }
            let (depth, pending) = (state.core.depth(), state.core.pending_preflights());
            for record in &mut recorder.records {
                record.queue_depth = depth;
                record.pending_preflights = pending;
            }
            result
        };
        for waker in wake {
            waker.wake();
        }
        self.deliver(recorder.records);
        // Last, and outside the lock: an evictor may report its eviction
        // at once, which is a transaction of its own.
        for request in evictions {
            if let Some(evictor) = self.evictors.get(&request.device) {
                let _ = self.boundaries.evictor.call(|| evictor(&request));
            }
        }
        result
    }

    /// Hands each record to the observer behind its panic boundary: a
    /// panic drops that record and nothing else. Never called under the
    /// lock, and always after the transaction's effects are in place, so a
    /// panic here cannot leave a reservation or a grant behind.
    fn deliver(&self, records: Vec<Observation>) {
        if let Some(observer) = &self.observer {
            for record in &records {
                let _ = self.boundaries.observer.call(|| observer(record));
            }
        }
    }

    /// A handle exists: its whole envelope validated.
    pub(crate) fn observe_published(
        &self,
        waiter: WaiterId,
        device: DeviceOrdinal,
        grant_bytes: u64,
    ) {
        self.observe_outside_transaction(&GpuEvent::Published {
            waiter,
            device,
            grant_bytes,
        });
    }

    pub(crate) fn observe_rejection(&self, waiter: Option<WaiterId>, error: &GpuAdmitError) {
        self.observe_outside_transaction(&GpuEvent::Rejected {
            waiter,
            error: error.clone(),
        });
    }

    /// Delivers one record of something that happened outside a
    /// transaction, with the queue's depth read now.
    pub(crate) fn observe_outside_transaction(&self, event: &GpuEvent) {
        let elapsed = Instant::now().saturating_duration_since(self.epoch);
        let mut record = event.observation(elapsed);
        {
            let state = self.state.lock();
            record.queue_depth = state.core.depth();
            record.pending_preflights = state.core.pending_preflights();
        }
        self.deliver(vec![record]);
    }
}
