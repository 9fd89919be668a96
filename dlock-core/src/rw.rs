//! Read-write locks: many readers or one writer, writers preferred unless configured.

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument as _;

use crate::engine::{Attempted, Engine, Lease, LockGuard, check_lease, held_or_timed_out};
use crate::error::{LockError, ReleaseOutcome};
use crate::hold::{Lost, hold_by_own_methods};
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
    /// for a [`LockGuard`] with its fencing token. It waits for the writer before it and for
    /// every reader to leave.
    pub fn write(&self) -> LockRequest {
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
            (Attempted::Busy(_), _) => Ok(None),
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
        let span = tracing::debug_span!("dlock.acquire_read", name = name.for_logs());
        let attempted = (engine.acquire_keys(name.clone(), keys, self.wait, self.lease))
            .instrument(span)
            .await?;
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
    /// The lock's name.
    pub fn name(&self) -> &LockName {
        self.guard.name()
    }

    /// Whether this guard re-entered a hold of the same task (a read, or the write lock).
    pub fn is_reentrant(&self) -> bool {
        self.guard.is_reentrant()
    }

    /// Whether the watchdog renews the read lock (otherwise it has a fixed lease).
    pub fn is_watchdog(&self) -> bool {
        self.guard.is_watchdog()
    }

    /// The validity deadline on tokio's clock.
    pub fn valid_until(&self) -> Instant {
        self.guard.valid_until()
    }

    /// How long the read lock is certainly still held for; zero once lost.
    pub fn remaining(&self) -> Duration {
        self.guard.remaining()
    }

    /// Whether the read lock was lost (expired before a renewal, or removed).
    pub fn is_lost(&self) -> bool {
        self.guard.is_lost()
    }

    /// Resolves when the read lock is lost; never for one released normally.
    pub fn lost(&self) -> Lost {
        self.guard.lost()
    }

    /// Runs `fut` while the read lock is held and cancels it as soon as it is lost, returning
    /// [`LockError::Lost`].
    pub async fn run<F: Future>(&self, fut: F) -> Result<F::Output, LockError> {
        self.guard.run(fut).await
    }

    /// Releases the read lock: the last reader to leave wakes the writers.
    pub async fn release(self) -> ReleaseOutcome {
        self.guard.release().await
    }
}

hold_by_own_methods!(ReadGuard);
