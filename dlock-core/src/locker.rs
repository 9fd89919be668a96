//! The `Locker`: where locks are acquired, and everything they share.

use std::collections::HashMap;
use std::fmt;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;
use tracing::Instrument as _;

use crate::backend::memory::MemoryBackend;
use crate::backend::redis::{RedisBackend, RedisConn};
use crate::backend::{AcquireReply, Backend, HandoffReply, MemoryStore, ReleaseReply, RenewItem};
use crate::error::{BackendError, LockError, ReleaseOutcome};
use crate::guard::{FencingToken, HoldState, LockGuard, LossReason};
use crate::multi::MultiLockRequest;
use crate::name::{IntoLockName, LockKeys, LockName, validate_prefix};
use crate::scope;
use crate::wait::Watch;
use crate::watchdog::Watchdog;

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

/// After this many hand-overs in a row inside one process, a release goes through Redis so
/// waiters in other processes get their chance.
const MAX_HANDOFF_STREAK: u32 = 16;

/// After such a release, local waiters hold back this long so that a waiter in another process,
/// woken by the release, can take the lock: hand-overs must not starve other processes.
const YIELD_WINDOW: Duration = Duration::from_millis(2);

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn next_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

/// A fresh random owner token (128 bits, hex).
fn new_owner() -> Arc<str> {
    Arc::from(format!("{:032x}", rand::random::<u128>()).as_str())
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
    queues: Mutex<HashMap<String, Arc<LocalQueue>>>,
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
    watchdog_lease: Duration,
    fence_ttl: Option<Duration>,
    poll_interval: Duration,
    handoff: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            prefix: DEFAULT_PREFIX.to_owned(),
            watchdog_lease: DEFAULT_WATCHDOG_LEASE,
            fence_ttl: Some(DEFAULT_FENCE_TTL),
            poll_interval: DEFAULT_POLL_INTERVAL,
            handoff: true,
        }
    }
}

/// Local waiters for one name: only the head waits in Redis; the others queue here.
#[derive(Debug, Default)]
struct LocalQueue {
    turn: tokio::sync::Mutex<()>,
    handoff: Mutex<Option<HandoffSlot>>,
    streak: AtomicU32,
    /// The wake-up registration, passed from one head waiter to the next.
    watch: Mutex<Option<Arc<Watch>>>,
    /// Local waiters hold back until then (see [`YIELD_WINDOW`]).
    defer_until: Mutex<Option<Instant>>,
    /// The last release broke a hand-over streak.
    yield_pending: std::sync::atomic::AtomicBool,
}

/// The head waiter's offer to take the lock over directly from a local releaser.
#[derive(Debug)]
struct HandoffSlot {
    owner: Arc<str>,
    lease: Duration,
    tx: oneshot::Sender<(u64, Instant)>,
}

impl LocalQueue {
    fn slot(&self) -> MutexGuard<'_, Option<HandoffSlot>> {
        self.handoff.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Until when local waiters hold back, if that is still ahead.
    fn deferred(&self) -> Option<Instant> {
        let until = *self.defer_until.lock().unwrap_or_else(|e| e.into_inner());
        until.filter(|u| *u > Instant::now())
    }

    fn defer(&self) {
        *self.defer_until.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(Instant::now() + YIELD_WINDOW);
    }
}

impl fmt::Debug for Locker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Locker")
            .field("backend", &self.inner.backend.kind())
            .field("at", &self.inner.display)
            .field("prefix", &self.inner.config.prefix)
            .field("watchdog_lease", &self.inner.config.watchdog_lease)
            .field("held", &self.inner.watchdog.len())
            .finish()
    }
}

/// How long a lock is leased for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lease {
    /// Renewed by the watchdog every third of this lease while the guard lives.
    Watchdog(Duration),
    /// Never renewed; the lock expires after this lease.
    Fixed(Duration),
}

