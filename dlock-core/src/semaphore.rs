//! Semaphores with expiring permits: at most N holders of one name at once, across processes.

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument as _;

use crate::engine::{
    Attempted, Engine, Lease, LockGuard, check_lease, held_or_timed_out, wrapped_guard_methods,
};
use crate::error::LockError;
use crate::hold::hold_by_own_methods;
use crate::name::{IntoLockName, LockKeys, LockName};

/// A counting semaphore in Redis: at most [`permits`](Self::permits) holders of one name at a
/// time, across tasks and processes. Made by [`Locker::semaphore`](crate::Locker::semaphore); cheap to clone.
///
/// Each [`Permit`] has an id and a lease of its own, renewed by the watchdog while the permit
/// lives (or fixed), so a holder that crashed gives its permit back when its lease ends. Waiters
/// are woken by every release. The count can be changed while the semaphore is in use
/// ([`set_permits`](Self::set_permits)): every handle on the name then uses the new count.
///
/// [`acquire_many(n)`](Self::acquire_many) takes `n` permits at once, all or none, as one
/// [`Permit`]. Waiting, it is not starved by requests for one: once it has waited longest, free
/// permits are kept for it until it has enough.
///
/// ```no_run
/// use std::time::Duration;
///
/// # async fn demo(locker: dlock_core::Locker) -> Result<(), dlock_core::LockError> {
/// // At most 3 checkouts of one SKU at a time, across every instance of the service.
/// let checkouts = locker.semaphore("checkout:sku-42", 3);
/// let permit = checkouts.acquire().wait(Duration::from_secs(2)).await?;
/// // ... the checkout ...
/// assert!(permit.release().await.is_released());
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Semaphore {
    engine: Engine,
    /// The name, or why it is not one (kept to be returned by every call).
    name: Result<LockName, Arc<LockError>>,
    permits: u32,
}

/// What a semaphore holds, read from Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct SemaphoreStatus {
    /// Permits held now (unexpired).
    pub held: u32,
    /// The count in force: the one set with [`Semaphore::set_permits`], or this handle's own.
    pub permits: u32,
    /// Whether a count was set at run time.
    pub set: bool,
}

impl Semaphore {
    pub(crate) fn new(engine: Engine, name: impl IntoLockName, permits: u32) -> Self {
        Self {
            name: engine.name(name).map_err(Arc::new),
            engine,
            permits,
        }
    }

    /// The count this handle uses when none was set at run time.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    fn keys(&self) -> Result<(LockName, Arc<LockKeys>), LockError> {
        self.keys_taking(1, Duration::ZERO)
    }

    /// The keys of a request for `take` permits that may wait `wait`.
    fn keys_taking(
        &self,
        take: u32,
        wait: Duration,
    ) -> Result<(LockName, Arc<LockKeys>), LockError> {
        let name = self.name.clone().map_err(|err| match &*err {
            LockError::InvalidName(invalid) => LockError::InvalidName(invalid.clone()),
            other => LockError::Config(other.to_string()),
        })?;
        let config = &self.engine.inner.config;
        // A waiting request for several keeps free permits from others while it waits longest:
        // for as long as a waiter counts as alive without another attempt.
        let counts = (!wait.is_zero()).then_some(config.dead_waiter_timeout);
        let keys = LockKeys::semaphore(&config.prefix, &name, self.permits, (take, counts));
        Ok((name, Arc::new(keys)))
    }

    /// Starts a request for one permit: set how long to wait and how to lease, then `.await`.
    pub fn acquire(&self) -> PermitRequest {
        self.acquire_many(1)
    }

    /// Starts a request for `n` permits at once: all of them, held as one [`Permit`] and given
    /// back together, or none. Set how long to wait and how to lease, then `.await`.
    ///
    /// Requests for one do not starve it: once it is the request that has waited longest (in
    /// its process, and across processes once it has claimed its turn), no other request takes
    /// a free permit until it has its `n`, for as long as it goes on waiting. `n` must be at
    /// least 1 and at most this handle's [`permits`](Self::permits) (a [`LockError::Config`]
    /// otherwise); a count set at run time below `n` keeps it waiting without holding permits
    /// from others.
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// # async fn demo(locker: dlock_core::Locker) -> Result<(), dlock_core::LockError> {
    /// // A large export takes 4 of the 10 database connections the service may use at once.
    /// let connections = locker.semaphore("db-connections", 10);
    /// let four = connections.acquire_many(4).wait(Duration::from_secs(5)).await?;
    /// assert_eq!(four.permits(), 4);
    /// // ... the export ...
    /// four.release().await;
    /// # Ok(())
    /// # }
    /// ```
    pub fn acquire_many(&self, n: u32) -> PermitRequest {
        PermitRequest {
            semaphore: self.clone(),
            take: n,
            wait: self.engine.inner.config.default_wait,
            lease: self.engine.inner.config.default_lease,
        }
    }

    /// Sets the permit count for every handle on this name, from now on, and wakes waiters (a
    /// higher count lets them in at once). Permits already held stay valid when the count goes
    /// down; new ones are granted once fewer than the new count are held. The count stays in
    /// Redis until changed or [reset](Self::reset_permits).
    ///
    /// A count of `0` closes the semaphore: no permit is granted (requests wait, and time out,
    /// or [`try_lock`](PermitRequest::try_lock) says none is free) until a higher count is set or the count is reset.
    ///
    /// A call that returns an error may still take effect, and later than calls made after it:
    /// a command held up in a stalled connection runs when the connection moves again. Read the
    /// count in force with [`status`](Self::status).
    ///
    /// On a PostgreSQL `Locker` a semaphore's count is its handle's: this is a
    /// [`LockError::Config`].
    pub async fn set_permits(&self, permits: u32) -> Result<(), LockError> {
        self.store_permits(Some(permits)).await
    }

    /// Removes a count set with [`set_permits`](Self::set_permits): each handle's own count
    /// applies again.
    pub async fn reset_permits(&self) -> Result<(), LockError> {
        self.store_permits(None).await
    }

    async fn store_permits(&self, permits: Option<u32>) -> Result<(), LockError> {
        let (_, keys) = self.keys()?;
        self.engine.inner.backend.offers(&keys.kind)?;
        self.engine.inner.backend.sets_permits()?;
        let session = self.engine.session().await?;
        (session.set_permits(&keys, permits).await).map_err(LockError::Backend)
    }

    /// How many permits are held now and the count in force, read from Redis in one script.
    pub async fn status(&self) -> Result<SemaphoreStatus, LockError> {
        let (_, keys) = self.keys()?;
        self.engine.inner.backend.offers(&keys.kind)?;
        let session = self.engine.session().await?;
        let (held, set) = (session.permits(&keys).await).map_err(LockError::Backend)?;
        Ok(SemaphoreStatus {
            held,
            permits: set.unwrap_or(self.permits),
            set: set.is_some(),
        })
    }
}

