//! Capability proofs: engine-issued evidence that one exact plan can run.
//!
//! # Why a proof, and why opaque
//!
//! Admission must never be talked into running a plan the device cannot
//! execute, nor into granting less memory than the plan's phases need. The
//! only component that knows both facts is the engine's lowering step, so
//! it alone issues a [`CapabilityProof`]: the plan's fingerprint, the device
//! capabilities it needs, the largest per-phase working floor and every
//! allocation owner. A caller holds the proof and hands it to admission, but
//! cannot build or edit one: its fields are private and the only
//! constructors are [`ProofIssuer::lower`] and [`ProofIssuer::compose`].
//! Cloning is allowed because a clone carries the same evidence.
//!
//! # Unforgeable across services
//!
//! Two services in one process (two engines, say) each own a
//! [`ProofIssuer`] with a process-unique [`IssuerId`]. Every proof records
//! the id of the issuer that made it, so a service can refuse a proof issued
//! by somebody else's engine ([`ProofIssuer::verify`]) instead of trusting
//! evidence about a plan it did not lower.
//!
//! # Composition
//!
//! A composed GPU execution (producers feeding one consumer) is admitted
//! once: one ticket, one device, one grant. [`ProofIssuer::compose`] binds
//! every producer occurrence and the consumer into one proof whose
//! requirements cover all of them: the union of capabilities, the largest
//! phase floor (the phases run one after another inside the one grant, so the
//! grant must cover the largest, not the sum), every allocation owner and a
//! fingerprint combining the parts in order.

use std::collections::BTreeSet;

use super::backend::DeviceOrdinal;
use super::ledger::GrantId;
use std::error::Error;
use std::fmt;

/// One device capability a plan may require (`"fp64"`, `"hash_join"`,
/// `"sm_90"`): a name, compared exactly. `Display` and `AsRef<str>` give the
/// name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Capability(String);

impl Capability {
    /// A capability with this name.
    pub fn new(name: impl Into<String>) -> Self {
        Capability(name.into())
    }
}

impl AsRef<str> for Capability {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A set of [`Capability`] names: what a device offers, or what a plan
/// requires. Ordered, so that messages and reports list names stably.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct CapabilitySet(BTreeSet<Capability>);

impl CapabilitySet {
    /// Adds a capability; returns whether it was new.
    pub(crate) fn insert(&mut self, capability: Capability) -> bool {
        self.0.insert(capability)
    }

    /// Whether every capability of `required` is in this set.
    pub(crate) fn satisfies(&self, required: &CapabilitySet) -> bool {
        required.0.is_subset(&self.0)
    }

    /// The capabilities of `required` that this set lacks, in name order.
    pub(crate) fn missing(&self, required: &CapabilitySet) -> CapabilitySet {
        CapabilitySet(required.0.difference(&self.0).cloned().collect())
    }

    /// Every capability of either set.
    pub(crate) fn union(&self, other: &CapabilitySet) -> CapabilitySet {
        CapabilitySet(self.0.union(&other.0).cloned().collect())
    }

    /// How many capabilities the set holds.
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the set is empty.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl FromIterator<Capability> for CapabilitySet {
    fn from_iter<I: IntoIterator<Item = Capability>>(iter: I) -> Self {
        CapabilitySet(iter.into_iter().collect())
    }
}

/// The capabilities in name order.
impl<'a> IntoIterator for &'a CapabilitySet {
    type Item = &'a Capability;
    type IntoIter = std::collections::btree_set::Iter<'a, Capability>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl fmt::Display for CapabilitySet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("{")?;
        for (i, capability) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            f.write_str(&capability.0)?;
        }
        f.write_str("}")
    }
}

/// A stable identity of one exact plan (the engine's hash of its IR).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PlanFingerprint(pub u64);

impl fmt::Display for PlanFingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "plan:{:016x}", self.0)
    }
}

/// Who owns the allocations of a plan phase, as far as lowering knows.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AllocationOwner {
    /// The named operator or scope that allocates and frees the memory.
    Resolved(String),
    /// Lowering could not tell who allocates: the plan cannot be proven.
    Unresolved,
}

