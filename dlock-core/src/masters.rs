//! One lock across independent Redis masters: held only when every master granted it
//! ([`MasterSet::all`], a multi-lock), or when a majority did within the lease's validity
//! ([`MasterSet::majority`], the Redlock algorithm).
//!
//! Independent masters do not replicate to each other, so losing one (a crash, a failover that
//! lost the latest writes, a partition) cannot hand the lock to a second holder: with
//! [`all`](MasterSet::all) the rival would need that master too; with
//! [`majority`](MasterSet::majority), two majorities always share a master, and that master
//! refuses the rival while the first hold runs. The price is one acquisition per master for
//! every grant, and no pub/sub wake-ups: a busy set is retried after a short random pause.

use std::fmt;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::time::Duration;

use futures_util::future::join_all;
use tokio::time::Instant;

use crate::clock;
use crate::engine::{Lease, LockGuard};
use crate::error::{BackendError, LockError, MasterOutcome, MastersError, ReleaseOutcome};
use crate::fencing::FencingToken;
use crate::hold::{Lost, hold_by_own_methods, worst};
use crate::locker::Locker;
use crate::name::{IntoLockName, LockName};

/// Independent Redis masters, one [`Locker`] each, that lock together. Cheap to clone.
#[derive(Clone)]
pub struct MasterSet {
    lockers: std::sync::Arc<[Locker]>,
    need: usize,
}

impl fmt::Debug for MasterSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MasterSet")
            .field("masters", &self.lockers)
            .field("need", &self.need)
            .finish()
    }
}

impl MasterSet {
    /// A lock is held only when every one of `lockers` granted it (a multi-lock). Its fencing
    /// token is the first master's (see [`MasterGuard::fencing_token`]).
    pub fn all(lockers: impl IntoIterator<Item = Locker>) -> Result<Self, LockError> {
        let lockers: Vec<Locker> = lockers.into_iter().collect();
        let need = lockers.len();
        Self::new(lockers, need)
    }

    /// A lock is held when a majority of `lockers` (⌊n/2⌋ + 1) granted it, within the lease's
    /// validity (the Redlock algorithm). Use an odd number of masters, three or more: one of
    /// three, two of five, may be down.
    pub fn majority(lockers: impl IntoIterator<Item = Locker>) -> Result<Self, LockError> {
        let lockers: Vec<Locker> = lockers.into_iter().collect();
        let need = lockers.len() / 2 + 1;
        Self::new(lockers, need)
    }

    fn new(lockers: Vec<Locker>, need: usize) -> Result<Self, LockError> {
        if lockers.is_empty() {
            return Err(LockError::Config(
                "a master set needs at least one Locker".into(),
            ));
        }
        Ok(Self {
            lockers: lockers.into(),
            need,
        })
    }

    /// How many masters the set has.
    pub fn len(&self) -> usize {
        self.lockers.len()
    }

    /// Always false: a set has at least one master.
    pub fn is_empty(&self) -> bool {
        self.lockers.is_empty()
    }

    /// How many masters must grant a lock.
    pub fn needed(&self) -> usize {
        self.need
    }

    /// A request for the lock `name` on the set: set the wait and lease, then `.await` it
    /// (or [`try_lock`](MasterRequest::try_lock)). Defaults come from the first `Locker`.
    pub fn lock(&self, name: impl IntoLockName) -> MasterRequest {
        let first = &self.lockers[0];
        MasterRequest {
            set: self.clone(),
            name: name.into_lock_name(),
            wait: first.default_wait(),
            lease: first.default_lease(),
            budget: None,
        }
    }
}

/// A request for a lock on a [`MasterSet`].
#[must_use = "a lock request does nothing until awaited"]
#[derive(Debug)]
pub struct MasterRequest {
    set: MasterSet,
    name: Result<LockName, LockError>,
    wait: Duration,
    lease: Lease,
    /// How long one master may take to answer one attempt (`None`: a fraction of the lease).
    budget: Option<Duration>,
}

