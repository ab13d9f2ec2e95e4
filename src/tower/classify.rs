//! Turning a request into the [`WorkInfo`] it is admitted as, and whose
//! word on that is taken: the rules are the module's
//! [trust model](crate::tower#trust-model).

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use http::{Extensions, HeaderMap, HeaderName, Method, Request, Uri};

use super::propagate::{
    header, parse_grpc_timeout, parse_priority, GRPC_TIMEOUT_HEADER, PRIORITY_HEADER, TENANT_HEADER,
};
use crate::error::ConfigError;
use crate::sync::StdArc;
use crate::work::{Priority, TenantId, WorkInfo};

/// Classifies requests for [`AdmissionLayer`](super::AdmissionLayer):
/// implemented by [`HttpClassifier`] and by every `Fn(&Req) -> WorkInfo`.
///
/// A closure should name its argument type (`|request: &Request| ..`), as
/// Rust cannot infer a closure's argument type from a trait bound alone.
pub trait Classify<Req> {
    /// The class `request` is admitted as. Called once per request, before
    /// admission: it should be cheap.
    fn classify(&self, request: &Req) -> WorkInfo;
}

impl<F, Req> Classify<Req> for F
where
    F: Fn(&Req) -> WorkInfo,
{
    fn classify(&self, request: &Req) -> WorkInfo {
        self(request)
    }
}

/// What a trust predicate sees of a request: everything but its body.
///
/// A view of borrowed parts, as [`http::request::Parts`] is of owned ones:
/// nothing to protect, so its fields are public.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct Caller<'a> {
    /// The request's headers.
    pub headers: &'a HeaderMap,
    /// The request's extensions: where axum puts `ConnectInfo` (the peer
    /// address, with `into_make_service_with_connect_info`) and where an
    /// authentication layer leaves the identity it established.
    pub extensions: &'a Extensions,
    /// The request's URI.
    pub uri: &'a Uri,
    /// The request's method.
    pub method: &'a Method,
}

impl<'a> Caller<'a> {
    /// The view of `request`.
    pub fn of<B>(request: &'a Request<B>) -> Self {
        Caller {
            headers: request.headers(),
            extensions: request.extensions(),
            uri: request.uri(),
            method: request.method(),
        }
    }
}

type TrustPredicate = StdArc<dyn Fn(&Caller<'_>) -> bool + Send + Sync>;

#[derive(Clone)]
enum Trust {
    Nobody,
    Everyone,
    Predicate(TrustPredicate),
}

impl Trust {
    fn trusts(&self, caller: &Caller<'_>) -> bool {
        match self {
            Trust::Nobody => false,
            Trust::Everyone => true,
            Trust::Predicate(trusts) => trusts(caller),
        }
    }
}

impl fmt::Debug for Trust {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Trust::Nobody => "nobody",
            Trust::Everyone => "everyone",
            Trust::Predicate(_) => "predicate",
        })
    }
}

/// Classifies HTTP requests into [`WorkInfo`] from the propagation headers,
/// believing them as far as the caller is trusted (see the
/// [trust model](crate::tower#trust-model)).
///
/// Without headers, requests get the classifier's defaults: the default
/// tenant ([`TenantId::ANONYMOUS`] unless set: anonymous traffic is one
/// tenant of its own, fair against named tenants), the route's priority or the
/// default priority ([`Priority::NORMAL`] unless set), and the default
/// timeout (none unless set; without one, a request waits as long as it
/// takes and early rejection never refuses it).
#[derive(Clone, Debug)]
pub struct HttpClassifier {
    /// Shared: axum clones the layered service, and with it the
    /// classifier, for every request; a clone is then one reference count,
    /// not a copy of the route table.
    config: StdArc<Config>,
}

#[derive(Clone, Debug)]
struct Config {
    default_tenant: TenantId,
    default_priority: Priority,
    max_priority: Priority,
    default_timeout: Option<Duration>,
    deadline_header: HeaderName,
    trust: Trust,
    reserved: Vec<TenantId>,
    routes: HashMap<Box<str>, Priority>,
}

impl Default for HttpClassifier {
    fn default() -> Self {
        HttpClassifier {
            config: StdArc::new(Config {
                default_tenant: TenantId::ANONYMOUS,
                default_priority: Priority::NORMAL,
                max_priority: Priority::USER_HIGH,
                default_timeout: Some(HttpClassifier::DEFAULT_TIMEOUT),
                deadline_header: HeaderName::from_static(GRPC_TIMEOUT_HEADER),
                trust: Trust::Nobody,
                reserved: vec![TenantId::SYSTEM],
                routes: HashMap::new(),
            }),
        }
    }
}