impl Lease {
    fn duration(self) -> Duration {
        match self {
            Self::Watchdog(d) | Self::Fixed(d) => d,
        }
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
            Backend::Memory(MemoryBackend::new(store)),
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
                display,
            }),
        }
    }

    /// Starts a lock request for `name`: await it to acquire.
    ///
    /// `name` is a `&str`/`String` (trusted text, validated) or a [`LockName`] built from escaped
    /// values. With no further settings the request makes one attempt and uses the watchdog.
    pub fn lock(&self, name: impl IntoLockName) -> LockRequest {
        LockRequest {
            locker: self.clone(),
            name: name.into_lock_name(),
            wait: Duration::ZERO,
            lease: Lease::Watchdog(self.inner.config.watchdog_lease),
        }
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

    /// How many holds the watchdog renews now.
    pub fn renewed_holds(&self) -> usize {
        self.inner.watchdog.len()
    }

    /// How many renewal round trips the watchdog has made.
    pub fn renewal_round_trips(&self) -> u64 {
        self.inner.watchdog.round_trips.load(Ordering::Relaxed)
    }

    /// How many names the subscriber connection is subscribed to now (Redis backends).
    pub fn watched_names(&self) -> usize {
        match &self.inner.backend {
            Backend::Redis(r) => r.watched_channels(),
            Backend::Memory(_) => 0,
        }
    }

    /// Whether the subscriber connection is up (Redis backends; false before the first wait).
    pub fn subscriber_connected(&self) -> bool {
        match &self.inner.backend {
            Backend::Redis(r) => r.subscriber_healthy(),
            Backend::Memory(_) => true,
        }
    }

    /// Checks that the backend answers, within the command timeout.
    pub async fn ping(&self) -> Result<(), LockError> {
        match &self.inner.backend {
            Backend::Redis(r) => r.ping().await.map_err(LockError::Backend),
            Backend::Memory(_) => Ok(()),
        }
    }

    /// One acquisition attempt, cancellation-safe: dropping the caller's future never leaks a
    /// lock that Redis granted.
    ///
    /// Over one pipelined connection the attempt runs inline: if it is dropped (or fails, and so
    /// may have been granted), a release for its token is sent down the same connection, where
    /// it can only arrive after the attempt. Over a pool, whose connections are not ordered with
    /// each other, the attempt runs in its own task, which releases what it was granted if
    /// nobody is left to take it.
    async fn attempt(
        &self,
        keys: &Arc<LockKeys>,
        owner: &Arc<str>,
        lease: Duration,
        fresh: bool,
    ) -> Result<AcquireReply, LockError> {
        let fence_ttl = self.inner.config.fence_ttl;
        if !self.inner.backend.is_remote() {
            return self
                .inner
                .backend
                .acquire(keys, owner, lease, fence_ttl, !fresh)
                .await
                .map_err(LockError::Backend);
        }
        if self.inner.backend.is_ordered() {
            let mut in_flight = InFlight {
                backend: &self.inner.backend,
                keys,
                owner,
                armed: fresh,
            };
            let res = self
                .inner
                .backend
                .acquire(keys, owner, lease, fence_ttl, !fresh)
                .await;
            // Answered: the caller turns a grant into a guard before its next `.await`. An
            // error leaves the clean-up armed, as the script may have run.
            if res.is_ok() {
                in_flight.armed = false;
            }
            return res.map_err(LockError::Backend);
        }
        let (tx, rx) = oneshot::channel();
        let backend = self.inner.backend.clone();
        let (task_keys, task_owner) = (keys.clone(), owner.clone());
        tokio::spawn(async move {
            let (keys, owner) = (task_keys, task_owner);
            let res = backend
                .acquire(&keys, &owner, lease, fence_ttl, !fresh)
                .await;
            // On an error the script may still have run: treat the lock as possibly granted.
            let maybe_granted = matches!(res, Ok(AcquireReply::Acquired { .. }) | Err(_));
            let failed = res.is_err();
            let undelivered = tx.send(res).is_err();
            if fresh && maybe_granted && (undelivered || failed) {
                let _ = backend.release(&keys, &owner).await;
            }
        });
        let mut pending = PendingAttempt {
            rx: Some(rx),
            backend: &self.inner.backend,
            keys,
            owner,
            fresh,
        };
        let answer = match pending.rx.as_mut() {
            Some(rx) => rx.await,
            None => return Err(LockError::Config("attempt already answered".to_owned())),
        };
        pending.rx = None;
        match answer {
            Ok(res) => res.map_err(LockError::Backend),
            Err(_) => Err(LockError::Backend(BackendError::protocol(
                "acquisition task ended without an answer",
            ))),
        }
    }

    fn queue(&self, lock_key: &str) -> QueueTicket {
        let mut queues = self.inner.queues.lock().unwrap_or_else(|e| e.into_inner());
        let queue = queues.entry(lock_key.to_owned()).or_default().clone();
        QueueTicket {
            locker: self.clone(),
            key: lock_key.to_owned(),
            queue,
        }
    }

    fn existing_queue(&self, lock_key: &str) -> Option<Arc<LocalQueue>> {
        let queues = self.inner.queues.lock().unwrap_or_else(|e| e.into_inner());
        queues.get(lock_key).cloned()
    }

    #[allow(clippy::too_many_arguments)]
    fn new_hold(
        &self,
        name: LockName,
        keys: Arc<LockKeys>,
        owner: Arc<str>,
        fence: u64,
        lease: Lease,
        sent_at: Instant,
    ) -> LockGuard {
        let watchdog = matches!(lease, Lease::Watchdog(_));
        let state = Arc::new(HoldState::new(
            next_id(),
            name,
            keys,
            owner,
            FencingToken::new(fence),
            watchdog,
            lease.duration(),
            sent_at,
        ));
        if watchdog {
            self.inner.watchdog.register(&self.inner, state.clone());
        }
        scope::record(self.inner.id, &state);
        LockGuard {
            state,
            locker: self.clone(),
            reentrant: false,
            done: false,
        }
    }

    async fn acquire(
        self,
        name: LockName,
        wait: Duration,
        lease: Lease,
    ) -> Result<Attempted, LockError> {
        let started = Instant::now();
        let deadline = started + wait;
        let keys = Arc::new(LockKeys::new(&self.inner.config.prefix, &name));

        // Re-entry inside a lock scope.
        if let Some(hold) = scope::find(self.inner.id, &keys.lock) {
            hold.holds.fetch_add(1, Ordering::AcqRel);
            let reply = self.attempt(&keys, &hold.owner, hold.lease(), false).await;
            match reply {
                Ok(AcquireReply::Acquired { .. }) => {
                    tracing::debug!(name = %name, fencing_token = hold.fence.get(), "dlock: re-entered");
                    return Ok(Attempted::Held(LockGuard {
                        state: hold,
                        locker: self.clone(),
                        reentrant: true,
                        done: false,
                    }));
                }
                Ok(AcquireReply::Busy { .. }) => {
                    hold.holds.fetch_sub(1, Ordering::AcqRel);
                    hold.mark_lost(LossReason::Gone);
                }
                Err(err) => {
                    hold.holds.fetch_sub(1, Ordering::AcqRel);
                    return Err(err);
                }
            }
        }

        let owner = new_owner();
        // A first attempt, ahead of any local queue — unless local waiters are holding back for
        // other processes right now.
        let holding_back = !wait.is_zero()
            && self
                .existing_queue(&keys.lock)
                .is_some_and(|q| q.deferred().is_some());
        let mut pttl = None;
        if !holding_back {
            let sent_at = Instant::now();
            match self.attempt(&keys, &owner, lease.duration(), true).await? {
                AcquireReply::Acquired { fence, .. } => {
                    return Ok(Attempted::Held(
                        self.acquired(name, keys, owner, fence, lease, sent_at, started),
                    ));
                }
                AcquireReply::Busy { pttl: now_pttl } => pttl = now_pttl,
            }
            if wait.is_zero() {
                return Ok(busy(&name, started, pttl));
            }
        }

        // Queue behind local waiters for the same name; only the head waits in Redis.
        let ticket = self.queue(&keys.lock);
        let Ok(_turn) = tokio::time::timeout_at(deadline, ticket.queue.turn.lock()).await else {
            return Ok(busy(&name, started, pttl));
        };
        let mut head = HeadWait::new(&self, &ticket.queue, &keys, lease.duration()).await;
        let handoff_owner = head.handoff_owner.clone();
        loop {
            let (watch, rx) = head.parts();
            let notified = watch.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(until) = ticket.queue.deferred() {
                tokio::time::sleep_until(until.min(deadline)).await;
            }
            let sent_at = Instant::now();
            match self.attempt(&keys, &owner, lease.duration(), true).await? {
                AcquireReply::Acquired { fence, .. } => {
                    return Ok(Attempted::Held(
                        self.acquired(name, keys, owner, fence, lease, sent_at, started),
                    ));
                }
                AcquireReply::Busy { pttl: now_pttl } => pttl = now_pttl,
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(busy(&name, started, pttl));
            }
            // The fallback timer: the holder's remaining lease (a lock nobody releases expires
            // then), or a short poll when wake-ups can't be delivered.
            let fallback = match (watch.is_reliable(), pttl) {
                (true, Some(pttl)) => pttl + Duration::from_millis(1),
                (true, None) => self.inner.config.poll_interval,
                (false, Some(pttl)) => pttl.min(self.inner.config.poll_interval),
                (false, None) => self.inner.config.poll_interval,
            };
            let until = deadline.min(now + fallback);
            tokio::select! {
                () = &mut notified => {}
                () = tokio::time::sleep_until(until) => {}
                Some((fence, sent_at)) = handed(rx) => {
                    return Ok(Attempted::Held(
                        self.acquired(name, keys, handoff_owner, fence, lease, sent_at, started),
                    ));
                }
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn acquired(
        &self,
        name: LockName,
        keys: Arc<LockKeys>,
        owner: Arc<str>,
        fence: u64,
        lease: Lease,
        sent_at: Instant,
        started: Instant,
    ) -> LockGuard {
        let waited = started.elapsed();
        metrics::counter!("dlock_acquired_total").increment(1);
        metrics::histogram!("dlock_wait_seconds").record(waited.as_secs_f64());
        tracing::debug!(
            name = %name,
            fencing_token = fence,
            waited_us = u64::try_from(waited.as_micros()).unwrap_or(u64::MAX),
            "dlock: acquired"
        );
        self.new_hold(name, keys, owner, fence, lease, sent_at)
    }

    pub(crate) async fn extend(&self, hold: &HoldState, lease: Duration) -> Result<(), LockError> {
        let item = RenewItem {
            key: hold.keys.lock.clone(),
            owner: hold.owner.to_string(),
            lease_ms: u64::try_from(lease.as_millis()).unwrap_or(u64::MAX).max(1),
        };
        let sent_at = Instant::now();
        let renewed = self
            .inner
            .backend
            .renew(std::slice::from_ref(&item))
            .await
            .map_err(LockError::Backend)?;
        if renewed.first().copied().unwrap_or(false) {
            hold.lease_ms.store(item.lease_ms, Ordering::Relaxed);
            hold.renewed(sent_at, lease);
            tracing::debug!(name = %hold.name, lease_ms = item.lease_ms, "dlock: extended");
            Ok(())
        } else {
            hold.mark_lost(LossReason::Gone);
            Err(hold.lost_error())
        }
    }

    /// Releases one hold of `hold` (cancellation-safe: the work runs in its own task for a
    /// remote backend).
    pub(crate) async fn release_hold(&self, hold: Arc<HoldState>) -> ReleaseOutcome {
        if !self.inner.backend.is_remote() {
            return self.release_now(hold).await;
        }
        // The last hold, nobody local waiting (so no hand-over), one ordered connection: release
        // inline; if this future is dropped half-way, the plain release is sent again in the
        // background (a repeated final release is recognised by the script).
        let simple = self.inner.backend.is_ordered()
            && hold.holds.load(Ordering::Acquire) == 1
            && self.existing_queue(&hold.keys.lock).is_none();
        if simple {
            let mut in_flight = InFlight {
                backend: &self.inner.backend,
                keys: &hold.keys,
                owner: &hold.owner,
                armed: true,
            };
            let outcome = self.release_now(hold.clone()).await;
            in_flight.armed = false;
            return outcome;
        }
        let this = self.clone();
        match tokio::spawn(async move { this.release_now(hold).await }).await {
            Ok(outcome) => outcome,
            Err(err) => ReleaseOutcome::Unreachable(LockError::Backend(BackendError::protocol(
                format!("release task failed: {err}"),
            ))),
        }
    }

    pub(crate) fn release_in_background(&self, hold: Arc<HoldState>) {
        let this = self.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(async move {
                    let _ = this.release_now(hold).await;
                });
            }
            Err(_) => {
                // No runtime to release on: stop renewing; the lease runs out by itself.
                if hold.holds.fetch_sub(1, Ordering::AcqRel) == 1 {
                    self.inner.watchdog.deregister(hold.id);
                }
                tracing::warn!(name = %hold.name, "dlock: guard dropped outside a runtime; the lock expires at the end of its lease");
            }
        }
    }

    async fn release_now(&self, hold: Arc<HoldState>) -> ReleaseOutcome {
        let span = tracing::debug_span!("dlock.release", name = %hold.name);
        async {
            let last = hold.holds.fetch_sub(1, Ordering::AcqRel) == 1;
            if last {
                self.inner.watchdog.deregister(hold.id);
                if !hold.is_lost() {
                    hold.mark_released();
                }
                metrics::histogram!("dlock_hold_seconds")
                    .record(hold.acquired_at.elapsed().as_secs_f64());
                if let Some(outcome) = self.try_handoff(&hold).await {
                    return outcome;
                }
            }
            let mut reply = self.inner.backend.release(&hold.keys, &hold.owner).await;
            if reply.is_err() {
                // One retry: a release whose answer was lost is recognised by the script.
                reply = self.inner.backend.release(&hold.keys, &hold.owner).await;
            }
            let outcome = match reply {
                Ok(reply) => {
                    if let ReleaseReply::Released { woke } = reply {
                        self.yield_to_other_processes(&hold, woke);
                    }
                    release_outcome(&hold, reply)
                }
                Err(err) => ReleaseOutcome::Unreachable(LockError::Backend(err)),
            };
            log_release(&hold, &outcome);
            outcome
        }
        .instrument(span)
        .await
    }

    /// After a release that broke a hand-over streak: if the wake-up reached another process
    /// (more subscribers than this `Locker`'s own), local waiters hold back briefly so that one
    /// of those can take the lock.
    fn yield_to_other_processes(&self, hold: &HoldState, woke: u32) {
        let Some(queue) = self.existing_queue(&hold.keys.lock) else {
            return;
        };
        if queue.yield_pending.swap(false, Ordering::Relaxed) && woke > 1 {
            queue.defer();
        }
    }

    /// Hands the lock straight to the local head waiter, if there is one.
    async fn try_handoff(&self, hold: &HoldState) -> Option<ReleaseOutcome> {
        if !self.inner.config.handoff || hold.is_lost() {
            return None;
        }
        let queue = self.existing_queue(&hold.keys.lock)?;
        if queue.streak.load(Ordering::Relaxed) >= MAX_HANDOFF_STREAK {
            // This one goes through Redis; if it wakes waiters of other processes, local
            // waiters hold back for them (see `yield_to_other_processes`).
            queue.streak.store(0, Ordering::Relaxed);
            queue.yield_pending.store(true, Ordering::Relaxed);
            return None;
        }
        let Some(slot) = queue.slot().take().filter(|s| !s.tx.is_closed()) else {
            queue.streak.store(0, Ordering::Relaxed);
            return None;
        };
        let sent_at = Instant::now();
        let reply = self
            .inner
            .backend
            .handoff(
                &hold.keys,
                &hold.owner,
                &slot.owner,
                slot.lease,
                self.inner.config.fence_ttl,
            )
            .await;
        match reply {
            Ok(HandoffReply::HandedOver { fence }) => {
                queue.streak.fetch_add(1, Ordering::Relaxed);
                if slot.tx.send((fence, sent_at)).is_err() {
                    // The waiter left meanwhile: release what it was given.
                    let _ = self.inner.backend.release(&hold.keys, &slot.owner).await;
                }
                let outcome = ReleaseOutcome::Released;
                log_release(hold, &outcome);
                Some(outcome)
            }
            Ok(HandoffReply::NotHandedOver(reply)) => {
                let mut current = queue.slot();
                if current.is_none() && !slot.tx.is_closed() {
                    *current = Some(slot);
                }
                drop(current);
                let outcome = release_outcome(hold, reply);
                log_release(hold, &outcome);
                Some(outcome)
            }
            Err(_) => {
                // Unknown whether it ran: the waiter may own the lock now. Releasing for the
                // waiter's token is safe either way; then fall back to a normal release.
                let _ = self.inner.backend.release(&hold.keys, &slot.owner).await;
                let mut current = queue.slot();
                if current.is_none() && !slot.tx.is_closed() {
                    *current = Some(slot);
                }
                None
            }
        }
    }
}

/// The result of an acquisition that did not fail.
enum Attempted {
    Held(LockGuard),
    /// Still busy at the deadline; the holder's remaining lease, if known.
    Busy(Option<Duration>),
}

fn busy(name: &LockName, started: Instant, pttl: Option<Duration>) -> Attempted {
    metrics::counter!("dlock_busy_total").increment(1);
    tracing::debug!(
        name = %name,
        waited_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
        holder_ttl_ms = pttl.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        "dlock: busy"
    );
    Attempted::Busy(pttl)
}

/// What a release reply means for the hold (marking it lost when it was).
fn release_outcome(hold: &HoldState, reply: ReleaseReply) -> ReleaseOutcome {
    match reply {
        ReleaseReply::Released { .. } | ReleaseReply::StillHeld(_) => ReleaseOutcome::Released,
        ReleaseReply::Expired => {
            hold.mark_lost(LossReason::Expired);
            ReleaseOutcome::Expired
        }
        ReleaseReply::TakenOver => {
            hold.mark_lost(LossReason::Gone);
            ReleaseOutcome::TakenOver
        }
    }
}

fn log_release(hold: &HoldState, outcome: &ReleaseOutcome) {
    match outcome {
        ReleaseOutcome::Released => {
            metrics::counter!("dlock_released_total").increment(1);
            tracing::debug!(name = %hold.name, fencing_token = hold.fence.get(), "dlock: released");
        }
        ReleaseOutcome::Expired | ReleaseOutcome::TakenOver => {
            metrics::counter!("dlock_release_failed_total").increment(1);
            tracing::warn!(name = %hold.name, fencing_token = hold.fence.get(), outcome = ?outcome, "dlock: released a lock that was no longer held");
        }
        ReleaseOutcome::Unreachable(err) => {
            metrics::counter!("dlock_release_failed_total").increment(1);
            tracing::warn!(name = %hold.name, error = %err, "dlock: release failed; the lock expires at the end of its lease");
        }
    }
}

/// The head waiter's state: its wake-up registration (kept in the queue for the next head, so
/// the subscription survives while local waiters remain) and its hand-over offer.
///
/// A hand-over gives the lock to a token of its own, never used for attempts: if the waiter
/// leaves before taking a lock handed to it, that token's hold is released, and nothing else can
/// be confused with it.
struct HeadWait<'a> {
    locker: &'a Locker,
    queue: &'a Arc<LocalQueue>,
    keys: Arc<LockKeys>,
    watch: Arc<Watch>,
    handoff_owner: Arc<str>,
    rx: Option<oneshot::Receiver<(u64, Instant)>>,
}

