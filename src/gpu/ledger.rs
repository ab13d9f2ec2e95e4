//! The per-device ledger: the only admission-capacity authority.
//!
//! # Implementation notes
//!
//! A [`DeviceLedger`] is plain data: integer counters over one device's
//! managed capacity, with no lock of its own. The query service holds one
//! mutex over every ledger and its queue, so one `&mut` call is one
//! transaction: `DeviceLedger::commit` re-decides and takes the slot and
//! the bytes together, and nothing can slip in between a decision and its
//! commit. Every sum and difference is checked or, where a sum is only
//! compared with the capacity, saturating (past `u64::MAX` is past any
//! capacity). A value the caller passed that would overflow is refused with
//! the typed error of the limit it breaks; an internal failure is a bug,
//! logged and reported as an error, never a wrap or a panic.
//!
//! At any instant the capacity is split into
//!
//! ```text
//! managed_capacity = live_grants            bytes of running attempts' grants
//!                  + cache_evictable        resident cache, reclaimable
//!                  + cache_pinned           resident cache, in use
//!                  + protected_bytes        held for one protected waiter
//!                  + floor * empty_slots    headroom for the slots left open
//!                  + unclaimed
//! ```
//!
//! and a new attempt may take `active + 1 <= max_active` (a slot protected
//! for another waiter counts as taken) and
//!
//! ```text
//! max_new = capacity - live_grants - cache_evictable - cache_pinned
//!         - protected_bytes - floor * empty_unprotected_slots_after_admission
//! required_floor <= grant <= max_new
//! ```
//!
//! where `required_floor = max(profile floor, proof phase floor)`. A
//! working-set hint picks the grant inside that interval (clamped to it);
//! without one the grant is `max_new`. Cache charges are bounded by the cache
//! cap and by the bytes nobody has claimed, but not by the open-slot
//! headroom: that headroom is a promise to future attempts, and evictable
//! cache is what an attempt can get back (it sees the pressure as a smaller
//! `max_new`): when the oldest runnable waiter lacks only evictable bytes,
//! the service asks the cache owner's registered evictor for exactly those
//! bytes (`QueryServiceBuilder::evictor`).
//!
//! # Decisions: Admit, Later, Never
//!
//! [`DeviceLedger::decide`] is pure. It answers
//!
//! * **Never** when waiting on this ledger cannot help: the ledger is
//!   [closed](LedgerState::Closed) or [quarantined](LedgerState::Quarantined)
//!   (a closed ledger never reopens; a quarantined one only when the
//!   operator reinstates it after a device reset and a passing health probe,
//!   `QueryService::reinstate`), the device lacks a required capability, or the required floor
//!   exceeds [`DeviceProfile::largest_possible_grant`], the grant an *empty*
//!   ledger could issue. Cache, grants and protections all drain, so any floor
//!   that fits an empty ledger is Later at worst.
//! * **Later** when no slot is open (counting a slot protected for another
//!   waiter) or the floor exceeds `max_new` now.
//! * **Admit** with the grant size otherwise.
//!
//! # Protection
//!
//! A waiter whose overtake budget is spent protects
//! one future slot and bytes up to its floor on one ledger; one protection
//! per ledger at a time. Accumulation is precise:
//!
//! * The protected slot counts as taken for everybody else at once, and
//!   stops being open-slot headroom.
//! * At `protect`, the bytes free right now are claimed at once, up to the
//!   target (`max(waiter floor, attempt floor)`). *Free* means
//!   `capacity - live_grants - cache - protected_bytes - floor *
//!   empty_unprotected_slots`: bytes no grant, cache charge or open-slot
//!   headroom holds.
//! * Every later `release` and cache
//!   [eviction](DeviceLedger::evict_cache) tops the protection up from the
//!   then-free bytes in the same call, before anybody else can decide, until
//!   it reaches its target. Nothing else adds to it.
//! * The holder's own request ([`GrantRequest::for_waiter`]) sees the
//!   protected slot and bytes as available; its `commit`
//!   consumes the protection in the same transaction.
//! * [`unprotect`](DeviceLedger::unprotect) (cancel, deadline, retargeting)
//!   returns the bytes; [`close`](DeviceLedger::close) and
//!   [`quarantine`](DeviceLedger::quarantine) drop the protection and name its
//!   holder so the service can retarget it.
//!
//! Once the protection reaches its target and a slot frees, the holder is
//! admissible: others never take the protected slot, and every admission of
//! theirs leaves `live + cache + protected + floor * empty_unprotected <=
//! capacity`; the holder's own `max_new` (its protected bytes counted as
//! available) is therefore at least what it has accumulated.
//!
//! # Grants and draining
//!
//! A [`MemoryGrant`] is immutable and not `Clone`: `release`
//! consumes it, so a grant cannot be released twice. Release works in every
//! admission state, so in-flight grants of a quarantined or closed ledger drain
//! normally; such a ledger issues nothing new (no grant, protection or
//! cache charge).