impl HttpClassifier {
    /// The configuration, copied first if a clone shares it (only while
    /// building: a classifier in use is not changed).
    fn config_mut(&mut self) -> &mut Config {
        StdArc::make_mut(&mut self.config)
    }

    /// The defaults described above; nobody's priority or tenant headers
    /// are trusted.
    pub fn new() -> Self {
        Self::default()
    }

    /// The tenant of requests without a (believed) tenant header.
    pub fn default_tenant(mut self, tenant: TenantId) -> Self {
        self.config_mut().default_tenant = tenant;
        self
    }

    /// The priority of requests without a priority header on routes without
    /// their own (default [`Priority::NORMAL`]); also the highest an
    /// untrusted caller's header may ask for there. A default above
    /// [`max_priority`](Self::max_priority) contradicts it and is refused
    /// with a [`ConfigError`] naming `default_priority` (rather than being
    /// capped without a word); to raise both, raise the cap first.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming `default_priority` if it is above
    /// [`max_priority`](Self::max_priority): a default the cap would cut is a
    /// mistake, not a silent cap.
    ///
    /// # Examples
    ///
    /// ```
    /// use admission::tower::HttpClassifier;
    /// use admission::Priority;
    ///
    /// let classifier = HttpClassifier::new().default_priority(Priority::USER_LOW)?;
    /// let work = classifier.classify(&http::Request::new(()));
    /// assert_eq!(work.priority(), Priority::USER_LOW);
    ///
    /// // Above the cap (user-high unless raised): refused, not capped.
    /// let err = HttpClassifier::new().default_priority(Priority::HIGH).unwrap_err();
    /// assert_eq!(err.field(), "default_priority");
    /// # Ok::<(), admission::ConfigError>(())
    /// ```
    pub fn default_priority(mut self, priority: Priority) -> Result<Self, ConfigError> {
        if priority > self.config.max_priority {
            return Err(ConfigError::new(
                "default_priority",
                format!(
                    "{priority} is above max_priority {}; raise max_priority first",
                    self.config.max_priority
                ),
            ));
        }
        self.config_mut().default_priority = priority;
        Ok(self)
    }

    /// The highest priority a trusted caller's header may ask for (default
    /// [`Priority::USER_HIGH`]). A cap below
    /// [`default_priority`](Self::default_priority) is refused with a
    /// [`ConfigError`] naming `max_priority`; to lower both, lower the
    /// default first.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming `max_priority` if it is below the default
    /// priority.
    ///
    /// # Examples
    ///
    /// ```
    /// use admission::tower::{HttpClassifier, PRIORITY_HEADER};
    /// use admission::Priority;
    ///
    /// let classifier = HttpClassifier::new()
    ///     .trust_all()
    ///     .max_priority(Priority::LOCKING_NORMAL)?;
    /// // A trusted caller asking for more than the cap gets the cap.
    /// let request = http::Request::builder()
    ///     .header(PRIORITY_HEADER, "high")
    ///     .body(())
    ///     .unwrap();
    /// assert_eq!(classifier.classify(&request).priority(), Priority::LOCKING_NORMAL);
    ///
    /// // Below the default priority (normal unless lowered): refused.
    /// let err = HttpClassifier::new().max_priority(Priority::USER_LOW).unwrap_err();
    /// assert_eq!(err.field(), "max_priority");
    /// # Ok::<(), admission::ConfigError>(())
    /// ```
    pub fn max_priority(mut self, priority: Priority) -> Result<Self, ConfigError> {
        if priority < self.config.default_priority {
            return Err(ConfigError::new(
                "max_priority",
                format!(
                    "{priority} is below default_priority {}; lower the default first",
                    self.config.default_priority
                ),
            ));
        }
        self.config_mut().max_priority = priority;
        Ok(self)
    }

    /// The priority of requests on `route` (an axum route pattern such as
    /// `/users/{id}`, matched against axum's `MatchedPath` with the `axum`
    /// feature, or else an exact request path). The route is the server's
    /// own decision, so it may be above `max_priority`; an untrusted caller
    /// may still ask to go lower. Later calls for the same route replace
    /// earlier ones.
    pub fn route(mut self, route: &str, priority: Priority) -> Self {
        self.config_mut().routes.insert(route.into(), priority);
        self
    }

