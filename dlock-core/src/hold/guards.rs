//! What every guard gives, as traits: [`Hold`] for all of them, [`Fenced`] for those with a
//! fencing token.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use super::Lost;
use crate::error::{LockError, ReleaseOutcome};
use crate::fencing::FencingToken;
use crate::name::LockName;

/// Keeps [`Hold`] and [`Fenced`] to dlock's own guards: their promises rest on the hold's
/// bookkeeping, which only dlock can keep.
pub(crate) mod sealed {
    pub trait Sealed {}
}

/// What every guard gives, with the same signatures on every kind: a lock's guard, a
/// writer's, a reader's, a permit, a multi-lock's and a master set's.
///
/// Each guard has the same methods of its own, so calling them needs no import; the trait is
/// for code that takes any guard:
///
/// ```
/// use dlock_core::Hold;
///
/// async fn guarded<G: Hold>(guard: G) -> Result<(), dlock_core::LockError> {
///     guard.run(async { /* the guarded work */ }).await?;
///     assert!(guard.release().await.is_released());
///     Ok(())
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let locker = dlock_core::Locker::memory();
/// guarded(locker.lock("report").await.unwrap()).await.unwrap();
/// guarded(locker.semaphore("exports", 2).acquire().await.unwrap()).await.unwrap();
/// # }
/// ```
///
/// Sealed: only dlock's guards implement it.
pub trait Hold: sealed::Sealed {
    /// The lock's name (a multi-lock's first name in key order; see its `names`).
    fn name(&self) -> &LockName;

    /// Until when the hold is certainly valid, on tokio's monotonic clock: acquisition (or the
    /// last renewal) plus the lease, minus a drift margin.
    fn valid_until(&self) -> Instant;

    /// How long the hold is certainly still valid for, as far as this process knows; zero
    /// once lost.
    fn remaining(&self) -> Duration;

    /// Whether the hold was lost (expired, deleted or taken over).
    fn is_lost(&self) -> bool;

    /// A future that resolves when the hold is lost: never for one released normally, at once
    /// for one already lost.
    fn lost(&self) -> Lost;

    /// Runs `fut` while the hold lasts and cancels it (drops it at its next `.await`) as soon
    /// as the hold is lost, returning [`LockError::Lost`].
    fn run<F: Future>(&self, fut: F) -> impl Future<Output = Result<F::Output, LockError>>;

    /// Releases the hold and says what the backend found (for several locks, the worst of
    /// their outcomes).
    fn release(self) -> impl Future<Output = ReleaseOutcome>
    where
        Self: Sized;
}

/// A guard with a fencing token: a lock's, a writer's, a master set's. Readers and permits
/// share their name with others and have none, so they don't implement it; a multi-lock has one
/// token per name (`MultiGuard::fencing_token_of`).
pub trait Fenced: Hold {
    /// The hold's fencing token, to hand to the resource the lock protects: minted at the first
    /// ask (one round trip, owner-checked) unless the grant brought it. Fails with
    /// [`LockError::Lost`] once the hold is known lost, or with [`LockError::Backend`] if the
    /// backend can't be asked.
    fn fencing_token(&self) -> impl Future<Output = Result<FencingToken, LockError>>;
}

/// The worst of several release outcomes: a takeover over an expiry over an unreachable
/// backend over a clean release. What a guard of several holds reports as one outcome.
pub(crate) fn worst(outcomes: impl IntoIterator<Item = ReleaseOutcome>) -> ReleaseOutcome {
    fn rank(outcome: &ReleaseOutcome) -> u8 {
        match outcome {
            ReleaseOutcome::Released => 0,
            ReleaseOutcome::Unreachable(_) => 1,
            ReleaseOutcome::Expired => 2,
            ReleaseOutcome::TakenOver => 3,
        }
    }
    outcomes
        .into_iter()
        .max_by_key(rank)
        .unwrap_or(ReleaseOutcome::Released)
}

/// Implements [`Hold`] (and [`sealed::Sealed`]) for a guard by calling its own methods of the
/// same names, so that the two can't differ.
macro_rules! hold_by_own_methods {
    ($guard:ty) => {
        impl $crate::hold::Sealed for $guard {}

        impl $crate::hold::Hold for $guard {
            fn name(&self) -> &$crate::name::LockName {
                <$guard>::name(self)
            }

            fn valid_until(&self) -> ::tokio::time::Instant {
                <$guard>::valid_until(self)
            }

            fn remaining(&self) -> ::std::time::Duration {
                <$guard>::remaining(self)
            }

            fn is_lost(&self) -> bool {
                <$guard>::is_lost(self)
            }

            fn lost(&self) -> $crate::hold::Lost {
                <$guard>::lost(self)
            }

            fn run<F: ::std::future::Future>(
                &self,
                fut: F,
            ) -> impl ::std::future::Future<
                Output = ::std::result::Result<F::Output, $crate::error::LockError>,
            > {
                <$guard>::run(self, fut)
            }

            fn release(self) -> impl ::std::future::Future<Output = $crate::error::ReleaseOutcome> {
                <$guard>::release(self)
            }
        }
    };
}

pub(crate) use hold_by_own_methods;

/// Implements [`Fenced`] for a guard by calling its own `fencing_token`.
macro_rules! fenced_by_own_method {
    ($guard:ty) => {
        impl $crate::hold::Fenced for $guard {
            fn fencing_token(
                &self,
            ) -> impl ::std::future::Future<
                Output = ::std::result::Result<
                    $crate::fencing::FencingToken,
                    $crate::error::LockError,
                >,
            > {
                <$guard>::fencing_token(self)
            }
        }
    };
}

pub(crate) use fenced_by_own_method;
