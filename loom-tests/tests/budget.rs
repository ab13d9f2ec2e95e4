//! loom models of the retry budget that tower's `Retry` shares between
//! every request in flight; the models live in the crate
//! (`src/tower/client/loom_models.rs`), where they reach its clock.

#![cfg(loom)]

use admission::tower::client::loom_models;

#[test]
fn racing_withdrawals_take_the_last_retry_once() {
    loom_models::racing_withdrawals_take_the_last_retry_once();
}

#[test]
fn concurrent_requests_deposit_once_and_retry_within_the_budget() {
    loom_models::concurrent_requests_deposit_once_and_retry_within_the_budget();
}
