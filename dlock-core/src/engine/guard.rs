//! The guard of a held lock: what `lock().await` gives, and what releases the hold.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::Engine;
use crate::error::{LockError, ReleaseOutcome};
use crate::fencing::FencingToken;
use crate::hold::{HeldLock, HoldState, Lost, fenced_by_own_method, hold_by_own_methods};
use crate::name::LockName;
use crate::scope::LockScope;

/// A held lock.
///
/// Dropping the guard releases the lock in the background (a runtime must be running); prefer
/// [`release`](LockGuard::release) to learn the outcome. The guard is `Send` and may be released
/// from any task: ownership is the guard's random token, never a thread or task id.
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct LockGuard {
    pub(crate) state: Arc<HoldState>,
    pub(crate) engine: Engine,
    pub(crate) reentrant: bool,
    pub(crate) done: bool,
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("name", &self.state.name)
            .field("fencing_token", &self.state.fence.get())
            .field("reentrant", &self.reentrant)
            .field("remaining", &self.remaining())
            .field("lost", &self.state.is_lost())
            .finish()
    }
}

impl LockGuard {
    /// The lock's name.
    pub fn name(&self) -> &LockName {
        &self.state.name
    }

    /// The fencing token of this hold, to hand to the resource the lock protects.
    ///
    /// A plain lock's first call asks Redis for it (one round trip, owner-checked): an
    /// acquisition that never asks pays nothing for fencing. Later calls, and the guards that
    /// re-entered this hold, get the same token without a round trip. Fails with
    /// [`LockError::Lost`] once the hold is known lost (its lease ran out here, a renewal found
    /// it gone), or if Redis no longer has it when the token is minted (which marks it lost);
    /// with [`LockError::Backend`] if Redis can't be asked. Either way the work must not go on
    /// with this hold's authority.
    pub async fn fencing_token(&self) -> Result<FencingToken, LockError> {
        self.state.fencing_token().await
    }

    /// The fencing token if this hold has one already (from its grant or an earlier ask), without
    /// asking Redis: for logs and error reports. Use [`fencing_token`](Self::fencing_token) to
    /// hand a token to a resource.
    pub fn minted_fencing_token(&self) -> Option<FencingToken> {
        self.state.fence.get().copied()
    }

    /// A view of this hold that may be kept apart from the guard (in a request's extensions,
    /// say): its name, its fencing token, its loss. It neither holds nor releases anything.
    pub fn held_lock(&self) -> HeldLock {
        HeldLock {
            hold: self.state.clone(),
        }
    }

    /// Whether this guard re-entered a hold that the same task already had.
    pub fn is_reentrant(&self) -> bool {
        self.reentrant
    }

    /// Whether the lock is renewed by the watchdog (otherwise it has a fixed lease).
    pub fn is_watchdog(&self) -> bool {
        self.state.watchdog
    }

    /// The validity deadline on tokio's monotonic clock: acquisition (or last renewal) time plus
    /// the lease, minus a drift margin.
    pub fn valid_until(&self) -> Instant {
        self.state.deadline()
    }

    /// How long the lock is certainly still held for, as far as this process knows; zero once
    /// lost.
    pub fn remaining(&self) -> Duration {
        if self.state.is_lost() {
            return Duration::ZERO;
        }
        self.state
            .deadline()
            .saturating_duration_since(Instant::now())
    }

    /// Whether the lock was lost (expired, deleted or taken over).
    pub fn is_lost(&self) -> bool {
        self.state.is_lost()
    }

    /// A future that resolves when the lock is lost. It never resolves for a lock that is
    /// released normally; it resolves at once if the lock is already lost.
    pub fn lost(&self) -> Lost {
        Lost::of(self.state.clone())
    }

    /// Runs `fut` while the lock is held and cancels it (drops it at its next `.await`) as soon
    /// as the lock is lost, returning [`LockError::Lost`].
    pub async fn run<F: Future>(&self, fut: F) -> Result<F::Output, LockError> {
        if self.state.is_lost() {
            return Err(self.state.lost_error());
        }
        let lost = self.lost();
        tokio::select! {
            biased;
            () = lost => Err(self.state.lost_error()),
            out = fut => Ok(out),
        }
    }