    /// The deadline a classifier gives requests unless told otherwise:
    /// [`default_timeout`](Self::default_timeout)'s default.
    pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);

    /// The deadline of requests without a (believed) deadline header, and
    /// the longest an untrusted caller may ask for; one second unless set.
    /// `None` sets none: such requests wait as long as it takes, an
    /// untrusted caller's deadline is not capped, and early rejection
    /// cannot refuse them; for work that is worth doing however late
    /// (batch jobs behind the same layer, say).
    ///
    /// Why a default: a request without a deadline waits as long as it
    /// takes, and early rejection, which refuses work that would wait past
    /// its deadline, can then refuse nothing; under overload every request
    /// waits the queue's full length instead of the excess being turned
    /// away at once (measured before this default: bulk requests waited
    /// 410 ms at p50 with no refusal at all). A second is longer than any
    /// interactive client waits for a first byte, and far shorter than the
    /// minutes a queue can hold; set what your clients' own timeouts are,
    /// or `None` for work that may wait without bound. Zero is refused
    /// with a [`ConfigError`] naming `default_timeout`: every request would
    /// be refused.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming `default_timeout` if it is zero (`None` sets
    /// none).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission::tower::HttpClassifier;
    ///
    /// let classifier = HttpClassifier::new().default_timeout(Duration::from_millis(100))?;
    /// // A request without a deadline header gets one 100 ms out.
    /// let work = classifier.classify(&http::Request::new(()));
    /// assert_eq!(work.deadline(), Some(work.create_time() + Duration::from_millis(100)));
    ///
    /// // No default: it waits as long as it takes.
    /// let unbounded = classifier.default_timeout(None)?;
    /// assert_eq!(unbounded.classify(&http::Request::new(())).deadline(), None);
    ///
    /// let err = HttpClassifier::new().default_timeout(Duration::ZERO).unwrap_err();
    /// assert_eq!(err.field(), "default_timeout");
    /// # Ok::<(), admission::ConfigError>(())
    /// ```
    pub fn default_timeout(
        mut self,
        timeout: impl Into<Option<Duration>>,
    ) -> Result<Self, ConfigError> {
        let timeout = timeout.into();
        if timeout.is_some_and(|timeout| timeout.is_zero()) {
            return Err(ConfigError::new(
                "default_timeout",
                "0 s would refuse every request; use None for no deadline",
            ));
        }
        self.config_mut().default_timeout = timeout;
        Ok(self)
    }

    /// The header read as the request's timeout, in `grpc-timeout` format
    /// (default `grpc-timeout` itself).
    pub fn deadline_header(mut self, name: HeaderName) -> Self {
        self.config_mut().deadline_header = name;
        self
    }

    /// Believes the priority and tenant headers (and a longer deadline) of
    /// callers for which `trusts` returns true; see the
    /// [trust model](crate::tower#trust-model). Called on every request: it should be cheap.
    ///
    /// ```
    /// use std::net::SocketAddr;
    /// use admission::tower::HttpClassifier;
    /// use axum::extract::ConnectInfo;
    ///
    /// // Callers on loopback are the node's own services.
    /// let classifier = HttpClassifier::new().trust(|caller| {
    ///     caller
    ///         .extensions
    ///         .get::<ConnectInfo<SocketAddr>>()
    ///         .is_some_and(|ConnectInfo(peer)| peer.ip().is_loopback())
    /// });
    /// # let _ = classifier;
    /// ```
    pub fn trust(mut self, trusts: impl Fn(&Caller<'_>) -> bool + Send + Sync + 'static) -> Self {
        self.config_mut().trust = Trust::Predicate(StdArc::new(trusts));
        self
    }

    /// Believes every caller's headers: for a service reachable only from
    /// services that classify their own callers (behind an edge that does).
    pub fn trust_all(mut self) -> Self {
        self.config_mut().trust = Trust::Everyone;
        self
    }

    /// Refuses `tenant` from headers, in addition to [`TenantId::SYSTEM`]:
    /// a header naming it is ignored (the default tenant applies).
    pub fn reserve_tenant(mut self, tenant: TenantId) -> Self {
        if !self.config.reserved.contains(&tenant) {
            self.config_mut().reserved.push(tenant);
        }
        self
    }

    fn route_priority(&self, caller: &Caller<'_>) -> Option<Priority> {
        if self.config.routes.is_empty() {
            return None;
        }
        #[cfg(feature = "axum")]
        if let Some(matched) = caller.extensions.get::<axum::extract::MatchedPath>() {
            return self.config.routes.get(matched.as_str()).copied();
        }
        self.config.routes.get(caller.uri.path()).copied()
    }

    /// The request's class, created now.
    pub fn classify<B>(&self, request: &Request<B>) -> WorkInfo {
        let caller = Caller::of(request);
        let headers = caller.headers;
        let trusted = self.config.trust.trusts(&caller);
        let base = self
            .route_priority(&caller)
            .unwrap_or(self.config.default_priority);

        let tenant = header(headers, TENANT_HEADER)
            .filter(|_| trusted)
            .and_then(|value| value.parse::<u64>().ok())
            .map(TenantId::new)
            .filter(|tenant| !self.config.reserved.contains(tenant))
            .unwrap_or(self.config.default_tenant);

        // An untrusted caller may step down, never up; a trusted one up to
        // the cap, or the route's own priority where that is higher.
        let ceiling = if trusted {
            self.config.max_priority.max(base)
        } else {
            base
        };
        let priority = header(headers, PRIORITY_HEADER)
            .and_then(parse_priority)
            .map_or(base, |asked| asked.min(ceiling));

        let asked =
            header(headers, self.config.deadline_header.as_str()).and_then(parse_grpc_timeout);
        let timeout = match (asked, self.config.default_timeout) {
            (Some(asked), Some(default)) if !trusted => Some(asked.min(default)),
            (Some(asked), _) => Some(asked),
            (None, default) => default,
        };

        let mut work = WorkInfo::builder().tenant(tenant).priority(priority);
        if let Some(timeout) = timeout {
            work = work.timeout(timeout);
        }
        work.build()
    }
}