impl<'a> HeadWait<'a> {
    async fn new(
        locker: &'a Locker,
        queue: &'a Arc<LocalQueue>,
        keys: &Arc<LockKeys>,
        lease: Duration,
    ) -> HeadWait<'a> {
        // Subscribe before the retry, so a release in between is not missed.
        let kept = queue.watch.lock().unwrap_or_else(|e| e.into_inner()).take();
        let watch = match kept {
            Some(watch) => watch,
            None => Arc::new(locker.inner.backend.watch(&keys.channel).await),
        };
        // No `.await` from here until `HeadWait` exists: once the offer is out, only its `Drop`
        // can give back a lock handed over to a waiter that was dropped.
        let handoff_owner = new_owner();
        let mut rx = None;
        if locker.inner.config.handoff {
            let (tx, handoff_rx) = oneshot::channel();
            *queue.slot() = Some(HandoffSlot {
                owner: handoff_owner.clone(),
                lease,
                tx,
            });
            rx = Some(handoff_rx);
        }
        HeadWait {
            locker,
            queue,
            keys: keys.clone(),
            watch,
            handoff_owner,
            rx,
        }
    }

    /// The wake-up registration and the hand-over receiver.
    fn parts(&mut self) -> (&Watch, &mut Option<oneshot::Receiver<(u64, Instant)>>) {
        (&self.watch, &mut self.rx)
    }
}

