//! The `Locker`: where locks are acquired, and everything they share.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::backend::redis::RedisBackend;
use crate::backend::{Backend, MemoryStore};
use crate::engine::{
    Config, DEFAULT_COMMAND_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_DEAD_WAITER_TIMEOUT,
    DEFAULT_FENCE_TTL, DEFAULT_POLL_INTERVAL, DEFAULT_PREFIX, DEFAULT_WATCHDOG_LEASE, Engine,
    Lease, MAX_LEASE, MIN_DEAD_WAITER_TIMEOUT, check_lease,
};
use crate::error::LockError;
use crate::multi::MultiLockRequest;
use crate::name::{IntoLockName, LockKeys};
use crate::request::{LockRequest, RequestKind};
use crate::rw::ReadWriteLock;
use crate::semaphore::Semaphore;

mod advisory;
mod builder;
mod checks;
#[cfg(feature = "cluster")]
mod cluster;
mod config;
mod connect;
mod default;
mod inspect;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sentinel")]
mod sentinel;
mod stats;
mod url;

pub use advisory::AdvisoryLock;
pub use builder::LockerBuilder;
pub use config::{ConfigError, LockerConfig};
pub use default::{default_locker, set_default_locker};
pub use inspect::{Holder, LockInfo};
pub use stats::LockerStats;

/// Acquires distributed locks.
///
/// Cheap to clone: clones share the connection, the scripts, the watchdog and the subscriber.
///
/// ```no_run
/// use std::time::Duration;
///
/// # async fn demo() -> Result<(), dlock_core::LockError> {
/// let locker = dlock_core::Locker::connect("redis://127.0.0.1:6379/").await?;
/// let guard = locker.lock("order:42").wait(Duration::from_secs(3)).await?;
/// // ... the guarded work, handing `guard.fencing_token()` to the resource ...
/// assert!(guard.release().await.is_released());
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Locker {
    pub(crate) engine: Engine,
}

impl fmt::Debug for Locker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.engine, f)
    }
}

