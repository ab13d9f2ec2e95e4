//! Device profiles, memory ownership and queue bounds: everything admission
//! may spend, declared once at construction.
//!
//! # Why declared, not measured
//!
//! Admission arithmetic runs over numbers an operator declared, never over
//! live CUDA free-memory samples: a sample is stale the moment it is read and
//! other processes move it, so it cannot prove that a grant fits. A
//! [`DeviceProfile`] fixes, per CUDA ordinal, the managed capacity the
//! [`DeviceLedger`](super::ledger::DeviceLedger) accounts for and the bounds
//! an attempt may take. It is immutable after [`DeviceProfileBuilder::build`]
//! and validated there, so the hot path never re-checks it.
//!
//! # Pool, reserve and ownership
//!
//! `managed_capacity` is the pool the ledger spends. `backend_reserve` is
//! device memory kept *outside* that pool for the backend itself (context,
//! driver workspace) and, when the device is shared, for external users. A
//! [`MemoryOwnership`] declaration per ordinal says which: the device is
//! exclusive to this process, or shared with external users whose bytes must
//! fit within the reserve. [`DeviceSet::new`] insists on exactly one
//! declaration per profile, so a shared device cannot be configured by
//! omission.
//!
//! # The attempt floor
//!
//! The floor is the guaranteed share: no grant is smaller, and the ledger
//! keeps one floor of headroom per open attempt slot. Unset, it defaults to
//! `managed_capacity / max(8, max_active_attempts)`. A profile whose floor
//! times its attempt limit exceeds the capacity could never admit a single
//! attempt (the first admission must leave a floor for every other slot),
//! so it is refused at construction.

use std::fmt;
use std::time::Duration;

use super::backend::DeviceOrdinal;
use super::proof::CapabilitySet;
use crate::error::ConfigError;

/// Formats a byte count in the largest binary unit that divides it exactly,
/// for messages (`80 GiB`, `1536 MiB`, `80000000000 bytes`). Smaller units
/// would turn decimal sizes into unreadable KiB counts.
pub(crate) fn fmt_bytes(bytes: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB")];
    for (size, unit) in UNITS {
        if bytes >= size && bytes % size == 0 {
            return format!("{} {unit}", bytes / size);
        }
    }
    format!("{bytes} bytes")
}

/// The immutable resource profile of one device. See the
/// [`gpu` module documentation](crate::gpu).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceProfile {
    ordinal: DeviceOrdinal,
    managed_capacity: u64,
    backend_reserve: u64,
    cache_cap: u64,
    attempt_floor: u64,
    max_active_attempts: u32,
    source_work_allowance: u32,
    streams_per_attempt: u32,
    workers_per_attempt: u32,
    lanes_per_attempt: u32,
    capabilities: CapabilitySet,
}

impl DeviceProfile {
    /// A builder for the profile of `ordinal`. Only `managed_capacity` has
    /// no default.
    pub fn builder(ordinal: DeviceOrdinal) -> DeviceProfileBuilder {
        DeviceProfileBuilder {
            ordinal,
            managed_capacity: None,
            backend_reserve: 0,
            cache_cap: 0,
            attempt_floor: None,
            max_active_attempts: 4,
            source_work_allowance: 1,
            streams_per_attempt: 1,
            workers_per_attempt: 1,
            lanes_per_attempt: 1,
            capabilities: CapabilitySet::default(),
        }
    }

    /// The device's ordinal.
    pub fn ordinal(&self) -> DeviceOrdinal {
        self.ordinal
    }

    /// The device-byte pool the ledger accounts for.
    pub(crate) fn managed_capacity(&self) -> u64 {
        self.managed_capacity
    }

    /// Device bytes kept outside the pool for the backend (and, on a shared
    /// device, for external users).
    #[cfg(all(test, feature = "config"))]
    pub(crate) fn backend_reserve(&self) -> u64 {
        self.backend_reserve
    }

