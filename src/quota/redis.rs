//! The Redis backend (feature `redis`): one hash per tenant, updated by one
//! Lua script (`lease.lua`) on Redis' own clock.
//!
//! # Implementation notes
//!
//! The connection is the `redis` crate's tokio [`ConnectionManager`]
//! (one multiplexed connection that reconnects by itself after an IO
//! error), made lazily on the first exchange, on the quota's leasing
//! thread's runtime, where it lives. An exchange is one pipeline of
//! `EVALSHA`s, one per tenant of the batch; a server that does not know
//! the script (a restarted one) answers `NOSCRIPT`, and the script is
//! loaded and the pipeline sent once more. Each key is
//! `<prefix>:<tenant>` with a TTL of [`key_ttl`](RedisBackendBuilder::key_ttl)
//! (at least the time its burst takes to refill), so tenants that come and
//! go leave no keys behind. Reconnection backs off briefly (50 to 200 ms,
//! two tries a round): a node must find a restarted Redis within its retry
//! interval, not after a long back-off.
//!
//! [`ConnectionManager`]: redis::aio::ConnectionManager

use std::fmt;
use std::sync::OnceLock;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{ErrorKind, RedisError, Script, ServerErrorKind};

use super::backend::{key_ttl_for, BackendError, LeaseBatch, LeaseFuture, Leased, QuotaBackend};
use crate::error::ConfigError;

/// The script every exchange runs; see `lease.lua`.
const LEASE_SCRIPT: &str = include_str!("lease.lua");

/// The fleet's buckets in Redis (feature `redis`); see the [module
/// docs](super) for what the script does and the failure model.
///
/// ```no_run
/// use admission::quota::{Quota, RedisBackend, TenantQuota};
/// use admission::TenantId;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let quota = Quota::builder()
///     .backend(RedisBackend::new("redis://127.0.0.1:6379/")?)
///     .node_id("node-a")
///     .expected_nodes(3)
///     .tenant(TenantId::new(7), TenantQuota::new(1_000, 1_000)?)
///     .build()?;
/// # drop(quota);
/// # Ok(())
/// # }
/// ```
pub struct RedisBackend {
    client: redis::Client,
    prefix: String,
    key_ttl: Duration,
    script: Script,
    connection: OnceLock<ConnectionManager>,
}

/// Builds a [`RedisBackend`]; see [`RedisBackend::builder`].
#[derive(Clone, Debug)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct RedisBackendBuilder {
    url: String,
    prefix: String,
    key_ttl: Duration,
}

impl RedisBackendBuilder {
    /// The prefix of every key (default `admission:quota`): a tenant's
    /// bucket is `<prefix>:<tenant id>`.
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long a bucket nobody exchanges with is kept (default 10
    /// minutes; never less than the time its burst takes to refill).
    /// At least one second.
    pub fn key_ttl(mut self, ttl: Duration) -> Self {
        self.key_ttl = ttl;
        self
    }

    /// The backend. Connects on its first exchange, not here.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `url` if the `redis` crate cannot parse it,
    /// `key_prefix` if it is empty, or `key_ttl` if it is under a second.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission::quota::RedisBackend;
    ///
    /// // Nothing connects yet: no server is needed to build one.
    /// let backend = RedisBackend::builder("redis://127.0.0.1:6379/")
    ///     .key_prefix("checkout:quota")
    ///     .key_ttl(Duration::from_secs(300))
    ///     .build()?;
    /// assert_eq!(backend.key(admission::TenantId::new(7)), "checkout:quota:7");
    ///
    /// let err = RedisBackend::builder("redis://127.0.0.1:6379/")
    ///     .key_ttl(Duration::from_millis(100))
    ///     .build()
    ///     .unwrap_err();
    /// assert_eq!(err.field(), "key_ttl");
    /// # Ok::<(), admission::ConfigError>(())
    /// ```
    pub fn build(self) -> Result<RedisBackend, ConfigError> {
        let client = redis::Client::open(self.url.as_str())
            .map_err(|error| ConfigError::new("url", error.to_string()))?;
        if self.prefix.is_empty() {
            return Err(ConfigError::new("key_prefix", "must not be empty"));
        }
        if self.key_ttl < Duration::from_secs(1) {
            return Err(ConfigError::new(
                "key_ttl",
                format!("{:?} is under the shortest accepted, 1s", self.key_ttl),
            ));
        }
        Ok(RedisBackend {
            client,
            prefix: self.prefix,
            key_ttl: self.key_ttl,
            script: Script::new(LEASE_SCRIPT),
            connection: OnceLock::new(),
        })
    }
}

impl RedisBackend {
    /// A backend on the Redis at `url` (`redis://host:port/db`), with the
    /// defaults.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `url` if it does not parse.
    ///
    /// # Examples
    ///
    /// ```
    /// use admission::quota::RedisBackend;
    ///
    /// // Parsed here, connected on the quota's first exchange.
    /// let backend = RedisBackend::new("redis://127.0.0.1:6379/")?;
    /// assert_eq!(backend.key(admission::TenantId::new(7)), "admission:quota:7");
    ///
    /// let err = RedisBackend::new("not a url").unwrap_err();
    /// assert_eq!(err.field(), "url");
    /// # Ok::<(), admission::ConfigError>(())
    /// ```
    pub fn new(url: &str) -> Result<Self, ConfigError> {
        Self::builder(url).build()
    }