use std::collections::BTreeMap;
use std::error::Error;
use std::fmt;

use super::backend::DeviceOrdinal;
use super::profile::{fmt_bytes, DeviceProfile};
use super::proof::{CapabilityProof, CapabilitySet};

/// The identity of a waiter in the GPU admission queue, as the ledger sees
/// it: the holder of a protection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WaiterId(u64);

impl WaiterId {
    test_hook! {
        /// Wraps the queue's raw waiter number (waiters are numbered from 1
        /// in submission order).
        const fn new(raw: u64) -> Self {
            WaiterId(raw)
        }
    }

    test_hook! {
        /// The raw waiter number.
        const fn get(self) -> u64 {
            self.0
        }
    }
}

impl fmt::Display for WaiterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "waiter#{}", self.0)
    }
}

/// The identity of one grant on one ledger.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GrantId(u64);

impl fmt::Display for GrantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "grant#{}", self.0)
    }
}

/// What one admission asks of a ledger. Callers never choose grant bytes:
/// the floor comes from engine-issued evidence (or a resource-only minimum),
/// and a hint only picks a point inside the interval the ledger computes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct GrantRequest {
    required_capabilities: CapabilitySet,
    phase_floor: u64,
    working_set_hint: Option<u64>,
    waiter: Option<WaiterId>,
}

impl GrantRequest {
    /// A request for the plan `proof` proves: its capabilities and its
    /// largest phase floor.
    pub(crate) fn for_proof(proof: &CapabilityProof) -> Self {
        GrantRequest {
            required_capabilities: proof.required_capabilities().clone(),
            phase_floor: proof.required_floor_bytes(),
            working_set_hint: None,
            waiter: None,
        }
    }

    /// A resource-only request (manual admission): no capabilities, a
    /// minimum of `min_bytes` (raised to the attempt floor).
    pub(crate) fn resource_only(min_bytes: u64) -> Self {
        GrantRequest {
            required_capabilities: CapabilitySet::default(),
            phase_floor: min_bytes,
            working_set_hint: None,
            waiter: None,
        }
    }

    /// A descriptive working-set estimate; the grant is this value clamped
    /// into `required_floor..=max_new`. Never a reason to admit.
    pub(crate) fn with_working_set_hint(mut self, bytes: u64) -> Self {
        self.working_set_hint = Some(bytes);
        self
    }

    /// The queue waiter making the request, so that a protection it holds
    /// counts as available to it.
    pub(crate) fn for_waiter(mut self, waiter: WaiterId) -> Self {
        self.waiter = Some(waiter);
        self
    }

    /// The capabilities the request needs.
    pub(crate) fn required_capabilities(&self) -> &CapabilitySet {
        &self.required_capabilities
    }

    /// The floor from the plan's phases (before the attempt floor).
    pub(crate) fn phase_floor(&self) -> u64 {
        self.phase_floor
    }

    /// The waiter making the request, if any.
    pub(crate) fn waiter(&self) -> Option<WaiterId> {
        self.waiter
    }
}

/// Whether a ledger may issue new grants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LedgerState {
    /// Admitting normally.
    Admitting,
    /// A proven device-local fault: nothing new is issued; in-flight grants
    /// drain.
    Quarantined {
        /// The driver's fault code.
        code: u32,
    },
    /// Closed (fault of unknown reach, or shutdown): nothing new is issued;
    /// in-flight grants drain.
    Closed,
}

/// Why a request must wait on this ledger.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LaterReason {
    /// Every attempt slot is running or protected for another waiter.
    SlotsFull {
        /// Attempts running.
        active: u32,
        /// Slots protected for another waiter (0 or 1).
        protected_slots: u32,
        /// The active-attempt limit.
        max_active: u32,
    },
    /// A slot is open but `max_new` is below the required floor.
    InsufficientBytes {
        /// The request's required floor.
        required_floor: u64,
        /// The largest grant available now.
        max_new: u64,
    },
}

