//! The CUDA backend, through `cudarc`'s driver API, loaded at run time.
//!
//! # Implementation notes
//!
//! * **No driver is an error, not a panic.** With dynamic loading, every
//!   `cudarc` driver call *panics* when `libcuda` cannot be loaded. The
//!   constructor therefore asks `cudarc::driver::sys::is_culib_present()`
//!   first (once per process, cached in a `OnceLock`) and returns
//!   [`BackendError::NoDriver`] without touching `cudarc` again. It never
//!   relies on `catch_unwind`: the crate's users may build with
//!   `panic = "abort"`. A driver that loads but has no usable device
//!   (`CUDA_ERROR_NO_DEVICE`, or a toolkit stub library,
//!   `CUDA_ERROR_STUB_LIBRARY`) is [`BackendError::NoDevice`].
//! * **Tables from ids to objects.** Lanes, streams (`Arc<CudaStream>`),
//!   domains (an optional memory pool, members, live allocations) and scopes
//!   sit in maps behind one mutex. The lock is never held across a driver
//!   call: an object is looked up and cloned, the lock released, the driver
//!   called. A release removes the entry first, so the host object is gone
//!   even if the driver reports an error (the backend contract).
//! * **The grant ceiling is enforced in software** by the crate's
//!   allocation domain before `alloc` is called. With
//!   [`CudaOptions::domain_pools`], each domain also gets its own memory
//!   pool whose `maxSize` is the ceiling, as a driver-level backstop
//!   (`cuMemAllocFromPoolAsync`); otherwise allocations use the device's
//!   current pool (`cuMemAllocAsync`). Frees are `cuMemFreeAsync` on the
//!   given stream.
//! * **Blocking calls run on the device worker only.**
//!   `synchronize` blocks the calling thread (it sleeps rather
//!   than spins when [`CudaOptions::blocking_sync`] is on); the crate calls
//!   it, and the teardown and build steps, only from the device's
//!   `DeviceWorker` thread.
//! * **Error classification.** CUDA's sticky errors leave the context
//!   unusable: 700 (illegal address), 702 (launch timeout), 710 (assert),
//!   714–719 (hardware stack error, illegal instruction, misaligned address,
//!   invalid address space, invalid PC, launch failure); by judgment also
//!   214 (uncorrectable ECC), 220 (uncorrectable NVLink), 709 (context
//!   destroyed), 999 (unknown) and 46 (device unavailable). Any of them, and
//!   any error at all from a synchronization (whose documented errors are of
//!   that kind), is a [`BackendError::Fault`] isolated to the device. Out of
//!   memory and everything else is an attempt-level [`BackendError::Driver`].
//!   Errors that `cudarc` deferred from `Drop`s are collected with
//!   `check_err` when a lane closes, so they are not lost to an unrelated
//!   call.

// FFI through cudarc's `result` layer needs `unsafe`; every block states why
// it is sound.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, OnceLock};

use cudarc::driver::{result, sys, CudaContext, CudaStream, DriverError};

use super::{
    BackendError, BackendOp, BackendOps, DeviceFacts, DeviceOrdinal, DevicePtr, DomainId,
    FaultIsolation, LaneId, ScopeId, StreamId,
};
use crate::sync::Mutex;

/// Whether the CUDA driver library can be loaded, asked once per process.
/// `cudarc` is never called when this is false. Crate-private: a user asks
/// by constructing the backend, which answers [`BackendError::NoDriver`].
pub(crate) fn driver_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: `is_culib_present` only tries `dlopen` on the driver's known
    // library names and drops the handle; it calls no driver function.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

/// Whether `code` is a sticky (context-corrupting) CUDA error.
fn is_sticky(code: u32) -> bool {
    matches!(
        code,
        700 | 702 | 710 | 714..=719 | 214 | 220 | 709 | 999 | 46
    )
}

const NO_DEVICE: u32 = 100;
const STUB_LIBRARY: u32 = 34;

fn code_of(error: &DriverError) -> u32 {
    error.0 as u32
}

