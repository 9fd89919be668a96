//! Leases against real Redis: `extend` both ways, racing renewals and late commands, a foreign
//! value under one key, a second runtime, and the fencing counter's TTL.
//!
//! The invariant behind most of these: a guard never believes it holds the lock for longer than
//! Redis will keep it (`remaining()` ≤ the key's `PTTL`).

use std::time::Duration;

use dlock_core::redis::{self, AsyncCommands as _};
use dlock_core::{LockGuard, Locker};
use dlock_tests::{RedisServer, pause_writes, unique_name};

async fn pttl(con: &mut redis::aio::MultiplexedConnection, key: &str) -> i64 {
    con.pttl(key).await.expect("PTTL")
}

/// The guard believes no longer than Redis keeps the key (a few ms of slack for the two reads).
async fn assert_belief_within_redis(
    con: &mut redis::aio::MultiplexedConnection,
    guard: &LockGuard,
    key: &str,
) {
    let remaining = guard.remaining();
    let ttl = pttl(con, key).await;
    let ttl = Duration::from_millis(u64::try_from(ttl.max(0)).unwrap_or(0));
    assert!(
        remaining <= ttl + Duration::from_millis(5),
        "the guard believes {remaining:?} but Redis keeps the key {ttl:?}"
    );
}

#[tokio::test]
async fn extending_a_watchdog_lock_to_a_shorter_lease_keeps_it_renewed_at_that_lease() {
    let server = RedisServer::start();
    let mut con = server.connection().await;
    let locker = Locker::connect(&server.url()).await.expect("connect");
    let rival = Locker::connect(&server.url()).await.expect("connect");
    let name = unique_name("extend-shorter");
    let key = locker.key_of(name.as_str()).unwrap();
    let guard = locker.lock(name.as_str()).await.expect("lock");
    guard
        .extend(Duration::from_millis(600))
        .await
        .expect("extend");
    assert!(guard.remaining() <= Duration::from_millis(600));
    assert_belief_within_redis(&mut con, &guard, &key).await;
    // Well past the short lease: the watchdog renews at the new lease, every third of it.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!guard.is_lost());
    assert!(
        rival
            .lock(name.as_str())
            .try_lock()
            .await
            .unwrap()
            .is_none()
    );
    assert!(pttl(&mut con, &key).await <= 600);
    assert_belief_within_redis(&mut con, &guard, &key).await;
    let outcome = guard.release().await;
    assert!(outcome.is_released(), "{outcome:?}");
}

#[tokio::test]
async fn extending_a_fixed_lease_to_a_shorter_one_ends_the_belief_with_it() {
    let server = RedisServer::start();
    let mut con = server.connection().await;
    let locker = Locker::connect(&server.url()).await.expect("connect");
    let rival = Locker::connect(&server.url()).await.expect("connect");
    let name = unique_name("extend-fixed");
    let key = locker.key_of(name.as_str()).unwrap();
    let guard = locker
        .lock(name.as_str())
        .lease(Duration::from_secs(30))
        .await
        .expect("lock");
    guard
        .extend(Duration::from_millis(300))
        .await
        .expect("extend");
    assert_belief_within_redis(&mut con, &guard, &key).await;
    let lost = tokio::time::timeout(Duration::from_secs(2), guard.lost()).await;
    assert!(
        lost.is_ok(),
        "the guard never noticed its shorter lease ran out"
    );
    let taken = rival
        .lock(name.as_str())
        .wait(Duration::from_secs(2))
        .await
        .expect("the rival takes the expired lock");
    assert!(guard.is_lost());
    let outcome = guard.release().await;
    assert!(!outcome.is_released(), "{outcome:?}");
    assert!(taken.release().await.is_released());
}

