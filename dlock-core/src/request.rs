//! Lock requests: how long to wait and how to lease, then `.await`. One request type serves the
//! plain and fair locks and a read-write lock's writer; what it gives is the guard of its kind.

use std::time::Duration;

use futures_util::FutureExt as _;
use futures_util::future::Either;
use tokio::time::Instant;
use tracing::Instrument as _;

use crate::engine::{
    Attempted, Engine, FromLockGuard, Lease, LockGuard, check_at_least, check_lease,
    held_or_timed_out,
};
use crate::error::LockError;
use crate::name::{IntoLockName, LockName};
use std::future::{Future, IntoFuture};
use std::marker::PhantomData;
use std::pin::Pin;

/// A lock request: set how long to wait and how to lease, then `.await` it.
///
/// Awaited, it gives a guard of its kind `G`: a [`LockGuard`] for a plain or fair lock, a
/// [`WriteGuard`](crate::WriteGuard) for a read-write lock's writer
/// ([`WriteRequest`](crate::WriteRequest)).
#[must_use = "a lock request does nothing until awaited"]
#[derive(Debug)]
pub struct LockRequest<G = LockGuard> {
    /// What the request gives once acquired.
    gives: PhantomData<fn() -> G>,
    engine: Engine,
    name: Result<LockName, LockError>,
    wait: Duration,
    lease: Lease,
    at_least: Option<Duration>,
    /// What kind of lock.
    kind: RequestKind,
}

/// What kind of lock a [`LockRequest`] takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RequestKind {
    /// A plain lock ([`Locker::lock`](crate::Locker::lock)).
    Plain,
    /// A fair lock ([`Locker::fair_lock`](crate::Locker::fair_lock)).
    Fair,
    /// A read-write lock's writer ([`ReadWriteLock::write`](crate::ReadWriteLock::write)).
    Write {
        /// New readers stay out while a writer waits.
        prefer_writers: bool,
    },
}

impl<G> LockRequest<G> {
    /// A request of `kind` for `name`, with the `Locker`'s default wait and lease.
    pub(crate) fn new(engine: Engine, name: impl IntoLockName, kind: RequestKind) -> Self {
        Self {
            gives: PhantomData,
            name: engine.name(name),
            wait: engine.default_wait(),
            lease: engine.default_lease(),
            at_least: None,
            kind,
            engine,
        }
    }