    /// Checks this profile against its device's total memory, as the
    /// backend reports it at start-up: the managed capacity plus the
    /// backend reserve must fit. A pure function of the two numbers (the
    /// query service calls it for every profiled device when it is built),
    /// so a profile written for a larger device is refused before any
    /// grant could promise bytes the device does not have.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming `managed_capacity` when the pool alone exceeds
    /// `total_bytes`, and `backend_reserve` when the pool fits but the pool
    /// plus the reserve does not.
    pub(crate) fn check_device_memory(&self, total_bytes: u64) -> Result<(), ConfigError> {
        let device = self.ordinal;
        if self.managed_capacity > total_bytes {
            return Err(ConfigError::new(
                "managed_capacity",
                format!(
                    "{} exceeds the {} of device memory on {device}",
                    fmt_bytes(self.managed_capacity),
                    fmt_bytes(total_bytes)
                ),
            ));
        }
        let fits = self
            .managed_capacity
            .checked_add(self.backend_reserve)
            .is_some_and(|needed| needed <= total_bytes);
        if !fits {
            return Err(ConfigError::new(
                "backend_reserve",
                format!(
                    "{} plus managed_capacity {} exceeds the {} of device memory on {device}",
                    fmt_bytes(self.backend_reserve),
                    fmt_bytes(self.managed_capacity),
                    fmt_bytes(total_bytes)
                ),
            ));
        }
        Ok(())
    }

    /// The ceiling for resident cache bytes (evictable plus pinned).
    pub(crate) fn cache_cap(&self) -> u64 {
        self.cache_cap
    }

    /// The minimum grant of an admitted attempt, and the headroom kept per
    /// open slot.
    pub(crate) fn attempt_floor(&self) -> u64 {
        self.attempt_floor
    }

    /// How many attempts may run on the device at once.
    pub(crate) fn max_active_attempts(&self) -> u32 {
        self.max_active_attempts
    }

    /// Concurrent source reads per attempt.
    pub(crate) fn source_work_allowance(&self) -> u32 {
        self.source_work_allowance
    }

    /// Streams an attempt's envelope may hold (its root stream included).
    pub(crate) fn streams_per_attempt(&self) -> u32 {
        self.streams_per_attempt
    }

    /// Device-worker registrations an attempt's envelope may hold.
    pub(crate) fn workers_per_attempt(&self) -> u32 {
        self.workers_per_attempt
    }

    /// Attempt lanes an attempt's envelope may hold.
    pub(crate) fn lanes_per_attempt(&self) -> u32 {
        self.lanes_per_attempt
    }

    /// The plan capabilities this device can satisfy.
    pub(crate) fn capabilities(&self) -> &CapabilitySet {
        &self.capabilities
    }

    /// The largest grant this device could ever issue: `max_new` on an
    /// empty ledger (no grants, cache or protection), which still keeps a
    /// floor for every other slot. A required floor above this can never
    /// fit, however long the request waits.
    pub(crate) fn largest_possible_grant(&self) -> u64 {
        let other_slots = u64::from(self.max_active_attempts.saturating_sub(1));
        // Validated at build: floor * max_active <= capacity, so neither
        // step can fail; the fallback only keeps release builds panic-free.
        self.attempt_floor
            .checked_mul(other_slots)
            .and_then(|reserved| self.managed_capacity.checked_sub(reserved))
            .unwrap_or(0)
    }
}

/// Builds a [`DeviceProfile`]; see [`DeviceProfile::builder`].
#[derive(Clone, Debug)]
pub struct DeviceProfileBuilder {
    ordinal: DeviceOrdinal,
    managed_capacity: Option<u64>,
    backend_reserve: u64,
    cache_cap: u64,
    attempt_floor: Option<u64>,
    max_active_attempts: u32,
    source_work_allowance: u32,
    streams_per_attempt: u32,
    workers_per_attempt: u32,
    lanes_per_attempt: u32,
    capabilities: CapabilitySet,
}

impl DeviceProfileBuilder {
    /// The device-byte pool the ledger accounts for. Required.
    pub fn managed_capacity(mut self, bytes: u64) -> Self {
        self.managed_capacity = Some(bytes);
        self
    }

    /// Bytes kept outside the pool for the backend. Default 0.
    pub fn backend_reserve(mut self, bytes: u64) -> Self {
        self.backend_reserve = bytes;
        self
    }

    /// The ceiling for resident cache bytes. Default 0 (no cache).
    pub fn cache_cap(mut self, bytes: u64) -> Self {
        self.cache_cap = bytes;
        self
    }

    /// The attempt floor. Default `managed_capacity / max(8,
    /// max_active_attempts)`.
    pub fn attempt_floor(mut self, bytes: u64) -> Self {
        self.attempt_floor = Some(bytes);
        self
    }