/// Why a request can never be admitted on this ledger.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum NeverReason {
    /// The device lacks required capabilities.
    MissingCapabilities {
        /// The capabilities missing.
        missing: CapabilitySet,
    },
    /// The floor exceeds the largest grant even an empty ledger could issue.
    FloorNeverFits {
        /// The request's required floor.
        required_floor: u64,
        /// The largest grant this device could ever issue: what an empty
        /// ledger offers one slot while keeping a floor for every other.
        largest_possible: u64,
    },
    /// The ledger is quarantined.
    Quarantined {
        /// The fault code.
        code: u32,
    },
    /// The ledger is closed.
    Closed,
}

/// The answer of [`DeviceLedger::decide`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Admissible now with this grant.
    Admit {
        /// The grant the commit would issue.
        grant_bytes: u64,
    },
    /// Not now; may become admissible as grants, cache or protection drain.
    Later {
        /// Why.
        reason: LaterReason,
    },
    /// Never on this ledger.
    Never {
        /// Why.
        reason: NeverReason,
    },
}

/// An immutable byte budget, issued by `DeviceLedger::commit` and returned
/// by `DeviceLedger::release`. Not `Clone`: releasing consumes it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct MemoryGrant {
    id: GrantId,
    device: DeviceOrdinal,
    bytes: u64,
    required_floor: u64,
}

impl MemoryGrant {
    /// The grant's id on its ledger.
    pub(crate) fn id(&self) -> GrantId {
        self.id
    }

    /// The device the grant is on.
    pub(crate) fn device(&self) -> DeviceOrdinal {
        self.device
    }

    /// The granted bytes: the ceiling of the attempt's allocation domain.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The floor the grant was sized against.
    pub(crate) fn required_floor(&self) -> u64 {
        self.required_floor
    }
}

/// What `DeviceLedger::release` gave back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ReleaseOutcome {
    /// The released grant.
    pub grant: GrantId,
    /// Bytes returned to the ledger.
    pub bytes: u64,
    /// Of those, bytes that went to the protected waiter's reserve.
    pub protection_top_up: u64,
}

/// A grant given to a ledger that did not issue it. The grant is handed
/// back ([`ForeignGrant::into_grant`]) so that it can still be released
/// where it belongs.
#[derive(Debug)]
pub(crate) struct ForeignGrant {
    grant: MemoryGrant,
    ledger: Option<DeviceOrdinal>,
}

impl ForeignGrant {
    /// A grant refused by `ledger`, or by a set of ledgers none of which is
    /// on the grant's device (`None`).
    pub(crate) fn new(grant: MemoryGrant, ledger: Option<DeviceOrdinal>) -> Self {
        ForeignGrant { grant, ledger }
    }

    /// The grant, unreleased.
    #[cfg(test)]
    pub(crate) fn into_grant(self) -> MemoryGrant {
        self.grant
    }
}

impl fmt::Display for ForeignGrant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ledger {
            Some(ledger) => write!(
                f,
                "{} on {} was not issued by the ledger of {ledger}",
                self.grant.id, self.grant.device
            ),
            None => write!(
                f,
                "{} on {} was not issued here: no ledger manages that device",
                self.grant.id, self.grant.device
            ),
        }
    }
}

impl Error for ForeignGrant {}

/// A refused ledger operation.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LedgerError {
    /// The request must wait.
    Later(LaterReason),
    /// The request or operation can never succeed on this ledger.
    Never(NeverReason),
    /// A cache charge would exceed the cache cap.
    CacheCapExceeded {
        /// Bytes to charge.
        requested: u64,
        /// Resident cache bytes now.
        resident: u64,
        /// The cap.
        cache_cap: u64,
    },
    /// A cache charge would exceed the bytes nobody has claimed.
    CacheNoRoom {
        /// Bytes to charge.
        requested: u64,
        /// Bytes not held by grants, cache or protection.
        unclaimed: u64,
    },
    /// More cache bytes were evicted, pinned or unpinned than the counter
    /// holds.
    CacheUnderflow {
        /// The counter (`cache_evictable` or `cache_pinned`).
        counter: &'static str,
        /// Bytes asked for.
        requested: u64,
        /// Bytes the counter holds.
        available: u64,
    },
    /// Another waiter already holds this ledger's protection.
    ProtectionHeld {
        /// The holder.
        holder: WaiterId,
    },
    /// The waiter holds no protection on this ledger.
    NotProtected {
        /// The waiter.
        waiter: WaiterId,
    },
    /// The device has no ledger in this service.
    NoSuchDevice {
        /// The ordinal asked for.
        device: DeviceOrdinal,
    },
    /// A counter would overflow or underflow: an accounting bug.
    Accounting {
        /// The counter.
        counter: &'static str,
    },
}