/// One phase of a plan: its name, the least device memory it needs to make
/// progress, and who owns its allocations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PhaseRequirement {
    /// The phase's name, for messages (`"build"`, `"probe"`).
    pub name: String,
    /// The minimum working bytes of the phase; `None` when lowering could
    /// not bound them (an unresolved phase).
    pub min_working_bytes: Option<u64>,
    /// Who owns the phase's allocations.
    pub owner: AllocationOwner,
}

impl PhaseRequirement {
    /// A fully resolved phase.
    pub fn new(name: impl Into<String>, min_working_bytes: u64, owner: impl Into<String>) -> Self {
        PhaseRequirement {
            name: name.into(),
            min_working_bytes: Some(min_working_bytes),
            owner: AllocationOwner::Resolved(owner.into()),
        }
    }
}

/// What lowering learned about one exact plan: the input to
/// [`ProofIssuer::lower`]. This is a description, not evidence: anybody may
/// build one, only the issuer turns it into a [`CapabilityProof`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanDescription {
    /// The plan's fingerprint.
    pub fingerprint: PlanFingerprint,
    /// The device capabilities the plan needs.
    pub required_capabilities: CapabilitySet,
    /// The plan's phases in execution order.
    pub phases: Vec<PhaseRequirement>,
}

impl PlanDescription {
    /// A plan with no requirements yet.
    pub fn new(fingerprint: PlanFingerprint) -> Self {
        PlanDescription {
            fingerprint,
            required_capabilities: CapabilitySet::default(),
            phases: Vec::new(),
        }
    }

    /// Adds a required capability.
    pub fn require(mut self, capability: Capability) -> Self {
        self.required_capabilities.insert(capability);
        self
    }

    /// Appends a phase.
    pub fn phase(mut self, phase: PhaseRequirement) -> Self {
        self.phases.push(phase);
        self
    }
}

/// The process-unique identity of a [`ProofIssuer`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct IssuerId(u64);

impl fmt::Display for IssuerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "issuer#{}", self.0)
    }
}

/// Opaque, engine-issued evidence that one exact plan is executable, with
/// what admission needs to know about it. See the [`gpu` module documentation](crate::gpu).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CapabilityProof {
    issuer: IssuerId,
    fingerprint: PlanFingerprint,
    required: CapabilitySet,
    floor_bytes: u64,
    owners: BTreeSet<String>,
    bound_plans: usize,
    binding: Option<ProofBinding>,
}

/// The admission an admitted proof is bound to: the device selected and the
/// grant committed for it. Set only by the query service when it publishes
/// a handle ([`QueryHandle::proof`](super::QueryHandle::proof)); a proof
/// from the issuer has none.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct ProofBinding {
    /// The selected device.
    pub device: DeviceOrdinal,
    /// The grant on that device's ledger.
    pub grant: GrantId,
}

impl CapabilityProof {
    /// The device and grant this proof was admitted with; `None` for a
    /// proof as the issuer made it.
    pub fn binding(&self) -> Option<ProofBinding> {
        self.binding
    }

    /// This proof, bound to the admission of `grant` on `device`.
    pub(crate) fn bound_to(&self, device: DeviceOrdinal, grant: GrantId) -> Self {
        CapabilityProof {
            binding: Some(ProofBinding { device, grant }),
            ..self.clone()
        }
    }

    /// The issuer that made this proof.
    pub(crate) fn issuer_id(&self) -> IssuerId {
        self.issuer
    }

    /// The proven plan's fingerprint (combined, for a composed proof).
    pub fn fingerprint(&self) -> PlanFingerprint {
        self.fingerprint
    }

    /// The device capabilities the plan needs.
    pub(crate) fn required_capabilities(&self) -> &CapabilitySet {
        &self.required
    }

    /// The largest minimum working bytes of any phase: the least grant the
    /// plan can run in. Admission raises it to the device's attempt floor.
    pub(crate) fn required_floor_bytes(&self) -> u64 {
        self.floor_bytes
    }

    /// Every allocation owner of the plan, in name order.
    #[cfg(test)]
    pub(crate) fn allocation_owners(&self) -> impl Iterator<Item = &str> {
        self.owners.iter().map(String::as_str)
    }