    /// A builder for the Redis at `url`.
    pub fn builder(url: &str) -> RedisBackendBuilder {
        RedisBackendBuilder {
            url: url.to_owned(),
            prefix: "admission:quota".to_owned(),
            key_ttl: Duration::from_secs(600),
        }
    }

    /// The key of `tenant`'s bucket.
    pub fn key(&self, tenant: crate::TenantId) -> String {
        format!("{}:{}", self.prefix, tenant.get())
    }

    fn connection(&self) -> Result<ConnectionManager, BackendError> {
        if let Some(connection) = self.connection.get() {
            return Ok(connection.clone());
        }
        let config = ConnectionManagerConfig::new()
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(Duration::from_millis(200))
            .set_number_of_retries(2)
            .set_connection_timeout(Some(Duration::from_millis(250)))
            .set_response_timeout(Some(Duration::from_secs(1)));
        let made = ConnectionManager::new_lazy_with_config(self.client.clone(), config)
            .map_err(unavailable)?;
        Ok(self.connection.get_or_init(|| made).clone())
    }

    async fn exchange_batch(&self, batch: &LeaseBatch) -> Result<Vec<Leased>, BackendError> {
        let mut connection = self.connection()?;
        let share_ttl = u64::try_from(batch.share_ttl.as_micros()).unwrap_or(u64::MAX);
        let invocations: Vec<_> = batch
            .leases
            .iter()
            .map(|lease| {
                let key_ttl = key_ttl_for(self.key_ttl, lease);
                let key_ttl = u64::try_from(key_ttl.as_millis()).unwrap_or(u64::MAX);
                let mut invocation = self.script.prepare_invoke();
                invocation
                    .key(self.key(lease.tenant))
                    .arg(&*batch.node)
                    .arg(lease.rate)
                    .arg(lease.burst)
                    .arg(lease.asked)
                    .arg(lease.demand)
                    .arg(lease.charge)
                    .arg(lease.returned)
                    .arg(u8::from(lease.leaving))
                    .arg(share_ttl)
                    .arg(key_ttl);
                invocation
            })
            .collect();
        let mut pipe = redis::pipe();
        for invocation in &invocations {
            pipe.invoke_script(invocation);
        }
        let answer: Result<Vec<(u64, u64)>, RedisError> = pipe.query_async(&mut connection).await;
        let answer = match answer {
            Err(error) if error.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.script
                    .load_async(&mut connection)
                    .await
                    .map_err(unavailable)?;
                pipe.query_async(&mut connection).await
            }
            answer => answer,
        };
        let answer = answer.map_err(unavailable)?;
        Ok(answer
            .into_iter()
            .map(|(granted, available)| Leased { granted, available })
            .collect())
    }
}

fn unavailable(error: RedisError) -> BackendError {
    BackendError::Unavailable(error.to_string())
}

impl QuotaBackend for RedisBackend {
    fn exchange<'a>(&'a self, batch: &'a LeaseBatch) -> LeaseFuture<'a> {
        Box::pin(self.exchange_batch(batch))
    }
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("prefix", &self.prefix)
            .field("key_ttl", &self.key_ttl)
            .field("connected", &self.connection.get().is_some())
            .finish_non_exhaustive()
    }
}