/// The share of the lease one master may take to answer an attempt, by default: a hung master
/// costs a round this much of the lease, and no more.
const BUDGET_DIVISOR: u32 = 16;

/// The least time a master is given to answer, whatever the lease.
const MIN_BUDGET: Duration = Duration::from_millis(5);

impl MasterRequest {
    /// Retries a busy or unreachable set until `wait` has passed since the call.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// A fixed lease on every master: the lock is valid until the lease, counted from when the
    /// acquisition was sent, minus a drift allowance, has run out on the masters that count.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Lease::Fixed(lease);
        self
    }

    /// A lease renewed on every master while the guard lives.
    pub fn watchdog_lease(mut self, lease: Duration) -> Self {
        self.lease = Lease::Watchdog(lease);
        self
    }

    /// How long each master may take to answer one attempt; a master that has not answered by
    /// then counts as failed for that attempt (whatever it granted late is given back). By
    /// default a sixteenth of the lease (at least 5 ms), as the Redlock algorithm asks: a small
    /// fraction of the lease, so that a hung master costs a round little of the validity. Each
    /// `Locker`'s command timeout still bounds its master's answer.
    pub fn master_budget(mut self, budget: Duration) -> Self {
        self.budget = Some(budget);
        self
    }

    /// The budget of one master's answer.
    fn budget(&self) -> Duration {
        let lease = match self.lease {
            Lease::Fixed(lease) | Lease::Watchdog(lease) => lease,
        };
        (self.budget).unwrap_or_else(|| (lease / BUDGET_DIVISOR).max(MIN_BUDGET))
    }

    /// One attempt: `Ok(None)` when the masters that granted were too few because the others
    /// were busy.
    pub async fn try_lock(mut self) -> Result<Option<MasterGuard>, LockError> {
        self.wait = Duration::ZERO;
        match self.acquire().await {
            Ok(guard) => Ok(Some(guard)),
            Err(LockError::Masters(err)) if err.is_busy() => Ok(None),
            Err(err) => Err(err),
        }
    }

    async fn acquire(self) -> Result<MasterGuard, LockError> {
        let budget = self.budget();
        let name = self.name?;
        let started = Instant::now();
        let deadline = clock::after(started, self.wait);
        let set = self.set;
        loop {
            let results = round(&set, &name, self.lease, budget).await;
            let mut guards = Vec::with_capacity(results.len());
            let mut outcomes = Vec::with_capacity(results.len());
            for result in results {
                match result {
                    Ok(Some(guard)) => {
                        guards.push(Some(guard));
                        outcomes.push(MasterOutcome::Granted);
                    }
                    Ok(None) => {
                        guards.push(None);
                        outcomes.push(MasterOutcome::Busy);
                    }
                    Err(err) => {
                        guards.push(None);
                        outcomes.push(MasterOutcome::Failed(err));
                    }
                }
            }
            let guard = MasterGuard {
                name: name.clone(),
                need: set.need,
                guards,
            };
            // Valid only if enough grants are still valid now: a slow round of attempts eats
            // into the lease (each guard's validity already counts from when it was sent, minus
            // drift).
            if guard.valid_count(Instant::now()) >= set.need {
                return Ok(guard);
            }
            for (outcome, sub) in outcomes.iter_mut().zip(&guard.guards) {
                let now = Instant::now();
                if matches!(outcome, MasterOutcome::Granted)
                    && sub
                        .as_ref()
                        .is_some_and(|g| g.is_lost() || g.valid_until() <= now)
                {
                    *outcome = MasterOutcome::Expired;
                }
            }
            // Too few: give back what was granted, on every master that granted.
            guard.give_back(budget).await;
            let now = Instant::now();
            if now >= deadline {
                let error = MastersError::new(name.to_string(), set.need, outcomes);
                return Err(LockError::Masters(Box::new(error)));
            }
            // A random pause, so that rivals that split the masters between them do not retry
            // in step.
            let pause = Duration::from_millis(10 + u64::from(random_byte()) % 40);
            tokio::time::sleep_until(deadline.min(now + pause)).await;
        }
    }
}

