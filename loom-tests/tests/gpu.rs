//! The GPU module's loom models. They live in the crate
//! (`src/gpu/loom_models/`), where they reach the query service's
//! crate-private code (`transact`, `wait`, the admit future's guard); each
//! test here runs one of them.

#![cfg(loom)]

use admission::gpu::loom_models::{loom_core, loom_domain, loom_ledger, loom_service};

#[test]
fn service_a_release_always_wakes_the_waiter_it_admits() {
    loom_service::a_release_always_wakes_the_waiter_it_admits();
}

#[test]
fn service_dropping_an_admit_racing_the_release_that_admits_it_returns_everything() {
    loom_service::dropping_an_admit_racing_the_release_that_admits_it_returns_everything();
}

#[test]
fn service_a_withdrawn_grant_passes_to_the_next_waiter() {
    loom_service::a_withdrawn_grant_passes_to_the_next_waiter();
}

#[test]
fn core_a_commit_racing_a_rollback_and_a_cancel_returns_everything() {
    loom_core::a_commit_racing_a_rollback_and_a_cancel_returns_everything();
}

#[test]
fn core_a_younger_waiter_never_takes_a_protected_slot_or_bytes() {
    loom_core::a_younger_waiter_never_takes_a_protected_slot_or_bytes();
}

#[test]
fn ledger_a_commit_racing_a_rollback_never_exceeds_capacity() {
    loom_ledger::a_commit_racing_a_rollback_never_exceeds_capacity();
}

#[test]
fn ledger_a_protected_waiter_keeps_its_slot_and_bytes_against_a_racing_request() {
    loom_ledger::a_protected_waiter_keeps_its_slot_and_bytes_against_a_racing_request();
}

#[test]
fn domain_concurrent_charges_never_exceed_the_ceiling_and_all_bytes_return() {
    loom_domain::concurrent_charges_never_exceed_the_ceiling_and_all_bytes_return();
}

#[test]
fn domain_two_requests_that_fit_together_never_fail() {
    loom_domain::two_requests_that_fit_together_never_fail();
}
