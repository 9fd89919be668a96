//! The `Locker`: where locks are acquired, and everything they share.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::backend::redis::RedisBackend;
use crate::backend::{Backend, MemoryStore};
use crate::error::LockError;
use crate::multi::MultiLockRequest;
use crate::name::{IntoLockName, LockKeys};
use crate::watchdog::Watchdog;

mod acquire;
mod builder;
mod checks;
#[cfg(feature = "cluster")]
mod cluster;
mod connect;
mod default;
mod fair;
mod fence;
mod head;
mod in_flight;
mod inspect;
mod lease;
mod leave;
mod owner;
mod queue;
mod release;
mod request;
mod rw;
mod semaphore;
#[cfg(feature = "sentinel")]
mod sentinel;
mod stats;
mod url;

use acquire::Attempted;
pub(crate) use acquire::{TriedAll, is_permanent};
pub use builder::LockerBuilder;
pub use default::{default_locker, set_default_locker};
use in_flight::InFlight;
pub use inspect::{Holder, LockInfo};
pub use lease::Lease;
pub(crate) use lease::check_at_least;
use owner::new_owner;
use queue::{HeadWait, QueueEntry, handed};
use release::release_outcome;
pub use request::LockRequest;
use request::RequestKind;
pub use rw::{ReadGuard, ReadRequest, ReadWriteLock};
pub use semaphore::{Permit, PermitRequest, Semaphore, SemaphoreStatus};
pub use stats::LockerStats;

/// The default lease of a watchdog-mode lock; it is renewed every third of it.
pub const DEFAULT_WATCHDOG_LEASE: Duration = Duration::from_secs(30);
/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "dlock:";
/// The default bound on every Redis command.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(2);
/// The default bound on connecting to Redis.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// The default lifetime of an idle fencing counter.
pub const DEFAULT_FENCE_TTL: Duration = Duration::from_secs(7 * 24 * 3600);
/// How often a waiter retries when wake-ups cannot be delivered (no subscriber connection).
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(50);
/// How long a fair lock's waiter keeps its place in line without showing that it is alive
/// (see [`LockerBuilder::dead_waiter_timeout`]).
pub const DEFAULT_DEAD_WAITER_TIMEOUT: Duration = Duration::from_secs(5);
/// The shortest dead-waiter timeout accepted.
const MIN_DEAD_WAITER_TIMEOUT: Duration = Duration::from_millis(30);

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn next_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

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
    inner: Arc<LockerInner>,
}

pub(crate) struct LockerInner {
    id: u64,
    pub(crate) backend: Backend,
    config: Config,
    pub(crate) watchdog: Watchdog,
    queues: Mutex<HashMap<queue::ByLock, QueueEntry>>,
    /// The last acquisition attempt's round trip, in µs (0: none yet): how long a turn kept for
    /// one of this `Locker`'s waiters must last.
    round_trip_us: std::sync::atomic::AtomicU64,
    /// A random id, named in the turns this `Locker`'s waiters claim: its hand-overs may serve
    /// its own waiters, never pass over another `Locker`'s.
    turn_id: Arc<str>,
    /// Where the locker points, with any password removed.
    display: String,
}

impl Drop for LockerInner {
    fn drop(&mut self) {
        self.watchdog.shutdown();
    }
}

#[derive(Debug, Clone)]
struct Config {
    prefix: String,
    default_wait: Duration,
    default_lease: Lease,
    fence_ttl: Option<Duration>,
    poll_interval: Duration,
    /// How long a fair waiter keeps its place without an attempt.
    dead_waiter_timeout: Duration,
    handoff: bool,
    /// Label metrics with the lock's name (see [`crate::metrics`]).
    metrics_name_label: bool,
    /// Keep every name of this `Locker` out of logs, spans and metric labels.
    hide_names: bool,
    /// Carried in every owner token this `Locker` mints, for `inspect` to show.
    holder_label: Option<Arc<str>>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            prefix: DEFAULT_PREFIX.to_owned(),
            default_wait: Duration::ZERO,
            default_lease: Lease::Watchdog(DEFAULT_WATCHDOG_LEASE),
            fence_ttl: Some(DEFAULT_FENCE_TTL),
            poll_interval: DEFAULT_POLL_INTERVAL,
            dead_waiter_timeout: DEFAULT_DEAD_WAITER_TIMEOUT,
            handoff: true,
            metrics_name_label: false,
            hide_names: false,
            holder_label: None,
        }
    }
}