/// Closes `rx` and takes what was sent before it closed: after this, a sender finds the
/// receiver gone (and cleans up itself), or its value is returned here (and the caller cleans
/// up). Nothing sent falls between the two.
fn reclaim<T>(rx: &mut oneshot::Receiver<T>) -> Option<T> {
    rx.close();
    rx.try_recv().ok()
}

/// An inline attempt; dropped while armed, it releases its token in the background.
struct InFlight<'a> {
    backend: &'a Backend,
    keys: &'a Arc<LockKeys>,
    owner: &'a Arc<str>,
    armed: bool,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let backend = self.backend.clone();
        let (keys, owner) = (self.keys.clone(), self.owner.clone());
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                let _ = backend.release(&keys, &owner).await;
            });
        }
    }
}

/// The receiving end of an attempt that runs in its own task. Dropped before the answer was
/// taken (the caller's future was dropped), it releases a lock the attempt was granted.
struct PendingAttempt<'a> {
    rx: Option<oneshot::Receiver<Result<AcquireReply, BackendError>>>,
    backend: &'a Backend,
    keys: &'a Arc<LockKeys>,
    owner: &'a Arc<str>,
    fresh: bool,
}

impl Drop for PendingAttempt<'_> {
    fn drop(&mut self) {
        let granted = self
            .rx
            .as_mut()
            .and_then(reclaim)
            .is_some_and(|answer| matches!(answer, Ok(AcquireReply::Acquired { .. })));
        if granted && self.fresh {
            let backend = self.backend.clone();
            let (keys, owner) = (self.keys.clone(), self.owner.clone());
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                handle.spawn(async move {
                    let _ = backend.release(&keys, &owner).await;
                });
            }
        }
    }
}

