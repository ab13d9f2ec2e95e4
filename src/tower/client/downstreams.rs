//! The downstream endpoints a client calls, what it has learned of each,
//! and the settings of the layer and the retry policy built from them.

use std::fmt;
use std::time::Duration;

use http::uri::Authority;
use tokio::time::Instant;

use super::budget::{BudgetRule, BudgetSnapshot, RetryBudget, WINDOW_RANGE};
use super::layer::DownstreamLayer;
use super::retry::RetryPolicy;
use super::throttle::Throttle;
use crate::error::ConfigError;
use crate::health::{Boundary, ComponentHealth};
use crate::sync::{Mutex, StdArc};
use crate::tower::report::LoadReport;
use crate::work::Priority;

/// A uniform draw in `0.0..1.0`, for the throttle's coin and the retry
/// backoff's jitter.
type Draw = Box<dyn Fn() -> f64 + Send + Sync>;

/// What the random source's panics are answered with.
const RANDOM_ON_FAILURE: &str = "the draw counts as 1.0: no request is throttled, no jitter";

/// The downstream endpoints a client is configured to call, and what it
/// has learned of each: the admission level last seen, the adaptive
/// throttle's counts, the last load report; and the retry budget. Built
/// once with [`Downstreams::builder`]; a cheap handle (clones share it).
///
/// Make the outbound stack from it with [`layer`](Self::layer) (levels,
/// throttling, the caller's slot given back during the call) and
/// [`retry_policy`](Self::retry_policy) (for tower's `Retry`, outside the
/// layer so that every attempt passes the checks); see the
/// [module docs](super) for an example.
#[derive(Clone)]
pub struct Downstreams {
    pub(super) inner: StdArc<Inner>,
}

/// What the layer, its services and futures and the retry policy share.
pub(super) struct Inner {
    pub(super) endpoints: Vec<Endpoint>,
    pub(super) level_ttl: Duration,
    pub(super) level_cap: Priority,
    pub(super) release_slot: bool,
    pub(super) max_attempts: u32,
    pub(super) backoff: Duration,
    pub(super) budget: StdArc<RetryBudget>,
    draw: Draw,
    draw_boundary: Boundary,
}

/// One configured endpoint.
pub(super) struct Endpoint {
    pub(super) authority: Authority,
    /// A leaf lock: held for a few reads and writes, never across a call,
    /// an await or user code.
    pub(super) state: Mutex<EndpointState>,
}

/// What the client learned of an endpoint, and its counters.
#[derive(Debug)]
pub(super) struct EndpointState {
    /// The last level the endpoint sent, and when.
    pub(super) level: Option<(Priority, Instant)>,
    pub(super) throttle: Throttle,
    /// The last load report the endpoint sent.
    pub(super) load: Option<LoadReport>,
    /// When a request last asked the endpoint for a load report.
    pub(super) load_asked: Option<Instant>,
    pub(super) counts: EndpointCounts,
}

/// How often a client asks an endpoint for a load report (ORCA's
/// per-request header on one request): as fresh as weighted balancing
/// reads load (gRPC's weighted round robin updates weights every second),
/// and the endpoint pays for a report on one response in that time instead
/// of on all of them.
pub(super) const LOAD_REPORT_PERIOD: Duration = Duration::from_millis(100);

impl EndpointState {
    /// Whether a request sent at `now` asks for a load report; if it does,
    /// the next one asks a period later.
    pub(super) fn asks_for_load(&mut self, now: Instant) -> bool {
        let due = self
            .load_asked
            .is_none_or(|asked| now.saturating_duration_since(asked) >= LOAD_REPORT_PERIOD);
        if due {
            self.load_asked = Some(now);
        }
        due
    }
}

/// Counters of one endpoint since the client was built.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct EndpointCounts {
    /// Requests sent to it.
    pub sent: u64,
    /// Of those, answered with anything but an overload refusal.
    pub accepted: u64,
    /// Refused here, below the endpoint's admission level.
    pub below_level: u64,
    /// Refused here by the adaptive throttle.
    pub throttled: u64,
    /// Responses whose level or load report did not parse (taken as no
    /// information).
    pub garbled: u64,
}

/// What a client knows of one endpoint now; see
/// [`Downstreams::snapshot`].
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct EndpointSnapshot {
    /// The endpoint, as configured.
    pub endpoint: Authority,
    /// The admission level believed now (capped, unexpired), if any.
    pub level: Option<Priority>,
    /// The adaptive throttle's refusal probability now, per priority it
    /// has seen (`None`: requests of no known priority), lowest first.
    pub throttle: Vec<(Option<Priority>, f64)>,
    /// The last load report it sent.
    pub load: Option<LoadReport>,
    /// Its counters.
    pub counts: EndpointCounts,
}