/// One attempt on every master at once, each bounded by `budget`: the round ends when every
/// master answered or ran out of budget. An attempt cut short is dropped, and a dropped attempt
/// gives back whatever it was granted.
async fn round(
    set: &MasterSet,
    name: &LockName,
    lease: Lease,
    budget: Duration,
) -> Vec<Result<Option<LockGuard>, LockError>> {
    join_all(set.lockers.iter().map(|locker| {
        let request = locker.lock(name.clone());
        let request = match lease {
            Lease::Fixed(lease) => request.lease(lease),
            Lease::Watchdog(lease) => request.watchdog_lease(lease),
        };
        async move {
            match tokio::time::timeout(budget, request.try_lock()).await {
                Ok(answer) => answer,
                Err(_) => Err(LockError::Backend(BackendError::timeout(budget))),
            }
        }
    }))
    .await
}

fn random_byte() -> u8 {
    let mut b = [0u8; 1];
    let _ = getrandom::fill(&mut b);
    b[0]
}

impl IntoFuture for MasterRequest {
    type Output = Result<MasterGuard, LockError>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.acquire())
    }
}

/// A lock held on a [`MasterSet`]: one [`LockGuard`] per master that granted it. Dropping it
/// releases every one in the background; [`release`](Self::release) says what each master
/// answered.
#[derive(Debug)]
pub struct MasterGuard {
    name: LockName,
    need: usize,
    /// By master, in the set's order; `None` where the master did not grant.
    guards: Vec<Option<LockGuard>>,
}

impl MasterGuard {
    /// The lock's name.
    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// The masters (by their index in the set) that granted the lock.
    pub fn granted(&self) -> Vec<usize> {
        (self.guards.iter().enumerate())
            .filter(|(_, g)| g.is_some())
            .map(|(i, _)| i)
            .collect()
    }

    /// How many granting masters' holds are still valid at `now`.
    fn valid_count(&self, now: Instant) -> usize {
        (self.guards.iter().flatten())
            .filter(|g| !g.is_lost() && g.valid_until() > now)
            .count()
    }

    /// The fencing token each granting master gives, by master index (each minted at the first
    /// ask, as [`LockGuard::fencing_token`] does; a master that no longer has the hold, or that
    /// can't be asked, is left out).
    ///
    /// What they mean: each master's tokens rise for every grant it makes, so two holds of the
    /// name are ordered by their tokens from a master both were granted by. With
    /// [`MasterSet::all`] every hold has every master; with [`MasterSet::majority`] any two holds
    /// share at least one. Tokens of different masters are not comparable.
    pub async fn fencing_tokens(&self) -> Vec<(usize, FencingToken)> {
        let asks = (self.guards.iter().enumerate()).filter_map(|(i, g)| {
            g.as_ref()
                .map(|g| async move { (i, g.fencing_token().await) })
        });
        (futures_util::future::join_all(asks).await.into_iter())
            .filter_map(|(i, token)| token.ok().map(|t| (i, t)))
            .collect()
    }

    /// One token that rises with every hold: the first master's, for a set where every master
    /// must grant ([`MasterSet::all`]). A majority set ([`MasterSet::majority`]) has no single
    /// master in every hold, so it has no such token: asking is a [`LockError::Config`] — use
    /// [`fencing_tokens`](Self::fencing_tokens) there. Otherwise fails as
    /// [`LockGuard::fencing_token`] does.
    pub async fn fencing_token(&self) -> Result<FencingToken, LockError> {
        if self.need < self.guards.len() {
            return Err(LockError::Config(
                "a majority master set has no single fencing token: ask each master's with \
                 `fencing_tokens()`"
                    .to_owned(),
            ));
        }
        match self.guards.first() {
            Some(Some(guard)) => guard.fencing_token().await,
            _ => Err(self.lost_error()),
        }
    }