/// A request for one permit of a [`Semaphore`]: set how long to wait and how to lease, then
/// `.await` it.
#[must_use = "a permit request does nothing until awaited"]
#[derive(Debug)]
pub struct PermitRequest {
    semaphore: Semaphore,
    /// How many permits it takes at once.
    take: u32,
    wait: Duration,
    lease: Lease,
}

impl PermitRequest {
    /// Waits up to `wait` for a permit (default: the `Locker`'s default wait). Returns within
    /// `wait` plus one command timeout; [`LockError::Busy`] if every permit stayed taken.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// A fixed lease: the permit is not renewed and expires `lease` after it was granted unless
    /// given back first.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Lease::Fixed(lease);
        self
    }

    /// Watchdog mode with this lease (renewed every third of it while the permit lives).
    pub fn watchdog_lease(mut self, lease: Duration) -> Self {
        self.lease = Lease::Watchdog(lease);
        self
    }

    /// One attempt (ignoring any wait): `Ok(None)` when every permit is taken. Every request
    /// has it under this name.
    pub async fn try_lock(mut self) -> Result<Option<Permit>, LockError> {
        self.wait = Duration::ZERO;
        match self.run().await? {
            (Attempted::Held(guard), _) => Ok(Some(Permit { guard })),
            (Attempted::Busy(..), _) => Ok(None),
        }
    }

    /// The old name of [`try_lock`](Self::try_lock).
    #[deprecated(note = "renamed `try_lock`, as on every request")]
    pub async fn try_acquire(self) -> Result<Option<Permit>, LockError> {
        self.try_lock().await
    }

    async fn run(self) -> Result<(Attempted, LockName), LockError> {
        let (name, keys) = self.semaphore.keys_taking(self.take, self.wait)?;
        let permits = self.semaphore.permits;
        if permits == 0 {
            return Err(LockError::Config(format!(
                "semaphore {name} has no permits: give it at least one"
            )));
        }
        if self.take == 0 || self.take > permits {
            return Err(LockError::Config(format!(
                "semaphore {name} of {permits} permits can't give {} at once: ask for 1 to {permits}",
                self.take
            )));
        }
        let engine = &self.semaphore.engine;
        if self.take > 1 && engine.inner.backend.runs_frozen_layout() {
            return Err(LockError::Config(
                "permits taken at once need this version's scripts, not an earlier layout's".into(),
            ));
        }
        check_lease(self.lease.duration())?;
        let engine = self.semaphore.engine.clone();
        let span = crate::engine::spans::acquire(engine.inner.config.span_level, &name, "permit");
        let attempted = (engine.acquire_keys(name.clone(), keys, self.wait, self.lease))
            .instrument(span.span.clone())
            .await;
        span.acquired(&attempted);
        let attempted = attempted?;
        Ok((attempted, name))
    }

    async fn acquire_or_timeout(self) -> Result<Permit, LockError> {
        let started = Instant::now();
        let labelled = self.semaphore.engine.inner.config.metrics_name_label;
        let attempted = self.run().await?;
        held_or_timed_out(attempted, labelled, started).map(|guard| Permit { guard })
    }
}

impl IntoFuture for PermitRequest {
    type Output = Result<Permit, LockError>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.acquire_or_timeout())
    }
}

/// A held permit of a [`Semaphore`].
///
/// Dropping it gives the permit back in the background (a runtime must be running); prefer
/// [`release`](Self::release) to learn the outcome.
#[must_use = "the permit is given back as soon as it is dropped"]
#[derive(Debug)]
pub struct Permit {
    guard: LockGuard,
}

impl Permit {
    wrapped_guard_methods!(
        what: "the permit",
        release: "Gives the permit back and wakes waiters: `Released`, or `Expired` if it was \
                  gone already."
    );

    /// This permit's id, unique among the semaphore's permits.
    pub fn id(&self) -> &str {
        &self.guard.state.owner
    }

    /// How many permits it is: 1, or the `n` of [`Semaphore::acquire_many`].
    pub fn permits(&self) -> u32 {
        self.guard.state.keys.members()
    }
}

hold_by_own_methods!(Permit);
