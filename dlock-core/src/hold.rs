//! A hold: what this process knows of one lock it took (its owner token, its fencing token, its
//! lease and its loss), shared by the guards of the hold, the watchdog and the scope.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::WeakBackend;
use crate::clock;
use crate::error::LockError;
use crate::fencing::FencingToken;
use crate::name::{LockKeys, LockName};

mod guards;
mod held_lock;

pub(crate) use guards::sealed::Sealed;
pub use guards::{Fenced, Hold};
pub(crate) use guards::{fenced_by_own_method, hold_by_own_methods, worst};
pub use held_lock::HeldLock;

/// Why a hold was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LossReason {
    /// The validity deadline passed without a successful renewal.
    Expired,
    /// A renewal or release found the lock gone or owned by another.
    Gone,
}

/// State shared by every guard of one hold (the outer guard and the guards that re-entered it)
/// and by the watchdog.
pub(crate) struct HoldState {
    pub(crate) id: u64,
    pub(crate) name: LockName,
    pub(crate) keys: Arc<LockKeys>,
    pub(crate) owner: Arc<str>,
    /// The hold's fencing token, once minted (with the grant, or at the first ask).
    pub(crate) fence: OnceLock<FencingToken>,
    /// Where the hold lives, to mint its token at the first ask (weak: a hold kept past its
    /// `Locker` can't reach Redis anyway).
    backend: WeakBackend,
    /// How long the name's fencing counter lives unused (`LockerBuilder::fence_ttl`).
    fence_ttl: Option<Duration>,
    /// Renewed by the watchdog (otherwise a fixed lease).
    pub(crate) watchdog: bool,
    /// The lease that renewals apply, in ms (set by `extend`).
    pub(crate) lease_ms: AtomicU64,
    /// Live guards of this hold: the outer guard and the ones that re-entered it. Redis knows
    /// one hold per owner token; the count lives here.
    pub(crate) holds: AtomicU32,
    /// Lease changes sent and confirmed, from which the validity deadline follows.
    book: Mutex<LeaseBook>,
    /// Notified whenever the deadline may have moved earlier.
    deadline_moved: tokio::sync::Notify,
    pub(crate) acquired_at: Instant,
    /// The labels of this hold's metrics.
    pub(crate) labels: crate::metrics::Labels,
    lost: Signal,
    loss: OnceLock<LossReason>,
    /// Set by the last release: a released hold is never reported lost.
    released: Signal,
    /// When the last guard let go, the deadline it believed then, and whether it was lost then.
    let_go: OnceLock<(Instant, Instant, bool)>,
    /// Until when a release must keep the name taken (`LockRequest::at_least`).
    pub(crate) keep_until: OnceLock<Instant>,
}

impl fmt::Debug for HoldState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HoldState")
            .field("name", &self.name)
            .field("fence", &self.fence.get())
            .field("watchdog", &self.watchdog)
            .field("holds", &self.holds.load(Ordering::Relaxed))
            .field("lost", &self.loss.get())
            .finish_non_exhaustive()
    }
}

/// What this process knows of a hold's lease in Redis.
///
/// Every lease change (watchdog renewal, `extend`) gets a sequence number, and Redis applies a
/// change only if its number is above the last one applied. So the lease in Redis is the one of
/// the last change confirmed applied, unless a later change still in flight (or whose answer was
/// lost) applies after it: the deadline is the earliest of those. A change confirmed applied
/// retires every earlier one.
#[derive(Debug)]
struct LeaseBook {
    next_seq: u64,
    confirmed_seq: u64,
    /// The deadline that the last confirmed change (or the acquisition) gives.
    confirmed: Instant,
    /// Changes newer than the confirmed one that may still apply: (sequence, deadline).
    pending: Vec<(u64, Instant)>,
}

impl LeaseBook {
    fn deadline(&self) -> Instant {
        self.pending
            .iter()
            .map(|(_, d)| *d)
            .fold(self.confirmed, Instant::min)
    }
}

/// The deadline a lease of `lease` sent at `sent_at` gives: Redis starts it no earlier.
fn lease_deadline(sent_at: Instant, lease: Duration) -> Instant {
    clock::after(sent_at, lease.saturating_sub(drift(lease)))
}

/// The safety margin taken off every lease: clock drift between this process and Redis plus a
/// little for the round trip.
pub(crate) fn drift(lease: Duration) -> Duration {
    lease / 100 + Duration::from_millis(2)
}