    /// Until when the lock is valid: the latest instant by which enough masters' holds are
    /// still valid (the `need`-th latest validity among the granting masters).
    pub fn valid_until(&self) -> Instant {
        let mut until: Vec<Instant> = self
            .guards
            .iter()
            .flatten()
            .map(LockGuard::valid_until)
            .collect();
        until.sort_unstable_by(|a, b| b.cmp(a));
        until
            .get(self.need.saturating_sub(1))
            .copied()
            .unwrap_or_else(Instant::now)
    }

    /// Whether the lock is lost: fewer than the needed masters still hold it.
    pub fn is_lost(&self) -> bool {
        self.valid_count(Instant::now()) < self.need
    }

    /// How long the lock is certainly still held for (by enough masters); zero once lost.
    pub fn remaining(&self) -> Duration {
        if self.is_lost() {
            return Duration::ZERO;
        }
        self.valid_until().saturating_duration_since(Instant::now())
    }

    /// Resolves once the lock is lost (fewer than the needed masters still hold it).
    pub fn lost(&self) -> Lost {
        let holds = (self.guards.iter().flatten())
            .map(|g| g.state.clone())
            .collect();
        Lost::fewer_than(self.need, holds)
    }

    /// Runs `fut`, cancelling it with [`LockError::Lost`] if the lock is lost first.
    pub async fn run<F: Future>(&self, fut: F) -> Result<F::Output, LockError> {
        if self.is_lost() {
            return Err(self.lost_error());
        }
        tokio::select! {
            out = fut => Ok(out),
            () = self.lost() => Err(self.lost_error()),
        }
    }

    fn lost_error(&self) -> LockError {
        LockError::Lost {
            name: self.name.to_string(),
            fencing_token: (self.guards.iter().flatten())
                .find_map(|g| g.state.fence.get().copied()),
        }
    }

    /// Gives back every grant of a round that got too few, waiting for the answers no longer
    /// than `within` (one master's budget): a master that stopped answering after it granted
    /// gets its release in the background, and costs the acquisition no more than a budget.
    async fn give_back(mut self, within: Duration) {
        let releases: Vec<_> = (std::mem::take(&mut self.guards).into_iter())
            .flatten()
            .map(|g| tokio::spawn(g.release()))
            .collect();
        if releases.is_empty() {
            return;
        }
        let _ = tokio::time::timeout(within, join_all(releases)).await;
    }

    /// Releases the lock on every master that granted it, all at once, and says the worst of
    /// their outcomes (see [`release_each`](Self::release_each) for each master's).
    pub async fn release(self) -> ReleaseOutcome {
        worst(self.release_each().await.into_iter().flatten())
    }

    /// Releases the lock on every master that granted it, all at once; returns each master's
    /// outcome by index (`None` where it had not granted).
    pub async fn release_each(mut self) -> Vec<Option<ReleaseOutcome>> {
        let guards = std::mem::take(&mut self.guards);
        let releases = guards.into_iter().map(|g| async move {
            match g {
                Some(g) => Some(g.release().await),
                None => None,
            }
        });
        join_all(releases).await
    }
}

hold_by_own_methods!(MasterGuard);

impl crate::locker::LockerConfig {
    /// Builds a [`MasterSet`] over [`masters`](Self::masters), each master a `Locker` with this
    /// configuration's settings, that holds a lock once a majority of them granted it
    /// ([`MasterSet::majority`]).
    pub async fn build_master_set(&self) -> Result<MasterSet, LockError> {
        if self.masters.is_empty() {
            return Err(LockError::Config(
                "no masters: set DLOCK_MASTERS to the masters' URLs, comma-separated".into(),
            ));
        }
        let mut lockers = Vec::with_capacity(self.masters.len());
        for url in &self.masters {
            lockers.push(
                self.settings(Locker::builder().url(url.as_str()))
                    .build()
                    .await?,
            );
        }
        MasterSet::majority(lockers)
    }
}
