//! A simulated backend: deterministic devices, an operation log and fault
//! injection, for tests on machines without a GPU.
//!
//! # Implementation notes
//!
//! All state sits behind one lock: tables from ids to lanes, streams,
//! domains, scopes and allocations, each device's free bytes, the fault plan
//! and the log. Ids come from one counter, so a test run is reproducible.
//! Nothing sleeps; the one way a call can block is a `SimGate` a test set
//! up on purpose (to hold a build step while it cancels the build).
//!
//! The simulator keeps the `cuda` backend's semantics:
//!
//! * an id it did not issue, or already closed, is
//!   [`BackendError::UnknownHandle`];
//! * release operations forget the id even when they fail (and a closed
//!   domain gives its outstanding allocations back to the device);
//! * a [`BackendError::Fault`] on a device is **sticky**, like a CUDA sticky
//!   error: every later call touching that device returns the same code;
//! * a domain's ceiling is enforced by the driver only when a test asks
//!   (`SimBackend::with_driver_ceiling`, with `test-util`), as with a capped
//!   memory pool: exceeding it is an out-of-memory [`BackendError::Driver`]
//!   (code 2).
//!
//! Every call is logged (operation, device, argument ids, result). With the
//! `test-util` feature, a test reads the log (`SimBackend::log`), to assert
//! the exact order of a rollback, and plans faults
//! (`SimBackend::fail_nth`, `SimBackend::gate`, ...).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;

use super::{
    BackendError, BackendOp, BackendOps, DeviceFacts, DeviceOrdinal, DevicePtr, DomainId,
    FaultIsolation, LaneId, ScopeId, StreamId,
};
use crate::sync::{mpsc, Mutex};

/// CUDA's `CUDA_ERROR_OUT_OF_MEMORY`, which the simulator reports for a
/// device or capped domain that is full.
const OUT_OF_MEMORY: u32 = 2;

/// How many calls the log keeps: the most recent ones. A long-running
/// simulation (a soak run) must not grow with every call.
const LOG_LIMIT: usize = 16_384;

/// A simulated device's description.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimDevice {
    facts: DeviceFacts,
}

impl SimDevice {
    /// A device with `total_bytes` of memory, named `sim-<ordinal>`, compute
    /// capability 9.0, with memory pools. Only the ordinal and the memory
    /// are admission inputs (a profile is checked against the memory); the
    /// other facts are fixed, since nothing reads them but diagnostics.
    pub fn new(ordinal: u32, total_bytes: u64) -> Self {
        Self {
            facts: DeviceFacts {
                ordinal: DeviceOrdinal(ordinal),
                name: format!("sim-{ordinal}"),
                compute_capability: (9, 0),
                total_bytes,
                free_bytes: total_bytes,
                memory_pools: true,
            },
        }
    }
}

// One definition, public only with `test-util`: without it, the log is
// kept (it costs what it always cost) but nothing outside reads it.
#[cfg_attr(
    not(any(test, loom, feature = "test-util")),
    allow(dead_code, unreachable_pub)
)]
mod logged {
    use super::{BackendError, BackendOp, DeviceOrdinal};

    /// One logged backend call.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct LoggedOp {
        /// The operation.
        pub op: BackendOp,
        /// The device it touched, when known.
        pub device: Option<DeviceOrdinal>,
        /// The raw ids (and, for `alloc`/`open_domain`, byte counts) it received.
        pub args: Vec<u64>,
        /// What it returned: the raw id it issued (if any), or the error.
        pub result: Result<Option<u64>, BackendError>,
    }
}
#[cfg(not(any(test, loom, feature = "test-util")))]
use logged::LoggedOp;
#[cfg(any(test, loom, feature = "test-util"))]
pub use logged::LoggedOp;

#[cfg(any(test, loom, feature = "test-util"))]
/// A blocking point a test set up with [`SimBackend::gate`]: the next call
/// of the gated operation signals [`SimGate::reached`] and then waits until
/// [`SimGate::open`] (or until the gate is dropped).
#[derive(Debug)]
pub struct SimGate {
    reached: mpsc::Receiver<()>,
    open: mpsc::Sender<()>,
}

#[cfg(any(test, loom, feature = "test-util"))]
impl SimGate {
    /// Blocks until the gated call has started (and is waiting).
    /// Returns `false` if the simulator dropped the gate first.
    pub fn reached(&self) -> bool {
        self.reached.recv().is_ok()
    }