    /// How many lowered plans this proof binds: 1, or producers + consumer
    /// for a composed proof.
    #[cfg(test)]
    pub(crate) fn bound_plans(&self) -> usize {
        self.bound_plans
    }
}

/// Why lowering or composition refused to issue a proof, or why a proof was
/// refused.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LoweringError {
    /// A phase's allocation owner is unresolved.
    UnresolvedOwner {
        /// The phase's name.
        phase: String,
    },
    /// A phase's minimum working bytes are unknown.
    UnresolvedPhase {
        /// The phase's name.
        phase: String,
    },
    /// The proof was issued by another issuer (another engine or service).
    ForeignProof {
        /// The issuer that was expected.
        expected: IssuerId,
        /// The issuer that made the proof.
        found: IssuerId,
    },
}

impl fmt::Display for LoweringError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoweringError::UnresolvedOwner { phase } => write!(
                f,
                "phase `{phase}` has an unresolved allocation owner; the plan cannot be proven"
            ),
            LoweringError::UnresolvedPhase { phase } => write!(
                f,
                "phase `{phase}` has no known minimum working bytes; the plan cannot be proven"
            ),
            LoweringError::ForeignProof { expected, found } => write!(
                f,
                "the proof was issued by {found}, not by this service's {expected}"
            ),
        }
    }
}

impl Error for LoweringError {}

/// The engine-side authority that issues [`CapabilityProof`]s.
///
/// Not `Clone`: one issuer belongs to one engine, and its id is what tells
/// that engine's proofs apart from any other's.
#[derive(Debug)]
pub struct ProofIssuer {
    id: IssuerId,
}

