//! A lock passed from a holder to a waiter: the check several backends' tests share.

use std::time::Duration;

use dlock_core::{FencingToken, LockError, LockGuard, Locker};

/// Starts a wait (up to 10 s) on `guard`'s name from `waiter`, gives it `settle` to find the lock
/// busy, releases `guard`, and returns what the wait got: the new holder's fencing token, which
/// must be above `guard`'s.
///
/// # Panics
///
/// If the release fails, the waiting task panics, or the new token is not above the old one.
pub async fn release_to_waiter(
    guard: LockGuard,
    waiter: &Locker,
    settle: Duration,
) -> Result<FencingToken, LockError> {
    let name = guard.name().clone();
    let waiter = waiter.clone();
    let waiting = tokio::spawn(async move {
        let guard = waiter.lock(name).wait(Duration::from_secs(10)).await?;
        guard.fencing_token().await
    });
    tokio::time::sleep(settle).await;
    let first = guard.fencing_token().await.unwrap();
    assert!(guard.release().await.is_released(), "the holder's release");
    let got = waiting.await.expect("the waiting task");
    if let Ok(second) = &got {
        assert!(*second > first, "{second} after {first}");
    }
    got
}
