//! loom models of a tenant's local balance (`balance.rs`): the fast path's
//! take, the handshake that moves units to requests entering the queue,
//! charges and the close, racing one another. Compiled only with
//! `RUSTFLAGS="--cfg loom"` and run by `loom-tests/tests/quota.rs`; in the
//! crate because the balance is crate-private.

use std::task::Poll;

use loom::thread;

use super::balance::probe::{balance, poll, wait_for};
use crate::sync::{loom_model as model, Arc};

/// Units arrive while a request enters the queue: whichever goes first,
/// the request is granted (units left in `ready` beside a waiter would
/// strand it, which this model would report).
pub fn an_arrival_racing_a_request_into_the_queue_reaches_it() {
    model(|| {
        let local = Arc::new(balance(100));
        let arrival = {
            let local = local.clone();
            thread::spawn(move || local.credit(3))
        };
        let mut admit = wait_for(&local, 2);
        let first = poll(&mut admit);
        arrival.join().unwrap();
        match first {
            Poll::Ready(granted) => assert!(granted, "granted, not refused"),
            Poll::Pending => assert_eq!(poll(&mut admit), Poll::Ready(true), "stranded"),
        }
        drop(admit);
        local.leave_queue();
        assert_eq!(local.balance(), 1, "3 arrived, 2 taken");
    });
}

/// A fast-path take races the close: the balance read after the close
/// counts the units exactly when the take did not get them.
pub fn a_take_racing_the_close_is_counted_once() {
    model(|| {
        let local = Arc::new(balance(100));
        local.credit(10);
        let taker = {
            let local = local.clone();
            thread::spawn(move || local.try_take(4))
        };
        local.close();
        let taken = taker.join().unwrap();
        let returned = local.balance();
        assert_eq!(returned + if taken { 4 } else { 0 }, 10);
        assert!(!local.try_take(1), "nothing is taken once closed");
        assert_eq!(local.balance(), returned, "the returned balance holds");
    });
}

/// A charge beyond the units at hand races an arrival and a take: the sum
/// is exact, and no unit is left at hand beside debt.
pub fn a_charge_racing_an_arrival_and_a_take_leaves_no_units_beside_debt() {
    model(|| {
        let local = Arc::new(balance(100));
        local.credit(5);
        let charge = {
            let local = local.clone();
            thread::spawn(move || local.charge(8))
        };
        let arrival = {
            let local = local.clone();
            thread::spawn(move || local.credit(4))
        };
        let taken = local.try_take(2);
        charge.join().unwrap();
        arrival.join().unwrap();
        let (at_hand, bucket) = local.parts();
        assert_eq!(
            i64::try_from(at_hand).unwrap() + bucket,
            5 - 8 + 4 - if taken { 2 } else { 0 }
        );
        assert!(
            bucket >= 0 || at_hand == 0,
            "{at_hand} at hand beside {bucket}"
        );
    });
}