    /// Lets the gated call continue.
    pub fn open(self) {
        let _ = self.open.send(());
    }
}

#[cfg_attr(not(any(test, loom, feature = "test-util")), allow(dead_code))]
struct GateSide {
    reached: mpsc::Sender<()>,
    open: mpsc::Receiver<()>,
}

#[cfg_attr(not(any(test, loom, feature = "test-util")), allow(dead_code))]
struct Injected {
    op: BackendOp,
    at_call: u64,
    error: BackendError,
}

struct Domain {
    lane: u64,
    device: DeviceOrdinal,
    ceiling: u64,
    allocated: u64,
    members: Vec<u64>,
    allocations: HashMap<u64, u64>,
}

struct Stream {
    lane: u64,
    device: DeviceOrdinal,
    parent: Option<u64>,
}

struct Device {
    facts: DeviceFacts,
    free: u64,
    sticky: Option<u32>,
    pending_sync_fault: Option<u32>,
}

#[derive(Default)]
struct State {
    devices: BTreeMap<DeviceOrdinal, Device>,
    lanes: HashMap<u64, DeviceOrdinal>,
    streams: HashMap<u64, Stream>,
    domains: HashMap<u64, Domain>,
    scopes: HashMap<u64, DeviceOrdinal>,
    next_id: u64,
    calls: HashMap<BackendOp, u64>,
    injected: Vec<Injected>,
    gates: HashMap<BackendOp, GateSide>,
    /// The most recent calls, at most `LOG_LIMIT`.
    log: VecDeque<LoggedOp>,
    driver_ceiling: bool,
    panic_on: Option<BackendOp>,
}

impl State {
    fn issue(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn lane_device(&self, op: BackendOp, lane: u64) -> Result<DeviceOrdinal, BackendError> {
        self.lanes
            .get(&lane)
            .copied()
            .ok_or(BackendError::UnknownHandle { op, id: lane })
    }

    fn stream(&self, op: BackendOp, stream: u64) -> Result<&Stream, BackendError> {
        self.streams
            .get(&stream)
            .ok_or(BackendError::UnknownHandle { op, id: stream })
    }

    fn domain_device(&self, op: BackendOp, domain: u64) -> Result<DeviceOrdinal, BackendError> {
        self.domains
            .get(&domain)
            .map(|d| d.device)
            .ok_or(BackendError::UnknownHandle { op, id: domain })
    }

    fn device(&mut self, ordinal: DeviceOrdinal) -> Result<&mut Device, BackendError> {
        self.devices
            .get_mut(&ordinal)
            .ok_or(BackendError::UnknownDevice { ordinal })
    }

    fn give_back(&mut self, ordinal: DeviceOrdinal, bytes: u64) {
        if let Some(device) = self.devices.get_mut(&ordinal) {
            device.free = device
                .free
                .saturating_add(bytes)
                .min(device.facts.total_bytes);
        }
    }

    /// A fault planned for this call, or the device's sticky fault.
    fn planned_error(
        &mut self,
        op: BackendOp,
        device: Option<DeviceOrdinal>,
    ) -> Option<BackendError> {
        let count = self.calls.entry(op).or_insert(0);
        *count += 1;
        let count = *count;
        if let Some(position) = self
            .injected
            .iter()
            .position(|i| i.op == op && i.at_call == count)
        {
            let mut error = self.injected.remove(position).error;
            if let BackendError::Fault { op: fault_op, .. } = &mut error {
                *fault_op = op;
            }
            return Some(error);
        }
        let ordinal = device?;
        let dev = self.devices.get_mut(&ordinal)?;
        if let Some(code) = dev.sticky {
            return Some(BackendError::Fault {
                op,
                code,
                isolation: FaultIsolation::Device(ordinal),
            });
        }
        if op == BackendOp::Synchronize {
            if let Some(code) = dev.pending_sync_fault.take() {
                return Some(BackendError::Fault {
                    op,
                    code,
                    isolation: FaultIsolation::Device(ordinal),
                });
            }
        }
        None
    }

    /// Makes a device fault sticky.
    fn note(&mut self, error: &BackendError) {
        if let BackendError::Fault {
            code,
            isolation: FaultIsolation::Device(ordinal),
            ..
        } = error
        {
            if let Some(device) = self.devices.get_mut(ordinal) {
                device.sticky.get_or_insert(*code);
            }
        }
    }
}

/// Deterministic simulated devices. See the [module documentation](self).
pub struct SimBackend {
    state: Mutex<State>,
}

impl fmt::Debug for SimBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.state.lock();
        f.debug_struct("SimBackend")
            .field("devices", &state.devices.len())
            .field("live_handles", &live(&state))
            .field("logged", &state.log.len())
            .finish()
    }
}