impl fmt::Display for LedgerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LedgerError::Later(LaterReason::SlotsFull {
                active,
                protected_slots,
                max_active,
            }) => write!(
                f,
                "no attempt slot open ({active} active, {protected_slots} protected, limit {max_active})"
            ),
            LedgerError::Later(LaterReason::InsufficientBytes {
                required_floor,
                max_new,
            }) => write!(
                f,
                "required floor {} exceeds max_new {}",
                fmt_bytes(*required_floor),
                fmt_bytes(*max_new)
            ),
            LedgerError::Never(reason) => match reason {
                NeverReason::MissingCapabilities { missing } => {
                    write!(f, "device lacks capabilities {missing}")
                }
                NeverReason::FloorNeverFits {
                    required_floor,
                    largest_possible,
                } => write!(
                    f,
                    "required floor {} exceeds the largest possible grant {}",
                    fmt_bytes(*required_floor),
                    fmt_bytes(*largest_possible)
                ),
                NeverReason::Quarantined { code } => {
                    write!(f, "ledger is quarantined (fault {code})")
                }
                NeverReason::Closed => f.write_str("ledger is closed"),
            },
            LedgerError::CacheCapExceeded {
                requested,
                resident,
                cache_cap,
            } => write!(
                f,
                "charging {} to a cache holding {} exceeds cache_cap {}",
                fmt_bytes(*requested),
                fmt_bytes(*resident),
                fmt_bytes(*cache_cap)
            ),
            LedgerError::CacheNoRoom {
                requested,
                unclaimed,
            } => write!(
                f,
                "charging {} to the cache exceeds the {} nobody has claimed",
                fmt_bytes(*requested),
                fmt_bytes(*unclaimed)
            ),
            LedgerError::CacheUnderflow {
                counter,
                requested,
                available,
            } => write!(
                f,
                "{counter} holds {}, fewer than the {} asked for",
                fmt_bytes(*available),
                fmt_bytes(*requested)
            ),
            LedgerError::ProtectionHeld { holder } => {
                write!(f, "{holder} already holds this ledger's protection")
            }
            LedgerError::NotProtected { waiter } => {
                write!(f, "{waiter} holds no protection on this ledger")
            }
            LedgerError::NoSuchDevice { device } => {
                write!(f, "{device} has no ledger in this service")
            }
            LedgerError::Accounting { counter } => {
                write!(f, "ledger counter `{counter}` would overflow (accounting bug)")
            }
        }
    }
}

impl Error for LedgerError {}

/// A protection as a report shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProtectionSnapshot {
    /// The waiter holding the protection.
    pub waiter: WaiterId,
    /// The bytes it accumulates up to.
    pub target_bytes: u64,
    /// The bytes accumulated so far (the ledger's `protected_bytes`).
    pub accumulated_bytes: u64,
}

/// A snapshot of every counter of one ledger, for observability. The
/// authoritative view of grants, protection, cache charges and whether it admits.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LedgerSnapshot {
    /// The device.
    pub device: DeviceOrdinal,
    /// Whether the ledger admits: admitting, quarantined or closed.
    pub state: LedgerState,
    /// The managed capacity.
    pub managed_capacity: u64,
    /// The attempt floor.
    pub attempt_floor: u64,
    /// The cache cap.
    pub cache_cap: u64,
    /// Bytes committed to running attempts.
    pub live_grants_bytes: u64,
    /// Grants not yet released.
    pub live_grant_count: usize,
    /// Resident, reclaimable cache bytes.
    pub cache_evictable_bytes: u64,
    /// Resident cache bytes in use.
    pub cache_pinned_bytes: u64,
    /// Bytes held for the protected waiter.
    pub protected_bytes: u64,
    /// The protection, if any.
    pub protection: Option<ProtectionSnapshot>,
    /// Attempts running.
    pub active_attempts: u32,
    /// The active-attempt limit.
    pub max_active_attempts: u32,
    /// Open slots not protected for a waiter.
    pub empty_unprotected_slots: u32,
    /// `max_new` for an unhinted request of no protected waiter; `None`
    /// when no slot is open. Health is reported separately.
    pub max_new_bytes: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Protection {
    waiter: WaiterId,
    target: u64,
    accumulated: u64,
}