/// Maps a driver error of `op` on `device` to the backend's error.
fn classify(op: BackendOp, device: DeviceOrdinal, error: DriverError) -> BackendError {
    let code = code_of(&error);
    if is_sticky(code) || op == BackendOp::Synchronize {
        BackendError::Fault {
            op,
            code,
            isolation: FaultIsolation::Device(device),
        }
    } else {
        BackendError::Driver {
            op,
            code,
            message: error
                .error_string()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|_| format!("CUresult {code}")),
        }
    }
}

/// Options of the CUDA backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CudaOptions {
    /// Give each allocation domain its own memory pool with
    /// `maxSize = ceiling`: a driver-level cap under the software ceiling.
    /// Ignored on devices without memory-pool support.
    pub domain_pools: bool,
    /// Make synchronizations sleep instead of spin
    /// (`CU_CTX_SCHED_BLOCKING_SYNC`), so the worker thread does not burn a
    /// core while it waits.
    pub blocking_sync: bool,
}

impl Default for CudaOptions {
    fn default() -> Self {
        Self {
            domain_pools: false,
            blocking_sync: true,
        }
    }
}

struct Device {
    ordinal: DeviceOrdinal,
    ctx: Arc<CudaContext>,
    facts: DeviceFacts,
}

/// A `CUmemoryPool` handle owned by one domain.
struct Pool(sys::CUmemoryPool);

// SAFETY: a memory pool handle is a process-wide driver object usable from
// any thread; the table that owns it is behind a mutex.
unsafe impl Send for Pool {}

struct StreamRec {
    stream: Arc<CudaStream>,
    device: usize,
    parent: Option<u64>,
}

struct DomainRec {
    device: usize,
    pool: Option<Pool>,
    members: Vec<u64>,
    // Live allocations: pointer → the stream they were made on.
    allocations: HashMap<u64, u64>,
}

#[derive(Default)]
struct Tables {
    next_id: u64,
    lanes: HashMap<u64, usize>,
    streams: HashMap<u64, StreamRec>,
    domains: HashMap<u64, DomainRec>,
    scopes: HashMap<u64, usize>,
}

impl Tables {
    fn issue(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn is_member(&self, domain: &DomainRec, mut stream: u64) -> bool {
        loop {
            if domain.members.contains(&stream) {
                return true;
            }
            match self.streams.get(&stream).and_then(|s| s.parent) {
                Some(parent) => stream = parent,
                None => return false,
            }
        }
    }
}

/// The CUDA driver backend. See the [module documentation](self).
pub struct CudaBackend {
    devices: Vec<Device>,
    options: CudaOptions,
    tables: Mutex<Tables>,
}

impl fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaBackend")
            .field(
                "devices",
                &self.devices.iter().map(|d| d.ordinal).collect::<Vec<_>>(),
            )
            .field("options", &self.options)
            .finish()
    }
}

fn unknown(op: BackendOp, id: u64) -> BackendError {
    BackendError::UnknownHandle { op, id }
}

impl CudaBackend {
    /// Opens the devices `ordinals` with default options.
    ///
    /// # Errors
    ///
    /// [`BackendError::NoDriver`] when no driver library loads (without
    /// panicking); [`BackendError::NoDevice`] when the driver has no usable
    /// device or `ordinals` is empty; [`BackendError::UnknownDevice`] for an
    /// ordinal past the device count; [`BackendError::Driver`] or
    /// [`BackendError::Fault`] when the driver fails to open a device's
    /// context or read its facts.
    ///
    /// # Examples
    ///
    /// ```
    /// use admission::gpu::backend::cuda::CudaBackend;
    /// use admission::gpu::backend::{BackendError, DeviceOrdinal};
    ///
    ///
    /// match CudaBackend::new([DeviceOrdinal(0)]) {
    ///     Ok(backend) => println!("{backend:?}"),
    ///     // A machine without the driver answers, it does not panic.
    ///     Err(BackendError::NoDriver | BackendError::NoDevice) => println!("no GPU here"),
    ///     Err(other) => panic!("{other}"),
    /// }
    /// ```
    pub fn new(ordinals: impl IntoIterator<Item = DeviceOrdinal>) -> Result<Self, BackendError> {
        Self::with_options(ordinals, CudaOptions::default())
    }

