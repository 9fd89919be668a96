//! Lock scopes: task-local reentrancy.
//!
//! Inside [`scope`], acquiring a name that the same logical task already holds (through the same
//! `Locker`) re-enters the hold: after a read-only check that Redis still has it, the new guard
//! is counted in this process and carries the same fencing token; releasing it counts it out,
//! and the lock is released in Redis when the last guard of the hold goes. Re-entering a hold
//! that was lost (expired, deleted, taken over) returns [`LockError::Lost`](crate::LockError)
//! instead of taking a new lock behind the outer guard's back. The `#[distributed_lock]`
//! attribute and the tower layer open a scope around the code they guard, so nested guarded
//! calls on the same key re-enter instead of deadlocking.
//!
//! A scope belongs to one task: a task spawned from inside it does not inherit it, so two tasks
//! never share a hold.
//!
//! **Outside a scope** every acquisition is independent: acquiring a name the same task already
//! holds waits for that hold to be released like any other contender would, and with a wait it
//! times out (it cannot succeed while the first guard is alive). Open a scope where nested
//! acquisitions can happen.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};

use crate::guard::{FencingToken, HoldState};

tokio::task_local! {
    static SCOPE: Arc<ScopeState>;
}

#[derive(Debug, Default)]
struct ScopeState {
    held: Mutex<Vec<Entry>>,
}

#[derive(Debug)]
struct Entry {
    locker: u64,
    hold: Weak<HoldState>,
    /// Whether acquisitions in this scope may re-enter the hold.
    reentrant: bool,
}

/// Runs `fut` inside a lock scope (or inside the current one, if there already is one).
///
/// ```
/// # async fn demo() -> Result<(), dlock_core::LockError> {
/// let locker = dlock_core::Locker::memory();
/// dlock_core::scope(async {
///     let outer = locker.lock("order:7").await?;
///     let inner = locker.lock("order:7").await?; // re-enters instead of deadlocking
///     assert_eq!(inner.fencing_token(), outer.fencing_token());
///     assert!(inner.release().await.is_released());
///     assert!(outer.release().await.is_released());
///     Ok(())
/// })
/// .await
/// # }
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
/// ```
pub async fn scope<F: Future>(fut: F) -> F::Output {
    if in_scope() {
        fut.await
    } else {
        SCOPE.scope(Arc::default(), fut).await
    }
}

/// A lock scope as a value: for code that can't wrap its work in an `async` block, such as a
/// tower middleware's named response future. [`adopt`](LockScope::adopt) a guard taken before
/// the scope started, then run the work with [`run`](LockScope::run): nested acquisitions of the
/// same name re-enter the adopted hold.
#[derive(Debug, Clone, Default)]
pub struct LockScope {
    state: Arc<ScopeState>,
}

impl LockScope {
    /// A new, empty scope.
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes `guard`'s hold re-enterable (and visible to [`fencing_token`]) inside this scope.
    pub fn adopt(&self, guard: &crate::LockGuard) {
        let mut held = self.state.held.lock().unwrap_or_else(|e| e.into_inner());
        held.push(Entry {
            locker: guard.locker.id(),
            hold: Arc::downgrade(&guard.state),
            reentrant: true,
        });
    }

    /// Runs `fut` inside this scope.
    pub fn run<F: Future>(&self, fut: F) -> Scoped<F> {
        Scoped {
            inner: SCOPE.scope(self.state.clone(), fut),
        }
    }
}

pin_project_lite::pin_project! {
    /// A future running inside a [`LockScope`].
    #[must_use = "futures do nothing unless polled"]
    pub struct Scoped<F> {
        #[pin]
        inner: tokio::task::futures::TaskLocalFuture<Arc<ScopeState>, F>,
    }
}

impl<F: std::fmt::Debug> std::fmt::Debug for Scoped<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scoped").finish_non_exhaustive()
    }
}

impl<F: Future> Future for Scoped<F> {
    type Output = F::Output;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        self.project().inner.poll(cx)
    }
}

/// Whether the current task runs inside a lock scope.
pub fn in_scope() -> bool {
    SCOPE.try_with(|_| ()).is_ok()
}

/// Runs `fut` in a new lock scope of its own, even inside another one: nothing held outside is
/// re-entered from inside.
pub async fn isolated_scope<F: Future>(fut: F) -> F::Output {
    SCOPE.scope(Arc::default(), fut).await
}

/// The fencing token of the innermost lock held in the current scope, if any.
///
/// Inside a `#[distributed_lock]` function this is the token of the lock the attribute took.
pub fn fencing_token() -> Option<FencingToken> {
    held_lock().map(|h| h.fencing_token())
}

/// The innermost lock held in the current scope (the last one taken that is still held).
///
/// Inside a `#[distributed_lock(on_lost = "signal")]` function this is how the body learns that
/// its lock was lost: [`HeldLock::is_lost`], or await [`HeldLock::lost`].
pub fn held_lock() -> Option<HeldLock> {
    SCOPE
        .try_with(|state| {
            let held = state.held.lock().unwrap_or_else(|e| e.into_inner());
            held.iter()
                .rev()
                .filter_map(|e| e.hold.upgrade())
                .find(|h| h.holds.load(Ordering::Acquire) > 0)
                .map(|hold| HeldLock { hold })
        })
        .ok()
        .flatten()
}

/// A view of a lock held in the current scope. See [`held_lock`].
#[derive(Debug, Clone)]
pub struct HeldLock {
    hold: Arc<HoldState>,
}

impl HeldLock {
    /// The lock's name.
    pub fn name(&self) -> &crate::LockName {
        &self.hold.name
    }

    /// The fencing token of the hold.
    pub fn fencing_token(&self) -> FencingToken {
        self.hold.fence
    }

    /// Whether the lock was lost.
    pub fn is_lost(&self) -> bool {
        self.hold.is_lost()
    }

    /// Resolves when the lock is lost (never, once it is released).
    pub fn lost(&self) -> crate::Lost {
        crate::guard::Lost::of(self.hold.clone())
    }
}

/// The hold of `lock_key` through `locker` in the current scope that still has guards — lost or
/// not: re-entering a lost hold reports the loss.
pub(crate) fn find(locker: u64, lock_key: &str) -> Option<Arc<HoldState>> {
    SCOPE
        .try_with(|state| {
            let held = state.held.lock().unwrap_or_else(|e| e.into_inner());
            held.iter()
                .filter(|e| e.locker == locker && e.reentrant)
                .filter_map(|e| e.hold.upgrade())
                .find(|h| h.keys.lock == lock_key && h.holds.load(Ordering::Acquire) > 0)
        })
        .ok()
        .flatten()
}

/// Records a fresh hold in the current scope (no-op outside a scope).
pub(crate) fn record(locker: u64, hold: &Arc<HoldState>) {
    record_with(locker, hold, true);
}

/// Records a hold in the current scope, re-enterable or not (no-op outside a scope).
pub(crate) fn record_with(locker: u64, hold: &Arc<HoldState>, reentrant: bool) {
    let _ = SCOPE.try_with(|state| {
        let mut held = state.held.lock().unwrap_or_else(|e| e.into_inner());
        held.retain(|e| {
            e.hold
                .upgrade()
                .is_some_and(|h| h.holds.load(Ordering::Acquire) > 0)
        });
        held.push(Entry {
            locker,
            hold: Arc::downgrade(hold),
            reentrant,
        });
    });
}
