//! Lock scopes: task-local reentrancy, and what code inside a scope can ask of the locks it
//! holds: [`fencing_token`], [`held_lock`], [`in_scope`]. [`scope`](crate::scope()) opens
//! one (it is also at the crate's root), [`isolated_scope`] a separate one.
//!
//! Inside [`scope`](mod@crate::scope), acquiring a name that the same logical task already holds (through the same
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
//! A [`LockScope::nested`] scope run inside another one sees the holds of both: a tower layer
//! inside another layer keeps the outer layer's hold re-enterable from the handler.
//!
//! Futures polled together in one task (`join!`, `select!`, a `FuturesUnordered`) share the
//! task's scope: an acquisition in one re-enters a hold another one took, and they do not
//! exclude each other. Run each in a [`LockScope::nested`] scope of its own to keep them apart,
//! as every `#[distributed_lock]` call does.
//!
//! **Outside a scope** every acquisition is independent: acquiring a name the same task already
//! holds waits for that hold to be released like any other contender would, and with a wait it
//! times out (it cannot succeed while the first guard is alive). Open a scope where nested
//! acquisitions can happen.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use crate::error::LockError;
use crate::fencing::FencingToken;
use crate::hold::{HeldLock, HoldState};

tokio::task_local! {
    static SCOPE: Arc<ScopeState>;
}

#[derive(Debug, Default)]
struct ScopeState {
    held: Mutex<Vec<Entry>>,
    /// Whether the scope sees the holds of the scope it first runs inside.
    nested: bool,
    /// That outer scope, once a nested scope has run inside one.
    outer: OnceLock<Arc<ScopeState>>,
}

/// Serializes the linking of nested scopes to their outer ones, so that no chain of scopes can
/// ever loop back on itself.
static LINKING: Mutex<()> = Mutex::new(());

impl ScopeState {
    /// This scope, then the scopes it is nested in, innermost first.
    fn chain(&self) -> impl Iterator<Item = &ScopeState> {
        std::iter::successors(Some(self), |state| state.outer.get().map(|outer| &**outer))
    }

    /// For a nested scope not linked yet: links it to the scope the current task runs in, if
    /// any (and if that scope is not inside this one already).
    fn link_to_current(self: &Arc<Self>) {
        if !self.nested || self.outer.get().is_some() {
            return;
        }
        let Ok(current) = SCOPE.try_with(Arc::clone) else {
            return;
        };
        let _linking = LINKING.lock().unwrap_or_else(|e| e.into_inner());
        if current.chain().any(|state| std::ptr::eq(state, &**self)) {
            return;
        }
        let _ = self.outer.set(current);
    }
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
///     assert_eq!(inner.fencing_token().await?, outer.fencing_token().await?);
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
/// the scope started, then run the work with [`run`](LockScope::run) (or a synchronous poll
/// with [`enter`](LockScope::enter)): nested acquisitions of the same name re-enter the adopted
/// hold.
#[derive(Debug, Clone, Default)]
pub struct LockScope {
    state: Arc<ScopeState>,
}

impl LockScope {
    /// A new, empty scope. Run inside another scope, it replaces it: nothing held there is
    /// re-entered or seen from inside (see [`nested`](Self::nested) for the other way).
    pub fn new() -> Self {
        Self::default()
    }

    /// A new, empty scope that also sees the holds of the scope it runs inside.
    ///
    /// The first time it is run ([`run`](Self::run) polled, or [`enter`](Self::enter)ed) inside
    /// another scope, it is linked to that scope for good. Inside it, an acquisition re-enters a
    /// hold of this scope or of the outer one, and [`fencing_token`] and [`held_lock`] answer
    /// with this scope's innermost hold first, then the outer scope's. Holds taken inside it are
    /// recorded in it, not in the outer scope. Run outside any scope, it is a scope like
    /// [`new`](Self::new) gives.
    ///
    /// ```
    /// # async fn demo() -> Result<(), dlock_core::LockError> {
    /// use dlock_core::LockScope;
    ///
    /// let locker = dlock_core::Locker::memory();
    /// dlock_core::scope(async {
    ///     let tenant = locker.lock("tenant:1").await?;
    ///     let order = locker.lock("order:7").await?;
    ///     let inner = LockScope::nested();
    ///     inner.adopt(&order);
    ///     inner
    ///         .run(async {
    ///             // The outer scope's hold re-enters; the innermost token is the order's.
    ///             let again = locker.lock("tenant:1").await?;
    ///             assert_eq!(again.fencing_token().await?, tenant.fencing_token().await?);
    ///             assert!(again.release().await.is_released());
    ///             let innermost = dlock_core::fencing_token().await.transpose()?;
    ///             assert_eq!(innermost, Some(order.fencing_token().await?));
    ///             Ok::<_, dlock_core::LockError>(())
    ///         })
    ///         .await?;
    ///     assert!(order.release().await.is_released());
    ///     assert!(tenant.release().await.is_released());
    ///     Ok(())
    /// })
    /// .await
    /// # }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
    /// ```
    pub fn nested() -> Self {
        Self {
            state: Arc::new(ScopeState {
                nested: true,
                ..ScopeState::default()
            }),
        }
    }