impl fmt::Debug for Locker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Locker")
            .field("backend", &self.inner.backend.kind())
            .field("at", &self.inner.display)
            .field("prefix", &self.inner.config.prefix)
            .field("default_wait", &self.inner.config.default_wait)
            .field("default_lease", &self.inner.config.default_lease)
            .field("held", &self.inner.watchdog.len())
            .finish()
    }
}

impl Locker {
    /// Connects to the Redis server at `url` (`redis://[user[:password]@]host[:port][/db]`, or
    /// `rediss://` with the `tls-rustls` feature) with the default settings.
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

    fn from_parts(backend: Backend, config: Config, display: String) -> Self {
        Self {
            inner: Arc::new(LockerInner {
                id: next_id(),
                backend,
                config,
                watchdog: Watchdog::default(),
                queues: Mutex::new(HashMap::new()),
                round_trip_us: std::sync::atomic::AtomicU64::new(0),
                turn_id: new_owner(None),
                display,
            }),
        }
    }

    /// Starts a lock request for `name`: await it to acquire.
    ///
    /// `name` is a `&str`/`String` (trusted text, validated) or a [`LockName`](crate::LockName) built from escaped
    /// values. The request starts from the `Locker`'s [`default_wait`](Self::default_wait) and
    /// [`default_lease`](Self::default_lease): with the builder's defaults, one attempt and a
    /// 30 s watchdog lease.
    pub fn lock(&self, name: impl IntoLockName) -> LockRequest {
        LockRequest {
            locker: self.clone(),
            name: self.name(name),
            wait: self.inner.config.default_wait,
            lease: self.inner.config.default_lease,
            at_least: None,
            kind: RequestKind::Plain,
        }
    }

    /// Starts a request for the fair lock `name`: waiters get it in the order they came, across
    /// processes. Await it, or call [`try_lock`](LockRequest::try_lock), as for [`lock`](Self::lock).
    ///
    /// A fair lock is a plain lock (same key, same fencing tokens, watchdog, loss detection,
    /// re-entry inside a [`scope`](crate::scope)) with a line of waiters in Redis. A request that
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
        LockRequest {
            kind: RequestKind::Fair,
            ..self.lock(name)
        }
    }

    /// How long a request waits when it doesn't say
    /// ([`LockerBuilder::default_wait`]; zero, one attempt, unless configured).
    pub fn default_wait(&self) -> Duration {
        self.inner.config.default_wait
    }

    /// How a request leases its lock when it doesn't say
    /// ([`LockerBuilder::default_lease`]; a 30 s watchdog lease unless configured).
    pub fn default_lease(&self) -> Lease {
        self.inner.config.default_lease
    }

    /// Starts an all-or-none request for several names (see [`MultiLockRequest`]). Names are
    /// deduplicated and taken in key order, so overlapping multi-locks never deadlock.
    pub fn lock_all<I>(&self, names: I) -> MultiLockRequest
    where
        I: IntoIterator,
        I::Item: IntoLockName,
    {
        MultiLockRequest::new(self.clone(), names)
    }

    /// Whether this `Locker` keeps every lock name out of dlock's logs, spans and metric labels
    /// ([`LockerBuilder::hide_names`]): code that logs names of its own next to dlock's should
    /// hide them too when this is true.
    pub fn names_hidden(&self) -> bool {
        self.inner.config.hide_names
    }

    /// `name`, validated and hidden from logs if this `Locker` hides every name.
    fn name(&self, name: impl IntoLockName) -> Result<crate::LockName, LockError> {
        let name = name.into_lock_name()?;
        Ok(if self.inner.config.hide_names {
            name.hidden(true)
        } else {
            name
        })
    }

    /// The Redis key that holds the lock `name` (`<prefix>{<name>}`).
    pub fn key_of(&self, name: impl IntoLockName) -> Result<String, LockError> {
        let name = name.into_lock_name()?;
        Ok(LockKeys::new(&self.inner.config.prefix, &name).lock)
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.inner.config.prefix
    }

    pub(crate) fn id(&self) -> u64 {
        self.inner.id
    }

    /// Checks that the backend answers, within the command timeout.
    pub async fn ping(&self) -> Result<(), LockError> {
        match &self.inner.backend {
            Backend::Redis(r) => r.ping().await.map_err(LockError::Backend),
        }
    }
}