impl HoldState {
    /// The hold's fencing token: the one it got with its grant or an earlier ask, or one Redis
    /// mints now after checking that the hold is still there. A hold known to be lost gets
    /// `Lost`; one Redis no longer has is marked lost.
    pub(crate) async fn fencing_token(&self) -> Result<FencingToken, LockError> {
        // A hold kept past its `Locker` has no authority left to give.
        let Some(backend) = self.backend.upgrade() else {
            return Err(self.lost_error());
        };
        // Lost here first: a token known from the grant is no authority once the hold is gone.
        if self.is_lost() {
            return Err(self.lost_error());
        }
        if let Some(token) = self.fence.get() {
            return Ok(*token);
        }
        let failed = |err| {
            crate::metrics::backend_error("fence");
            LockError::Backend(err)
        };
        let session = (backend.session().await).map_err(failed)?;
        let minted = session
            .fence(&self.keys, &self.owner, self.fence_ttl)
            .await
            .map_err(failed)?;
        match minted {
            Some(token) => Ok(*self.fence.get_or_init(|| FencingToken::new(token))),
            None => {
                self.mark_lost(LossReason::Gone);
                Err(self.lost_error())
            }
        }
    }

    /// How long a release sent now must keep the name taken (`at_least`), if at all.
    pub(crate) fn keep_for(&self) -> Option<Duration> {
        let until = *self.keep_until.get()?;
        let left = until.saturating_duration_since(Instant::now());
        (!left.is_zero()).then_some(left)
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        id: u64,
        name: LockName,
        keys: Arc<LockKeys>,
        owner: Arc<str>,
        fence: Option<FencingToken>,
        (backend, fence_ttl): (WeakBackend, Option<Duration>),
        watchdog: bool,
        lease: Duration,
        (sent_at, acquired_at): (Instant, Instant),
        labels: crate::metrics::Labels,
    ) -> Self {
        Self {
            id,
            name,
            keys,
            owner,
            fence: fence.map(OnceLock::from).unwrap_or_default(),
            backend,
            fence_ttl,
            watchdog,
            lease_ms: AtomicU64::new(u64::try_from(lease.as_millis()).unwrap_or(u64::MAX)),
            holds: AtomicU32::new(1),
            book: Mutex::new(LeaseBook {
                next_seq: 1,
                confirmed_seq: 0,
                confirmed: lease_deadline(sent_at, lease),
                pending: Vec::new(),
            }),
            deadline_moved: tokio::sync::Notify::new(),
            acquired_at,
            labels,
            lost: Signal::default(),
            loss: OnceLock::new(),
            released: Signal::default(),
            let_go: OnceLock::new(),
            keep_until: OnceLock::new(),
        }
    }

    /// The hold is known to last `lease` from no earlier than `sent_at` — shorter than its own
    /// lease (a grant made by another's release, see the `protocol` module): its belief ends then,
    /// until a change of its lease applies.
    pub(crate) fn believe_until(&self, sent_at: Instant, lease: Duration) {
        let deadline = lease_deadline(sent_at, lease);
        let mut book = self.book();
        if deadline < book.confirmed {
            book.confirmed = deadline;
            drop(book);
            self.deadline_moved.notify_waiters();
        }
    }

    pub(crate) fn lease(&self) -> Duration {
        Duration::from_millis(self.lease_ms.load(Ordering::Relaxed))
    }

    fn book(&self) -> std::sync::MutexGuard<'_, LeaseBook> {
        self.book.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn deadline(&self) -> Instant {
        self.book().deadline()
    }

    /// Records a lease change of `lease` about to be sent at `sent_at`; returns its sequence
    /// number. Until it is answered, the deadline assumes it may apply.
    pub(crate) fn begin_change(&self, lease: Duration, sent_at: Instant) -> u64 {
        let mut book = self.book();
        let seq = book.next_seq;
        book.next_seq += 1;
        let before = book.deadline();
        book.pending.push((seq, lease_deadline(sent_at, lease)));
        let moved_earlier = book.deadline() < before;
        drop(book);
        if moved_earlier {
            self.deadline_moved.notify_waiters();
        }
        seq
    }

    /// Redis applied change `seq`.
    pub(crate) fn change_applied(&self, seq: u64) {
        let mut book = self.book();
        if seq <= book.confirmed_seq {
            return;
        }
        let Some(deadline) = book
            .pending
            .iter()
            .find(|(s, _)| *s == seq)
            .map(|(_, d)| *d)
        else {
            return;
        };
        let before = book.deadline();
        book.confirmed_seq = seq;
        book.confirmed = deadline;
        book.pending.retain(|(s, _)| *s > seq);
        let moved_earlier = book.deadline() < before;
        drop(book);
        if moved_earlier {
            self.deadline_moved.notify_waiters();
        }
    }

    /// Redis ignored change `seq` (a later one was applied first): it will never apply.
    pub(crate) fn change_ignored(&self, seq: u64) {
        self.book().pending.retain(|(s, _)| *s != seq);
    }

    /// Why the hold was lost, if it was.
    pub(crate) fn loss(&self) -> Option<LossReason> {
        self.loss.get().copied()
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.is_lost_at(Instant::now(), self.deadline())
    }

    /// Whether the hold is lost, at `now`, with the deadline as `deadline` (marking it lost if
    /// that has passed).
    fn is_lost_at(&self, now: Instant, deadline: Instant) -> bool {
        if self.lost.is_raised() {
            return true;
        }
        if now >= deadline {
            self.mark_lost(LossReason::Expired);
            return true;
        }
        false
    }

