//! A lock passed from a holder to a waiter: the checks several tests share.

use std::time::{Duration, Instant};

use dlock_core::redis::aio::MultiplexedConnection;
use dlock_core::{FencingToken, LockError, LockGuard, Locker};

use crate::hold::HoldValue;

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

/// Waits (up to 2 s) until a head waiter's claim on the lock key `key` offers a hand-over token
/// to be granted the lock, and returns the token.
///
/// # Panics
///
/// If Redis can't be read, or no claim offers a token within 2 s.
pub async fn offered_token(con: &mut MultiplexedConnection, key: &str) -> String {
    let until = Instant::now() + Duration::from_secs(2);
    loop {
        let hold = HoldValue::read(con, key).await.expect("GET");
        if let Some(token) = hold.as_ref().and_then(HoldValue::claim_token) {
            return token;
        }
        assert!(Instant::now() < until, "no claim offered a hand-over token");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}
