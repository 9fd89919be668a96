//! Lock scopes: task-local reentrancy.
//!
//! Inside [`scope`], acquiring a name that the same logical task already holds (through the same
//! `Locker`) re-enters the hold: the hold count in Redis goes up by one, the new guard carries the
//! same fencing token, and releasing it counts the hold down. The `#[distributed_lock]` attribute
//! and the tower layer open a scope around the code they guard, so nested guarded calls on the
//! same key re-enter instead of deadlocking.
//!
//! A scope belongs to one task: a task spawned from inside it does not inherit it, so two tasks
//! never share a hold.
//!
//! **Outside a scope** every acquisition is independent: acquiring a name the same task already
//! holds waits for that hold to be released like any other contender would, and with a wait it
//! times out (it cannot succeed while the first guard is alive). Open a scope where nested
//! acquisitions can happen.

use std::future::Future;
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

/// Whether the current task runs inside a lock scope.
pub fn in_scope() -> bool {
    SCOPE.try_with(|_| ()).is_ok()
}

/// The fencing token of the innermost lock held in the current scope, if any.
///
/// Inside a `#[distributed_lock]` function this is the token of the lock the attribute took.
pub fn fencing_token() -> Option<FencingToken> {
    SCOPE
        .try_with(|state| {
            let held = state.held.lock().unwrap_or_else(|e| e.into_inner());
            held.iter()
                .rev()
                .filter_map(|e| e.hold.upgrade())
                .find(|h| h.is_live())
                .map(|h| h.fence)
        })
        .ok()
        .flatten()
}

/// The live hold of `lock_key` through `locker` in the current scope.
pub(crate) fn find(locker: u64, lock_key: &str) -> Option<Arc<HoldState>> {
    SCOPE
        .try_with(|state| {
            let held = state.held.lock().unwrap_or_else(|e| e.into_inner());
            held.iter()
                .filter(|e| e.locker == locker)
                .filter_map(|e| e.hold.upgrade())
                .find(|h| h.keys.lock == lock_key && h.is_live())
        })
        .ok()
        .flatten()
}

/// Records a fresh hold in the current scope (no-op outside a scope).
pub(crate) fn record(locker: u64, hold: &Arc<HoldState>) {
    let _ = SCOPE.try_with(|state| {
        let mut held = state.held.lock().unwrap_or_else(|e| e.into_inner());
        held.retain(|e| e.hold.upgrade().is_some_and(|h| h.is_live()));
        held.push(Entry {
            locker,
            hold: Arc::downgrade(hold),
        });
    });
}