fn live(state: &State) -> usize {
    state.lanes.len() + state.streams.len() + state.domains.len() + state.scopes.len()
}

impl SimBackend {
    /// While set, every call of `op` panics, as a backend with a bug would
    /// (`None` stops it). The panic happens before the call touches the
    /// simulated devices, so nothing is issued or released by it.
    #[cfg(any(test, loom, feature = "test-util"))]
    pub fn panic_on(&self, op: Option<BackendOp>) {
        self.state.lock().panic_on = op;
    }

    /// A simulator with these devices (a later duplicate ordinal replaces an
    /// earlier one).
    pub fn new(devices: impl IntoIterator<Item = SimDevice>) -> Self {
        let mut state = State::default();
        for device in devices {
            state.devices.insert(
                device.facts.ordinal,
                Device {
                    free: device.facts.total_bytes,
                    facts: device.facts,
                    sticky: None,
                    pending_sync_fault: None,
                },
            );
        }
        Self {
            state: Mutex::new(state),
        }
    }

    test_hook! {
        /// Enforces each domain's ceiling in the "driver" too, like a memory
        /// pool capped at the ceiling. Only a test that calls the backend
        /// past the allocation domain can reach it: through a service, the
        /// domain refuses first.
        fn with_driver_ceiling(self, enforce: bool) -> Self {
            self.state.lock().driver_ceiling = enforce;
            self
        }
    }

    /// Fails the `n`-th call of `op` from now (`n >= 1`) with `error`. A
    /// [`BackendError::Fault`] is reported with `op` as its operation and,
    /// when isolated to a device, makes that device's fault sticky.
    #[cfg(any(test, loom, feature = "test-util"))]
    pub fn fail_nth(&self, op: BackendOp, n: u64, error: BackendError) {
        let mut state = self.state.lock();
        let done = state.calls.get(&op).copied().unwrap_or(0);
        state.injected.push(Injected {
            op,
            at_call: done.saturating_add(n.max(1)),
            error,
        });
    }

    /// The next `synchronize` of a stream on `device` reports a
    /// sticky fault `code` (700 is an illegal address), isolated to the
    /// device.
    #[cfg(any(test, loom, feature = "test-util"))]
    pub fn inject_sync_fault(&self, device: DeviceOrdinal, code: u32) {
        if let Some(dev) = self.state.lock().devices.get_mut(&device) {
            dev.pending_sync_fault = Some(code);
        }
    }

    /// Resets a device, as an operator's device reset would: its sticky
    /// fault and any pending synchronization fault are cleared.
    #[cfg(any(test, loom, feature = "test-util"))]
    pub fn reset_device(&self, device: DeviceOrdinal) {
        if let Some(dev) = self.state.lock().devices.get_mut(&device) {
            dev.sticky = None;
            dev.pending_sync_fault = None;
        }
    }

    /// Makes the next call of `op` block until the returned gate opens.
    #[cfg(any(test, loom, feature = "test-util"))]
    pub fn gate(&self, op: BackendOp) -> SimGate {
        let (reached_tx, reached_rx) = mpsc::channel();
        let (open_tx, open_rx) = mpsc::channel();
        self.state.lock().gates.insert(
            op,
            GateSide {
                reached: reached_tx,
                open: open_rx,
            },
        );
        SimGate {
            reached: reached_rx,
            open: open_tx,
        }
    }

    /// Every call so far, in order (the most recent 16,384 of them: a
    /// long-running simulation does not grow with every call).
    #[cfg(any(test, loom, feature = "test-util"))]
    pub fn log(&self) -> Vec<LoggedOp> {
        self.state.lock().log.iter().cloned().collect()
    }

    /// The operations of every call so far, in order (the most recent
    /// 16,384).
    #[cfg(any(test, loom, feature = "test-util"))]
    pub fn ops(&self) -> Vec<BackendOp> {
        self.state.lock().log.iter().map(|l| l.op).collect()
    }

    /// Forgets the log (the fault plan and call counts stay).
    #[cfg(any(test, loom, feature = "test-util"))]
    pub fn clear_log(&self) {
        self.state.lock().log.clear();
    }

