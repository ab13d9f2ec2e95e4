//! Placement: which device one request goes to.
//!
//! Two questions, asked at two moments:
//!
//! * **At submission**, [`compatible_devices`] asks whether the request can
//!   *ever* run here: some installed device must offer every required
//!   capability, and the required floor must fit the largest grant such a
//!   device could issue when empty. Otherwise the request is rejected at
//!   once with a capability or configuration error; queueing never makes
//!   an impossible request admissible.
//! * **At scheduling**, [`rank_devices`] orders the devices where the
//!   request is admissible *now*. Only devices whose
//!   [`decide`](super::ledger::DeviceLedger::decide) says Admit take part,
//!   ranked by
//!   1. spare bytes after admission, descending;
//!   2. active attempts, live grants, worker depth, ascending;
//!   3. stream availability, descending;
//!   4. ordinal, ascending,
//!
//!   so work spreads to the device with the most room left, and every tie
//!   is broken deterministically. Worker depth and stream availability are
//!   the service's observations ([`DeviceLoad`]), not ledger state.
//!
//! *Spare bytes after admission* is the managed capacity minus live grants,
//! resident cache, bytes protected for another waiter and the grant itself:
//! what the device has left unclaimed (its open-slot headroom included) if
//! this request lands there.

use std::cmp::Reverse;

use super::backend::DeviceOrdinal;
use super::ledger::{Decision, DeviceLedger, GrantRequest};
use super::outcome::GpuAdmitError;
use super::profile::DeviceProfile;

/// The service's view of a device's execution load, an input to ranking.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct DeviceLoad {
    /// Work queued on the device's worker thread.
    pub worker_depth: u32,
    /// Streams the device can still hand out.
    pub available_streams: u32,
}

/// One admissible device, with the grant it would issue and its ranking
/// keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RankedDevice {
    /// The device.
    pub device: DeviceOrdinal,
    /// The grant a commit would issue now.
    pub grant_bytes: u64,
    /// Unclaimed bytes left on the device after this grant.
    pub spare_bytes_after: u64,
    /// Attempts running.
    pub active_attempts: u32,
    /// Bytes committed to running attempts.
    pub live_grants_bytes: u64,
    /// Work queued on the device's worker thread.
    pub worker_depth: u32,
    /// Streams the device can still hand out.
    pub available_streams: u32,
}

/// Orders the devices where `request` is admissible now, best first. See
/// the [module docs](self) for the keys.
pub(crate) fn rank_devices<'a>(
    request: &GrantRequest,
    candidates: impl IntoIterator<Item = (&'a DeviceLedger, DeviceLoad)>,
) -> Vec<RankedDevice> {
    let mut ranked: Vec<RankedDevice> = candidates
        .into_iter()
        .filter_map(|(ledger, load)| {
            let Decision::Admit { grant_bytes } = ledger.decide(request) else {
                return None;
            };
            let report = ledger.snapshot();
            let others_protected = match report.protection {
                Some(p) if Some(p.waiter) == request.waiter() => 0,
                Some(p) => p.accumulated_bytes,
                None => 0,
            };
            // Admit guarantees these sums fit in the capacity; saturation
            // only guards a broken ledger from ranking it first.
            let claimed = report
                .live_grants_bytes
                .saturating_add(report.cache_evictable_bytes)
                .saturating_add(report.cache_pinned_bytes)
                .saturating_add(others_protected)
                .saturating_add(grant_bytes);
            Some(RankedDevice {
                device: report.device,
                grant_bytes,
                spare_bytes_after: report.managed_capacity.saturating_sub(claimed),
                active_attempts: report.active_attempts,
                live_grants_bytes: report.live_grants_bytes,
                worker_depth: load.worker_depth,
                available_streams: load.available_streams,
            })
        })
        .collect();
    ranked.sort_by_key(|d| {
        (
            Reverse(d.spare_bytes_after),
            d.active_attempts,
            d.live_grants_bytes,
            d.worker_depth,
            Reverse(d.available_streams),
            d.device,
        )
    });
    ranked
}

/// The installed devices `request` could ever run on, in ordinal order: they
/// offer every required capability and their largest possible grant covers
/// the required floor. Health is not considered here (the service reports a
/// lost or quarantined device separately).
///
/// # Errors
///
/// [`GpuAdmitError::NoCapableDevice`] naming the capabilities missing on the
/// closest device (the one lacking fewest, lowest ordinal on a tie), or
/// [`GpuAdmitError::FloorNeverFits`] against the largest grant any
/// compatible device could issue.
pub(crate) fn compatible_devices<'a>(
    request: &GrantRequest,
    profiles: impl IntoIterator<Item = &'a DeviceProfile>,
) -> Result<Vec<DeviceOrdinal>, GpuAdmitError> {
    let mut profiles: Vec<&DeviceProfile> = profiles.into_iter().collect();
    profiles.sort_by_key(|p| p.ordinal());
    let required = request.required_capabilities();
    let capable: Vec<&DeviceProfile> = profiles
        .iter()
        .copied()
        .filter(|p| p.capabilities().satisfies(required))
        .collect();
    if capable.is_empty() {
        let missing = profiles
            .iter()
            .map(|p| p.capabilities().missing(required))
            .min_by_key(|missing| missing.len())
            .unwrap_or_else(|| required.clone());
        return Err(GpuAdmitError::NoCapableDevice { missing });
    }
    let fitting: Vec<DeviceOrdinal> = capable
        .iter()
        .filter(|p| p.attempt_floor().max(request.phase_floor()) <= p.largest_possible_grant())
        .map(|p| p.ordinal())
        .collect();
    if fitting.is_empty() {
        // Report against the roomiest compatible device.
        let roomiest = capable
            .iter()
            .max_by_key(|p| (p.largest_possible_grant(), Reverse(p.ordinal())));
        let (required_floor, largest_possible) = roomiest.map_or((request.phase_floor(), 0), |p| {
            (
                p.attempt_floor().max(request.phase_floor()),
                p.largest_possible_grant(),
            )
        });
        return Err(GpuAdmitError::FloorNeverFits {
            required_floor,
            largest_possible,
        });
    }
    Ok(fitting)
}
