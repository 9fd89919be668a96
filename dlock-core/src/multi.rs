//! All-or-none locking of several names.
//!
//! Names are deduplicated and acquired in the order of their keys, so two multi-locks over
//! overlapping sets can never deadlock each other; the wait deadline is shared by all of them.
//! Names next to each other in that order that live together — every name on one server, names
//! in one slot on a cluster — are first tried in one script, all or none; if one of them is
//! busy, they are taken one by one in order. If any name stays busy past the deadline (or the
//! backend fails), every lock already taken is released before the error is returned.

use std::fmt;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::time::Duration;

use tokio::time::Instant;

use crate::engine::{Engine, Lease, LockGuard, TriedAll, check_at_least, is_permanent};
use crate::error::{LockError, ReleaseOutcome};
use crate::fencing::FencingToken;
use crate::hold::{Lost, hold_by_own_methods, worst};
use crate::name::{IntoLockName, LockName};
use crate::request::{LockRequest, RequestKind};

/// A request for several locks at once: set the wait and lease, then `.await` it.
///
/// It returns within its wait plus one command timeout per name; when it fails after taking
/// some of them, it gives those back before returning (all at once: at most two command
/// timeouts more), so that none is held when it returns.
#[must_use = "a lock request does nothing until awaited"]
pub struct MultiLockRequest {
    engine: Engine,
    names: Result<Vec<LockName>, LockError>,
    wait: Duration,
    lease: Option<Lease>,
    at_least: Option<Duration>,
}

impl fmt::Debug for MultiLockRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiLockRequest")
            .field("names", &self.names)
            .field("wait", &self.wait)
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

impl MultiLockRequest {
    pub(crate) fn new<I>(engine: Engine, names: I) -> Self
    where
        I: IntoIterator,
        I::Item: IntoLockName,
    {
        let names = names
            .into_iter()
            .map(IntoLockName::into_lock_name)
            .collect::<Result<Vec<_>, _>>();
        Self {
            wait: engine.default_wait(),
            engine,
            names,
            lease: None,
            at_least: None,
        }
    }

    /// Waits up to `wait` (one deadline for all names, counted from the call; default: the
    /// `Locker`'s [`default_wait`](crate::Locker::default_wait)). Without a lease setting, every lock
    /// takes the `Locker`'s [`default_lease`](crate::Locker::default_lease).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// A fixed lease for every lock (no renewal).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(Lease::Fixed(lease));
        self
    }

    /// Watchdog mode with this lease for every lock.
    pub fn watchdog_lease(mut self, lease: Duration) -> Self {
        self.lease = Some(Lease::Watchdog(lease));
        self
    }

    /// Keeps every name taken until at least `at_least` after the grant, even when released
    /// sooner (see [`LockRequest::at_least`](crate::LockRequest::at_least)).
    pub fn at_least(mut self, at_least: Duration) -> Self {
        self.at_least = Some(at_least);
        self
    }

    /// Keeps these names out of dlock's logs, spans and metric labels when `hide` is true (see
    /// [`LockName::hidden`]); errors returned to the caller still carry them.
    pub fn hide_names(mut self, hide: bool) -> Self {
        self.names = self
            .names
            .map(|names| names.into_iter().map(|n| n.hidden(hide)).collect());
        self
    }

    /// One attempt per name, no waiting: `Ok(None)` if any is busy (none is held then).
    pub async fn try_lock(mut self) -> Result<Option<MultiGuard>, LockError> {
        self.wait = Duration::ZERO;
        match self.acquire().await {
            Ok(guard) => Ok(Some(guard)),
            Err(LockError::Busy { .. }) => Ok(None),
            Err(err) => Err(err),
        }
    }

    async fn acquire(self) -> Result<MultiGuard, LockError> {
        let started = Instant::now();
        let deadline = crate::clock::after(started, self.wait);
        let mut names = self.names?;
        // Key order is the global order every multi-lock follows.
        names.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        names.dedup();
        let lease = self.lease.unwrap_or(self.engine.default_lease());
        if let Some(at_least) = self.at_least {
            check_at_least(at_least, lease)?;
        }
        let mut guards = Vec::with_capacity(names.len());
        for run in self.engine.runs_together(&names) {
            // One script for the run: taking them all at once, holding only names before them,
            // keeps the order. Busy, or not for this call to try: one by one, in order.
            if run.len() > 1 {
                match self.engine.try_all(run, lease).await {
                    Ok(TriedAll::Taken(taken)) => {
                        guards.extend(taken);
                        continue;
                    }
                    // One attempt only (or no wait left), and it was all or none: nothing to
                    // take one by one.
                    Ok(TriedAll::Busy(name, retry_after))
                        if self.wait.is_zero() || Instant::now() >= deadline =>
                    {
                        let err = self.engine.busy_at_once(&name, started, retry_after);
                        return Err(give_back(guards, err).await);
                    }
                    Ok(TriedAll::Busy(..) | TriedAll::NotTried) => {}
                    // One by one, the requests below retry within what is left of the wait.
                    // None left: the error now, not one more command's timeout later.
                    Err(err) if Instant::now() < deadline && !is_permanent(&err) => {}
                    Err(err) => return Err(give_back(guards, err).await),
                }
            }
            for name in run {
                let wait = deadline.saturating_duration_since(Instant::now());
                let request =
                    LockRequest::new(self.engine.clone(), name.clone(), RequestKind::Plain)
                        .wait(wait);
                let request = match lease {
                    Lease::Fixed(lease) => request.lease(lease),
                    Lease::Watchdog(lease) => request.watchdog_lease(lease),
                };
                match request.await {
                    Ok(guard) => guards.push(guard),
                    Err(LockError::Busy {
                        name, retry_after, ..
                    }) => {
                        let err = LockError::Busy {
                            name,
                            waited: started.elapsed(),
                            retry_after,
                        };
                        return Err(give_back(guards, err).await);
                    }
                    Err(err) => return Err(give_back(guards, err).await),
                }
            }
        }
        if let Some(at_least) = self.at_least {
            let until = crate::clock::after(Instant::now(), at_least);
            for guard in guards.iter().filter(|g| !g.is_reentrant()) {
                let _ = guard.state.keep_until.set(until);
            }
        }
        Ok(MultiGuard { guards })
    }
}