    /// Resolves once the hold is over: released or lost.
    pub(crate) async fn ended(&self) {
        tokio::select! {
            () = self.released.raised() => {}
            () = self.lost.raised() => {}
        }
    }

    /// Records the last release: from now on the hold is over, not lost.
    pub(crate) fn mark_released(&self) {
        self.released.raise();
    }

    /// Records that the last guard lets go now (with what it believed at that moment); returns
    /// when that was and whether the hold was lost then.
    pub(crate) fn mark_let_go(&self) -> (Instant, bool) {
        let (now, deadline) = (Instant::now(), self.deadline());
        let lost = self.is_lost_at(now, deadline);
        let _ = self.let_go.set((now, deadline, lost));
        (now, lost)
    }

    /// When the last guard let go, the deadline it believed then, and whether it was lost then.
    pub(crate) fn let_go(&self) -> (Instant, Instant, bool) {
        self.let_go
            .get()
            .copied()
            .unwrap_or_else(|| (Instant::now(), self.deadline(), self.is_lost()))
    }

    /// Marks the hold lost (once): `lost()` resolves and guarded futures are cancelled.
    pub(crate) fn mark_lost(&self, reason: LossReason) {
        if self.released.is_raised() {
            return;
        }
        if self.loss.set(reason).is_ok() {
            self.lost.raise();
            let reason_label = match reason {
                LossReason::Expired => "expired",
                LossReason::Gone => "gone",
            };
            crate::metrics::count_with(crate::metrics::LOST, "reason", reason_label, &self.labels);
            tracing::warn!(
                name = self.name.for_logs(),
                fencing_token = self.known_fence(),
                reason = ?reason,
                "dlock: lock lost while held"
            );
        }
    }

    pub(crate) fn lost_error(&self) -> LockError {
        LockError::Lost {
            name: self.name.to_string(),
            fencing_token: self.fence.get().copied(),
        }
    }

    /// The fencing token, once minted (for logs and errors).
    pub(crate) fn known_fence(&self) -> Option<u64> {
        self.fence.get().map(|t| t.get())
    }

    /// Resolves when the hold is lost, by a renewal or release finding it gone or by its
    /// validity deadline passing.
    pub(crate) async fn wait_lost(self: Arc<Self>) {
        loop {
            let moved = self.deadline_moved.notified();
            tokio::pin!(moved);
            moved.as_mut().enable();
            let deadline = self.deadline();
            tokio::select! {
                biased;
                () = self.lost.raised() => return,
                () = self.released.raised() => std::future::pending::<()>().await,
                () = &mut moved => {}
                () = tokio::time::sleep_until(deadline) => {
                    if Instant::now() >= self.deadline() {
                        self.mark_lost(LossReason::Expired);
                        return;
                    }
                }
            }
        }
    }
}

/// Resolves when a lock is lost. See [`Hold::lost`].
#[must_use = "futures do nothing unless polled"]
pub struct Lost {
    inner: Pin<Box<dyn Future<Output = ()> + Send>>,
}

impl fmt::Debug for Lost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lost").finish_non_exhaustive()
    }
}

impl Lost {
    pub(crate) fn of(hold: Arc<HoldState>) -> Self {
        Self {
            inner: Box::pin(hold.wait_lost()),
        }
    }

    /// Resolves once fewer than `need` of `holds` are still not lost (never, if `need` is 0):
    /// with `need` = all of them, at the first loss.
    pub(crate) fn fewer_than(need: usize, holds: Vec<Arc<HoldState>>) -> Self {
        Self {
            inner: Box::pin(async move {
                if need == 0 {
                    return std::future::pending().await;
                }
                let mut pending: Vec<_> = (holds.into_iter())
                    .filter(|h| !h.is_lost())
                    .map(|h| Box::pin(h.wait_lost()))
                    .collect();
                while pending.len() >= need {
                    let ((), _, rest) = futures_util::future::select_all(pending).await;
                    pending = rest;
                }
            }),
        }
    }
}

impl Future for Lost {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.inner.as_mut().poll(cx)
    }
}

/// A flag set once and never cleared, that tasks can wait for: a hold's loss, its release. Kept
/// inline (a cancellation token allocates, and every hold has two).
#[derive(Debug, Default)]
struct Signal {
    raised: AtomicBool,
    notify: tokio::sync::Notify,
}

impl Signal {
    fn raise(&self) {
        if !self.raised.swap(true, Ordering::AcqRel) {
            self.notify.notify_waiters();
        }
    }

    fn is_raised(&self) -> bool {
        self.raised.load(Ordering::Acquire)
    }

    /// Resolves once the flag is raised (at once if it is).
    async fn raised(&self) {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            // Registered before the flag is read: a raise after the read wakes this waiter.
            notified.as_mut().enable();
            if self.is_raised() {
                return;
            }
            notified.await;
        }
    }
}
