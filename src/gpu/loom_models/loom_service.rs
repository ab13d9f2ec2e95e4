//! loom models of the query service's own synchronization: `transact`
//! (wakers collected under the lock, woken after it), `wait` (outcome
//! checked and waker registered in one critical section) and the admit
//! future's guard (`AdmitGuard::drop`), each racing a release of the grant
//! that blocks the waiter.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use loom::thread;

use super::model;
use crate::gpu::backend::DeviceOrdinal;
use crate::gpu::ledger::{GrantRequest, MemoryGrant};
use crate::gpu::release::wait;
use crate::gpu::service::QueryService;
use crate::gpu::{DeviceSet, QueueBounds, WaiterId};

const GIB: u64 = 1 << 30;
const D0: DeviceOrdinal = DeviceOrdinal(0);

/// One 16 GiB device with one attempt slot; no deadline (`max_wait` of
/// `Duration::MAX`), so no timer is involved.
fn service() -> QueryService {
    let devices = DeviceSet::one_16_gib_device(1);
    let bounds = QueueBounds::new(8, Duration::MAX, 4).expect("valid bounds");
    QueryService::for_model(devices, bounds)
}

/// Takes the device's one slot through the real transaction path.
fn hold_the_slot(service: &QueryService) -> MemoryGrant {
    let inner = &service.inner;
    let waiter = inner
        .transact(|core, _| core.reserve(tokio::time::Instant::now()))
        .expect("room");
    inner
        .transact(|core, _| core.resolve(waiter, GrantRequest::resource_only(GIB), vec![D0]))
        .expect("healthy");
    inner
        .state
        .lock()
        .core
        .take_outcome(waiter)
        .expect("admitted at once")
        .expect("granted")
}

/// Queues a second waiter behind the held slot.
fn queue_behind(service: &QueryService) -> WaiterId {
    let inner = &service.inner;
    let waiter = inner
        .transact(|core, _| core.reserve(tokio::time::Instant::now()))
        .expect("room");
    inner
        .transact(|core, _| core.resolve(waiter, GrantRequest::resource_only(GIB), vec![D0]))
        .expect("healthy");
    waiter
}

fn release(service: &QueryService, grant: MemoryGrant) {
    service
        .inner
        .transact(|core, _| core.release(grant))
        .expect("issued here");
}

/// Releases `grant` on a thread of its own, racing whatever the model's
/// main thread does next.
fn release_on_another_thread(service: &QueryService, grant: MemoryGrant) -> thread::JoinHandle<()> {
    let service = service.clone();
    thread::spawn(move || release(&service, grant))
}

/// Nothing is held and nothing is remembered: no grant, no slot, no
/// queued or parked waiter, no waker.
fn assert_idle(service: &QueryService) {
    let report = &service.ledger_snapshots()[0];
    super::assert_ledger_conserved(report);
    assert_eq!((report.live_grants_bytes, report.active_attempts), (0, 0));
    let snapshot = service.admission_snapshot();
    assert_eq!(
        (
            snapshot.queued,
            snapshot.pending_preflights,
            snapshot.granted_unobserved
        ),
        (0, 0, 0)
    );
    assert_eq!(service.inner.live_wakers(), 0);
}

/// A waiter blocks in `wait` while another thread releases the grant that
/// blocks it: whatever the interleaving of the outcome check, the waker's
/// registration and the release's wake-up, the waiter is woken with the
/// grant (a lost wake-up would leave `block_on` parked forever, which loom
/// reports as a deadlock), and no waker outlives it.
pub fn a_release_always_wakes_the_waiter_it_admits() {
    model(|| {
        let service = service();
        let held = hold_the_slot(&service);
        let waiter = queue_behind(&service);
        let releaser = release_on_another_thread(&service, held);
        let submitted = tokio::time::Instant::now();
        let grant = loom::future::block_on(wait(&service.inner, waiter, None, submitted))
            .expect("admitted after the release");
        releaser.join().expect("releaser");
        assert_eq!(grant.bytes(), 16 * GIB);
        release(&service, grant);
        assert_idle(&service);
    });
}

/// An admit future waiting in the queue is dropped (its guard withdraws
/// it) while another thread releases the slot, which may admit it first:
/// either the waiter is withdrawn before the pass, or the pass parks a
/// grant that the guard hands back. Either way everything comes back.
pub fn dropping_an_admit_racing_the_release_that_admits_it_returns_everything() {
    model(|| {
        let service = service();
        let held = hold_the_slot(&service);
        let mut admit = Box::pin(service.resource_ticket(GIB).admit());
        let polled = admit.as_mut().poll(&mut Context::from_waker(Waker::noop()));
        assert!(polled.is_pending(), "queued behind the held slot");
        let releaser = release_on_another_thread(&service, held);
        drop(admit);
        releaser.join().expect("releaser");
        assert_idle(&service);
    });
}

/// Two waiters queue behind the one slot; the release admits the older
/// while the older's future is dropped: the younger one is then admitted by
/// the guard's own transaction, never left waiting on a free device.
pub fn a_withdrawn_grant_passes_to_the_next_waiter() {
    model(|| {
        let service = service();
        let held = hold_the_slot(&service);
        let mut older = Box::pin(service.resource_ticket(GIB).admit());
        assert!(older
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
            .is_pending());
        let younger = queue_behind(&service);
        let releaser = release_on_another_thread(&service, held);
        drop(older);
        releaser.join().expect("releaser");
        let submitted = tokio::time::Instant::now();
        let mut next = pin!(wait(&service.inner, younger, None, submitted));
        let grant = match next.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(outcome) => outcome.expect("granted"),
            Poll::Pending => panic!("the device is free but the younger waiter still waits"),
        };
        release(&service, grant);
        assert_idle(&service);
    });
}