/// Resolves when a local releaser hands the lock over (never, with hand-over off).
async fn handed(rx: &mut Option<oneshot::Receiver<(u64, Instant)>>) -> Option<(u64, Instant)> {
    let answer = match rx.as_mut() {
        Some(receiver) => receiver.await,
        None => std::future::pending().await,
    };
    // A oneshot receiver must not be polled again once it has answered.
    *rx = None;
    answer.ok()
}

impl Drop for HeadWait<'_> {
    fn drop(&mut self) {
        {
            let mut slot = self.queue.slot();
            if slot
                .as_ref()
                .is_some_and(|s| Arc::ptr_eq(&s.owner, &self.handoff_owner))
            {
                *slot = None;
            }
        }
        let handed_late = self.rx.as_mut().and_then(reclaim).is_some();
        if handed_late {
            // Handed over after this waiter stopped waiting: give it back.
            let backend = self.locker.inner.backend.clone();
            let (keys, owner) = (self.keys.clone(), self.handoff_owner.clone());
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                handle.spawn(async move {
                    let _ = backend.release(&keys, &owner).await;
                });
            }
        }
        // The map, the ticket and this head: other waiters remain if there are more users.
        if Arc::strong_count(self.queue) > 2 {
            *self.queue.watch.lock().unwrap_or_else(|e| e.into_inner()) = Some(self.watch.clone());
        }
    }
}