/// Releases what a failed multi-lock took (in reverse order) and hands back its error.
/// All at once: giving back takes at most one release's time (two command timeouts) however
/// many there are.
async fn give_back(guards: Vec<LockGuard>, err: LockError) -> LockError {
    futures_util::future::join_all(guards.into_iter().map(LockGuard::release)).await;
    err
}

impl IntoFuture for MultiLockRequest {
    type Output = Result<MultiGuard, LockError>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.acquire())
    }
}

/// Several locks held together. Dropping it releases them all in the background.
#[must_use = "the locks are released as soon as the guard is dropped"]
#[derive(Debug)]
pub struct MultiGuard {
    guards: Vec<LockGuard>,
}

impl MultiGuard {
    /// The individual guards, in acquisition (key) order.
    pub fn guards(&self) -> &[LockGuard] {
        &self.guards
    }

    /// The names held, in acquisition order.
    pub fn names(&self) -> impl Iterator<Item = &LockName> {
        self.guards.iter().map(LockGuard::name)
    }

    /// The first name in key order: the one [`Hold::name`](crate::Hold::name) gives. An empty
    /// multi-lock has none, and gives an empty name.
    pub fn name(&self) -> &LockName {
        static NONE: std::sync::LazyLock<LockName> = std::sync::LazyLock::new(LockName::empty);
        self.guards.first().map_or(&NONE, LockGuard::name)
    }

    /// The fencing token of the lock `name`, one of this multi-lock's (see
    /// [`LockGuard::fencing_token`]; locks taken together on one server got theirs with the
    /// grant, so asking costs no round trip). A name the multi-lock does not hold is a
    /// [`LockError::Config`].
    pub async fn fencing_token_of(
        &self,
        name: impl IntoLockName,
    ) -> Result<FencingToken, LockError> {
        let name = name.into_lock_name()?;
        match self
            .guards
            .iter()
            .find(|g| g.name().as_str() == name.as_str())
        {
            Some(guard) => guard.fencing_token().await,
            None => Err(LockError::Config(format!(
                "{name} is not one of this multi-lock's names"
            ))),
        }
    }

    /// The fencing token of each lock, in acquisition (key) order, as
    /// [`names`](Self::names) lists them.
    pub async fn fencing_tokens(&self) -> Result<Vec<FencingToken>, LockError> {
        let mut tokens = Vec::with_capacity(self.guards.len());
        for guard in &self.guards {
            tokens.push(guard.fencing_token().await?);
        }
        Ok(tokens)
    }

    /// How many locks are held.
    pub fn len(&self) -> usize {
        self.guards.len()
    }

    /// Whether no lock is held (an empty set of names).
    pub fn is_empty(&self) -> bool {
        self.guards.is_empty()
    }

    /// Until when every lock is certainly held: the earliest of their validity deadlines (far
    /// in the future for an empty set).
    pub fn valid_until(&self) -> Instant {
        (self.guards.iter().map(LockGuard::valid_until).min())
            .unwrap_or_else(|| crate::clock::after(Instant::now(), Duration::MAX))
    }

    /// How long every lock is certainly still held for; zero once one is lost.
    pub fn remaining(&self) -> Duration {
        (self.guards.iter().map(LockGuard::remaining).min()).unwrap_or(Duration::MAX)
    }

    /// Whether any of the locks was lost.
    pub fn is_lost(&self) -> bool {
        self.guards.iter().any(LockGuard::is_lost)
    }

    /// Resolves when any of the locks is lost (never, for an empty set).
    pub fn lost(&self) -> Lost {
        let holds = self.guards.iter().map(|g| g.state.clone()).collect();
        Lost::fewer_than(self.guards.len(), holds)
    }

    /// The error of the first lock lost, if one was.
    fn lost_error(&self) -> Option<LockError> {
        (self.guards.iter().find(|g| g.is_lost())).map(|g| g.state.lost_error())
    }

    /// Runs `fut` and cancels it as soon as any of the locks is lost, with that lock's
    /// [`LockError::Lost`].
    pub async fn run<F: Future>(&self, fut: F) -> Result<F::Output, LockError> {
        if let Some(err) = self.lost_error() {
            return Err(err);
        }
        tokio::select! {
            biased;
            () = self.lost() => Err(self.lost_error().unwrap_or_else(|| {
                LockError::Config("a multi-lock reported a loss no lock shows".to_owned())
            })),
            out = fut => Ok(out),
        }
    }

    /// Releases every lock (in reverse order) and says the worst of their outcomes (see
    /// [`release_each`](Self::release_each) for each one's).
    pub async fn release(self) -> ReleaseOutcome {
        worst(self.release_each().await)
    }

    /// Releases every lock (in reverse order) and returns each outcome, in acquisition order.
    pub async fn release_each(self) -> Vec<ReleaseOutcome> {
        let mut outcomes = Vec::with_capacity(self.guards.len());
        for guard in self.guards.into_iter().rev() {
            outcomes.push(guard.release().await);
        }
        outcomes.reverse();
        outcomes
    }

    /// Takes the individual guards out.
    pub fn into_guards(self) -> Vec<LockGuard> {
        self.guards
    }
}

hold_by_own_methods!(MultiGuard);