#[tokio::test]
async fn a_renewal_that_lands_after_extend_cannot_shorten_the_lease_behind_the_guard() {
    let server = RedisServer::start();
    let mut con = server.connection().await;
    let locker = Locker::builder()
        .url(server.url())
        .default_lease(dlock_core::Lease::watchdog(Duration::from_millis(900)))
        .build()
        .await
        .expect("connect");
    let name = unique_name("extend-race");
    let key = locker.key_of(name.as_str()).unwrap();
    let guard = locker.lock(name.as_str()).await.expect("lock");
    for _ in 0..5 {
        // Right after a watchdog tick (one every 300 ms), writes wait in the server: the extend
        // goes in first, then the next tick queues behind it.
        let ticks = locker.stats().renewal_round_trips;
        while locker.stats().renewal_round_trips == ticks {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        pause_writes(&mut con, 400).await;
        guard.extend(Duration::from_secs(10)).await.expect("extend");
        assert_belief_within_redis(&mut con, &guard, &key).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_belief_within_redis(&mut con, &guard, &key).await;
        guard
            .extend(Duration::from_millis(900))
            .await
            .expect("extend back");
    }
    assert!(!guard.is_lost());
    assert!(guard.release().await.is_released());
}

#[tokio::test]
async fn an_extend_that_times_out_but_runs_later_is_assumed_to_have_run() {
    let server = RedisServer::start();
    let mut con = server.connection().await;
    let locker = Locker::builder()
        .url(server.url())
        .command_timeout(Duration::from_millis(100))
        .build()
        .await
        .expect("connect");
    let name = unique_name("extend-late");
    let key = locker.key_of(name.as_str()).unwrap();
    let guard = locker
        .lock(name.as_str())
        .lease(Duration::from_secs(5))
        .await
        .expect("lock");
    // Load the lease script first: a command stuck in a paused server must find it there.
    guard.extend(Duration::from_secs(5)).await.expect("extend");
    pause_writes(&mut con, 300).await;
    let err = guard
        .extend(Duration::from_millis(400))
        .await
        .expect_err("the extend can't be answered while writes are paused");
    assert!(err.is_backend(), "{err}");
    // The extend may still run when the pause ends: the guard must not count on its old lease.
    assert!(guard.remaining() <= Duration::from_millis(400));
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert!(pttl(&mut con, &key).await <= 400, "the late extend did run");
    assert_belief_within_redis(&mut con, &guard, &key).await;
    drop(guard);
}

#[tokio::test]
async fn a_foreign_value_under_one_key_does_not_stop_the_other_renewals() {
    let server = RedisServer::start();
    let mut con = server.connection().await;
    let locker = Locker::builder()
        .url(server.url())
        .default_lease(dlock_core::Lease::watchdog(Duration::from_millis(300)))
        .build()
        .await
        .expect("connect");
    let (a, b) = (unique_name("foreign-a"), unique_name("foreign-b"));
    let guard_a = locker.lock(a.as_str()).await.expect("a");
    let guard_b = locker.lock(b.as_str()).await.expect("b");
    let () = con
        .set(locker.key_of(a.as_str()).unwrap(), "not a lock")
        .await
        .expect("SET");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(guard_a.is_lost(), "a foreign value replaced the lock");
    assert!(!guard_b.is_lost(), "the healthy hold was not renewed");
    assert!(guard_b.release().await.is_released());
    drop(guard_a);
}

#[test]
fn a_locker_first_used_on_a_runtime_that_is_gone_keeps_renewing_and_waking() {
    let server = RedisServer::start();
    let url = server.url();
    let first = tokio::runtime::Runtime::new().expect("runtime");
    let (locker, rival) = first.block_on(async {
        // A waiter that is not woken polls only every 5 s: a dead subscriber shows.
        let locker = Locker::builder()
            .url(url.as_str())
            .default_lease(dlock_core::Lease::watchdog(Duration::from_millis(300)))
            .poll_interval(Duration::from_secs(5))
            .build()
            .await
            .expect("connect");
        let rival = Locker::connect(url.as_str()).await.expect("connect");
        // Start the watchdog and the subscriber on this runtime.
        let guard = locker.lock("warm-up").await.expect("lock");
        let waiter = locker.lock("warm-up").wait(Duration::from_millis(50)).await;
        assert!(waiter.is_err());
        assert!(guard.release().await.is_released());
        (locker, rival)
    });
    drop(first);
    let second = tokio::runtime::Runtime::new().expect("runtime");
    second.block_on(async {
        let name = unique_name("second-runtime");
        // The first command finds the old runtime's connection gone; it is sent again once the
        // connection manager has reconnected on this runtime.
        let guard = locker.lock(name.as_str()).await.expect("lock");
        tokio::time::sleep(Duration::from_millis(1200)).await;
        assert!(!guard.is_lost(), "not renewed on the second runtime");
        assert!(
            rival
                .lock(name.as_str())
                .try_lock()
                .await
                .unwrap()
                .is_none()
        );
        // A waiter on this locker is woken by the rival's release, not by polling its lease.
        let held = rival
            .lock("wake")
            .lease(Duration::from_secs(20))
            .await
            .unwrap();
        let waiting = tokio::spawn({
            let locker = locker.clone();
            async move {
                let started = std::time::Instant::now();
                let guard = locker.lock("wake").wait(Duration::from_secs(10)).await;
                (guard.map(|_| ()), started.elapsed())
            }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(held.release().await.is_released());
        let (got, waited) = waiting.await.expect("waiter");
        got.expect("the waiter got the lock");
        assert!(waited < Duration::from_secs(2), "woken after {waited:?}");
        assert!(locker.stats().subscriber_connected);
        assert!(guard.release().await.is_released());
    });
}

#[tokio::test]
async fn a_fencing_counter_that_expires_comes_back_with_a_ttl_at_the_next_token() {
    let server = RedisServer::start();
    let mut con = server.connection().await;
    let locker = Locker::builder()
        .url(server.url())
        .fence_ttl(Some(Duration::from_millis(300)))
        .build()
        .await
        .expect("connect");
    let name = unique_name("fence-ttl");
    let key = locker.key_of(name.as_str()).unwrap();
    let fence_key = format!("{key}:fence");
    let guard = locker.lock(name.as_str()).await.expect("lock");
    let first = guard.fencing_token().await.expect("a token");
    assert!(
        pttl(&mut con, &fence_key).await > 0,
        "a new counter has a TTL"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let exists: bool = con.exists(&fence_key).await.expect("EXISTS");
    assert!(!exists, "the counter should have expired by now");
    assert!(guard.release().await.is_released());
    // A release writes no counter; the next token does, with its TTL, and still rises.
    assert!(!con.exists::<_, bool>(&fence_key).await.expect("EXISTS"));
    let again = locker.lock(name.as_str()).await.expect("lock again");
    let second = again.fencing_token().await.expect("a token");
    assert!(second > first, "{second:?} after {first:?}");
    let ttl = pttl(&mut con, &fence_key).await;
    assert!(ttl > 0, "the counter came back without a TTL ({ttl})");
    assert!(again.release().await.is_released());
}

/// A guard whose lease ran out as its process counts it has been told it lost the lock; Redis,
/// which started the lease a moment later, may still hold it when the release comes — the
/// release then says the loss, not `Released` (the lock was not this guard's all along).
#[tokio::test]
async fn a_release_after_the_lease_ran_out_says_so_even_if_redis_still_holds_it() {
    let server = RedisServer::start();
    let mut con = server.connection().await;
    let locker = Locker::connect(&server.url()).await.expect("connect");
    let name = unique_name("late-release");
    let key = locker.key_of(name.as_str()).expect("key");
    let guard = locker
        .lock(name.as_str())
        .lease(Duration::from_secs(3))
        .await
        .expect("lock");
    // Past the guard's belief (it counts from before the command was sent, less a margin for
    // clock drift), inside Redis's lease.
    tokio::time::sleep_until(guard.valid_until() + Duration::from_millis(3)).await;
    assert!(guard.is_lost());
    let left: i64 = con.pttl(&key).await.expect("PTTL");
    assert!(left > 0, "Redis let it go already ({left})");
    let outcome = guard.release().await;
    assert!(
        matches!(outcome, dlock_core::ReleaseOutcome::Expired),
        "{outcome:?}"
    );
}