/// A place in a local queue; removes the queue from the map when its last user leaves.
struct QueueTicket {
    locker: Locker,
    key: String,
    queue: Arc<LocalQueue>,
}

impl Drop for QueueTicket {
    fn drop(&mut self) {
        let mut queues = self
            .locker
            .inner
            .queues
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        // The map and this ticket: nobody else uses the queue.
        if Arc::strong_count(&self.queue) == 2 {
            queues.remove(&self.key);
        }
    }
}

/// A lock request: set how long to wait and how to lease, then `.await` it.
#[must_use = "a lock request does nothing until awaited"]
#[derive(Debug)]
pub struct LockRequest {
    locker: Locker,
    name: Result<LockName, LockError>,
    wait: Duration,
    lease: Lease,
}

impl LockRequest {
    /// Waits up to `wait`, counted from the call, for the lock to become free (default: one
    /// attempt, no waiting).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// A fixed lease: the lock is not renewed and expires `lease` after acquisition unless
    /// released first.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Lease::Fixed(lease);
        self
    }

    /// Watchdog mode with this lease (renewed every third of it while the guard lives).
    pub fn watchdog_lease(mut self, lease: Duration) -> Self {
        self.lease = Lease::Watchdog(lease);
        self
    }

    /// Makes one attempt (ignoring any wait): `Ok(None)` when the lock is busy.
    pub async fn try_lock(mut self) -> Result<Option<LockGuard>, LockError> {
        self.wait = Duration::ZERO;
        match self.run().await? {
            (Attempted::Held(guard), _) => Ok(Some(guard)),
            (Attempted::Busy(_), _) => Ok(None),
        }
    }

    async fn run(self) -> Result<(Attempted, LockName), LockError> {
        let name = self.name?;
        if self.lease.duration() < Duration::from_millis(10) {
            return Err(LockError::Config(format!(
                "lease {:?} is too short; the minimum is 10ms",
                self.lease.duration()
            )));
        }
        let span = tracing::debug_span!("dlock.acquire", name = %name);
        let attempted = self
            .locker
            .acquire(name.clone(), self.wait, self.lease)
            .instrument(span)
            .await?;
        Ok((attempted, name))
    }

    async fn acquire_or_timeout(self) -> Result<LockGuard, LockError> {
        let started = Instant::now();
        match self.run().await? {
            (Attempted::Held(guard), _) => Ok(guard),
            (Attempted::Busy(retry_after), name) => {
                metrics::counter!("dlock_timeout_total").increment(1);
                Err(LockError::Timeout {
                    name: name.to_string(),
                    waited: started.elapsed(),
                    retry_after,
                })
            }
        }
    }
}

