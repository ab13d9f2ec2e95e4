//! loom models of a tenant's local balance under quota; the models live in
//! the crate (`src/quota/loom_models.rs`), where they reach the balance.

#![cfg(loom)]

use admission::quota::loom_models;

#[test]
fn an_arrival_racing_a_request_into_the_queue_reaches_it() {
    loom_models::an_arrival_racing_a_request_into_the_queue_reaches_it();
}

#[test]
fn a_take_racing_the_close_is_counted_once() {
    loom_models::a_take_racing_the_close_is_counted_once();
}

#[test]
fn a_charge_racing_an_arrival_and_a_take_leaves_no_units_beside_debt() {
    loom_models::a_charge_racing_an_arrival_and_a_take_leaves_no_units_beside_debt();
}