/// A client's state; see [`Downstreams::snapshot`].
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct DownstreamsSnapshot {
    /// Each configured endpoint, in the order configured.
    pub endpoints: Vec<EndpointSnapshot>,
    /// The retry budget's counts.
    pub budget: BudgetSnapshot,
    /// The random source's panics (only a source a test injected can
    /// panic: `random`, with the `test-util` feature).
    pub random: ComponentHealth,
}

impl Downstreams {
    /// A builder with the defaults described on each setting.
    pub fn builder() -> DownstreamsBuilder {
        DownstreamsBuilder::default()
    }

    /// The layer for the outbound service; see [`DownstreamLayer`].
    pub fn layer(&self) -> DownstreamLayer {
        DownstreamLayer::new(self.clone())
    }

    /// The retry policy for tower's `Retry`, spending this client's
    /// budget; see [`RetryPolicy`].
    pub fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy::new(self.inner.clone())
    }

    /// The admission level believed for `endpoint` now: the last one it
    /// sent, unless older than the [`level_ttl`](DownstreamsBuilder::level_ttl),
    /// capped at the [`level_cap`](DownstreamsBuilder::level_cap); `None`
    /// when none is known or `endpoint` is not configured. A handler that
    /// will call the endpoint can check it before doing any work of its own
    /// for a request below it.
    pub fn level(&self, endpoint: &str) -> Option<Priority> {
        let at = self.inner.endpoint_named(endpoint)?;
        let now = Instant::now();
        let state = self.inner.endpoints[at].state.lock();
        self.inner.believed_level(&state, now)
    }

    /// The highest level believed now for any endpoint (see
    /// [`level`](Self::level)): what a service that calls each of them
    /// for every request cannot admit below.
    pub(crate) fn highest_level(&self) -> Option<Priority> {
        let now = Instant::now();
        self.inner
            .endpoints
            .iter()
            .filter_map(|endpoint| self.inner.believed_level(&endpoint.state.lock(), now))
            .max()
    }

    /// What the client knows of each endpoint now, and the budget's counts.
    pub fn snapshot(&self) -> DownstreamsSnapshot {
        let now = Instant::now();
        let endpoints = self
            .inner
            .endpoints
            .iter()
            .map(|endpoint| {
                let state = endpoint.state.lock();
                EndpointSnapshot {
                    endpoint: endpoint.authority.clone(),
                    level: self.inner.believed_level(&state, now),
                    throttle: state.throttle.probabilities(now),
                    load: state.load,
                    counts: state.counts,
                }
            })
            .collect();
        DownstreamsSnapshot {
            endpoints,
            budget: self.inner.budget.snapshot(),
            random: self.inner.draw_boundary.health(),
        }
    }
}

impl Inner {
    /// The configured endpoint `authority` names; a request without an
    /// authority (a client bound to one origin, such as a tonic channel)
    /// belongs to the only endpoint, when exactly one is configured.
    pub(super) fn endpoint_for(&self, authority: Option<&Authority>) -> Option<usize> {
        match authority {
            Some(authority) => self
                .endpoints
                .iter()
                .position(|endpoint| endpoint.authority == *authority),
            None if self.endpoints.len() == 1 => Some(0),
            None => None,
        }
    }

    fn endpoint_named(&self, endpoint: &str) -> Option<usize> {
        let authority: Authority = endpoint.parse().ok()?;
        self.endpoint_for(Some(&authority))
    }

    /// The level believed at `now`: unexpired, capped.
    pub(super) fn believed_level(&self, state: &EndpointState, now: Instant) -> Option<Priority> {
        let (level, seen) = state.level?;
        let fresh = now.saturating_duration_since(seen) < self.level_ttl;
        fresh.then_some(level.min(self.level_cap))
    }

    /// A uniform draw in `0.0..1.0` from the configured source, behind
    /// its panic boundary; a panic, or a value outside the range, is 1.0
    /// (nothing throttled).
    pub(super) fn draw(&self) -> f64 {
        self.draw_boundary
            .call(|| (self.draw)())
            .filter(|unit| (0.0..1.0).contains(unit))
            .unwrap_or(1.0)
    }
}

