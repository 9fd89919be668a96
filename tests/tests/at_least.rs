//! Run at most once per period: `LockRequest::at_least` keeps the name taken after an early
//! release until the period has passed since the grant — against real Redis.

use std::time::Duration;

use dlock_core::redis::AsyncCommands as _;
use dlock_core::{LockError, Locker};
use dlock_tests::hold::HoldValue;
use dlock_tests::{RedisServer, pause_writes, unique_name, unpause};
use tokio::time::Instant;

const PERIOD: Duration = Duration::from_millis(800);

#[tokio::test]
async fn an_early_release_keeps_the_name_taken_until_the_period_ends() {
    let server = RedisServer::start();
    let locker = Locker::connect(&server.url()).await.expect("connect");
    let rival = Locker::connect(&server.url()).await.expect("connect");
    let name = unique_name("at-least");
    let key = locker.key_of(name.as_str()).expect("key");
    let sent = Instant::now();
    let guard = (locker.lock(name.as_str()).at_least(PERIOD).await).expect("lock");
    let granted = Instant::now();
    assert!(guard.release().await.is_released());

    // Taken by nobody: no owner on the key, only the released one (`#k:`), until the period
    // ends.
    let mut con = server.connection().await;
    let hold = HoldValue::read(&mut con, &key).await.expect("GET");
    assert!(
        hold.as_ref()
            .is_some_and(|h| h.owner.is_none() && h.kept_after.is_some()),
        "{hold:?}"
    );
    let pttl: i64 = con.pttl(&key).await.expect("PTTL");
    assert!(pttl > 0 && pttl <= PERIOD.as_millis() as i64, "PTTL {pttl}");
    let busy = rival.lock(name.as_str()).try_lock().await.expect("try");
    assert!(busy.is_none(), "taken again within the period");

    // A waiter of another process is let in once the period is over — not at the end of the
    // 30 s lease the holder had.
    let again = (rival.lock(name.as_str()).wait(Duration::from_secs(5)).await).expect("later");
    let at = Instant::now();
    assert!(
        at >= sent + PERIOD,
        "granted {:?} after the first grant",
        at - sent
    );
    assert!(
        at < granted + PERIOD + Duration::from_millis(500),
        "granted {:?} after the period",
        at - (granted + PERIOD)
    );
    assert!(again.release().await.is_released());
    let left: bool = con.exists(&key).await.expect("EXISTS");
    assert!(!left, "a release without a period frees the name");
}

#[tokio::test]
async fn a_release_after_the_period_frees_the_name_at_once() {
    let server = RedisServer::start();
    let locker = Locker::connect(&server.url()).await.expect("connect");
    let name = unique_name("at-least-over");
    let guard = (locker.lock(name.as_str()))
        .at_least(Duration::from_millis(100))
        .await
        .expect("lock");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(guard.release().await.is_released());
    let again = locker.lock(name.as_str()).try_lock().await.expect("try");
    assert!(again.is_some(), "free at once after the period");
}

#[tokio::test]
async fn a_local_waiter_is_not_handed_the_name_within_the_period() {
    let server = RedisServer::start();
    let locker = Locker::connect(&server.url()).await.expect("connect");
    let name = unique_name("at-least-local");
    let sent = Instant::now();
    let guard = (locker.lock(name.as_str()).at_least(PERIOD).await).expect("lock");
    let waiter = tokio::spawn({
        let locker = locker.clone();
        let name = name.clone();
        async move {
            let guard = locker
                .lock(name.as_str())
                .wait(Duration::from_secs(5))
                .await;
            (guard, Instant::now())
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(guard.release().await.is_released());
    let (next, at) = waiter.await.expect("waiter");
    let next = next.expect("the waiter gets it after the period");
    assert!(
        at >= sent + PERIOD,
        "handed over {:?} after the grant",
        at - sent
    );
    assert!(next.release().await.is_released());
}

#[tokio::test]
async fn a_release_dropped_mid_flight_still_keeps_the_period() {
    let server = RedisServer::start();
    let mut admin = server.connection().await;
    let locker = Locker::connect(&server.url()).await.expect("connect");
    let name = unique_name("at-least-dropped");
    let key = locker.key_of(name.as_str()).expect("key");
    let guard = (locker.lock(name.as_str()))
        .at_least(Duration::from_secs(3))
        .await
        .expect("lock");
    // Load the release script, so the release below waits in the paused server.
    let warm = (locker.lock(unique_name("warm").as_str()).await).expect("warm");
    assert!(warm.release().await.is_released());
    pause_writes(&mut admin, 300).await;
    let dropped = tokio::time::timeout(Duration::from_millis(20), guard.release()).await;
    assert!(dropped.is_err(), "the release waited in the paused server");
    unpause(&mut admin).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let hold = HoldValue::read(&mut admin, &key).await.expect("GET");
    assert!(
        hold.as_ref()
            .is_some_and(|h| h.owner.is_none() && h.kept_after.is_some()),
        "{hold:?}"
    );
    let pttl: i64 = admin.pttl(&key).await.expect("PTTL");
    assert!(pttl > 1_000, "kept for the rest of the period, PTTL {pttl}");
}

#[tokio::test]
async fn a_period_longer_than_a_fixed_lease_is_refused() {
    let server = RedisServer::start();
    let locker = Locker::connect(&server.url()).await.expect("connect");
    let err = locker
        .lock("at-least-bad")
        .lease(Duration::from_secs(1))
        .at_least(Duration::from_secs(2))
        .await
        .expect_err("a period the lease can't cover");
    assert!(matches!(err, LockError::Config(_)), "{err}");
    // With the watchdog, any period goes.
    let guard = (locker.lock("at-least-ok"))
        .watchdog_lease(Duration::from_secs(1))
        .at_least(Duration::from_secs(2))
        .await
        .expect("watchdog lease");
    assert!(guard.release().await.is_released());
}

/// A fair lock's early release within its period wakes the head of the line, which learns the
/// kept key's expiry and takes the name when the period ends — not at its own heartbeat (20 s
/// here) or the holder's lease (60 s).
#[tokio::test]
async fn a_fair_early_release_wakes_the_head_for_the_end_of_the_period() {
    let server = RedisServer::start();
    let build = || async {
        (Locker::builder().url(server.url()))
            .dead_waiter_timeout(Duration::from_secs(60))
            .build()
            .await
            .expect("connect")
    };
    let (holder, waiter) = (build().await, build().await);
    let name = unique_name("at-least-fair");
    let first = (holder
        .fair_lock(name.as_str())
        .lease(Duration::from_secs(60)))
    .at_least(PERIOD)
    .await
    .expect("first");
    let granted = Instant::now();
    let waiting = tokio::spawn({
        let name = name.clone();
        async move {
            let got = waiter
                .fair_lock(name.as_str())
                .wait(Duration::from_secs(30))
                .await;
            (got, Instant::now())
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(first.release().await.is_released());
    let (next, at) = waiting.await.expect("waiter");
    let next = next.expect("the head gets the name once the period ends");
    let after = at - granted;
    assert!(
        after >= PERIOD && after < PERIOD + Duration::from_secs(2),
        "the head got the name {after:?} after the grant"
    );
    assert!(next.release().await.is_released());
}