impl IntoFuture for LockRequest {
    type Output = Result<LockGuard, LockError>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.acquire_or_timeout())
    }
}

/// Configures and builds a [`Locker`].
#[derive(Default)]
pub struct LockerBuilder {
    source: Source,
    subscriber: Option<redis::Client>,
    prefix: Option<String>,
    watchdog_lease: Option<Duration>,
    fence_ttl: Option<Option<Duration>>,
    command_timeout: Option<Duration>,
    connect_timeout: Option<Duration>,
    poll_interval: Option<Duration>,
    handoff: Option<bool>,
}

#[derive(Default)]
enum Source {
    #[default]
    None,
    Url(String),
    Client(redis::Client),
    Pool(bb8::Pool<bb8_redis::RedisConnectionManager>),
    Multiplexed(redis::aio::MultiplexedConnection),
    Memory(MemoryStore),
}

impl fmt::Debug for LockerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let source = match &self.source {
            Source::None => "none".to_owned(),
            Source::Url(url) => redact_url(url),
            Source::Client(_) => "client".to_owned(),
            Source::Pool(_) => "bb8 pool".to_owned(),
            Source::Multiplexed(_) => "multiplexed connection".to_owned(),
            Source::Memory(_) => "memory".to_owned(),
        };
        f.debug_struct("LockerBuilder")
            .field("source", &source)
            .field("prefix", &self.prefix)
            .field("watchdog_lease", &self.watchdog_lease)
            .finish_non_exhaustive()
    }
}

impl LockerBuilder {
    /// Connect to this Redis URL (a connection manager that reconnects by itself, plus one
    /// subscriber connection for wake-ups).
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.source = Source::Url(url.into());
        self
    }

    /// Connect with this client (as [`url`](Self::url)).
    pub fn client(mut self, client: redis::Client) -> Self {
        self.source = Source::Client(client);
        self
    }

    /// Run over an application's bb8 pool. Pass a [`subscriber`](Self::subscriber) client too,
    /// or waiters poll instead of being woken.
    pub fn pool(mut self, pool: bb8::Pool<bb8_redis::RedisConnectionManager>) -> Self {
        self.source = Source::Pool(pool);
        self
    }

    /// Run over one multiplexed connection (it is not reconnected). Pass a
    /// [`subscriber`](Self::subscriber) client too, or waiters poll instead of being woken.
    pub fn multiplexed(mut self, conn: redis::aio::MultiplexedConnection) -> Self {
        self.source = Source::Multiplexed(conn);
        self
    }

    /// Run over an in-process store.
    pub fn memory(mut self, store: MemoryStore) -> Self {
        self.source = Source::Memory(store);
        self
    }

    /// The client that opens the subscriber connection for wake-ups (with a pool or a
    /// multiplexed connection; a URL or client source has one already).
    pub fn subscriber(mut self, client: redis::Client) -> Self {
        self.subscriber = Some(client);
        self
    }

    /// The prefix of every key (default `dlock:`).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = Some(prefix.into());
        self
    }

    /// The default lease of watchdog-mode locks (default 30 s, renewed every 10 s).
    pub fn watchdog_lease(mut self, lease: Duration) -> Self {
        self.watchdog_lease = Some(lease);
        self
    }

    /// How long an idle fencing counter lives (default 7 days; `None`: forever). Tokens keep
    /// increasing across an expiry because a new counter starts from the server clock.
    pub fn fence_ttl(mut self, ttl: Option<Duration>) -> Self {
        self.fence_ttl = Some(ttl);
        self
    }

    /// The bound on every Redis command (default 2 s).
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = Some(timeout);
        self
    }

    /// The bound on connecting (default 2 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = Some(timeout);
        self
    }

    /// How often a waiter retries when wake-ups can't be delivered (default 50 ms).
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = Some(interval);
        self
    }

    /// Whether a release hands the lock straight to a waiter of the same `Locker` in the same
    /// round trip (default on).
    pub fn handoff(mut self, enabled: bool) -> Self {
        self.handoff = Some(enabled);
        self
    }

    /// Connects (for a URL or client) and builds the `Locker`.
    pub async fn build(self) -> Result<Locker, LockError> {
        let prefix = self.prefix.unwrap_or_else(|| DEFAULT_PREFIX.to_owned());
        validate_prefix(&prefix)?;
        let watchdog_lease = self.watchdog_lease.unwrap_or(DEFAULT_WATCHDOG_LEASE);
        if watchdog_lease < Duration::from_millis(30) {
            return Err(LockError::Config(format!(
                "watchdog lease {watchdog_lease:?} is too short; the minimum is 30ms"
            )));
        }
        let command_timeout = self.command_timeout.unwrap_or(DEFAULT_COMMAND_TIMEOUT);
        let connect_timeout = self.connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT);
        let config = Config {
            prefix,
            watchdog_lease,
            fence_ttl: self.fence_ttl.unwrap_or(Some(DEFAULT_FENCE_TTL)),
            poll_interval: self.poll_interval.unwrap_or(DEFAULT_POLL_INTERVAL),
            handoff: self.handoff.unwrap_or(true),
        };
        let (client, display) = match self.source {
            Source::None => {
                return Err(LockError::Config(
                    "no backend: call `url`, `client`, `pool`, `multiplexed` or `memory`".into(),
                ));
            }
            Source::Memory(store) => {
                return Ok(Locker::from_parts(
                    Backend::Memory(MemoryBackend::new(store)),
                    config,
                    "memory".to_owned(),
                ));
            }
            Source::Pool(pool) => {
                let backend =
                    RedisBackend::new(RedisConn::Pool(pool), self.subscriber, command_timeout);
                return Ok(Locker::from_parts(
                    Backend::Redis(Arc::new(backend)),
                    config,
                    "bb8 pool".to_owned(),
                ));
            }
            Source::Multiplexed(conn) => {
                let backend = RedisBackend::new(
                    RedisConn::Multiplexed(conn),
                    self.subscriber,
                    command_timeout,
                );
                return Ok(Locker::from_parts(
                    Backend::Redis(Arc::new(backend)),
                    config,
                    "multiplexed connection".to_owned(),
                ));
            }
            Source::Url(url) => {
                let display = redact_url(&url);
                #[cfg(feature = "tls-rustls")]
                if url.starts_with("rediss://") {
                    // rustls needs a process-wide crypto provider; keep the application's if it
                    // installed one.
                    let _ = rustls::crypto::ring::default_provider().install_default();
                }
                let client = redis::Client::open(url.as_str()).map_err(|e| {
                    LockError::Config(format!("bad redis url `{display}`: {}", url_error(&e)))
                })?;
                (client, display)
            }
            Source::Client(client) => {
                let display = describe_client(&client);
                (client, display)
            }
        };
        let manager_config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            // Every call is bounded by the command timeout already; a second timer per command
            // would only cost.
            .set_response_timeout(None)
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(10))
            .set_max_delay(Duration::from_millis(500));
        let connecting =
            redis::aio::ConnectionManager::new_with_config(client.clone(), manager_config);
        let manager = match tokio::time::timeout(connect_timeout * 2, connecting).await {
            Ok(Ok(manager)) => manager,
            Ok(Err(err)) => {
                return Err(connect_error(&display, err));
            }
            Err(_) => {
                return Err(LockError::Backend(BackendError::timeout(
                    connect_timeout * 2,
                )));
            }
        };
        let subscriber = self.subscriber.unwrap_or(client);
        let backend = RedisBackend::new(
            RedisConn::Manager(manager),
            Some(subscriber),
            command_timeout,
        );
        Ok(Locker::from_parts(
            Backend::Redis(Arc::new(backend)),
            config,
            display,
        ))
    }
}