    /// How many times `op` has been called.
    #[cfg(any(test, loom, feature = "test-util"))]
    pub fn calls(&self, op: BackendOp) -> u64 {
        self.state.lock().calls.get(&op).copied().unwrap_or(0)
    }

    /// Lanes, streams, domains and scopes issued and not yet released.
    #[cfg(any(test, loom, feature = "test-util"))]
    pub fn live_handles(&self) -> usize {
        live(&self.state.lock())
    }

    /// Simulated free bytes of a device (no call is logged; works on a
    /// faulted device).
    #[cfg(any(test, loom, feature = "test-util"))]
    pub fn free_bytes(&self, device: DeviceOrdinal) -> Option<u64> {
        self.state.lock().devices.get(&device).map(|d| d.free)
    }

    /// The sticky fault code of a device, if it has faulted.
    #[cfg(any(test, loom, feature = "test-util"))]
    pub fn sticky_fault(&self, device: DeviceOrdinal) -> Option<u32> {
        self.state
            .lock()
            .devices
            .get(&device)
            .and_then(|d| d.sticky)
    }

    /// Waits at the gate of `op`, if a test set one up.
    fn pass_gate(&self, op: BackendOp) {
        let gate = self.state.lock().gates.remove(&op);
        if let Some(gate) = gate {
            let _ = gate.reached.send(());
            let _ = gate.open.recv();
        }
    }

    /// Runs one call: the gate, the fault plan, then `body` under the lock;
    /// logs the outcome. `device` finds the device the call touches (an
    /// unknown id is reported by `body`).
    fn call<T>(
        &self,
        op: BackendOp,
        args: Vec<u64>,
        device: impl FnOnce(&State) -> Option<DeviceOrdinal>,
        release: impl FnOnce(&mut State),
        body: impl FnOnce(&mut State) -> Result<T, BackendError>,
        issued: impl Fn(&T) -> Option<u64>,
    ) -> Result<T, BackendError> {
        self.pass_gate(op);
        let mut state = self.state.lock();
        if state.panic_on == Some(op) {
            drop(state);
            panic!("the simulated backend panics in {op}, as it was told to");
        }
        let ordinal = device(&state);
        let result = match state.planned_error(op, ordinal) {
            Some(error) => {
                // A failed release still forgets the id (backend contract).
                release(&mut state);
                Err(error)
            }
            None => body(&mut state),
        };
        if let Err(error) = &result {
            state.note(error);
        }
        if state.log.len() == LOG_LIMIT {
            state.log.pop_front();
        }
        state.log.push_back(LoggedOp {
            op,
            device: ordinal,
            args,
            result: result.as_ref().map(&issued).map_err(Clone::clone),
        });
        result
    }
}

fn none<T>(_: &T) -> Option<u64> {
    None
}

fn keep(_: &mut State) {}

fn release_stream(state: &mut State, stream: u64) {
    state.streams.remove(&stream);
    for domain in state.domains.values_mut() {
        domain.members.retain(|m| *m != stream);
    }
}

fn release_domain(state: &mut State, domain: u64) {
    if let Some(d) = state.domains.remove(&domain) {
        state.give_back(d.device, d.allocated);
    }
}

fn release_alloc(state: &mut State, domain: u64, ptr: u64) {
    let freed = state.domains.get_mut(&domain).and_then(|d| {
        let bytes = d.allocations.remove(&ptr)?;
        d.allocated = d.allocated.saturating_sub(bytes);
        Some((d.device, bytes))
    });
    if let Some((device, bytes)) = freed {
        state.give_back(device, bytes);
    }
}

/// Whether `stream` is a member of `domain` or forked from one.
fn is_member(state: &State, domain: &Domain, mut stream: u64) -> bool {
    loop {
        if domain.members.contains(&stream) {
            return true;
        }
        match state.streams.get(&stream).and_then(|s| s.parent) {
            Some(parent) => stream = parent,
            None => return false,
        }
    }
}

impl BackendOps for SimBackend {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn inventory(&self) -> Result<Vec<DeviceFacts>, BackendError> {
        self.call(
            BackendOp::Inventory,
            vec![],
            |_| None,
            keep,
            |s| {
                Ok(s.devices
                    .values()
                    .map(|d| DeviceFacts {
                        free_bytes: d.free,
                        ..d.facts.clone()
                    })
                    .collect())
            },
            none,
        )
    }