/// The per-device accounting authority. See the [module docs](self).
///
/// Only the query service's admission core owns ledgers: from outside the
/// crate a ledger can be read (through
/// [`QueryService::ledger_snapshots`](super::QueryService::ledger_snapshots)
/// and placement) but neither created nor made to commit, release or
/// protect bytes, so no caller can forge a grant or free bytes it was not
/// granted.
///
/// ```compile_fail,E0624
/// use admission::gpu::DeviceLedger;
/// // Creating a ledger is crate-private: the service's core owns every one.
/// let _ = DeviceLedger::new;
/// ```
///
/// ```compile_fail,E0624
/// use admission::gpu::{DeviceLedger, GrantRequest};
/// fn forge(ledger: &mut DeviceLedger) {
///     // Committing is crate-private: no bytes leave a ledger except to
///     // a waiter the scheduler admitted.
///     let _ = ledger.commit(&GrantRequest::resource_only(0));
/// }
/// ```
///
/// ```compile_fail,E0603
/// // The core that owns the ledgers and the queue is crate-private too.
/// use admission::gpu::scheduler::AdmissionCore;
/// ```
#[derive(Debug)]
pub(crate) struct DeviceLedger {
    profile: DeviceProfile,
    state: LedgerState,
    live_grants: u64,
    cache_evictable: u64,
    cache_pinned: u64,
    active: u32,
    protection: Option<Protection>,
    // Grant id -> bytes: what `release` checks a grant against.
    grants: BTreeMap<u64, u64>,
    next_grant: u64,
}

// What the formula sees for one requester.
enum Room {
    NoSlot { protected_slots: u32 },
    Bytes(u64),
}

impl DeviceLedger {
    /// An empty, healthy ledger over `profile`.
    pub(crate) fn new(profile: DeviceProfile) -> Self {
        DeviceLedger {
            profile,
            state: LedgerState::Admitting,
            live_grants: 0,
            cache_evictable: 0,
            cache_pinned: 0,
            active: 0,
            protection: None,
            grants: BTreeMap::new(),
            next_grant: 0,
        }
    }

    /// The device's profile.
    pub(crate) fn profile(&self) -> &DeviceProfile {
        &self.profile
    }

    /// The device's ordinal.
    pub(crate) fn device(&self) -> DeviceOrdinal {
        self.profile.ordinal()
    }

    /// Whether the ledger admits.
    pub(crate) fn state(&self) -> LedgerState {
        self.state
    }

    /// The protection's holder, if any.
    pub(crate) fn protection_holder(&self) -> Option<WaiterId> {
        self.protection.map(|p| p.waiter)
    }

    /// `max(attempt floor, request's phase floor)`.
    pub(crate) fn required_floor(&self, request: &GrantRequest) -> u64 {
        self.profile.attempt_floor().max(request.phase_floor)
    }

    /// Decides `request` without changing anything. See the
    /// [module docs](self) for Admit, Later and Never.
    pub(crate) fn decide(&self, request: &GrantRequest) -> Decision {
        match self.state {
            LedgerState::Admitting => {}
            LedgerState::Quarantined { code } => {
                return Decision::Never {
                    reason: NeverReason::Quarantined { code },
                }
            }
            LedgerState::Closed => {
                return Decision::Never {
                    reason: NeverReason::Closed,
                }
            }
        }
        let missing = self
            .profile
            .capabilities()
            .missing(&request.required_capabilities);
        if !missing.is_empty() {
            return Decision::Never {
                reason: NeverReason::MissingCapabilities { missing },
            };
        }
        let required_floor = self.required_floor(request);
        let largest_possible = self.profile.largest_possible_grant();
        if required_floor > largest_possible {
            return Decision::Never {
                reason: NeverReason::FloorNeverFits {
                    required_floor,
                    largest_possible,
                },
            };
        }
        let max_new = match self.room_for(request.waiter) {
            Room::NoSlot { protected_slots } => {
                return Decision::Later {
                    reason: LaterReason::SlotsFull {
                        active: self.active,
                        protected_slots,
                        max_active: self.profile.max_active_attempts(),
                    },
                }
            }
            Room::Bytes(max_new) => max_new,
        };
        if required_floor > max_new {
            return Decision::Later {
                reason: LaterReason::InsufficientBytes {
                    required_floor,
                    max_new,
                },
            };
        }
        let grant_bytes = match request.working_set_hint {
            Some(hint) => hint.clamp(required_floor, max_new),
            None => max_new,
        };
        Decision::Admit { grant_bytes }
    }