    /// Like [`new`](Self::new), with options.
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new); a failure to switch a context to blocking
    /// synchronization ([`CudaOptions::blocking_sync`]) is also a
    /// [`BackendError::Driver`] or [`BackendError::Fault`].
    ///
    /// # Examples
    ///
    /// ```
    /// use admission::gpu::backend::cuda::{CudaBackend, CudaOptions};
    /// use admission::gpu::backend::DeviceOrdinal;
    ///
    ///
    /// let options = CudaOptions {
    ///     // Synchronization sleeps in the driver instead of spinning a core.
    ///     blocking_sync: true,
    ///     ..CudaOptions::default()
    /// };
    /// if let Ok(backend) = CudaBackend::with_options([DeviceOrdinal(0)], options) {
    ///     println!("{backend:?}");
    /// }
    /// ```
    pub fn with_options(
        ordinals: impl IntoIterator<Item = DeviceOrdinal>,
        options: CudaOptions,
    ) -> Result<Self, BackendError> {
        if !driver_present() {
            return Err(BackendError::NoDriver);
        }
        let op = BackendOp::Inventory;
        let no_device = |error: DriverError, ordinal: DeviceOrdinal| match code_of(&error) {
            NO_DEVICE | STUB_LIBRARY => BackendError::NoDevice,
            _ => classify(op, ordinal, error),
        };
        let count = CudaContext::device_count().map_err(|e| no_device(e, DeviceOrdinal(0)))?;
        let count = u32::try_from(count).unwrap_or(0);
        if count == 0 {
            return Err(BackendError::NoDevice);
        }
        let mut devices = Vec::new();
        for ordinal in ordinals {
            if ordinal.0 >= count {
                return Err(BackendError::UnknownDevice { ordinal });
            }
            let index =
                usize::try_from(ordinal.0).map_err(|_| BackendError::UnknownDevice { ordinal })?;
            let ctx = CudaContext::new(index).map_err(|e| no_device(e, ordinal))?;
            if options.blocking_sync {
                ctx.set_blocking_synchronize()
                    .map_err(|e| classify(op, ordinal, e))?;
            }
            let facts = read_facts(ordinal, &ctx)?;
            devices.push(Device {
                ordinal,
                ctx,
                facts,
            });
        }
        if devices.is_empty() {
            return Err(BackendError::NoDevice);
        }
        Ok(Self {
            devices,
            options,
            tables: Mutex::new(Tables::default()),
        })
    }

    fn device_index(&self, ordinal: DeviceOrdinal) -> Result<usize, BackendError> {
        self.devices
            .iter()
            .position(|d| d.ordinal == ordinal)
            .ok_or(BackendError::UnknownDevice { ordinal })
    }

    /// The context of a managed device (the primary context, shared with
    /// every other user of the device in this process).
    ///
    /// # Errors
    ///
    /// [`BackendError::UnknownDevice`] when `ordinal` is not a device this
    /// backend opened.
    ///
    /// # Examples
    ///
    /// ```
    /// use admission::gpu::backend::cuda::CudaBackend;
    /// use admission::gpu::backend::{BackendError, DeviceOrdinal};
    ///
    ///
    /// if let Ok(backend) = CudaBackend::new([DeviceOrdinal(0)]) {
    ///     let context = backend.context(DeviceOrdinal(0)).unwrap();
    ///     println!("{:?}", context.name());
    ///     // An ordinal the backend did not open is an error, not a panic.
    ///     assert!(matches!(
    ///         backend.context(DeviceOrdinal(99)),
    ///         Err(BackendError::UnknownDevice { .. })
    ///     ));
    /// }
    /// ```
    pub fn context(&self, ordinal: DeviceOrdinal) -> Result<Arc<CudaContext>, BackendError> {
        Ok(self.devices[self.device_index(ordinal)?].ctx.clone())
    }

    /// The `cudarc` stream behind an id, for launching an execution's work
    /// on the stream of its execution context.
    ///
    /// # Errors
    ///
    /// [`BackendError::UnknownHandle`] when `id` is not a live stream of
    /// this backend.
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::time::Duration;
    /// use std::sync::Arc;
    ///
    /// use admission::gpu::backend::cuda::CudaBackend;
    /// use admission::gpu::backend::DeviceOrdinal;
    /// use admission::gpu::{DeviceProfile, DeviceSet, MemoryOwnership, QueryService, QueueBounds};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let gpu0 = DeviceOrdinal(0);
    /// let Ok(cuda) = CudaBackend::new([gpu0]) else {
    ///     return Ok(()); // no GPU on this machine
    /// };
    /// let cuda = Arc::new(cuda);
    /// let profile = DeviceProfile::builder(gpu0).managed_capacity(1 << 30).streams_per_attempt(2).build()?;
    /// let devices = DeviceSet::new(vec![profile], vec![MemoryOwnership::exclusive(gpu0)])?;
    /// let bounds = QueueBounds::new(16, Duration::from_secs(5), 2)?;
    /// let service = QueryService::builder(cuda.clone(), devices, bounds).build()?;
    ///
    /// let handle = service.resource_ticket(1 << 28).admit().await?;
    /// let ctx = handle.execution_context()?;
    /// // The attempt's stream, for the kernels its work launches.
    /// let stream = cuda.stream(ctx.stream())?;
    /// stream.synchronize()?;
    /// drop((stream, ctx));
    /// handle.release().await;
    /// # Ok(())
    /// # }
    /// ```
    pub fn stream(&self, id: StreamId) -> Result<Arc<CudaStream>, BackendError> {
        self.tables
            .lock()
            .streams
            .get(&id.get())
            .map(|s| s.stream.clone())
            .ok_or(unknown(BackendOp::Synchronize, id.get()))
    }

    /// Looks up a stream: its object and device index.
    fn stream_rec(&self, op: BackendOp, id: u64) -> Result<(Arc<CudaStream>, usize), BackendError> {
        self.tables
            .lock()
            .streams
            .get(&id)
            .map(|s| (s.stream.clone(), s.device))
            .ok_or(unknown(op, id))
    }

    /// The index of the device `lane` was opened on.
    fn lane_device(&self, op: BackendOp, lane: LaneId) -> Result<usize, BackendError> {
        self.tables
            .lock()
            .lanes
            .get(&lane.get())
            .copied()
            .ok_or(unknown(op, lane.get()))
    }

    fn bind(&self, op: BackendOp, device: usize) -> Result<&Device, BackendError> {
        let dev = &self.devices[device];
        dev.ctx
            .bind_to_thread()
            .map_err(|e| classify(op, dev.ordinal, e))?;
        Ok(dev)
    }
}

