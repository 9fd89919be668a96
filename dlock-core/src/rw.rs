//! Read-write locks: many readers or one writer, writers preferred unless configured.

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument as _;

use crate::engine::{
    Attempted, Engine, FromLockGuard, Lease, LockGuard, check_lease, held_or_timed_out,
    wrapped_guard_methods,
};
use crate::error::LockError;
use crate::fencing::FencingToken;
use crate::hold::{HeldLock, fenced_by_own_method, hold_by_own_methods};
use crate::name::{IntoLockName, LockKeys, LockName};
use crate::request::{LockRequest, RequestKind};
use crate::scope;

/// A read-write lock in Redis: any number of readers at once, or one writer. Made by
/// [`Locker::read_write_lock`](crate::Locker::read_write_lock); cheap to clone.
///
/// - **Writers are preferred** by default: while a writer waits, new readers stay out, so a
///   stream of readers can't starve writers. A waiting writer's wait counts for the
///   [dead-waiter timeout](crate::LockerBuilder::dead_waiter_timeout) after each of its attempts (it
///   attempts at least every third of it), so a writer whose process died holds readers back
///   for at most that long. [`prefer_writers(false)`](Self::prefer_writers) lets readers in
///   whenever no writer holds the lock.
/// - **The writer** holds a lock of its own ([`write`](Self::write) gives a [`LockGuard`]):
///   fencing tokens, the watchdog, loss detection and re-entry inside a
///   [`scope`](mod@crate::scope), as a plain lock.
/// - **Readers** each hold a lease of their own in a sorted set ([`read`](Self::read) gives a
///   [`ReadGuard`]), renewed by the watchdog; a reader that crashed leaves when its lease
///   ends. A read inside a scope that holds the write lock re-enters the writer's hold; a read
///   inside a scope that holds a read re-enters that read. A write inside a scope that holds
///   only a read is refused ([`LockError::Config`]): upgrading would wait for itself.
///
/// The keys of a read-write lock never collide with a plain lock's of the same name.
///
/// ```no_run
/// use std::time::Duration;
///
/// # async fn demo(locker: dlock_core::Locker) -> Result<(), dlock_core::LockError> {
/// let prices = locker.read_write_lock("prices:eu");
/// let read = prices.read().wait(Duration::from_secs(1)).await?;
/// // ... read the prices ...
/// read.release().await;
/// let write = prices.write().wait(Duration::from_secs(5)).await?;
/// // ... write them, handing `write.fencing_token()` to the store ...
/// write.release().await;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct ReadWriteLock {
    engine: Engine,
    /// The name, or why it is not one (kept to be returned by every request).
    name: Result<LockName, Arc<LockError>>,
    prefer_writers: bool,
}

impl ReadWriteLock {
    pub(crate) fn new(engine: Engine, name: impl IntoLockName) -> Self {
        Self {
            name: engine.name(name).map_err(Arc::new),
            engine,
            prefer_writers: true,
        }
    }

    /// Whether new readers stay out while a writer waits (default true). Every handle on one
    /// name should say the same: readers and writers each follow their own handle's setting.
    pub fn prefer_writers(mut self, prefer: bool) -> Self {
        self.prefer_writers = prefer;
        self
    }

    fn name(&self) -> Result<LockName, LockError> {
        self.name.clone().map_err(|err| match &*err {
            LockError::InvalidName(invalid) => LockError::InvalidName(invalid.clone()),
            other => LockError::Config(other.to_string()),
        })
    }

    /// Starts a request for the write lock: await it (or [`try_lock`](LockRequest::try_lock))
    /// for a [`WriteGuard`] with its fencing token. It waits for the writer before it and for
    /// every reader to leave.
    pub fn write(&self) -> WriteRequest {
        let kind = RequestKind::Write {
            prefer_writers: self.prefer_writers,
        };
        LockRequest::new(self.engine.clone(), self.name(), kind)
    }

    /// Starts a request for a read lock: await it (or [`try_lock`](ReadRequest::try_lock)) for
    /// a [`ReadGuard`].
    pub fn read(&self) -> ReadRequest {
        ReadRequest {
            lock: self.clone(),
            wait: self.engine.inner.config.default_wait,
            lease: self.engine.inner.config.default_lease,
        }
    }
}

/// A request for a read lock: set how long to wait and how to lease, then `.await` it.
#[must_use = "a lock request does nothing until awaited"]
#[derive(Debug)]
pub struct ReadRequest {
    lock: ReadWriteLock,
    wait: Duration,
    lease: Lease,
}