    /// Re-decides `request` and, when admissible, takes its slot and grant
    /// in this one call; a protection the requesting waiter holds here is
    /// consumed in the same call.
    pub(crate) fn commit(&mut self, request: &GrantRequest) -> Result<MemoryGrant, LedgerError> {
        let grant_bytes = match self.decide(request) {
            Decision::Admit { grant_bytes } => grant_bytes,
            Decision::Later { reason } => return Err(LedgerError::Later(reason)),
            Decision::Never { reason } => return Err(LedgerError::Never(reason)),
        };
        // Compute every new value before storing any, so a failure leaves
        // the ledger untouched.
        let live_grants = checked(
            self.live_grants.checked_add(grant_bytes),
            "live_grants_bytes",
        )?;
        let active = checked(self.active.checked_add(1), "active_attempts")?;
        let id = self.next_grant;
        let next_grant = checked(self.next_grant.checked_add(1), "next_grant")?;

        self.live_grants = live_grants;
        self.active = active;
        self.next_grant = next_grant;
        self.grants.insert(id, grant_bytes);
        if request.waiter.is_some() && self.protection_holder() == request.waiter {
            self.protection = None;
        }
        Ok(MemoryGrant {
            id: GrantId(id),
            device: self.device(),
            bytes: grant_bytes,
            required_floor: self.required_floor(request),
        })
    }

    /// Returns a grant's bytes and slot. Works in every admission state, so
    /// in-flight grants drain from a quarantined or closed ledger. On a
    /// healthy ledger the freed bytes first top up a protection.
    pub(crate) fn release(&mut self, grant: MemoryGrant) -> Result<ReleaseOutcome, ForeignGrant> {
        let issued_here = grant.device == self.device()
            && self.grants.get(&grant.id.0).copied() == Some(grant.bytes);
        if !issued_here {
            return Err(ForeignGrant::new(grant, Some(self.device())));
        }
        self.grants.remove(&grant.id.0);
        // The grant was in the table, so both counters include it; a failure
        // here is an accounting bug, kept at zero instead of wrapping.
        self.live_grants = self
            .live_grants
            .checked_sub(grant.bytes)
            .unwrap_or_else(|| accounting_bug(0));
        self.active = self
            .active
            .checked_sub(1)
            .unwrap_or_else(|| accounting_bug(0));
        let protection_top_up = self.top_up_protection();
        Ok(ReleaseOutcome {
            grant: grant.id,
            bytes: grant.bytes,
            protection_top_up,
        })
    }

    /// Protects one future slot and up to `floor` bytes (at least the
    /// attempt floor) for `waiter`, claiming the bytes free now at once.
    /// One protection per ledger; refused on a quarantined or closed ledger
    /// and for a floor that can never fit.
    pub(crate) fn protect(
        &mut self,
        waiter: WaiterId,
        floor: u64,
    ) -> Result<ProtectionSnapshot, LedgerError> {
        if let Some(reason) = self.refusing_reason() {
            return Err(LedgerError::Never(reason));
        }
        if let Some(holder) = self.protection_holder() {
            return Err(LedgerError::ProtectionHeld { holder });
        }
        let target = floor.max(self.profile.attempt_floor());
        let largest_possible = self.profile.largest_possible_grant();
        if target > largest_possible {
            return Err(LedgerError::Never(NeverReason::FloorNeverFits {
                required_floor: target,
                largest_possible,
            }));
        }
        self.protection = Some(Protection {
            waiter,
            target,
            accumulated: 0,
        });
        self.top_up_protection();
        let report = self.protection.map(|p| ProtectionSnapshot {
            waiter: p.waiter,
            target_bytes: p.target,
            accumulated_bytes: p.accumulated,
        });
        // Set just above; the fallback is unreachable.
        Ok(report.unwrap_or(ProtectionSnapshot {
            waiter,
            target_bytes: target,
            accumulated_bytes: 0,
        }))
    }

    /// Drops `waiter`'s protection (cancel, deadline, retargeting); returns
    /// the bytes it held.
    pub(crate) fn unprotect(&mut self, waiter: WaiterId) -> Result<u64, LedgerError> {
        match self.protection {
            Some(p) if p.waiter == waiter => {
                self.protection = None;
                Ok(p.accumulated)
            }
            _ => Err(LedgerError::NotProtected { waiter }),
        }
    }

