//! GPU query admission on two simulated devices: queueing, an overtaken
//! waiter protecting a slot, and a quarantine after an injected fault.
//!
//! `cargo run --example gpu_queries` prints every admission observation as
//! it happens, and the queue and ledgers at each stage. With
//! `--features cuda` on a machine with a CUDA driver, the same scenario runs
//! on device 0 of the CUDA backend (both "devices" are then ordinal 0's
//! profile and the quarantine is an operator's decision instead of an
//! injected fault).

use std::sync::Arc;
use std::time::Duration;

use admission::gpu::backend::sim::{SimBackend, SimDevice};
use admission::gpu::backend::{DeviceOrdinal, SharedBackend};
use admission::gpu::{
    DeviceProfile, DeviceSet, MemoryOwnership, Observation, QueryHandle, QueryService, QueueBounds,
};

const GIB: u64 = 1 << 30;

fn print_state(service: &QueryService, stage: &str) {
    let snapshot = service.admission_snapshot();
    println!("\n== {stage}");
    println!(
        "   queue: {} queued, {} pending preflight (max {})",
        snapshot.queued, snapshot.pending_preflights, snapshot.max_pending
    );
    for w in &snapshot.waiters {
        println!(
            "   {}: overtaken {} time(s), protected on {:?}, floor {} GiB",
            w.waiter,
            w.overtakes,
            w.protected_on,
            w.phase_floor / GIB
        );
    }
    for r in service.ledger_snapshots() {
        println!(
            "   {}: {:?}, {}/{} attempts, {} GiB granted, {} GiB protected{}",
            r.device,
            r.state,
            r.active_attempts,
            r.max_active_attempts,
            r.live_grants_bytes / GIB,
            r.protected_bytes / GIB,
            r.protection
                .map(|p| format!(" for {}", p.waiter))
                .unwrap_or_default()
        );
    }
}

fn print_observation(o: &Observation) {
    let mut line = format!("   [{:>8} µs] {:<18}", o.elapsed_us, o.kind);
    if let Some(w) = o.waiter {
        line.push_str(&format!(" waiter#{w}"));
    }
    if let Some(d) = o.device {
        line.push_str(&format!(" gpu{d}"));
    }
    if let Some(b) = o.grant_bytes {
        line.push_str(&format!(" {} GiB", b / GIB));
    }
    if let Some(reason) = o.reason {
        line.push_str(&format!(" ({reason})"));
    }
    println!("{line} depth={}", o.queue_depth);
}

/// The backend: CUDA device 0 when built with `cuda` and a driver is
/// present, otherwise two simulated devices.
fn backend() -> (SharedBackend, Option<Arc<SimBackend>>, Vec<u32>) {
    #[cfg(feature = "cuda")]
    {
        use admission::gpu::backend::cuda::CudaBackend;
        // Without a driver this is `BackendError::NoDriver`, not a panic.
        if let Ok(cuda) = CudaBackend::new([DeviceOrdinal(0)]) {
            println!("backend: cuda (device 0)");
            return (Arc::new(cuda), None, vec![0]);
        }
    }
    let sim = Arc::new(SimBackend::new([
        SimDevice::new(0, 32 * GIB),
        SimDevice::new(1, 32 * GIB),
    ]));
    println!("backend: simulated (devices 0 and 1)");
    (sim.clone(), Some(sim), vec![0, 1])
}

async fn hinted(service: &QueryService, gib: u64) -> QueryHandle {
    service
        .resource_ticket(0)
        .with_working_set_hint(gib * GIB)
        .admit()
        .await
        .expect("admitted")
}

async fn wait_for_queue(service: &QueryService, queued: usize) {
    while service.admission_snapshot().queued != queued {
        tokio::task::yield_now().await;
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let (backend, sim, ordinals) = backend();
    // 16 GiB managed per device, three attempts (a 2 GiB floor); a waiter
    // may be overtaken once before it protects a slot. On CUDA the numbers
    // are the ledger's, not the device's: nothing here allocates.
    let profiles: Vec<DeviceProfile> = ordinals
        .iter()
        .map(|o| {
            DeviceProfile::builder(DeviceOrdinal(*o))
                .managed_capacity(16 * GIB)
                .max_active_attempts(3)
                .build()
                .expect("valid profile")
        })
        .collect();
    let ownerships = ordinals
        .iter()
        .map(|o| MemoryOwnership::exclusive(DeviceOrdinal(*o)))
        .collect();
    let devices = DeviceSet::new(profiles, ownerships).expect("valid devices");
    let bounds = QueueBounds::new(64, Duration::from_secs(30), 1).expect("valid bounds");
    let service = QueryService::builder(backend, devices, bounds)
        .observer(print_observation)
        .build()
        .expect("every profiled device is installed");

    println!("\n-- two long attempts of 10 GiB fill the devices' bytes");
    let mut long: Vec<QueryHandle> = Vec::new();
    for _ in &ordinals {
        long.push(hinted(&service, 10).await);
    }

    println!("\n-- a 5 GiB request has to queue");
    let old = {
        let service = service.clone();
        tokio::spawn(async move { service.resource_ticket(5 * GIB).admit().await })
    };
    wait_for_queue(&service, 1).await;
    print_state(&service, "queued");

    println!("\n-- two younger 2 GiB requests fit and overtake it");
    let young = [hinted(&service, 2).await, hinted(&service, 2).await];
    print_state(&service, "protection");

    let protected_on = service
        .ledger_snapshots()
        .into_iter()
        .find(|r| r.protection.is_some())
        .map(|r| r.device);
    if let Some(device) = protected_on {
        println!("\n-- {device} fails a stream synchronization at release");
        match &sim {
            Some(sim) => sim.inject_sync_fault(device, 700),
            None => service.quarantine(device, 700),
        }
        if let Some(i) = long.iter().position(|h| h.device() == device) {
            let report = long.swap_remove(i).release().await;
            println!(
                "   release of {}: {:?}, grant released: {}",
                report.device, report.disposition, report.ledger_released
            );
        }
        print_state(&service, "quarantine; the protection moved");
    }

    println!("\n-- the remaining long attempts finish");
    for handle in long {
        handle.release().await;
    }
    match old.await {
        Ok(Ok(handle)) => {
            println!(
                "   the overtaken waiter ran on {} with {} GiB",
                handle.device(),
                handle.grant_bytes() / GIB
            );
            handle.release().await;
        }
        Ok(Err(error)) => println!(
            "   the overtaken waiter failed: {error} ({})",
            error.outcome()
        ),
        Err(error) => println!("   the overtaken waiter's task failed: {error}"),
    }
    for handle in young {
        handle.release().await;
    }
    print_state(&service, "done");
}