    fn memory_info(&self, device: DeviceOrdinal) -> Result<(u64, u64), BackendError> {
        self.call(
            BackendOp::MemoryInfo,
            vec![u64::from(device.0)],
            |_| Some(device),
            keep,
            |s| {
                let d = s.device(device)?;
                Ok((d.free, d.facts.total_bytes))
            },
            none,
        )
    }

    fn open_lane(&self, device: DeviceOrdinal) -> Result<LaneId, BackendError> {
        self.call(
            BackendOp::OpenLane,
            vec![u64::from(device.0)],
            |_| Some(device),
            keep,
            |s| {
                s.device(device)?;
                let id = s.issue();
                s.lanes.insert(id, device);
                Ok(LaneId::new(id))
            },
            |l| Some(l.get()),
        )
    }

    fn create_root_stream(&self, lane: LaneId) -> Result<StreamId, BackendError> {
        let op = BackendOp::CreateRootStream;
        self.call(
            op,
            vec![lane.get()],
            |s| s.lanes.get(&lane.get()).copied(),
            keep,
            |s| {
                let device = s.lane_device(op, lane.get())?;
                let id = s.issue();
                s.streams.insert(
                    id,
                    Stream {
                        lane: lane.get(),
                        device,
                        parent: None,
                    },
                );
                Ok(StreamId::new(id))
            },
            |x| Some(x.get()),
        )
    }

    fn open_domain(&self, lane: LaneId, ceiling_bytes: u64) -> Result<DomainId, BackendError> {
        let op = BackendOp::OpenDomain;
        self.call(
            op,
            vec![lane.get(), ceiling_bytes],
            |s| s.lanes.get(&lane.get()).copied(),
            keep,
            |s| {
                let device = s.lane_device(op, lane.get())?;
                let id = s.issue();
                s.domains.insert(
                    id,
                    Domain {
                        lane: lane.get(),
                        device,
                        ceiling: ceiling_bytes,
                        allocated: 0,
                        members: Vec::new(),
                        allocations: HashMap::new(),
                    },
                );
                Ok(DomainId::new(id))
            },
            |x| Some(x.get()),
        )
    }

    fn join_domain(&self, domain: DomainId, stream: StreamId) -> Result<(), BackendError> {
        let op = BackendOp::JoinDomain;
        self.call(
            op,
            vec![domain.get(), stream.get()],
            |s| s.domains.get(&domain.get()).map(|d| d.device),
            keep,
            |s| {
                let lane = s.stream(op, stream.get())?.lane;
                let d = s
                    .domains
                    .get_mut(&domain.get())
                    .ok_or(BackendError::UnknownHandle {
                        op,
                        id: domain.get(),
                    })?;
                if d.lane != lane {
                    // A stream of another attempt cannot join this domain.
                    return Err(BackendError::UnknownHandle {
                        op,
                        id: stream.get(),
                    });
                }
                if !d.members.contains(&stream.get()) {
                    d.members.push(stream.get());
                }
                Ok(())
            },
            none,
        )
    }

    fn open_worker_scope(&self, lane: LaneId) -> Result<ScopeId, BackendError> {
        let op = BackendOp::OpenWorkerScope;
        self.call(
            op,
            vec![lane.get()],
            |s| s.lanes.get(&lane.get()).copied(),
            keep,
            |s| {
                let device = s.lane_device(op, lane.get())?;
                let id = s.issue();
                s.scopes.insert(id, device);
                Ok(ScopeId::new(id))
            },
            |x| Some(x.get()),
        )
    }

    fn fork_stream(&self, root: StreamId) -> Result<StreamId, BackendError> {
        let op = BackendOp::ForkStream;
        self.call(
            op,
            vec![root.get()],
            |s| s.streams.get(&root.get()).map(|x| x.device),
            keep,
            |s| {
                let parent = s.stream(op, root.get())?;
                let (lane, device) = (parent.lane, parent.device);
                let id = s.issue();
                s.streams.insert(
                    id,
                    Stream {
                        lane,
                        device,
                        parent: Some(root.get()),
                    },
                );
                Ok(StreamId::new(id))
            },
            |x| Some(x.get()),
        )
    }