    /// Makes `hold`, taken by the `Locker` `locker`, re-enterable inside this scope (see
    /// `Scope::adopt`, next to the guard).
    pub(crate) fn adopt_hold(&self, locker: u64, hold: &Arc<HoldState>) {
        let mut held = self.state.held.lock().unwrap_or_else(|e| e.into_inner());
        held.push(Entry {
            locker,
            hold: Arc::downgrade(hold),
            reentrant: true,
        });
    }

    /// Runs `fut` inside this scope.
    pub fn run<F: Future>(&self, fut: F) -> Scoped<F> {
        Scoped {
            state: self.state.clone(),
            inner: SCOPE.scope(self.state.clone(), fut),
        }
    }

    /// Calls `f` inside this scope, synchronously: for work polled outside a future of its
    /// own, such as a response body's `poll_frame`. The scope is the task's for the duration of
    /// the call only.
    pub fn enter<R>(&self, f: impl FnOnce() -> R) -> R {
        self.state.link_to_current();
        SCOPE.sync_scope(self.state.clone(), f)
    }
}

pin_project_lite::pin_project! {
    /// A future running inside a [`LockScope`].
    #[must_use = "futures do nothing unless polled"]
    pub struct Scoped<F> {
        state: Arc<ScopeState>,
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
        let this = self.project();
        this.state.link_to_current();
        this.inner.poll(cx)
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

/// The fencing token of the innermost lock held in the current scope, as
/// [`LockGuard::fencing_token`](crate::LockGuard::fencing_token) gives it: minted at the first
/// ask. With no lock held here, a [`LockError::Config`]: the call is in the wrong place.
///
/// Inside a `#[distributed_lock]` function this is the token of the lock the attribute took.
pub async fn fencing_token() -> Result<FencingToken, LockError> {
    match held_lock() {
        Some(held) => held.fencing_token().await,
        None => Err(LockError::Config(
            "no lock is held in this task's scope: ask for the fencing token inside a \
             `#[distributed_lock]` function, a `LockLayer` handler or `dlock_core::scope`"
                .to_owned(),
        )),
    }
}

/// What the crate's root gave before these functions moved into [`scope`](self).
pub(crate) mod moved {
    use super::*;

    /// Moved to [`dlock_core::scope::fencing_token`](crate::scope::fencing_token), which
    /// returns the `Result` alone (no lock held: a [`LockError::Config`]).
    #[deprecated(note = "use `dlock_core::scope::fencing_token()`, which returns a `Result`")]
    pub async fn fencing_token() -> Option<Result<FencingToken, LockError>> {
        let held = super::held_lock()?;
        Some(held.fencing_token().await)
    }

    /// Moved to [`dlock_core::scope::held_lock`](crate::scope::held_lock).
    #[deprecated(note = "use `dlock_core::scope::held_lock()`")]
    pub fn held_lock() -> Option<HeldLock> {
        super::held_lock()
    }

    /// Moved to [`dlock_core::scope::in_scope`](crate::scope::in_scope).
    #[deprecated(note = "use `dlock_core::scope::in_scope()`")]
    pub fn in_scope() -> bool {
        super::in_scope()
    }

    /// Moved to [`dlock_core::scope::isolated_scope`](crate::scope::isolated_scope).
    #[deprecated(note = "use `dlock_core::scope::isolated_scope()`")]
    pub async fn isolated_scope<F: Future>(fut: F) -> F::Output {
        super::isolated_scope(fut).await
    }
}

/// The innermost lock held in the current scope (the last one taken that is still held).
///
/// Inside a `#[distributed_lock(on_lost = "signal")]` function this is how the body learns that
/// its lock was lost: [`HeldLock::is_lost`], or await [`HeldLock::lost`].
pub fn held_lock() -> Option<HeldLock> {
    SCOPE
        .try_with(|state| {
            state.chain().find_map(|state| {
                let held = state.held.lock().unwrap_or_else(|e| e.into_inner());
                held.iter()
                    .rev()
                    .filter_map(|e| e.hold.upgrade())
                    .find(|h| h.holds.load(Ordering::Acquire) > 0)
                    .map(|hold| HeldLock { hold })
            })
        })
        .ok()
        .flatten()
}

/// The hold of `lock_key` through `locker` in the current scope (or a scope it is nested in)
/// that still has guards — lost or not: re-entering a lost hold reports the loss.
pub(crate) fn find(locker: u64, lock_key: &str) -> Option<Arc<HoldState>> {
    SCOPE
        .try_with(|state| {
            state.chain().find_map(|state| {
                let held = state.held.lock().unwrap_or_else(|e| e.into_inner());
                held.iter()
                    .filter(|e| e.locker == locker && e.reentrant)
                    .filter_map(|e| e.hold.upgrade())
                    .find(|h| h.keys.lock == lock_key && h.holds.load(Ordering::Acquire) > 0)
            })
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A guard's token, which the memory store mints with the grant.
    async fn token_of(guard: &crate::LockGuard) -> FencingToken {
        guard
            .fencing_token()
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// The token `fencing_token()` answers in the current scope (`None`: no lock is held here).
    async fn scope_token() -> Option<FencingToken> {
        match fencing_token().await {
            Ok(token) => Some(token),
            Err(err) if err.is_config() => None,
            Err(err) => panic!("{err}"),
        }
    }

    fn block_on<F: Future>(fut: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("{e}"))
            .block_on(fut)
    }

    #[test]
    fn a_nested_scope_re_enters_the_outer_scopes_holds_and_answers_its_own_token_first() {
        block_on(async {
            let locker = crate::Locker::memory();
            let outer = LockScope::new();
            let tenant = locker
                .lock("tenant")
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            outer.adopt(&tenant);
            let order = locker.lock("order").await.unwrap_or_else(|e| panic!("{e}"));
            let inner = LockScope::nested();
            inner.adopt(&order);
            let (token, again) = outer
                .run(inner.run(async {
                    let again = locker.lock("tenant").try_lock().await;
                    (scope_token().await, again)
                }))
                .await;
            assert_eq!(token, Some(token_of(&order).await));
            let again = again
                .unwrap_or_else(|e| panic!("{e}"))
                .unwrap_or_else(|| panic!("the outer hold was not re-entered"));
            assert_eq!(token_of(&again).await, token_of(&tenant).await);
            assert!(again.release().await.is_released());
            // Still linked after its first run; `enter` sees the outer hold too.
            let found = inner.enter(|| find(locker.id(), &tenant.state.keys.lock).is_some());
            assert!(found);
            assert!(order.release().await.is_released());
            assert!(tenant.release().await.is_released());
        });
    }

    #[test]
    fn a_new_scope_inside_another_sees_nothing_of_it() {
        block_on(async {
            let locker = crate::Locker::memory();
            let outer = LockScope::new();
            let tenant = locker
                .lock("tenant")
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            outer.adopt(&tenant);
            let (token, again) = outer
                .run(LockScope::new().run(async {
                    let again = locker.lock("tenant").try_lock().await;
                    (scope_token().await, again)
                }))
                .await;
            assert_eq!(token, None);
            assert!(again.unwrap_or_else(|e| panic!("{e}")).is_none());
            assert!(tenant.release().await.is_released());
        });
    }

    #[test]
    fn holds_taken_in_a_nested_scope_stay_in_it() {
        block_on(async {
            let locker = crate::Locker::memory();
            let outer = LockScope::new();
            let inner = LockScope::nested();
            let seen_outside = outer
                .run(async {
                    let order = inner
                        .run(async { locker.lock("order").await })
                        .await
                        .unwrap_or_else(|e| panic!("{e}"));
                    let seen = scope_token().await;
                    assert!(order.release().await.is_released());
                    seen
                })
                .await;
            assert_eq!(seen_outside, None);
        });
    }

    #[test]
    fn scopes_nested_in_each_other_never_loop() {
        block_on(async {
            let locker = crate::Locker::memory();
            let a = LockScope::nested();
            let b = LockScope::nested();
            // `a` runs inside `b`, then `b` inside `a`: the second link is refused.
            b.run(a.run(async {})).await;
            a.run(b.run(async {})).await;
            let guard = a
                .run(async { locker.lock("x").await })
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            let held = a
                .enter(held_lock)
                .unwrap_or_else(|| panic!("no lock in scope"));
            let seen = held.fencing_token().await.unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(seen, token_of(&guard).await);
            b.run(async {
                assert!(find(locker.id(), &guard.state.keys.lock).is_none());
            })
            .await;
            assert!(guard.release().await.is_released());
        });
    }
}
