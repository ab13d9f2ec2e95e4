//! loom models of the retry budget's accounting under concurrent calls.
//! Compiled only with `RUSTFLAGS="--cfg loom"` and run by
//! `loom-tests/tests/budget.rs`; in the crate because the budget's clock
//! is injected through crate-private methods.
//!
//! tower's `Retry` clones the policy for every request, so every request
//! in flight spends the same budget at once. Each model races requests
//! that deposit and retries that withdraw, then checks that the counts
//! are exact: every deposit counted once, and never more retries allowed
//! than the budget's rule gives the requests counted.

use std::time::Duration;

use http::{Request, Response};
use tokio::time::Instant;
use tower::retry::Policy;

use super::budget::{BudgetRule, RetryBudget};
use super::Downstreams;
use crate::sync::{loom_model as model, Arc};
use loom::thread;

fn budget(ratio: f64) -> RetryBudget {
    let rule = BudgetRule {
        ratio,
        floor_per_sec: 0,
        window: Duration::from_secs(10),
    };
    RetryBudget::with_rule(rule, Instant::now())
}

/// Two retries race for the one a budget has left: exactly one gets it,
/// in every interleaving.
pub fn racing_withdrawals_take_the_last_retry_once() {
    model(|| {
        let now = Instant::now();
        let budget = Arc::new(budget(0.5));
        budget.deposit_at(now);
        budget.deposit_at(now);
        let racers: Vec<_> = (0..2)
            .map(|_| {
                let budget = budget.clone();
                thread::spawn(move || budget.withdraw_at(now))
            })
            .collect();
        let won = racers
            .into_iter()
            .map(|racer| racer.join().unwrap())
            .filter(|&won| won)
            .count();
        assert_eq!(won, 1);
        let counts = budget.snapshot();
        assert_eq!((counts.requests, counts.retries, counts.denied), (2, 1, 1));
    });
}

/// The policy as `Retry` uses it for these requests and responses.
type Attempting = dyn Policy<Request<()>, Response<()>, (), Future = super::RetryWait>;

/// An overload refusal whose endpoint asks for a retry at once.
fn refusal() -> Result<Response<()>, ()> {
    Ok(Response::builder()
        .status(503)
        .header("grpc-retry-pushback-ms", "0")
        .body(())
        .expect("a valid response"))
}

/// Two requests, each through its own clone of the policy (as tower's
/// `Retry` makes them), deposit and then ask to retry, racing. Both
/// deposits count, once each; the budget (half a retry per request) has
/// one retry for two requests, and whichever interleaving, at most one is
/// allowed: a retry asked before the other request's deposit is refused,
/// never granted on credit.
pub fn concurrent_requests_deposit_once_and_retry_within_the_budget() {
    model(|| {
        let downstreams = Downstreams::builder()
            .retry_budget(0.5, 0, Duration::from_secs(10))
            .build()
            .expect("valid settings");
        let requests: Vec<_> = (0..2)
            .map(|_| {
                let mut policy = downstreams.retry_policy();
                thread::spawn(move || {
                    let original = Request::get("http://127.0.0.1:1/").body(()).unwrap();
                    let mut stored = Attempting::clone_request(&mut policy, &original)
                        .expect("a body of () is cloned");
                    policy.retry(&mut stored, &mut refusal()).is_some()
                })
            })
            .collect();
        let retried = requests
            .into_iter()
            .map(|request| request.join().unwrap())
            .filter(|&retried| retried)
            .count();
        let counts = downstreams.inner.budget.snapshot();
        assert_eq!(counts.requests, 2, "one deposit per request");
        assert!(retried <= 1, "half a retry per request");
        assert_eq!(counts.retries as usize, retried);
        assert_eq!(counts.retries + counts.denied, 2, "each retry asked once");
    });
}