impl fmt::Debug for Downstreams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let endpoints: Vec<&Authority> = self
            .inner
            .endpoints
            .iter()
            .map(|endpoint| &endpoint.authority)
            .collect();
        f.debug_struct("Downstreams")
            .field("endpoints", &endpoints)
            .field("level_ttl", &self.inner.level_ttl)
            .field("level_cap", &self.inner.level_cap)
            .field("release_slot", &self.inner.release_slot)
            .field("max_attempts", &self.inner.max_attempts)
            .field("budget", &self.inner.budget)
            .finish_non_exhaustive()
    }
}

/// Settings for [`Downstreams`], validated by [`build`](Self::build).
#[must_use = "a builder does nothing until `build` is called"]
pub struct DownstreamsBuilder {
    endpoints: Vec<String>,
    level_ttl: Duration,
    level_cap: Priority,
    release_slot: bool,
    throttle_multiplier: f64,
    throttle_window: Duration,
    max_attempts: u32,
    backoff: Duration,
    retry_ratio: f64,
    min_retries_per_sec: u32,
    budget_window: Duration,
    draw: Option<Draw>,
}

impl Default for DownstreamsBuilder {
    fn default() -> Self {
        DownstreamsBuilder {
            endpoints: Vec::new(),
            level_ttl: Self::DEFAULT_LEVEL_TTL,
            level_cap: Priority::USER_HIGH,
            release_slot: true,
            throttle_multiplier: 2.0,
            throttle_window: Self::DEFAULT_THROTTLE_WINDOW,
            max_attempts: 3,
            backoff: Self::DEFAULT_BACKOFF,
            retry_ratio: 0.1,
            min_retries_per_sec: 10,
            budget_window: Self::DEFAULT_BUDGET_WINDOW,
            draw: None,
        }
    }
}

impl DownstreamsBuilder {
    /// Default of [`level_ttl`](Self::level_ttl): one second.
    pub(crate) const DEFAULT_LEVEL_TTL: Duration = Duration::from_secs(1);
    /// Default of [`throttle_window`](Self::throttle_window): one second.
    pub(crate) const DEFAULT_THROTTLE_WINDOW: Duration = Duration::from_secs(1);
    /// Default of [`retry_backoff`](Self::retry_backoff): 10 ms.
    pub(crate) const DEFAULT_BACKOFF: Duration = Duration::from_millis(10);
    /// Default of [`retry_budget`](Self::retry_budget)'s window: 10 s.
    pub(crate) const DEFAULT_BUDGET_WINDOW: Duration = Duration::from_secs(10);

    /// An endpoint the client calls, as a URI authority (`host:port`):
    /// requests whose URI names it are checked against what it said, and
    /// its responses are learned from. Nothing is learned from, and
    /// nothing refused for, any other: a level is a claim about the
    /// endpoint's queue, believed only of endpoints the client was
    /// configured to call. A request without an authority in its URI
    /// belongs to the only endpoint when exactly one is configured (a
    /// client bound to one origin, such as a tonic channel). An authority
    /// that does not parse fails [`build`](Self::build) with a
    /// [`ConfigError`] naming `endpoint`.
    pub fn endpoint(mut self, authority: &str) -> Self {
        self.endpoints.push(authority.to_owned());
        self
    }

    /// How long a level is believed without being heard again (default
    /// one second; from 1 ms to an hour). A downstream that goes quiet
    /// (every request to it refused here, so no response says otherwise)
    /// is tried again once its level expires.
    pub fn level_ttl(mut self, ttl: Duration) -> Self {
        self.level_ttl = ttl;
        self
    }

    /// The highest level believed: a level above it is taken as this one,
    /// so that work at or above it is always sent whatever an endpoint
    /// says (default [`Priority::USER_HIGH`]). A level cannot then refuse
    /// everything: what stays is for the throttle and the endpoint itself
    /// to refuse.
    pub fn level_cap(mut self, cap: Priority) -> Self {
        self.level_cap = cap;
        self
    }

    /// Whether the caller's own admission slot (its request admitted by
    /// an [`AdmissionLayer`](crate::tower::AdmissionLayer)) is given back
    /// while an outbound call is in flight and taken again, in order,
    /// when it returns (default: on): the handler is waiting, not
    /// computing. See [`release_during`](crate::tower::release_during).
    pub fn release_slot_during_calls(mut self, on: bool) -> Self {
        self.release_slot = on;
        self
    }