    /// Charges `bytes` of newly resident, evictable cache.
    pub(crate) fn charge_cache(&mut self, bytes: u64) -> Result<(), LedgerError> {
        if let Some(reason) = self.refusing_reason() {
            return Err(LedgerError::Never(reason));
        }
        let resident = checked(
            self.cache_evictable.checked_add(self.cache_pinned),
            "cache_bytes",
        )?;
        // `bytes` is the caller's: a sum past `u64::MAX` is past any cap,
        // which is what the caller needs to hear, not an accounting bug.
        if resident.saturating_add(bytes) > self.profile.cache_cap() {
            return Err(LedgerError::CacheCapExceeded {
                requested: bytes,
                resident,
                cache_cap: self.profile.cache_cap(),
            });
        }
        let claimed = checked(
            self.live_grants
                .checked_add(resident)
                .and_then(|sum| sum.checked_add(self.protected_bytes())),
            "claimed_bytes",
        )?;
        let unclaimed = self.profile.managed_capacity().saturating_sub(claimed);
        if bytes > unclaimed {
            return Err(LedgerError::CacheNoRoom {
                requested: bytes,
                unclaimed,
            });
        }
        self.cache_evictable = checked(
            self.cache_evictable.checked_add(bytes),
            "cache_evictable_bytes",
        )?;
        Ok(())
    }

    /// Evicts `bytes` of evictable cache; freed bytes top up a protection.
    pub(crate) fn evict_cache(&mut self, bytes: u64) -> Result<(), LedgerError> {
        self.cache_evictable = take(self.cache_evictable, bytes, "cache_evictable")?;
        self.top_up_protection();
        Ok(())
    }

    /// Marks `bytes` of evictable cache as pinned (in use).
    pub(crate) fn pin_cache(&mut self, bytes: u64) -> Result<(), LedgerError> {
        let evictable = take(self.cache_evictable, bytes, "cache_evictable")?;
        let pinned = checked(self.cache_pinned.checked_add(bytes), "cache_pinned")?;
        self.cache_evictable = evictable;
        self.cache_pinned = pinned;
        Ok(())
    }

    /// Makes `bytes` of pinned cache evictable again.
    pub(crate) fn unpin_cache(&mut self, bytes: u64) -> Result<(), LedgerError> {
        let pinned = take(self.cache_pinned, bytes, "cache_pinned")?;
        let evictable = checked(self.cache_evictable.checked_add(bytes), "cache_evictable")?;
        self.cache_pinned = pinned;
        self.cache_evictable = evictable;
        Ok(())
    }

    /// Quarantines the ledger after a proven device-local fault: nothing new
    /// is issued, in-flight grants drain. A closed ledger stays closed and a
    /// quarantined one keeps its first code. Returns the holder of a
    /// dropped protection, to be retargeted.
    pub(crate) fn quarantine(&mut self, code: u32) -> Option<WaiterId> {
        if self.state == LedgerState::Admitting {
            self.state = LedgerState::Quarantined { code };
        }
        self.protection.take().map(|p| p.waiter)
    }

    /// Returns a quarantined ledger to service (the operator's reinstatement
    /// after a device reset, once a health probe passed). Whether it was
    /// quarantined; a closed ledger stays closed.
    pub(crate) fn reinstate(&mut self) -> bool {
        let quarantined = matches!(self.state, LedgerState::Quarantined { .. });
        if quarantined {
            self.state = LedgerState::Admitting;
        }
        quarantined
    }

    /// Closes the ledger: nothing new is issued, in-flight grants drain.
    /// Returns the holder of a dropped protection, to be retargeted.
    pub(crate) fn close(&mut self) -> Option<WaiterId> {
        self.state = LedgerState::Closed;
        self.protection.take().map(|p| p.waiter)
    }

    /// A snapshot of every counter.
    pub(crate) fn snapshot(&self) -> LedgerSnapshot {
        let max_new_bytes = match self.room_for(None) {
            Room::Bytes(bytes) => Some(bytes),
            Room::NoSlot { .. } => None,
        };
        LedgerSnapshot {
            device: self.device(),
            state: self.state,
            managed_capacity: self.profile.managed_capacity(),
            attempt_floor: self.profile.attempt_floor(),
            cache_cap: self.profile.cache_cap(),
            live_grants_bytes: self.live_grants,
            live_grant_count: self.grants.len(),
            cache_evictable_bytes: self.cache_evictable,
            cache_pinned_bytes: self.cache_pinned,
            protected_bytes: self.protected_bytes(),
            protection: self.protection.map(|p| ProtectionSnapshot {
                waiter: p.waiter,
                target_bytes: p.target,
                accumulated_bytes: p.accumulated,
            }),
            active_attempts: self.active,
            max_active_attempts: self.profile.max_active_attempts(),
            empty_unprotected_slots: self.empty_unprotected_slots(),
            max_new_bytes,
        }
    }

