//! A query service over simulated devices, shared by the GPU service and
//! queue tests.

#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use admission::gpu::backend::sim::{SimBackend, SimDevice};
use admission::gpu::backend::DeviceOrdinal;
use admission::gpu::{
    Capability, CapabilityProof, CapabilitySet, DeviceProfile, DeviceSet, LedgerSnapshot,
    MemoryOwnership, Observation, ObservationKind, PhaseRequirement, PlanDescription,
    PlanFingerprint, ProofIssuer, QueryService, QueryServiceBuilder, QueueBounds,
};

pub const GIB: u64 = 1 << 30;

pub fn dev(n: u32) -> DeviceOrdinal {
    DeviceOrdinal(n)
}

pub fn caps(names: &[&str]) -> CapabilitySet {
    names.iter().map(|name| Capability::new(*name)).collect()
}

/// One simulated device's profile: `capacity` GiB, `slots` attempts,
/// default floor (`capacity / 8`), these capabilities, two streams and two
/// source reads per attempt.
pub fn profile(
    ordinal: u32,
    capacity_gib: u64,
    slots: u32,
    capabilities: &[&str],
) -> DeviceProfile {
    DeviceProfile::builder(dev(ordinal))
        .managed_capacity(capacity_gib * GIB)
        .max_active_attempts(slots)
        .streams_per_attempt(2)
        .source_work_allowance(2)
        .capabilities(caps(capabilities))
        .build()
        .expect("valid profile")
}

pub struct Rig {
    pub sim: Arc<SimBackend>,
    pub service: QueryService,
    /// The engine's side: the one issuer the service accepts proofs of.
    pub issuer: ProofIssuer,
    pub observed: Arc<Mutex<Vec<Observation>>>,
}

pub fn bounds(max_pending: usize, budget: u32) -> QueueBounds {
    QueueBounds::new(max_pending, Duration::from_secs(3600), budget).expect("valid bounds")
}

impl Rig {
    pub fn new(profiles: Vec<DeviceProfile>, bounds: QueueBounds) -> Self {
        Self::with(profiles, bounds, |b| b)
    }

    pub fn with(
        profiles: Vec<DeviceProfile>,
        bounds: QueueBounds,
        configure: impl FnOnce(QueryServiceBuilder) -> QueryServiceBuilder,
    ) -> Self {
        let sim = Arc::new(SimBackend::new(
            profiles
                .iter()
                .map(|p| SimDevice::new(p.ordinal().0, 64 * GIB)),
        ));
        let ownerships = profiles
            .iter()
            .map(|p| MemoryOwnership::exclusive(p.ordinal()))
            .collect();
        let devices = DeviceSet::new(profiles, ownerships).expect("valid device set");
        let observed = Arc::new(Mutex::new(Vec::new()));
        let sink = observed.clone();
        let builder = QueryService::builder(sim.clone(), devices, bounds)
            .observer(move |o: &Observation| sink.lock().unwrap().push(o.clone()));
        let (service, issuer) = configure(builder).build_with_issuer().expect("service");
        Rig {
            sim,
            issuer,
            service,
            observed,
        }
    }

    /// A proof for a plan needing `capabilities` and a phase of `floor`.
    pub fn proof(&self, fingerprint: u64, floor: u64, capabilities: &[&str]) -> CapabilityProof {
        let mut plan = PlanDescription::new(PlanFingerprint(fingerprint))
            .phase(PhaseRequirement::new("run", floor, "op"));
        for c in capabilities {
            plan = plan.require(Capability::new(*c));
        }
        self.issuer.lower(&plan).expect("provable plan")
    }

    pub fn reports(&self) -> Vec<LedgerSnapshot> {
        self.service.ledger_snapshots()
    }

    pub fn report(&self, n: u32) -> LedgerSnapshot {
        self.reports()
            .into_iter()
            .find(|r| r.device == dev(n))
            .expect("installed device")
    }

    /// The kinds observed so far for `waiter`.
    pub fn kinds_of(&self, waiter: u64) -> Vec<ObservationKind> {
        self.observed
            .lock()
            .unwrap()
            .iter()
            .filter(|o| o.waiter == Some(waiter))
            .map(|o| o.kind)
            .collect()
    }

    /// Waiters in the order they were admitted.
    pub fn admitted_order(&self) -> Vec<u64> {
        self.observed
            .lock()
            .unwrap()
            .iter()
            .filter(|o| o.kind == ObservationKind::Admitted)
            .filter_map(|o| o.waiter)
            .collect()
    }

    /// Nothing granted, protected or running anywhere, and no physical
    /// resource left.
    pub fn assert_idle(&self) {
        for r in self.reports() {
            assert_eq!(r.live_grants_bytes, 0, "{r:?}");
            assert_eq!(r.live_grant_count, 0, "{r:?}");
            assert_eq!(r.active_attempts, 0, "{r:?}");
            assert_eq!(r.protected_bytes, 0, "{r:?}");
            assert!(r.protection.is_none(), "{r:?}");
        }
        assert_eq!(self.sim.live_handles(), 0, "physical resources left");
    }
}