impl<B> Classify<Request<B>> for HttpClassifier {
    fn classify(&self, request: &Request<B>) -> WorkInfo {
        HttpClassifier::classify(self, request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::Instant;

    fn request(headers: &[(&str, &str)]) -> Request<()> {
        let mut builder = Request::builder();
        for &(name, value) in headers {
            builder = builder.header(name, value);
        }
        builder.body(()).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn trusted_headers_map_to_the_work_class_with_defaults_and_a_cap() {
        let classifier = HttpClassifier::new()
            .default_priority(Priority::USER_LOW)
            .unwrap()
            .trust_all();
        let plain = classifier.classify(&request(&[]));
        assert_eq!(
            (plain.tenant(), plain.priority(), plain.deadline()),
            (
                TenantId::ANONYMOUS,
                Priority::USER_LOW,
                Some(Instant::now() + HttpClassifier::DEFAULT_TIMEOUT)
            )
        );
        let unbounded = classifier.clone().default_timeout(None).unwrap();
        assert_eq!(unbounded.config.default_timeout, None);
        assert_eq!(unbounded.classify(&request(&[])).deadline(), None);

        let named = classifier.classify(&request(&[
            (TENANT_HEADER, "42"),
            (PRIORITY_HEADER, "bulk-normal"),
            (GRPC_TIMEOUT_HEADER, "20m"),
        ]));
        assert_eq!(
            (named.tenant(), named.priority()),
            (TenantId::new(42), Priority::BULK_NORMAL)
        );
        assert_eq!(
            named.deadline(),
            Some(named.create_time() + Duration::from_millis(20))
        );

        let greedy = classifier.classify(&request(&[(PRIORITY_HEADER, "127")]));
        assert_eq!(greedy.priority(), Priority::USER_HIGH, "capped");

        let garbage = classifier.classify(&request(&[
            (TENANT_HEADER, "not-a-number"),
            (PRIORITY_HEADER, "urgent!!"),
            (GRPC_TIMEOUT_HEADER, "soon"),
        ]));
        assert_eq!(
            (garbage.tenant(), garbage.priority(), garbage.deadline()),
            (
                TenantId::ANONYMOUS,
                Priority::USER_LOW,
                Some(garbage.create_time() + HttpClassifier::DEFAULT_TIMEOUT)
            )
        );
    }

    #[tokio::test(start_paused = true)]
    async fn routes_set_the_priority_and_the_default_timeout_the_deadline() {
        let classifier = HttpClassifier::new()
            .route("/high", Priority::USER_HIGH)
            .route("/bulk", Priority::BULK_NORMAL)
            .default_timeout(Duration::from_millis(100))
            .unwrap();
        let on = |path: &str| {
            let work = classifier.classify(&Request::get(path).body(()).unwrap());
            (
                work.priority(),
                work.deadline().map(|d| d - work.create_time()),
            )
        };
        let timeout = Some(Duration::from_millis(100));
        assert_eq!(on("/high"), (Priority::USER_HIGH, timeout));
        assert_eq!(on("/bulk"), (Priority::BULK_NORMAL, timeout));
        assert_eq!(on("/other"), (Priority::NORMAL, timeout));
    }
}