// A process-wide id counter, the one atomic in this module. It is a plain
// `std` atomic, not one from `crate::sync`: loom atomics cannot live in a
// `static`, and handing out distinct numbers is not an interleaving any model
// needs to explore (every `fetch_add` returns a distinct value). 2^64 issuers
// cannot be created in one process, so the counter cannot wrap.
static NEXT_ISSUER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl ProofIssuer {
    /// A new issuer with a process-unique id.
    pub fn new() -> Self {
        let id = NEXT_ISSUER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        ProofIssuer { id: IssuerId(id) }
    }

    pub(crate) fn id(&self) -> IssuerId {
        self.id
    }

    /// Lowers one exact plan into a proof. Refuses a plan with an unresolved
    /// allocation owner or a phase without known minimum working bytes: such
    /// a plan is a capability or configuration failure, never a reason to
    /// wait.
    ///
    /// # Errors
    ///
    /// For the first phase at fault, in plan order:
    /// [`LoweringError::UnresolvedPhase`] when its minimum working bytes are
    /// unknown, otherwise [`LoweringError::UnresolvedOwner`] when its
    /// allocation owner is unresolved.
    ///
    /// # Examples
    ///
    /// ```
    /// use admission::gpu::{PhaseRequirement, PlanDescription, PlanFingerprint, ProofIssuer};
    ///
    /// const GIB: u64 = 1 << 30;
    /// let issuer = ProofIssuer::new();
    /// let plan = PlanDescription::new(PlanFingerprint(42))
    ///     .phase(PhaseRequirement::new("build", 12 * GIB, "join"))
    ///     .phase(PhaseRequirement::new("probe", 4 * GIB, "join"));
    /// let proof = issuer.lower(&plan).unwrap();
    /// // The proof names the exact plan it was lowered from.
    /// assert_eq!(proof.fingerprint(), PlanFingerprint(42));
    ///
    /// // A phase whose working bytes lowering could not bound is refused.
    /// let mut unbounded = PhaseRequirement::new("scan", 0, "join");
    /// unbounded.min_working_bytes = None;
    /// let plan = PlanDescription::new(PlanFingerprint(43)).phase(unbounded);
    /// assert!(issuer.lower(&plan).is_err());
    /// ```
    pub fn lower(&self, plan: &PlanDescription) -> Result<CapabilityProof, LoweringError> {
        let mut floor_bytes = 0u64;
        let mut owners = BTreeSet::new();
        for phase in &plan.phases {
            let Some(min) = phase.min_working_bytes else {
                return Err(LoweringError::UnresolvedPhase {
                    phase: phase.name.clone(),
                });
            };
            match &phase.owner {
                AllocationOwner::Resolved(owner) => {
                    owners.insert(owner.clone());
                }
                AllocationOwner::Unresolved => {
                    return Err(LoweringError::UnresolvedOwner {
                        phase: phase.name.clone(),
                    })
                }
            }
            floor_bytes = floor_bytes.max(min);
        }
        Ok(CapabilityProof {
            issuer: self.id,
            fingerprint: plan.fingerprint,
            required: plan.required_capabilities.clone(),
            floor_bytes,
            owners,
            bound_plans: 1,
            binding: None,
        })
    }

    /// Binds every producer occurrence and the consumer into one proof,
    /// admitted once. Every part must have been issued by this issuer.
    ///
    /// # Errors
    ///
    /// [`LoweringError::ForeignProof`] for the first part (producers, then
    /// the consumer) that another issuer issued.
    ///
    /// # Examples
    ///
    /// ```
    /// use admission::gpu::{PhaseRequirement, PlanDescription, PlanFingerprint, ProofIssuer};
    ///
    /// const GIB: u64 = 1 << 30;
    /// let issuer = ProofIssuer::new();
    /// let lower = |id, bytes| {
    ///     issuer.lower(&PlanDescription::new(PlanFingerprint(id))
    ///         .phase(PhaseRequirement::new("run", bytes, "op")))
    /// };
    /// let producer = lower(1, 2 * GIB).unwrap();
    /// let consumer = lower(2, 6 * GIB).unwrap();
    /// let pipeline = issuer.compose(&[producer], &consumer).unwrap();
    /// // One proof for the whole pipeline, under a fingerprint of its own.
    /// assert_ne!(pipeline.fingerprint(), consumer.fingerprint());
    ///
    /// // A part another issuer made is refused.
    /// let foreign = ProofIssuer::new()
    ///     .lower(&PlanDescription::new(PlanFingerprint(3)).phase(PhaseRequirement::new("run", GIB, "op")))
    ///     .unwrap();
    /// assert!(issuer.compose(&[foreign], &consumer).is_err());
    /// ```
    pub fn compose(
        &self,
        producers: &[CapabilityProof],
        consumer: &CapabilityProof,
    ) -> Result<CapabilityProof, LoweringError> {
        for part in producers.iter().chain(std::iter::once(consumer)) {
            self.verify(part)?;
        }
        let mut composed = CapabilityProof {
            issuer: self.id,
            fingerprint: PlanFingerprint(0),
            required: CapabilitySet::default(),
            floor_bytes: 0,
            owners: BTreeSet::new(),
            bound_plans: 0,
            binding: None,
        };
        let mut fingerprint = COMPOSE_SEED;
        for part in producers.iter().chain(std::iter::once(consumer)) {
            composed.required = composed.required.union(&part.required);
            composed.floor_bytes = composed.floor_bytes.max(part.floor_bytes);
            composed.owners.extend(part.owners.iter().cloned());
            // A count of plans, bounded by the slice length plus one.
            composed.bound_plans = composed.bound_plans.saturating_add(part.bound_plans);
            fingerprint = mix(fingerprint, part.fingerprint.0);
        }
        composed.fingerprint = PlanFingerprint(fingerprint);
        Ok(composed)
    }

    /// Checks that `proof` was issued by this issuer.
    ///
    /// # Errors
    ///
    /// [`LoweringError::ForeignProof`] when another issuer issued `proof`.
    pub(crate) fn verify(&self, proof: &CapabilityProof) -> Result<(), LoweringError> {
        if proof.issuer == self.id {
            Ok(())
        } else {
            Err(LoweringError::ForeignProof {
                expected: self.id,
                found: proof.issuer,
            })
        }
    }
}

impl Default for ProofIssuer {
    fn default() -> Self {
        Self::new()
    }
}

const COMPOSE_SEED: u64 = 0xcbf2_9ce4_8422_2325;

// Order-sensitive mixing of fingerprints. A fingerprint is an identity, not
// a quantity, so the wrapping multiply is the hash, not an accounting error.
fn mix(acc: u64, part: u64) -> u64 {
    (acc.rotate_left(27) ^ part).wrapping_mul(0x0000_0100_0000_01b3)
}