    /// The adaptive throttle's K (at least 1.0; default 2.0): about K
    /// requests are sent per request the endpoint accepts before any is
    /// refused here. Lower is more aggressive.
    pub fn throttle_multiplier(mut self, multiplier: f64) -> Self {
        self.throttle_multiplier = multiplier;
        self
    }

    /// The trailing window the throttle counts requests and accepts over
    /// (10 ms..=1 h; default one second).
    pub fn throttle_window(mut self, window: Duration) -> Self {
        self.throttle_window = window;
        self
    }

    /// Attempts per request, the first included (1..=10; default 3).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts;
        self
    }

    /// The wait before a retry when the refusal gave no hint, doubled on
    /// each retry, with jitter (at most a minute; default 10 ms).
    pub fn retry_backoff(mut self, backoff: Duration) -> Self {
        self.backoff = backoff;
        self
    }

    /// The retry budget: `ratio` retries per request (0.0..=1.0; default
    /// 0.1) plus `min_per_sec` a second (default 10), over the trailing
    /// `window` (10 ms..=1 h; default 10 s). See [`RetryBudget`].
    pub fn retry_budget(mut self, ratio: f64, min_per_sec: u32, window: Duration) -> Self {
        self.retry_ratio = ratio;
        self.min_retries_per_sec = min_per_sec;
        self.budget_window = window;
        self
    }

    test_hook! {
        /// The random source of the throttle's coin and the backoff's
        /// jitter: a uniform draw in `0.0..1.0` (default: `fastrand`). A
        /// test hook (feature `test-util`), for tests that must be
        /// deterministic. It runs behind a panic boundary: a panic, or a
        /// value outside the range, counts as 1.0 (nothing throttled, no
        /// jitter).
        fn random(mut self, draw: impl Fn() -> f64 + Send + Sync + 'static) -> Self {
            self.draw = Some(Box::new(draw));
            self
        }
    }

    /// Validates the settings.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the first setting out of its range:
    /// `endpoint`, `level_ttl`, `throttle_multiplier`, `throttle_window`,
    /// `max_attempts`, `retry_backoff`, `retry_ratio` or `budget_window`.
    ///
    /// # Examples
    ///
    /// ```
    /// use admission::tower::client::Downstreams;
    ///
    /// let downstreams = Downstreams::builder()
    ///     .endpoint("users.internal:8080")
    ///     .endpoint("search.internal:8080")
    ///     .max_attempts(2)
    ///     .build()?;
    /// // Nothing heard from the endpoint yet: no level to refuse by.
    /// assert_eq!(downstreams.level("users.internal:8080"), None);
    ///
    /// let err = Downstreams::builder().max_attempts(0).build().unwrap_err();
    /// assert_eq!(err.field(), "max_attempts");
    /// # Ok::<(), admission::ConfigError>(())
    /// ```
    pub fn build(self) -> Result<Downstreams, ConfigError> {
        let now = Instant::now();
        let mut endpoints: Vec<Endpoint> = Vec::with_capacity(self.endpoints.len());
        for name in &self.endpoints {
            let authority: Authority = name.parse().map_err(|error| {
                ConfigError::new("endpoint", format!("{name:?} is not a host:port: {error}"))
            })?;
            if endpoints.iter().any(|known| known.authority == authority) {
                continue;
            }
            endpoints.push(Endpoint {
                authority,
                state: Mutex::new(EndpointState {
                    level: None,
                    throttle: Throttle::new(self.throttle_multiplier, self.throttle_window, now),
                    load: None,
                    load_asked: None,
                    counts: EndpointCounts::default(),
                }),
            });
        }
        if !(Duration::from_millis(1)..=Duration::from_secs(3600)).contains(&self.level_ttl) {
            return Err(ConfigError::new(
                "level_ttl",
                format!("{:?} is outside 1 ms..=1 h", self.level_ttl),
            ));
        }
        if !(self.throttle_multiplier >= 1.0 && self.throttle_multiplier.is_finite()) {
            return Err(ConfigError::new(
                "throttle_multiplier",
                format!(
                    "{} would throttle requests that are all accepted; at least 1.0",
                    self.throttle_multiplier
                ),
            ));
        }
        if !WINDOW_RANGE.contains(&self.throttle_window) {
            return Err(ConfigError::new(
                "throttle_window",
                format!("{:?} is outside 10 ms..=1 h", self.throttle_window),
            ));
        }
        if !(1..=10).contains(&self.max_attempts) {
            return Err(ConfigError::new(
                "max_attempts",
                format!("{} is outside 1..=10", self.max_attempts),
            ));
        }
        if self.backoff > Duration::from_secs(60) {
            return Err(ConfigError::new(
                "retry_backoff",
                format!("{:?} is over a minute", self.backoff),
            ));
        }
        let rule = BudgetRule::checked(
            self.retry_ratio,
            self.min_retries_per_sec,
            self.budget_window,
        )?;
        let draw = self.draw.unwrap_or_else(|| Box::new(fastrand::f64));
        Ok(Downstreams {
            inner: StdArc::new(Inner {
                endpoints,
                level_ttl: self.level_ttl,
                level_cap: self.level_cap,
                release_slot: self.release_slot,
                max_attempts: self.max_attempts,
                backoff: self.backoff,
                budget: StdArc::new(RetryBudget::with_rule(rule, now)),
                draw,
                draw_boundary: Boundary::new("downstream_random", RANDOM_ON_FAILURE),
            }),
        })
    }
}