    /// The active-attempt limit. Default 4.
    pub fn max_active_attempts(mut self, limit: u32) -> Self {
        self.max_active_attempts = limit;
        self
    }

    /// Concurrent source reads per attempt. Default 1.
    pub fn source_work_allowance(mut self, reads: u32) -> Self {
        self.source_work_allowance = reads;
        self
    }

    /// Streams per attempt. Default 1.
    pub fn streams_per_attempt(mut self, streams: u32) -> Self {
        self.streams_per_attempt = streams;
        self
    }

    /// Device-worker registrations per attempt. Default 1.
    pub fn workers_per_attempt(mut self, workers: u32) -> Self {
        self.workers_per_attempt = workers;
        self
    }

    /// Attempt lanes per attempt. Default 1.
    pub fn lanes_per_attempt(mut self, lanes: u32) -> Self {
        self.lanes_per_attempt = lanes;
        self
    }

    /// The capabilities the device offers. Default none.
    pub fn capabilities(mut self, capabilities: CapabilitySet) -> Self {
        self.capabilities = capabilities;
        self
    }

    /// Validates the profile.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the field at fault, with the device:
    /// `managed_capacity` when unset or zero; `max_active_attempts`,
    /// `source_work_allowance`, `streams_per_attempt`, `workers_per_attempt`
    /// or `lanes_per_attempt` when zero; `backend_reserve` or `cache_cap`
    /// when over the managed capacity; `attempt_floor` when it (set or
    /// defaulted) is zero, exceeds the managed capacity, or times
    /// `max_active_attempts` does.
    ///
    /// # Examples
    ///
    /// ```
    /// use admission::gpu::backend::DeviceOrdinal;
    /// use admission::gpu::DeviceProfile;
    ///
    /// const GIB: u64 = 1 << 30;
    /// // Without an attempt floor, the floor is derived: capacity / 8.
    /// let profile = DeviceProfile::builder(DeviceOrdinal(0))
    ///     .managed_capacity(72 * GIB)
    ///     .backend_reserve(4 * GIB)
    ///     .max_active_attempts(4)
    ///     .build();
    /// assert!(profile.is_ok());
    ///
    /// // An attempt floor no slot count can honour names its field.
    /// let error = DeviceProfile::builder(DeviceOrdinal(0))
    ///     .managed_capacity(8 * GIB)
    ///     .max_active_attempts(4)
    ///     .attempt_floor(4 * GIB)
    ///     .build()
    ///     .unwrap_err();
    /// assert_eq!(error.field(), "attempt_floor");
    /// ```
    pub fn build(self) -> Result<DeviceProfile, ConfigError> {
        let device = self.ordinal;
        let capacity = match self.managed_capacity {
            None => {
                return Err(ConfigError::new(
                    "managed_capacity",
                    format!("is required on {device}"),
                ))
            }
            Some(0) => {
                return Err(ConfigError::new(
                    "managed_capacity",
                    format!("must be greater than zero on {device}"),
                ))
            }
            Some(bytes) => bytes,
        };
        for (field, value) in [
            ("max_active_attempts", self.max_active_attempts),
            ("source_work_allowance", self.source_work_allowance),
            ("streams_per_attempt", self.streams_per_attempt),
            ("workers_per_attempt", self.workers_per_attempt),
            ("lanes_per_attempt", self.lanes_per_attempt),
        ] {
            if value == 0 {
                return Err(ConfigError::new(
                    field,
                    format!("must be at least 1 on {device}"),
                ));
            }
        }
        if self.backend_reserve > capacity {
            return Err(ConfigError::new(
                "backend_reserve",
                format!(
                    "{} exceeds managed_capacity {} on {device}",
                    fmt_bytes(self.backend_reserve),
                    fmt_bytes(capacity)
                ),
            ));
        }
        if self.cache_cap > capacity {
            return Err(ConfigError::new(
                "cache_cap",
                format!(
                    "{} exceeds managed_capacity {} on {device}",
                    fmt_bytes(self.cache_cap),
                    fmt_bytes(capacity)
                ),
            ));
        }
        let shares = u64::from(self.max_active_attempts.max(8));
        let floor = self.attempt_floor.unwrap_or(capacity / shares);
        if floor == 0 {
            return Err(ConfigError::new(
                "attempt_floor",
                format!(
                    "is zero on {device}; an attempt must be guaranteed some memory \
                     (raise managed_capacity or set attempt_floor)"
                ),
            ));
        }
        if floor > capacity {
            return Err(ConfigError::new(
                "attempt_floor",
                format!(
                    "{} exceeds managed_capacity {} on {device}",
                    fmt_bytes(floor),
                    fmt_bytes(capacity)
                ),
            ));
        }
        let all_slots = u64::from(self.max_active_attempts);
        match floor.checked_mul(all_slots) {
            Some(total) if total <= capacity => {}
            _ => {
                return Err(ConfigError::new(
                    "attempt_floor",
                    format!(
                        "{} for each of {} attempt slots exceeds managed_capacity {} on {device}; \
                         no attempt could ever be admitted",
                        fmt_bytes(floor),
                        self.max_active_attempts,
                        fmt_bytes(capacity)
                    ),
                ))
            }
        }
        Ok(DeviceProfile {
            ordinal: device,
            managed_capacity: capacity,
            backend_reserve: self.backend_reserve,
            cache_cap: self.cache_cap,
            attempt_floor: floor,
            max_active_attempts: self.max_active_attempts,
            source_work_allowance: self.source_work_allowance,
            streams_per_attempt: self.streams_per_attempt,
            workers_per_attempt: self.workers_per_attempt,
            lanes_per_attempt: self.lanes_per_attempt,
            capabilities: self.capabilities,
        })
    }
}