fn url_error(err: &redis::RedisError) -> String {
    let msg = err.to_string();
    if msg.to_ascii_lowercase().contains("tls") {
        format!("{msg} (enable dlock-core's `tls-rustls` feature for rediss:// URLs)")
    } else {
        msg
    }
}

fn connect_error(at: &str, err: redis::RedisError) -> LockError {
    if err.kind() == redis::ErrorKind::InvalidClientConfig {
        return LockError::Config(format!("cannot connect to `{at}`: {}", url_error(&err)));
    }
    tracing::debug!(at, error = %err, "dlock: cannot connect");
    LockError::Backend(BackendError::redis(err))
}

fn describe_client(client: &redis::Client) -> String {
    let info = client.get_connection_info();
    format!("{}", info.addr())
}

/// `scheme://user:password@host/db` → `scheme://user:***@host/db`.
pub(crate) fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return "<unparsable url>".to_owned();
    };
    let rest = &url[scheme_end + 3..];
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    match authority.rfind('@') {
        Some(at) => {
            let userinfo = &authority[..at];
            let user = userinfo.split(':').next().unwrap_or("");
            let redacted = if userinfo.contains(':') {
                format!("{user}:***")
            } else {
                // A lone userinfo in a redis URL is a password.
                "***".to_owned()
            };
            format!(
                "{}://{redacted}@{}{}",
                &url[..scheme_end],
                &authority[at + 1..],
                &rest[authority_end..]
            )
        }
        None => url.to_owned(),
    }
}

static DEFAULT_LOCKER: OnceLock<Locker> = OnceLock::new();

/// Installs the process-wide default `Locker` (used by `#[distributed_lock]` without `locker =`).
/// Fails if one was installed already.
pub fn set_default_locker(locker: Locker) -> Result<(), LockError> {
    DEFAULT_LOCKER
        .set(locker)
        .map_err(|_| LockError::Config("a default locker is already installed".to_owned()))
}

/// The process-wide default `Locker`, or a configuration error naming
/// [`set_default_locker`] if none was installed.
pub fn default_locker() -> Result<&'static Locker, LockError> {
    DEFAULT_LOCKER.get().ok_or_else(|| {
        LockError::Config(
            "no default locker installed: call dlock_core::set_default_locker at start-up, or pass `locker = ...`"
                .to_owned(),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact_url("redis://user:secret@host:6379/2"),
            "redis://user:***@host:6379/2"
        );
        assert_eq!(redact_url("redis://:secret@host/"), "redis://:***@host/");
        assert_eq!(redact_url("rediss://secret@host"), "rediss://***@host");
        assert_eq!(redact_url("redis://host:1/0"), "redis://host:1/0");
    }
}