    fn alloc(
        &self,
        domain: DomainId,
        bytes: u64,
        stream: StreamId,
    ) -> Result<DevicePtr, BackendError> {
        let op = BackendOp::Alloc;
        self.call(
            op,
            vec![domain.get(), bytes, stream.get()],
            |s| s.domains.get(&domain.get()).map(|d| d.device),
            keep,
            |s| {
                let device = s.domain_device(op, domain.get())?;
                s.stream(op, stream.get())?;
                let oom = BackendError::Driver {
                    op,
                    code: OUT_OF_MEMORY,
                    message: "out of memory".into(),
                };
                let enforce = s.driver_ceiling;
                let d = &s.domains[&domain.get()];
                if !is_member(s, d, stream.get()) {
                    return Err(BackendError::UnknownHandle {
                        op,
                        id: stream.get(),
                    });
                }
                if enforce && d.allocated.checked_add(bytes).is_none_or(|t| t > d.ceiling) {
                    return Err(oom);
                }
                let dev = s.device(device)?;
                if dev.free < bytes {
                    return Err(oom);
                }
                dev.free -= bytes;
                let id = s.issue();
                if let Some(d) = s.domains.get_mut(&domain.get()) {
                    d.allocated = d.allocated.saturating_add(bytes);
                    d.allocations.insert(id, bytes);
                }
                Ok(DevicePtr::new(id))
            },
            |p| Some(p.get()),
        )
    }

    fn free(&self, domain: DomainId, ptr: DevicePtr, stream: StreamId) -> Result<(), BackendError> {
        let op = BackendOp::Free;
        self.call(
            op,
            vec![domain.get(), ptr.get(), stream.get()],
            |s| s.domains.get(&domain.get()).map(|d| d.device),
            |s| release_alloc(s, domain.get(), ptr.get()),
            |s| {
                s.domain_device(op, domain.get())?;
                s.stream(op, stream.get())?;
                let known = s.domains[&domain.get()]
                    .allocations
                    .contains_key(&ptr.get());
                if !known {
                    return Err(BackendError::UnknownHandle { op, id: ptr.get() });
                }
                release_alloc(s, domain.get(), ptr.get());
                Ok(())
            },
            none,
        )
    }

    fn synchronize(&self, stream: StreamId) -> Result<(), BackendError> {
        let op = BackendOp::Synchronize;
        self.call(
            op,
            vec![stream.get()],
            |s| s.streams.get(&stream.get()).map(|x| x.device),
            keep,
            |s| s.stream(op, stream.get()).map(|_| ()),
            none,
        )
    }

    fn close_worker_scope(&self, scope: ScopeId) -> Result<(), BackendError> {
        let op = BackendOp::CloseWorkerScope;
        self.call(
            op,
            vec![scope.get()],
            |s| s.scopes.get(&scope.get()).copied(),
            |s| {
                s.scopes.remove(&scope.get());
            },
            |s| {
                s.scopes
                    .remove(&scope.get())
                    .map(|_| ())
                    .ok_or(BackendError::UnknownHandle {
                        op,
                        id: scope.get(),
                    })
            },
            none,
        )
    }

    fn leave_domain(&self, domain: DomainId, stream: StreamId) -> Result<(), BackendError> {
        let op = BackendOp::LeaveDomain;
        let remove = move |s: &mut State| {
            s.domains
                .get_mut(&domain.get())
                .map(|d| {
                    let before = d.members.len();
                    d.members.retain(|m| *m != stream.get());
                    before != d.members.len()
                })
                .unwrap_or(false)
        };
        self.call(
            op,
            vec![domain.get(), stream.get()],
            |s| s.domains.get(&domain.get()).map(|d| d.device),
            |s| {
                remove(s);
            },
            |s| {
                s.domain_device(op, domain.get())?;
                if remove(s) {
                    Ok(())
                } else {
                    Err(BackendError::UnknownHandle {
                        op,
                        id: stream.get(),
                    })
                }
            },
            none,
        )
    }

    fn close_domain(&self, domain: DomainId) -> Result<(), BackendError> {
        let op = BackendOp::CloseDomain;
        self.call(
            op,
            vec![domain.get()],
            |s| s.domains.get(&domain.get()).map(|d| d.device),
            |s| release_domain(s, domain.get()),
            |s| {
                s.domain_device(op, domain.get())?;
                release_domain(s, domain.get());
                Ok(())
            },
            none,
        )
    }