impl fmt::Debug for DownstreamsBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DownstreamsBuilder")
            .field("endpoints", &self.endpoints)
            .field("level_ttl", &self.level_ttl)
            .field("level_cap", &self.level_cap)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_out_of_range_are_refused_naming_the_field() {
        let second = Duration::from_secs(1);
        let rows: Vec<(DownstreamsBuilder, &str)> = vec![
            (Downstreams::builder().endpoint("not a host"), "endpoint"),
            (Downstreams::builder().endpoint("http://a:1/"), "endpoint"),
            (
                Downstreams::builder().level_ttl(Duration::ZERO),
                "level_ttl",
            ),
            (
                Downstreams::builder().throttle_multiplier(0.5),
                "throttle_multiplier",
            ),
            (
                Downstreams::builder().throttle_multiplier(f64::NAN),
                "throttle_multiplier",
            ),
            (
                Downstreams::builder().throttle_window(Duration::from_millis(1)),
                "throttle_window",
            ),
            (Downstreams::builder().max_attempts(0), "max_attempts"),
            (Downstreams::builder().max_attempts(11), "max_attempts"),
            (
                Downstreams::builder().retry_backoff(Duration::from_secs(61)),
                "retry_backoff",
            ),
            (
                Downstreams::builder().retry_budget(1.5, 0, second),
                "retry_ratio",
            ),
            (
                Downstreams::builder().retry_budget(0.1, 0, Duration::ZERO),
                "budget_window",
            ),
        ];
        for (builder, field) in rows {
            let error = builder.build().unwrap_err();
            assert_eq!(error.field(), field, "{error}");
        }
        let fine = Downstreams::builder()
            .endpoint("127.0.0.1:8080")
            .endpoint("127.0.0.1:8080")
            .endpoint("backend.internal:443")
            .build()
            .unwrap();
        assert_eq!(fine.snapshot().endpoints.len(), 2, "duplicates kept once");
    }

    #[test]
    fn requests_are_matched_to_configured_endpoints_only() {
        let one = Downstreams::builder()
            .endpoint("127.0.0.1:8080")
            .build()
            .unwrap();
        let at = |downstreams: &Downstreams, authority: Option<&str>| {
            let authority = authority.map(|a| a.parse::<Authority>().unwrap());
            downstreams.inner.endpoint_for(authority.as_ref())
        };
        assert_eq!(at(&one, Some("127.0.0.1:8080")), Some(0));
        assert_eq!(at(&one, Some("127.0.0.1:8081")), None);
        assert_eq!(at(&one, None), Some(0), "the only endpoint");
        let two = Downstreams::builder()
            .endpoint("a.internal:80")
            .endpoint("b.internal:80")
            .build()
            .unwrap();
        assert_eq!(
            at(&two, Some("B.INTERNAL:80")),
            Some(1),
            "hosts ignore case"
        );
        assert_eq!(at(&two, None), None, "which of two is not known");
    }

    #[test]
    fn a_panicking_or_absurd_random_source_throttles_nothing() {
        for draw in [
            Box::new(|| -> f64 { panic!("broken source") }) as Draw,
            Box::new(|| f64::NAN),
            Box::new(|| -1.0),
            Box::new(|| 7.0),
        ] {
            let mut builder = Downstreams::builder();
            builder.draw = Some(draw);
            let downstreams = builder.build().unwrap();
            assert_eq!(downstreams.inner.draw(), 1.0);
        }
        let fixed = Downstreams::builder().random(|| 0.25).build().unwrap();
        assert_eq!(fixed.inner.draw(), 0.25);
        assert!(fixed.snapshot().random.is_healthy());
    }
}