/// Who else uses a device's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OwnershipMode {
    /// Only this process allocates on the device.
    Exclusive,
    /// External users (other processes) also allocate on the device; their
    /// bytes must fit within the profile's backend reserve, because the
    /// managed pool is spent by this process alone.
    Shared {
        /// The most device bytes external users may hold.
        external_bytes: u64,
    },
}

/// The memory-ownership declaration of one ordinal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryOwnership {
    ordinal: DeviceOrdinal,
    mode: OwnershipMode,
}

impl MemoryOwnership {
    /// `ordinal` is used by this process alone.
    pub fn exclusive(ordinal: DeviceOrdinal) -> Self {
        MemoryOwnership {
            ordinal,
            mode: OwnershipMode::Exclusive,
        }
    }

    /// `ordinal` is shared with external users holding up to
    /// `external_bytes`.
    pub fn shared(ordinal: DeviceOrdinal, external_bytes: u64) -> Self {
        MemoryOwnership {
            ordinal,
            mode: OwnershipMode::Shared { external_bytes },
        }
    }

    /// The ordinal declared.
    pub(crate) fn ordinal(&self) -> DeviceOrdinal {
        self.ordinal
    }

    /// The declared mode.
    #[cfg(test)]
    pub(crate) fn mode(&self) -> OwnershipMode {
        self.mode
    }
}

/// The installed devices: one validated profile and one matching ownership
/// declaration per ordinal, in ordinal order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceSet {
    devices: Vec<(DeviceProfile, MemoryOwnership)>,
}

impl DeviceSet {
    /// The in-crate tests' and loom models' usual device: ordinal 0,
    /// exclusive, 16 GiB managed, `max_active` attempt slots.
    #[cfg(any(test, loom))]
    pub(crate) fn one_16_gib_device(max_active: u32) -> DeviceSet {
        let gpu0 = DeviceOrdinal(0);
        let profile = DeviceProfile::builder(gpu0)
            .managed_capacity(16 << 30)
            .max_active_attempts(max_active)
            .build()
            .expect("a valid profile");
        DeviceSet::new(vec![profile], vec![MemoryOwnership::exclusive(gpu0)])
            .expect("one profile, one ownership")
    }