impl Locker {
    /// Connects to the Redis server at `url` (`redis://[user[:password]@]host[:port][/db]`, or
    /// `rediss://` with the `tls-rustls` feature) with the default settings — or, with the
    /// `postgres` feature, to the PostgreSQL database at a `postgres://` URL.
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        Self::builder().url(url).build().await
    }

    /// Configures a `Locker`.
    pub fn builder() -> LockerBuilder {
        LockerBuilder::default()
    }

    /// A `Locker` over a fresh in-process [`MemoryStore`], for tests.
    pub fn memory() -> Self {
        Self::memory_with(MemoryStore::new())
    }

    /// A `Locker` over a shared in-process [`MemoryStore`].
    pub fn memory_with(store: MemoryStore) -> Self {
        Self::from_parts(
            Backend::Redis(Arc::new(RedisBackend::memory(
                store,
                DEFAULT_COMMAND_TIMEOUT,
            ))),
            Config::default(),
            "memory".to_owned(),
        )
    }

    /// Whether this `Locker` runs an earlier layout's frozen scripts (built with
    /// `LockerBuilder::frozen_layout`, for tests that run two versions side by side).
    #[doc(hidden)]
    pub fn runs_frozen_layout(&self) -> bool {
        self.engine.inner.backend.runs_frozen_layout()
    }

    fn from_parts(backend: Backend, config: Config, display: String) -> Self {
        Self {
            engine: Engine::new(backend, config, display),
        }
    }

    /// Starts a lock request for `name`: await it to acquire.
    ///
    /// `name` is a `&str`/`String` (trusted text, validated) or a [`LockName`](crate::LockName) built from escaped
    /// values. The request starts from the `Locker`'s [`default_wait`](Self::default_wait) and
    /// [`default_lease`](Self::default_lease): with the builder's defaults, one attempt and a
    /// 30 s watchdog lease.
    pub fn lock(&self, name: impl IntoLockName) -> LockRequest {
        LockRequest::new(self.engine.clone(), name, RequestKind::Plain)
    }

    /// Starts a request for the fair lock `name`: waiters get it in the order they came, across
    /// processes. Await it, or call [`try_lock`](LockRequest::try_lock), as for [`lock`](Self::lock).
    ///
    /// A fair lock is a plain lock (same key, same fencing tokens, watchdog, loss detection,
    /// re-entry inside a [`scope`](mod@crate::scope)) with a line of waiters in Redis. A request that
    /// finds the lock taken, or finds others in line, joins the line at the back; the lock goes
    /// to the head of the line, and a release wakes the head alone, on its own channel. A
    /// [`try_lock`](LockRequest::try_lock) never joins the line and gets the lock only when it is
    /// free and nobody is in line. Waiters of one `Locker` each stand in line themselves (no
    /// hand-over between them), so the order holds across tasks and processes alike.
    ///
    /// A waiter that stops waiting (its wait ran out, or its future was dropped) leaves the line
    /// at once. A waiter whose process crashed or froze stays in line until the
    /// [dead-waiter timeout](LockerBuilder::dead_waiter_timeout) has passed since its last
    /// attempt (5 s unless configured), so it delays the line by at most that timeout plus a
    /// third of it; waiters show they are alive with an attempt at least every third of it.
    /// The line's keys expire with their last waiter, so none is left behind.
    ///
    /// Use a name either fairly or plainly, not both: a plain request ignores the line.
    pub fn fair_lock(&self, name: impl IntoLockName) -> LockRequest {
        LockRequest::new(self.engine.clone(), name, RequestKind::Fair)
    }

    /// How long a request waits when it doesn't say
    /// ([`LockerBuilder::default_wait`]; zero, one attempt, unless configured).
    pub fn default_wait(&self) -> Duration {
        self.engine.inner.config.default_wait
    }

    /// How a request leases its lock when it doesn't say
    /// ([`LockerBuilder::default_lease`]; a 30 s watchdog lease unless configured).
    pub fn default_lease(&self) -> Lease {
        self.engine.inner.config.default_lease
    }

    /// Starts an all-or-none request for several names (see [`MultiLockRequest`]). Names are
    /// deduplicated and taken in key order, so overlapping multi-locks never deadlock.
    pub fn lock_all<I>(&self, names: I) -> MultiLockRequest
    where
        I: IntoIterator,
        I::Item: IntoLockName,
    {
        MultiLockRequest::new(self.engine.clone(), names)
    }

    /// Whether this `Locker` keeps every lock name out of dlock's logs, spans and metric labels
    /// ([`LockerBuilder::hide_names`]): code that logs names of its own next to dlock's should
    /// hide them too when this is true.
    pub fn names_hidden(&self) -> bool {
        self.engine.inner.config.hide_names
    }

    /// The Redis key that holds the lock `name` (`<prefix>{<name>}`).
    pub fn key_of(&self, name: impl IntoLockName) -> Result<String, LockError> {
        let name = name.into_lock_name()?;
        Ok(LockKeys::new(&self.engine.inner.config.prefix, &name).lock)
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.engine.inner.config.prefix
    }

    pub(crate) fn id(&self) -> u64 {
        self.engine.id()
    }

    /// The read-write lock `name` (writers preferred; see [`ReadWriteLock`]).
    pub fn read_write_lock(&self, name: impl IntoLockName) -> ReadWriteLock {
        ReadWriteLock::new(self.engine.clone(), name)
    }

    /// A semaphore named `name` with `permits` permits (unless a count was set for the name at
    /// run time, see [`Semaphore::set_permits`]). A semaphore's keys never collide with a lock's
    /// of the same name.
    ///
    /// A handle needs at least one permit of its own: a request on a handle made with `0` is a
    /// [`LockError::Config`], whatever count is set at run time (its `status` still reads that
    /// count). To stop granting permits for a while, set the count to `0` at run time.
    pub fn semaphore(&self, name: impl IntoLockName, permits: u32) -> Semaphore {
        Semaphore::new(self.engine.clone(), name, permits)
    }

    /// Checks that the backend answers, within the command timeout.
    pub async fn ping(&self) -> Result<(), LockError> {
        match &self.engine.inner.backend {
            Backend::Redis(r) => r.ping().await.map_err(LockError::Backend),
            #[cfg(feature = "postgres")]
            Backend::Postgres(p) => p.ping().await.map_err(LockError::Backend),
        }
    }
}