    /// Sets the lease to `lease` from now (owner-checked), shorter or longer than before:
    /// [`valid_until`](LockGuard::valid_until) follows it either way. For a watchdog lock, later
    /// renewals use the new lease too (every third of it).
    ///
    /// If the call fails (the backend timed out, say), the change may still reach Redis later:
    /// until a later renewal is confirmed, the guard counts on the shorter of the two leases.
    pub async fn extend(&self, lease: Duration) -> Result<(), LockError> {
        if self.state.is_lost() {
            return Err(self.state.lost_error());
        }
        self.engine.extend(&self.state, lease).await
    }

    /// Releases the lock and says what Redis found.
    ///
    /// A re-entered guard counts its hold down; the lock stays held by the enclosing guard.
    pub async fn release(mut self) -> ReleaseOutcome {
        self.done = true;
        // Boxed: a task that holds a release future for later (say, after a long wait for the
        // lock) keeps only a pointer until it releases.
        Box::pin(self.engine.release_hold(self.state.clone())).await
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if !self.done {
            self.engine.release_in_background(self.state.clone());
        }
    }
}

/// Makes a kind's guard from the `LockGuard` its request took. Public, in a private module, so
/// that it may bound the public `LockRequest` while no one outside can implement it.
pub(crate) mod from_lock_guard {
    /// A guard made from the `LockGuard` its request took.
    pub trait FromLockGuard {
        /// Wraps `guard`.
        fn from_lock_guard(guard: super::LockGuard) -> Self;
    }
}

pub(crate) use from_lock_guard::FromLockGuard;

/// The methods a guard that wraps a `LockGuard` (a writer's, a reader's, a permit) shares with
/// it, written once: inside the wrapper's `impl`, `what` names the hold in the docs ("the read
/// lock") and `release` says what its release does.
macro_rules! wrapped_guard_methods {
    (what: $what:literal, release: $release:literal) => {
        /// The lock's name.
        pub fn name(&self) -> &$crate::name::LockName {
            self.guard.name()
        }

        #[doc = concat!("Whether the watchdog renews ", $what, " (otherwise it has a fixed lease).")]
        pub fn is_watchdog(&self) -> bool {
            self.guard.is_watchdog()
        }

        /// The validity deadline on tokio's monotonic clock: the grant (or the last renewal)
        /// plus the lease, minus a drift margin.
        pub fn valid_until(&self) -> ::tokio::time::Instant {
            self.guard.valid_until()
        }

        #[doc = concat!("How long ", $what, " is certainly still held for; zero once lost.")]
        pub fn remaining(&self) -> ::std::time::Duration {
            self.guard.remaining()
        }

        #[doc = concat!("Whether ", $what, " was lost (expired before a renewal, or removed).")]
        pub fn is_lost(&self) -> bool {
            self.guard.is_lost()
        }

        #[doc = concat!("Resolves when ", $what, " is lost; never for one released normally.")]
        pub fn lost(&self) -> $crate::hold::Lost {
            self.guard.lost()
        }

        #[doc = concat!("Runs `fut` while ", $what, " is held and cancels it as soon as it is                          lost, returning [`LockError::Lost`](crate::LockError::Lost).")]
        pub async fn run<F: ::std::future::Future>(
            &self,
            fut: F,
        ) -> ::std::result::Result<F::Output, $crate::error::LockError> {
            self.guard.run(fut).await
        }

        #[doc = $release]
        pub async fn release(self) -> $crate::error::ReleaseOutcome {
            self.guard.release().await
        }
    };
}

pub(crate) use wrapped_guard_methods;

impl FromLockGuard for LockGuard {
    fn from_lock_guard(guard: LockGuard) -> Self {
        guard
    }
}

hold_by_own_methods!(LockGuard);
fenced_by_own_method!(LockGuard);

// Here rather than in `scope`: a scope sits below the guards and knows holds only.
impl LockScope {
    /// Makes `guard`'s hold re-enterable (and visible to [`fencing_token`](crate::scope::fencing_token))
    /// inside this scope.
    pub fn adopt(&self, guard: &LockGuard) {
        self.adopt_hold(guard.engine.id(), &guard.state);
    }
}
