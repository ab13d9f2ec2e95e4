//! Cost of a GPU admission decision: the query service's synchronous core
//! with 8 simulated devices and 1,000 queued waiters, under the one lock
//! the service would hold (no backend, no envelope, no runtime).
//!
//! * `scan_1000_blocked`: one scheduling pass over 1,000 waiters, every
//!   device full: what each release, cancel or submission pays when nobody
//!   can be admitted.
//! * `release_admit_resubmit`: a grant is released, the pass admits the
//!   oldest waiter onto the freed device, its grant is taken, and a new
//!   waiter joins the tail (so the queue stays at 1,000).
//!
//! The core is crate-private; this benchmark reaches it through
//! `admission::gpu::bench_internals`, which exists only with the
//! `bench-internals` feature and is not part of the API. Run with
//! `cargo bench --features bench-internals --bench gpu_admit`.

use std::hint::black_box;
use std::time::Duration;

use admission::gpu::backend::DeviceOrdinal;
use admission::gpu::bench_internals::{BenchGrant, CoreBench};
use admission::gpu::{DeviceProfile, DeviceSet, MemoryOwnership, QueueBounds, WaiterId};
use criterion::{criterion_group, criterion_main, Criterion};

const GIB: u64 = 1 << 30;
const DEVICES: u32 = 8;
const WAITERS: usize = 1_000;

/// Eight full devices (two 8 GiB attempts each) and 1,000 queued waiters.
fn loaded() -> (CoreBench, Vec<BenchGrant>, Vec<DeviceOrdinal>) {
    let ordinals: Vec<DeviceOrdinal> = (0..DEVICES).map(DeviceOrdinal).collect();
    let profiles = ordinals
        .iter()
        .map(|d| {
            DeviceProfile::builder(*d)
                .managed_capacity(16 * GIB)
                .max_active_attempts(2)
                .build()
                .expect("valid profile")
        })
        .collect();
    let ownerships = ordinals
        .iter()
        .map(|d| MemoryOwnership::exclusive(*d))
        .collect();
    let devices = DeviceSet::new(profiles, ownerships).expect("valid devices");
    let bounds =
        QueueBounds::new(WAITERS * 2, Duration::from_secs(60), 1_000_000).expect("valid bounds");
    let mut core = CoreBench::new(&devices, bounds);
    let mut running = Vec::new();
    for _ in 0..(DEVICES * 2) {
        let waiter = submit(&mut core, &ordinals, Some(8 * GIB));
        core.schedule();
        let grant = core
            .take_outcome(waiter)
            .expect("room on an empty device")
            .expect("granted");
        running.push(grant);
    }
    for _ in 0..WAITERS {
        submit(&mut core, &ordinals, None);
    }
    core.schedule();
    assert_eq!(core.depth(), WAITERS, "every device is full");
    (core, running, ordinals)
}

fn submit(core: &mut CoreBench, devices: &[DeviceOrdinal], hint: Option<u64>) -> WaiterId {
    core.submit(2 * GIB, hint, devices)
        .expect("room in the queue on healthy devices")
}

fn decision(c: &mut Criterion) {
    let mut group = c.benchmark_group("gpu_admission_8_devices_1000_waiters");

    let (mut core, _running, _) = loaded();
    group.bench_function("scan_1000_blocked", |b| {
        b.iter(|| black_box(core.schedule()))
    });

    let (mut core, mut running, ordinals) = loaded();
    let mut next = 0usize;
    group.bench_function("release_admit_resubmit", |b| {
        b.iter(|| {
            let i = next % running.len();
            next = next.wrapping_add(1);
            let grant = running.swap_remove(i);
            assert!(core.release(grant), "issued here");
            let admitted = core
                .schedule()
                .expect("the oldest waiter fits the freed slot");
            let grant = core
                .take_outcome(admitted)
                .expect("granted")
                .expect("granted");
            running.push(grant);
            black_box(submit(&mut core, &ordinals, None))
        })
    });
    group.finish();
}

criterion_group!(benches, decision);
criterion_main!(benches);