fn read_facts(ordinal: DeviceOrdinal, ctx: &Arc<CudaContext>) -> Result<DeviceFacts, BackendError> {
    let op = BackendOp::Inventory;
    let err = |e| classify(op, ordinal, e);
    let (major, minor) = ctx.compute_capability().map_err(err)?;
    let (free, total) = ctx.mem_get_info().map_err(err)?;
    let pools = ctx
        .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)
        .map_err(err)?;
    Ok(DeviceFacts {
        ordinal,
        name: ctx.name().map_err(err)?,
        compute_capability: (
            u32::try_from(major).unwrap_or(0),
            u32::try_from(minor).unwrap_or(0),
        ),
        total_bytes: total as u64,
        free_bytes: free as u64,
        memory_pools: pools != 0,
    })
}

/// Creates a pool on `ordinal` capped at `max_bytes`, with a release
/// threshold of 0 (memory returns to the device at every synchronization).
fn create_pool(ordinal: DeviceOrdinal, max_bytes: u64) -> Result<Pool, DriverError> {
    // SAFETY: `CUmemPoolProps` is a plain C struct of integers, enums whose
    // zero value is valid, a pointer (null is allowed) and reserved bytes
    // that must be zero.
    let mut props: sys::CUmemPoolProps = unsafe { std::mem::zeroed() };
    props.allocType = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    props.handleTypes = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE;
    props.location = sys::CUmemLocation {
        type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: i32::try_from(ordinal.0).unwrap_or(i32::MAX),
    };
    props.maxSize = usize::try_from(max_bytes).unwrap_or(usize::MAX);
    // SAFETY: `props` is a valid, fully initialized `CUmemPoolProps`.
    let pool = unsafe { result::mem_pool::create(&props) }?;
    let mut threshold: u64 = 0;
    // SAFETY: the pool was just created; the release threshold attribute is
    // a `cuuint64_t`, which `threshold` is.
    let set = unsafe {
        result::mem_pool::set_attribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut threshold as *mut u64).cast(),
        )
    };
    if let Err(error) = set {
        // SAFETY: the pool is valid, has no allocations, and is not used
        // again.
        let _ = unsafe { result::mem_pool::destroy(pool) };
        return Err(error);
    }
    Ok(Pool(pool))
}