    fn refusing_reason(&self) -> Option<NeverReason> {
        match self.state {
            LedgerState::Admitting => None,
            LedgerState::Quarantined { code } => Some(NeverReason::Quarantined { code }),
            LedgerState::Closed => Some(NeverReason::Closed),
        }
    }

    fn protected_bytes(&self) -> u64 {
        self.protection.map_or(0, |p| p.accumulated)
    }

    fn protected_slots(&self) -> u32 {
        u32::from(self.protection.is_some())
    }

    // Open slots nobody runs in or protects; zero when a protection waits
    // for a slot that is still running.
    fn empty_unprotected_slots(&self) -> u32 {
        self.profile
            .max_active_attempts()
            .saturating_sub(self.active.saturating_add(self.protected_slots()))
    }

    /// The slot check and `max_new` for a request by `waiter`.
    fn room_for(&self, waiter: Option<WaiterId>) -> Room {
        let own = waiter.is_some() && self.protection_holder() == waiter;
        let (protected_slots, protected_bytes) = if own {
            (0, 0)
        } else {
            (self.protected_slots(), self.protected_bytes())
        };
        // In u64, so that a limit of `u32::MAX` slots cannot overflow it.
        let taken_after = u64::from(self.active) + u64::from(protected_slots) + 1;
        let Some(empty_after) =
            u64::from(self.profile.max_active_attempts()).checked_sub(taken_after)
        else {
            return Room::NoSlot { protected_slots };
        };
        // Saturating sums are exact here: anything past `u64::MAX` is past
        // the capacity too, and leaves no room (a profile near `u64::MAX`
        // bytes is legal and must not read as an accounting bug).
        let headroom = self.profile.attempt_floor().saturating_mul(empty_after);
        let spoken_for = self
            .live_grants
            .saturating_add(self.cache_evictable)
            .saturating_add(self.cache_pinned)
            .saturating_add(protected_bytes)
            .saturating_add(headroom);
        // Cache may have grown into open-slot headroom: then nothing is left.
        Room::Bytes(self.profile.managed_capacity().saturating_sub(spoken_for))
    }

    /// Moves free bytes into the protection, up to its target; returns how
    /// many moved. Free: not held by grants, cache, the protection or the
    /// headroom of open unprotected slots.
    fn top_up_protection(&mut self) -> u64 {
        if self.state != LedgerState::Admitting {
            return 0;
        }
        let Some(mut protection) = self.protection else {
            return 0;
        };
        // Saturating, as in `room_for`: a sum past `u64::MAX` leaves nothing
        // free, which is exactly what the capacity minus it says.
        let headroom = self
            .profile
            .attempt_floor()
            .saturating_mul(u64::from(self.empty_unprotected_slots()));
        let spoken_for = self
            .live_grants
            .saturating_add(self.cache_evictable)
            .saturating_add(self.cache_pinned)
            .saturating_add(protection.accumulated)
            .saturating_add(headroom);
        let free = self.profile.managed_capacity().saturating_sub(spoken_for);
        let wanted = protection.target.saturating_sub(protection.accumulated);
        let moved = free.min(wanted);
        // accumulated + moved <= target, so this cannot overflow.
        protection.accumulated = protection.accumulated.saturating_add(moved);
        self.protection = Some(protection);
        moved
    }
}

fn checked<T>(value: Option<T>, counter: &'static str) -> Result<T, LedgerError> {
    value.ok_or_else(|| accounting_bug(LedgerError::Accounting { counter }))
}

fn take(from: u64, bytes: u64, counter: &'static str) -> Result<u64, LedgerError> {
    from.checked_sub(bytes).ok_or(LedgerError::CacheUnderflow {
        counter,
        requested: bytes,
        available: from,
    })
}

// A counter broke its invariant: the crate's bug, never the caller's (every
// sum a caller's value enters is checked against its limit first, or
// saturates where saturation is exact). Logged and answered with the
// fallback, a typed error or a zero, rather than a panic: a ledger that
// panics under the service's lock would take every admission with it.
fn accounting_bug<T>(fallback: T) -> T {
    tracing::error!(target: "admission", "device ledger accounting invariant broken");
    fallback
}

#[cfg(all(test, not(loom)))]
#[path = "ledger_tests.rs"]
mod tests;