    /// Pairs each profile with its ownership declaration.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming `device_profiles` for an empty set or an
    /// ordinal with two profiles; `memory_ownership` for an ordinal with two
    /// declarations, a declaration without a profile or a profile without a
    /// declaration; `external_bytes` when a shared device's external bytes
    /// exceed its backend reserve.
    ///
    /// # Examples
    ///
    /// ```
    /// use admission::gpu::backend::DeviceOrdinal;
    /// use admission::gpu::{DeviceProfile, DeviceSet, MemoryOwnership};
    ///
    /// const GIB: u64 = 1 << 30;
    /// let profile = |n| {
    ///     DeviceProfile::builder(DeviceOrdinal(n))
    ///         .managed_capacity(24 * GIB)
    ///         // Room outside the pool, where another process's bytes must fit.
    ///         .backend_reserve(4 * GIB)
    ///         .build()
    /// };
    /// let devices = DeviceSet::new(
    ///     vec![profile(1).unwrap(), profile(0).unwrap()],
    ///     vec![
    ///         MemoryOwnership::exclusive(DeviceOrdinal(0)),
    ///         // Another process may hold up to 2 GiB of this one.
    ///         MemoryOwnership::shared(DeviceOrdinal(1), 2 * GIB),
    ///     ],
    /// )
    /// .unwrap();
    /// assert_eq!(devices.ordinals(), vec![DeviceOrdinal(0), DeviceOrdinal(1)]);
    ///
    /// // Every profile needs its ownership declaration.
    /// assert!(DeviceSet::new(vec![profile(0).unwrap()], vec![]).is_err());
    /// ```
    pub fn new(
        profiles: Vec<DeviceProfile>,
        ownerships: Vec<MemoryOwnership>,
    ) -> Result<DeviceSet, ConfigError> {
        if profiles.is_empty() {
            return Err(ConfigError::new(
                "device_profiles",
                "at least one device profile is required",
            ));
        }
        let mut profiles = profiles;
        profiles.sort_by_key(DeviceProfile::ordinal);
        if let Some(pair) = profiles.windows(2).find(|w| w[0].ordinal == w[1].ordinal) {
            return Err(ConfigError::new(
                "device_profiles",
                format!("{} has more than one profile", pair[0].ordinal),
            ));
        }
        let mut ownerships = ownerships;
        ownerships.sort_by_key(MemoryOwnership::ordinal);
        if let Some(pair) = ownerships.windows(2).find(|w| w[0].ordinal == w[1].ordinal) {
            return Err(ConfigError::new(
                "memory_ownership",
                format!(
                    "{} has more than one ownership declaration",
                    pair[0].ordinal
                ),
            ));
        }
        if let Some(extra) = ownerships.iter().find(|o| {
            profiles
                .binary_search_by_key(&o.ordinal, DeviceProfile::ordinal)
                .is_err()
        }) {
            return Err(ConfigError::new(
                "memory_ownership",
                format!("{} is declared but has no device profile", extra.ordinal),
            ));
        }
        let mut devices = Vec::with_capacity(profiles.len());
        for profile in profiles {
            let Ok(i) = ownerships.binary_search_by_key(&profile.ordinal, MemoryOwnership::ordinal)
            else {
                return Err(ConfigError::new(
                    "memory_ownership",
                    format!(
                        "{} has a profile but no ownership declaration",
                        profile.ordinal
                    ),
                ));
            };
            let ownership = ownerships[i];
            if let OwnershipMode::Shared { external_bytes } = ownership.mode {
                if external_bytes > profile.backend_reserve {
                    return Err(ConfigError::new(
                        "external_bytes",
                        format!(
                            "{} of external use on shared {} exceeds its backend_reserve {}",
                            fmt_bytes(external_bytes),
                            profile.ordinal,
                            fmt_bytes(profile.backend_reserve)
                        ),
                    ));
                }
            }
            devices.push((profile, ownership));
        }
        Ok(DeviceSet { devices })
    }

    /// The profiles in ordinal order.
    pub(crate) fn profiles(&self) -> impl Iterator<Item = &DeviceProfile> {
        self.devices.iter().map(|(profile, _)| profile)
    }

    /// The profile of `ordinal`, if installed.
    pub(crate) fn profile(&self, ordinal: DeviceOrdinal) -> Option<&DeviceProfile> {
        self.find(ordinal).map(|(profile, _)| profile)
    }

    /// The ownership declaration of `ordinal`, if installed.
    #[cfg(test)]
    pub(crate) fn ownership(&self, ordinal: DeviceOrdinal) -> Option<&MemoryOwnership> {
        self.find(ordinal).map(|(_, ownership)| ownership)
    }

    /// The installed ordinals, ascending.
    pub fn ordinals(&self) -> Vec<DeviceOrdinal> {
        self.profiles().map(DeviceProfile::ordinal).collect()
    }