impl BackendOps for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn inventory(&self) -> Result<Vec<DeviceFacts>, BackendError> {
        self.devices
            .iter()
            .map(|d| {
                let (free, _) = d
                    .ctx
                    .mem_get_info()
                    .map_err(|e| classify(BackendOp::Inventory, d.ordinal, e))?;
                Ok(DeviceFacts {
                    free_bytes: free as u64,
                    ..d.facts.clone()
                })
            })
            .collect()
    }

    fn memory_info(&self, device: DeviceOrdinal) -> Result<(u64, u64), BackendError> {
        let dev = &self.devices[self.device_index(device)?];
        let (free, total) = dev
            .ctx
            .mem_get_info()
            .map_err(|e| classify(BackendOp::MemoryInfo, device, e))?;
        Ok((free as u64, total as u64))
    }

    fn open_lane(&self, device: DeviceOrdinal) -> Result<LaneId, BackendError> {
        let index = self.device_index(device)?;
        let mut tables = self.tables.lock();
        let id = tables.issue();
        tables.lanes.insert(id, index);
        Ok(LaneId::new(id))
    }

    fn create_root_stream(&self, lane: LaneId) -> Result<StreamId, BackendError> {
        let op = BackendOp::CreateRootStream;
        let device = self.lane_device(op, lane)?;
        let dev = &self.devices[device];
        let stream = dev
            .ctx
            .new_stream()
            .map_err(|e| classify(op, dev.ordinal, e))?;
        let mut tables = self.tables.lock();
        let id = tables.issue();
        tables.streams.insert(
            id,
            StreamRec {
                stream,
                device,
                parent: None,
            },
        );
        Ok(StreamId::new(id))
    }

    fn open_domain(&self, lane: LaneId, ceiling_bytes: u64) -> Result<DomainId, BackendError> {
        let op = BackendOp::OpenDomain;
        let device = self.lane_device(op, lane)?;
        let dev = &self.devices[device];
        let pool = if self.options.domain_pools && dev.facts.memory_pools {
            self.bind(op, device)?;
            Some(
                create_pool(dev.ordinal, ceiling_bytes)
                    .map_err(|e| classify(op, dev.ordinal, e))?,
            )
        } else {
            None
        };
        let mut tables = self.tables.lock();
        let id = tables.issue();
        tables.domains.insert(
            id,
            DomainRec {
                device,
                pool,
                members: Vec::new(),
                allocations: HashMap::new(),
            },
        );
        Ok(DomainId::new(id))
    }

    fn join_domain(&self, domain: DomainId, stream: StreamId) -> Result<(), BackendError> {
        let op = BackendOp::JoinDomain;
        let mut tables = self.tables.lock();
        if !tables.streams.contains_key(&stream.get()) {
            return Err(unknown(op, stream.get()));
        }
        let d = tables
            .domains
            .get_mut(&domain.get())
            .ok_or(unknown(op, domain.get()))?;
        if !d.members.contains(&stream.get()) {
            d.members.push(stream.get());
        }
        Ok(())
    }

    fn open_worker_scope(&self, lane: LaneId) -> Result<ScopeId, BackendError> {
        let op = BackendOp::OpenWorkerScope;
        let mut tables = self.tables.lock();
        let device = *tables
            .lanes
            .get(&lane.get())
            .ok_or(unknown(op, lane.get()))?;
        let id = tables.issue();
        tables.scopes.insert(id, device);
        Ok(ScopeId::new(id))
    }

    fn fork_stream(&self, root: StreamId) -> Result<StreamId, BackendError> {
        let op = BackendOp::ForkStream;
        let (parent, device) = self.stream_rec(op, root.get())?;
        let stream = parent
            .fork()
            .map_err(|e| classify(op, self.devices[device].ordinal, e))?;
        let mut tables = self.tables.lock();
        let id = tables.issue();
        tables.streams.insert(
            id,
            StreamRec {
                stream,
                device,
                parent: Some(root.get()),
            },
        );
        Ok(StreamId::new(id))
    }

    fn alloc(
        &self,
        domain: DomainId,
        bytes: u64,
        stream: StreamId,
    ) -> Result<DevicePtr, BackendError> {
        let op = BackendOp::Alloc;
        let (cu_stream, device, pool) = {
            let tables = self.tables.lock();
            let d = tables
                .domains
                .get(&domain.get())
                .ok_or(unknown(op, domain.get()))?;
            let s = tables
                .streams
                .get(&stream.get())
                .ok_or(unknown(op, stream.get()))?;
            if !tables.is_member(d, stream.get()) {
                return Err(unknown(op, stream.get()));
            }
            (s.stream.clone(), d.device, d.pool.as_ref().map(|p| p.0))
        };
        let dev = self.bind(op, device)?;
        let size = usize::try_from(bytes).map_err(|_| BackendError::GrantExceeded {
            requested: bytes,
            available: 0,
        })?;
        let ptr = match pool {
            // SAFETY: the pool belongs to this live domain (its entry is only
            // removed, and the pool destroyed, by `close_domain`, which the
            // envelope calls after its allocations), and the stream is kept
            // alive by the `Arc` held here.
            Some(pool) => unsafe {
                result::mem_pool::alloc_async(pool, size, cu_stream.cu_stream())
            },
            // SAFETY: the stream is alive (the `Arc` is held) and its context
            // is bound to this thread; the memory is uninitialized, which is
            // fine for an allocation handed to the engine.
            None => unsafe { result::malloc_async(cu_stream.cu_stream(), size) },
        }
        .map_err(|e| classify(op, dev.ordinal, e))?;
        let mut tables = self.tables.lock();
        if let Some(d) = tables.domains.get_mut(&domain.get()) {
            d.allocations.insert(ptr, stream.get());
        }
        Ok(DevicePtr::new(ptr))
    }

    fn free(&self, domain: DomainId, ptr: DevicePtr, stream: StreamId) -> Result<(), BackendError> {
        let op = BackendOp::Free;
        let (cu_stream, device) = {
            let mut tables = self.tables.lock();
            let s = tables
                .streams
                .get(&stream.get())
                .map(|s| s.stream.clone())
                .ok_or(unknown(op, stream.get()))?;
            let d = tables
                .domains
                .get_mut(&domain.get())
                .ok_or(unknown(op, domain.get()))?;
            d.allocations
                .remove(&ptr.get())
                .ok_or(unknown(op, ptr.get()))?;
            (s, d.device)
        };
        let dev = self.bind(op, device)?;
        // SAFETY: the pointer was returned by an allocation of this domain
        // and has just been removed from its table, so it is freed once; the
        // stream is kept alive by the `Arc` held here.
        unsafe { result::free_async(ptr.get(), cu_stream.cu_stream()) }
            .map_err(|e| classify(op, dev.ordinal, e))
    }

    fn synchronize(&self, stream: StreamId) -> Result<(), BackendError> {
        let op = BackendOp::Synchronize;
        let (stream, device) = self.stream_rec(op, stream.get())?;
        stream
            .synchronize()
            .map_err(|e| classify(op, self.devices[device].ordinal, e))
    }

    fn close_worker_scope(&self, scope: ScopeId) -> Result<(), BackendError> {
        self.tables
            .lock()
            .scopes
            .remove(&scope.get())
            .map(|_| ())
            .ok_or(unknown(BackendOp::CloseWorkerScope, scope.get()))
    }

    fn leave_domain(&self, domain: DomainId, stream: StreamId) -> Result<(), BackendError> {
        let op = BackendOp::LeaveDomain;
        let mut tables = self.tables.lock();
        let d = tables
            .domains
            .get_mut(&domain.get())
            .ok_or(unknown(op, domain.get()))?;
        let before = d.members.len();
        d.members.retain(|m| *m != stream.get());
        if d.members.len() == before {
            return Err(unknown(op, stream.get()));
        }
        Ok(())
    }

    fn close_domain(&self, domain: DomainId) -> Result<(), BackendError> {
        let op = BackendOp::CloseDomain;
        let (rec, streams) = {
            let mut tables = self.tables.lock();
            let rec = tables
                .domains
                .remove(&domain.get())
                .ok_or(unknown(op, domain.get()))?;
            let streams: HashMap<u64, Arc<CudaStream>> = rec
                .allocations
                .values()
                .filter_map(|s| tables.streams.get(s).map(|r| (*s, r.stream.clone())))
                .collect();
            (rec, streams)
        };
        let dev = self.bind(op, rec.device)?;
        let mut first_error = None;
        for (&ptr, stream) in &rec.allocations {
            let result = match streams.get(stream) {
                // SAFETY: the pointer belongs to this domain, whose table
                // entry is gone, so it is freed exactly once; the stream is
                // alive (its `Arc` is held).
                Some(s) => unsafe { result::free_async(ptr, s.cu_stream()) },
                // SAFETY: as above; with its stream gone, the free is
                // synchronous.
                None => unsafe { result::free_sync(ptr) },
            };
            if let Err(e) = result {
                first_error.get_or_insert(classify(op, dev.ordinal, e));
            }
        }
        if let Some(pool) = rec.pool {
            // SAFETY: the pool belongs to this domain, which is gone from the
            // table, so nothing allocates from it any more; destroying a pool
            // with frees still pending is allowed (the driver releases it
            // when they complete).
            let done = unsafe {
                result::mem_pool::trim_to(pool.0, 0)
                    .and_then(|()| result::mem_pool::destroy(pool.0))
            };
            if let Err(e) = done {
                first_error.get_or_insert(classify(op, dev.ordinal, e));
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    fn destroy_stream(&self, stream: StreamId) -> Result<(), BackendError> {
        let op = BackendOp::DestroyStream;
        let (rec, parent) = {
            let mut tables = self.tables.lock();
            let rec = tables
                .streams
                .remove(&stream.get())
                .ok_or(unknown(op, stream.get()))?;
            for d in tables.domains.values_mut() {
                d.members.retain(|m| *m != stream.get());
            }
            let parent = rec
                .parent
                .and_then(|p| tables.streams.get(&p).map(|r| r.stream.clone()));
            (rec, parent)
        };
        // A fork's work must be ordered before its root's synchronization:
        // the root waits on the fork before the fork goes.
        let joined = match parent {
            Some(parent) => parent.join(&rec.stream),
            None => Ok(()),
        };
        drop(rec.stream);
        joined.map_err(|e| classify(op, self.devices[rec.device].ordinal, e))
    }

    fn close_lane(&self, lane: LaneId) -> Result<(), BackendError> {
        let op = BackendOp::CloseLane;
        let device = self
            .tables
            .lock()
            .lanes
            .remove(&lane.get())
            .ok_or(unknown(op, lane.get()))?;
        let dev = &self.devices[device];
        // Errors `cudarc` recorded in `Drop`s (stream destroys) surface here,
        // not in some later, unrelated call.
        dev.ctx
            .check_err()
            .map_err(|e| classify(op, dev.ordinal, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sticky_codes_are_classified_as_device_faults() {
        for code in [700, 702, 710, 714, 719, 214, 220, 709, 999, 46] {
            assert!(is_sticky(code), "{code}");
        }
        for code in [1, 2, 100, 201, 713, 720] {
            assert!(!is_sticky(code), "{code}");
        }
    }

    #[test]
    fn without_a_driver_construction_is_no_driver_and_does_not_panic() {
        if driver_present() {
            // A machine with a driver: construction must still not panic.
            let _ = CudaBackend::new([DeviceOrdinal(0)]);
            return;
        }
        assert_eq!(
            CudaBackend::new([DeviceOrdinal(0)]).map(|_| ()),
            Err(BackendError::NoDriver)
        );
        assert_eq!(
            CudaBackend::with_options([], CudaOptions::default()).map(|_| ()),
            Err(BackendError::NoDriver)
        );
    }
}
