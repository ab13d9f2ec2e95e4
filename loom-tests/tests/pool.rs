//! The CPU pool's loom models. They live in the crate
//! (`src/pool/loom_models.rs`), where they reach the pool's crate-private
//! hand-off; each test here runs one of them.

#![cfg(loom)]

use admission::pool::loom_models;

#[test]
fn a_grant_collected_by_the_returning_thread_is_dispatched_once() {
    loom_models::a_grant_collected_by_the_returning_thread_is_dispatched_once();
}

#[test]
fn a_grant_racing_the_callers_poll_is_seen_or_wakes_the_caller() {
    loom_models::a_grant_racing_the_callers_poll_is_seen_or_wakes_the_caller();
}

#[test]
fn a_caller_dropping_its_task_racing_the_grant_loses_no_slot() {
    loom_models::a_caller_dropping_its_task_racing_the_grant_loses_no_slot();
}