    /// Waits up to `wait`, counted from the call, for the lock to become free (default: the
    /// `Locker`'s [`default_wait`](crate::Locker::default_wait), which is one attempt, no waiting,
    /// unless configured). `Duration::MAX` waits for as long as it takes.
    ///
    /// The call returns within `wait` plus one command timeout. A backend error during the wait
    /// is retried until the deadline (Redis may be back in a moment); at the deadline the call
    /// returns that error if Redis has not answered since, [`LockError::Busy`] otherwise.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// A fixed lease: the lock is not renewed and expires `lease` after acquisition unless
    /// released first. Without a lease setting, the request takes the `Locker`'s
    /// [`default_lease`](crate::Locker::default_lease).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Lease::Fixed(lease);
        self
    }

    /// Watchdog mode with this lease (renewed every third of it while the guard lives).
    pub fn watchdog_lease(mut self, lease: Duration) -> Self {
        self.lease = Lease::Watchdog(lease);
        self
    }

    /// Keeps the name taken until at least `at_least` after the acquisition, even when the
    /// guard is released sooner: a scheduled job that finishes quickly does not run again on
    /// another instance within the same period (what ShedLock calls lock-at-least-for; the lease
    /// is the lock-at-most-for). A release before then frees the holder and wakes waiters, but
    /// the name stays taken, by nobody, until the period ends, and it is not handed to a local
    /// waiter; a release after it frees the name at once. Only a fresh acquisition takes it (a
    /// re-entry inside a scope leaves the outer hold's setting alone).
    ///
    /// The period runs from when the grant came back, so it lasts at least `at_least` from the
    /// grant in Redis. A holder that crashes keeps the name until its lease ends — with a fixed
    /// lease, `at_least` may not exceed it ([`LockError::Config`] otherwise); with the watchdog,
    /// a crash frees the name one lease after the last renewal, which may be before the period
    /// ends. With [`ReplicaAck`](crate::ReplicaAck), a release is not held back for replicas, so
    /// a failover right after an early release may free the name before the period ends too.
    pub fn at_least(mut self, at_least: Duration) -> Self {
        self.at_least = Some(at_least);
        self
    }

    /// Keeps this lock's name out of dlock's logs, spans and metric labels when `hide` is true
    /// (see [`LockName::hidden`]); errors returned to the caller still carry it.
    pub fn hide_name(mut self, hide: bool) -> Self {
        self.name = self.name.map(|name| name.hidden(hide));
        self
    }

    /// Makes one attempt (ignoring any wait): `Ok(None)` when the lock is busy.
    pub async fn try_lock(mut self) -> Result<Option<G>, LockError>
    where
        G: FromLockGuard,
    {
        self.wait = Duration::ZERO;
        match self.run().await? {
            (Attempted::Held(guard), _) => Ok(Some(G::from_lock_guard(guard))),
            (Attempted::Busy(..), _) => Ok(None),
        }
    }

    /// The acquisition, built without an `async fn` of its own around it: every layer of
    /// `async fn` keeps its arguments beside the future it awaits, and a waiting request's
    /// future is what each of thousands of waiters holds.
    fn run(self) -> impl Future<Output = Result<(Attempted, LockName), LockError>> + Send {
        let LockRequest {
            gives: _,
            engine,
            name,
            wait,
            lease,
            at_least,
            kind,
        } = self;
        let checked = name.and_then(|name| {
            check_lease(lease.duration())?;
            if let Some(at_least) = at_least {
                check_at_least(at_least, lease)?;
            }
            Ok(name)
        });
        let name = match checked {
            Ok(name) => name,
            Err(err) => return Either::Left(std::future::ready(Err(err))),
        };
        let span_kind = match kind {
            RequestKind::Plain => "lock",
            RequestKind::Fair => "fair",
            RequestKind::Write { .. } => "write",
        };
        let span = crate::engine::spans::acquire(engine.inner.config.span_level, &name, span_kind);
        let attempt = match kind {
            RequestKind::Plain => Either::Left(engine.acquire(name.clone(), wait, lease)),
            // Boxed: the fair and write paths have larger futures than the plain one, which
            // would otherwise size every plain request's future too.
            RequestKind::Fair => {
                Either::Right(Box::pin(engine.acquire_fair(name.clone(), wait, lease))
                    as Pin<Box<dyn Future<Output = Result<Attempted, LockError>> + Send>>)
            }
            RequestKind::Write { prefer_writers } => {
                let keys = match engine.write_keys(&name, prefer_writers, wait) {
                    Ok(keys) => keys,
                    Err(err) => return Either::Left(std::future::ready(Err(err))),
                };
                Either::Right(Box::pin(engine.acquire_keys(name.clone(), keys, wait, lease)) as _)
            }
        };
        Either::Right(attempt.instrument(span.span.clone()).map(move |attempted| {
            span.acquired(&attempted);
            let attempted = attempted?;
            if let (Attempted::Held(guard), Some(at_least)) = (&attempted, at_least)
                && !guard.is_reentrant()
            {
                let _ = (guard.state.keep_until).set(crate::clock::after(Instant::now(), at_least));
            }
            Ok((attempted, name))
        }))
    }

    fn acquire_or_timeout(self) -> impl Future<Output = Result<G, LockError>> + Send
    where
        G: FromLockGuard,
    {
        let started = Instant::now();
        let labelled = self.engine.inner.config.metrics_name_label;
        self.run()
            .map(move |run| held_or_timed_out(run?, labelled, started).map(G::from_lock_guard))
    }
}

impl<G: FromLockGuard + Send + 'static> IntoFuture for LockRequest<G> {
    type Output = Result<G, LockError>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.acquire_or_timeout())
    }
}