    /// How many devices are installed (never zero).
    pub(crate) fn len(&self) -> usize {
        self.devices.len()
    }

    fn find(&self, ordinal: DeviceOrdinal) -> Option<&(DeviceProfile, MemoryOwnership)> {
        self.devices
            .binary_search_by_key(&ordinal, |(p, _)| p.ordinal)
            .ok()
            .and_then(|i| self.devices.get(i))
    }
}

/// The three bounds of the one GPU admission queue across all devices. The
/// queue itself lives in the query service; only its bounds are declared
/// here, next to the device profiles they complement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueBounds {
    max_pending: usize,
    max_wait: Duration,
    overtake_budget: u32,
}

impl QueueBounds {
    /// Validated bounds: `max_pending` (queued plus pending-preflight
    /// requests) and `max_wait` must be non-zero. An `overtake_budget` of 0
    /// is strict FIFO: the first time younger work would pass a blocked
    /// waiter, the waiter protects a slot instead.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming `max_pending` when it is zero, or `max_wait`
    /// when it is zero.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// use admission::gpu::QueueBounds;
    ///
    /// assert!(QueueBounds::new(64, Duration::from_secs(30), 4).is_ok());
    /// // A queue that can hold nobody is a configuration error.
    /// assert!(QueueBounds::new(0, Duration::from_secs(30), 4).is_err());
    /// ```
    pub fn new(
        max_pending: usize,
        max_wait: Duration,
        overtake_budget: u32,
    ) -> Result<QueueBounds, ConfigError> {
        if max_pending == 0 {
            return Err(ConfigError::new(
                "max_pending",
                "must be at least 1 (queued plus pending-preflight requests)",
            ));
        }
        if max_wait.is_zero() {
            return Err(ConfigError::new("max_wait", "must be greater than zero"));
        }
        Ok(QueueBounds {
            max_pending,
            max_wait,
            overtake_budget,
        })
    }

    /// The most queued plus pending-preflight requests.
    pub(crate) fn max_pending(&self) -> usize {
        self.max_pending
    }

    /// The longest a request may wait.
    pub(crate) fn max_wait(&self) -> Duration {
        self.max_wait
    }

    /// How many times younger runnable work may be admitted past a blocked
    /// older waiter before it protects a slot.
    pub(crate) fn overtake_budget(&self) -> u32 {
        self.overtake_budget
    }
}

impl fmt::Display for QueueBounds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "max_pending {}, max_wait {:?}, overtake_budget {}",
            self.max_pending, self.max_wait, self.overtake_budget
        )
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn an_unset_attempt_floor_is_an_eighth_of_the_capacity() {
        let profile = DeviceProfile::builder(DeviceOrdinal(0))
            .managed_capacity(72 * GIB)
            .backend_reserve(4 * GIB)
            .max_active_attempts(4)
            .build()
            .unwrap();
        assert_eq!(profile.attempt_floor(), 9 * GIB);
    }

    #[test]
    fn capacity_plus_reserve_must_fit_the_device_memory() {
        // (managed_capacity, backend_reserve, device total, the field at fault)
        let rows: [(u64, u64, u64, Option<&str>); 7] = [
            (72 * GIB, 4 * GIB, 80 * GIB, None),
            (76 * GIB, 4 * GIB, 80 * GIB, None),
            (77 * GIB, 4 * GIB, 80 * GIB, Some("backend_reserve")),
            (80 * GIB, 0, 80 * GIB, None),
            (80 * GIB, 1, 80 * GIB, Some("backend_reserve")),
            (81 * GIB, 0, 80 * GIB, Some("managed_capacity")),
            // The sum overflows: still the reserve's fault, never a wrap.
            (u64::MAX, u64::MAX, u64::MAX, Some("backend_reserve")),
        ];
        for (capacity, reserve, total, field) in rows {
            let profile = DeviceProfile::builder(DeviceOrdinal(1))
                .managed_capacity(capacity)
                .backend_reserve(reserve)
                .build()
                .unwrap();
            let checked = profile.check_device_memory(total);
            assert_eq!(
                checked.as_ref().err().map(ConfigError::field),
                field,
                "{capacity} + {reserve} on {total}: {checked:?}"
            );
            if let Err(error) = checked {
                assert!(error.to_string().contains("gpu1"), "{error}");
            }
        }
    }
}