impl ReadRequest {
    /// Waits up to `wait` (default: the `Locker`'s default wait); returns within `wait` plus
    /// one command timeout, [`LockError::Busy`] if the writer (or a waiting one) stayed.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// A fixed lease: the read lock expires `lease` after it was granted unless released.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Lease::Fixed(lease);
        self
    }

    /// Watchdog mode with this lease (renewed every third of it while the guard lives).
    pub fn watchdog_lease(mut self, lease: Duration) -> Self {
        self.lease = Lease::Watchdog(lease);
        self
    }

    /// One attempt (ignoring any wait): `Ok(None)` when a writer holds or waits.
    pub async fn try_lock(mut self) -> Result<Option<ReadGuard>, LockError> {
        self.wait = Duration::ZERO;
        match self.run().await? {
            (Attempted::Held(guard), _) => Ok(Some(ReadGuard { guard })),
            (Attempted::Busy(..), _) => Ok(None),
        }
    }

    async fn run(self) -> Result<(Attempted, LockName), LockError> {
        let name = self.lock.name()?;
        check_lease(self.lease.duration())?;
        let engine = self.lock.engine.clone();
        let prefix = &engine.inner.config.prefix;
        let prefer = self.lock.prefer_writers;
        // The writer reads too: a read inside its scope re-enters the write hold.
        let write = LockKeys::read_write(prefix, &name, true, prefer, None);
        if let Some(hold) = scope::find(engine.id(), &write.lock)
            && let Some(guard) = engine.reenter(hold).await?
        {
            return Ok((Attempted::Held(guard), name));
        }
        let keys = Arc::new(LockKeys::read_write(prefix, &name, false, prefer, None));
        let span = crate::engine::spans::acquire(engine.inner.config.span_level, &name, "read");
        let attempted = (engine.acquire_keys(name.clone(), keys, self.wait, self.lease))
            .instrument(span.span.clone())
            .await;
        span.acquired(&attempted);
        let attempted = attempted?;
        Ok((attempted, name))
    }

    async fn acquire_or_timeout(self) -> Result<ReadGuard, LockError> {
        let started = Instant::now();
        let labelled = self.lock.engine.inner.config.metrics_name_label;
        let attempted = self.run().await?;
        held_or_timed_out(attempted, labelled, started).map(|guard| ReadGuard { guard })
    }
}

impl IntoFuture for ReadRequest {
    type Output = Result<ReadGuard, LockError>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.acquire_or_timeout())
    }
}

/// A held read lock (or, inside a writer's scope, the write hold re-entered for reading).
///
/// Dropping it releases it in the background (a runtime must be running); prefer
/// [`release`](Self::release) to learn the outcome.
#[must_use = "the read lock is released as soon as the guard is dropped"]
#[derive(Debug)]
pub struct ReadGuard {
    guard: LockGuard,
}

impl ReadGuard {
    wrapped_guard_methods!(
        what: "the read lock",
        release: "Releases the read lock: the last reader to leave wakes the writers."
    );

    /// Whether this guard re-entered a hold of the same task (a read, or the write lock).
    pub fn is_reentrant(&self) -> bool {
        self.guard.is_reentrant()
    }
}

hold_by_own_methods!(ReadGuard);

/// A request for a read-write lock's write lock ([`ReadWriteLock::write`]): the same settings
/// as every [`LockRequest`], and a [`WriteGuard`] once awaited.
pub type WriteRequest = LockRequest<WriteGuard>;

/// A held write lock of a [`ReadWriteLock`]: a lock's guard, with its fencing token, that no
/// reader shares.
///
/// Dropping it releases the lock in the background (a runtime must be running); prefer
/// [`release`](Self::release) to learn the outcome.
#[must_use = "the lock is released as soon as the guard is dropped"]
#[derive(Debug)]
pub struct WriteGuard {
    guard: LockGuard,
}

impl FromLockGuard for WriteGuard {
    fn from_lock_guard(guard: LockGuard) -> Self {
        Self { guard }
    }
}

impl WriteGuard {
    wrapped_guard_methods!(
        what: "the write lock",
        release: "Releases the write lock and wakes the waiting readers and writer."
    );

    /// The fencing token of this hold, as [`LockGuard::fencing_token`] gives it.
    pub async fn fencing_token(&self) -> Result<FencingToken, LockError> {
        self.guard.fencing_token().await
    }

    /// The fencing token if this hold has one already, without asking Redis (see
    /// [`LockGuard::minted_fencing_token`]).
    pub fn minted_fencing_token(&self) -> Option<FencingToken> {
        self.guard.minted_fencing_token()
    }

    /// A view of this hold that may be kept apart from the guard (see
    /// [`LockGuard::held_lock`]).
    pub fn held_lock(&self) -> HeldLock {
        self.guard.held_lock()
    }

    /// Whether this guard re-entered a write lock that the same task already had.
    pub fn is_reentrant(&self) -> bool {
        self.guard.is_reentrant()
    }

    /// Sets the lease to `lease` from now (see [`LockGuard::extend`]).
    pub async fn extend(&self, lease: Duration) -> Result<(), LockError> {
        self.guard.extend(lease).await
    }

    /// The lock's guard this is: for code that keeps writers' guards beside other locks'.
    pub fn into_lock_guard(self) -> LockGuard {
        self.guard
    }
}

hold_by_own_methods!(WriteGuard);
fenced_by_own_method!(WriteGuard);