    fn destroy_stream(&self, stream: StreamId) -> Result<(), BackendError> {
        let op = BackendOp::DestroyStream;
        self.call(
            op,
            vec![stream.get()],
            |s| s.streams.get(&stream.get()).map(|x| x.device),
            |s| release_stream(s, stream.get()),
            |s| {
                s.stream(op, stream.get())?;
                release_stream(s, stream.get());
                Ok(())
            },
            none,
        )
    }

    fn close_lane(&self, lane: LaneId) -> Result<(), BackendError> {
        let op = BackendOp::CloseLane;
        self.call(
            op,
            vec![lane.get()],
            |s| s.lanes.get(&lane.get()).copied(),
            |s| {
                s.lanes.remove(&lane.get());
            },
            |s| {
                s.lanes
                    .remove(&lane.get())
                    .map(|_| ())
                    .ok_or(BackendError::UnknownHandle { op, id: lane.get() })
            },
            none,
        )
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn sim() -> SimBackend {
        SimBackend::new([SimDevice::new(0, 1 << 20), SimDevice::new(1, 1 << 20)])
    }

    #[test]
    fn unknown_ids_are_unknown_handles() {
        let sim = sim();
        assert_eq!(
            sim.create_root_stream(LaneId::new(99)),
            Err(BackendError::UnknownHandle {
                op: BackendOp::CreateRootStream,
                id: 99
            })
        );
        assert_eq!(
            sim.open_lane(DeviceOrdinal(7)),
            Err(BackendError::UnknownDevice {
                ordinal: DeviceOrdinal(7)
            })
        );
        let lane = sim.open_lane(DeviceOrdinal(0)).unwrap();
        sim.close_lane(lane).unwrap();
        assert!(matches!(
            sim.close_lane(lane),
            Err(BackendError::UnknownHandle { .. })
        ));
    }

    #[test]
    fn memory_drops_on_alloc_and_returns_on_close_domain() {
        let sim = sim().with_driver_ceiling(true);
        let lane = sim.open_lane(DeviceOrdinal(0)).unwrap();
        let root = sim.create_root_stream(lane).unwrap();
        let domain = sim.open_domain(lane, 4096).unwrap();
        sim.join_domain(domain, root).unwrap();
        let fork = sim.fork_stream(root).unwrap();
        sim.alloc(domain, 4096, fork).unwrap();
        assert_eq!(sim.free_bytes(DeviceOrdinal(0)), Some((1 << 20) - 4096));
        assert!(matches!(
            sim.alloc(domain, 1, root),
            Err(BackendError::Driver {
                code: OUT_OF_MEMORY,
                ..
            })
        ));
        sim.close_domain(domain).unwrap();
        assert_eq!(sim.free_bytes(DeviceOrdinal(0)), Some(1 << 20));
    }

    #[test]
    fn a_fault_is_sticky_on_its_device_only() {
        let sim = sim();
        let lane0 = sim.open_lane(DeviceOrdinal(0)).unwrap();
        let root0 = sim.create_root_stream(lane0).unwrap();
        sim.inject_sync_fault(DeviceOrdinal(0), 700);
        let fault = BackendError::Fault {
            op: BackendOp::Synchronize,
            code: 700,
            isolation: FaultIsolation::Device(DeviceOrdinal(0)),
        };
        assert_eq!(sim.synchronize(root0), Err(fault));
        assert!(matches!(
            sim.fork_stream(root0),
            Err(BackendError::Fault { code: 700, .. })
        ));
        // Releases still forget the id.
        assert!(sim.destroy_stream(root0).is_err());
        assert!(sim.close_lane(lane0).is_err());
        assert_eq!(sim.live_handles(), 0);
        assert!(sim.open_lane(DeviceOrdinal(1)).is_ok());
    }

    #[test]
    fn the_nth_call_fails_and_is_logged() {
        let sim = sim();
        let error = BackendError::Driver {
            op: BackendOp::OpenLane,
            code: 1,
            message: "invalid value".into(),
        };
        sim.fail_nth(BackendOp::OpenLane, 2, error.clone());
        assert!(sim.open_lane(DeviceOrdinal(0)).is_ok());
        assert_eq!(sim.open_lane(DeviceOrdinal(0)), Err(error.clone()));
        assert!(sim.open_lane(DeviceOrdinal(0)).is_ok());
        let log = sim.log();
        assert_eq!(log.len(), 3);
        assert_eq!(log[1].result, Err(error));
        assert_eq!(log[1].device, Some(DeviceOrdinal(0)));
    }
}
