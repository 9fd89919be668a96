//! Re-entry inside a lock scope under cancellation, timeouts and loss, against real Redis.
//!
//! Windows are opened for real: `CLIENT PAUSE ... WRITE` holds every script in the server while
//! the client times out or drops the future.

use std::future::IntoFuture as _;
use std::time::Duration;

use dlock_core::Locker;
use dlock_core::redis::AsyncCommands as _;
use dlock_tests::{Proxy, RedisServer, pause_writes, unique_name, unpause};

async fn locker_with_timeout(server: &RedisServer, timeout: Duration) -> Locker {
    Locker::builder()
        .url(server.url())
        .command_timeout(timeout)
        .build()
        .await
        .expect("connect")
}

#[tokio::test]
async fn re_entries_dropped_or_timed_out_mid_flight_leave_nothing_behind() {
    let server = RedisServer::start();
    let mut admin = server.connection().await;
    let locker = locker_with_timeout(&server, Duration::from_millis(40)).await;
    let rival = Locker::connect(&server.url()).await.expect("connect");
    let name = unique_name("reenter-cancel");
    let key = locker.key_of(name.as_str()).expect("key");
    dlock_core::scope(async {
        let outer = locker.lock(name.as_str()).await.expect("outer");
        pause_writes(&mut admin, 300).await;
        for i in 0..20 {
            if i % 2 == 0 {
                // Dropped while the script waits in the paused server.
                let dropped =
                    tokio::time::timeout(Duration::from_millis(5), locker.lock(name.as_str()))
                        .await;
                if let Ok(Ok(guard)) = dropped {
                    assert!(guard.release().await.is_released());
                }
            } else {
                // Timed out by the command timeout, so the script may still run later.
                match locker.lock(name.as_str()).await {
                    Ok(guard) => assert!(guard.release().await.is_released()),
                    Err(err) => assert!(err.is_backend(), "{err}"),
                }
            }
        }
        unpause(&mut admin).await;
        assert!(!outer.is_lost());
        let outcome = outer.release().await;
        assert!(outcome.is_released(), "{outcome:?}");
    })
    .await;
    let exists: bool = admin.exists(&key).await.expect("EXISTS");
    assert!(!exists, "the lock outlived its last guard");
    assert_eq!(locker.stats().renewed_holds, 0);
    let taken = rival
        .lock(name.as_str())
        .try_lock()
        .await
        .expect("try_lock");
    assert!(
        taken.is_some(),
        "another locker can't take the released lock"
    );
}

#[tokio::test]
async fn releasing_an_inner_guard_while_redis_times_out_keeps_the_outer_hold() {
    let server = RedisServer::start();
    let mut admin = server.connection().await;
    let locker = locker_with_timeout(&server, Duration::from_millis(50)).await;
    let rival = Locker::connect(&server.url()).await.expect("connect");
    let name = unique_name("reenter-release");
    dlock_core::scope(async {
        let outer = locker.lock(name.as_str()).await.expect("outer");
        let inner = locker.lock(name.as_str()).await.expect("inner");
        assert!(inner.is_reentrant());
        assert_eq!(
            inner.fencing_token().await.unwrap(),
            outer.fencing_token().await.unwrap()
        );
        pause_writes(&mut admin, 200).await;
        let outcome = inner.release().await;
        assert!(outcome.is_released(), "{outcome:?}");
        unpause(&mut admin).await;
        // The outer guard still holds the lock in Redis, and nobody else can take it.
        assert!(
            rival
                .lock(name.as_str())
                .try_lock()
                .await
                .unwrap()
                .is_none()
        );
        assert!(!outer.is_lost());
        let outcome = outer.release().await;
        assert!(outcome.is_released(), "{outcome:?}");
    })
    .await;
    assert!(
        rival
            .lock(name.as_str())
            .try_lock()
            .await
            .unwrap()
            .is_some()
    );
}

#[tokio::test]
async fn re_entering_a_hold_whose_key_vanished_reports_the_loss() {
    let server = RedisServer::start();
    let mut admin = server.connection().await;
    let locker = Locker::connect(&server.url()).await.expect("connect");
    let name = unique_name("reenter-gone");
    let key = locker.key_of(name.as_str()).expect("key");
    dlock_core::scope(async {
        let outer = locker.lock(name.as_str()).await.expect("outer");
        let _: i64 = admin.del(&key).await.expect("DEL");
        let err = locker
            .lock(name.as_str())
            .await
            .expect_err("re-entered a lost hold");
        assert!(err.is_lost(), "{err}");
        assert!(outer.is_lost());
        // No new lock was minted on the way.
        let exists: bool = admin.exists(&key).await.expect("EXISTS");
        assert!(!exists);
        // Still lost on a second try, and its release says so.
        assert!(locker.lock(name.as_str()).await.unwrap_err().is_lost());
        let outcome = outer.release().await;
        assert!(!outcome.is_released(), "{outcome:?}");
    })
    .await;
}

/// A re-entry's check that Redis still has the hold runs while it does, and its answer comes
/// back after the hold's lease ran out: no guard is handed out for a hold over by then.
#[tokio::test]
async fn a_re_entry_answered_after_the_hold_ran_out_reports_the_loss() {
    let server = RedisServer::start();
    let line = Proxy::start(server.addr()).await;
    let locker = Locker::builder()
        .url(line.url())
        .command_timeout(Duration::from_secs(3))
        .build()
        .await
        .expect("connect");
    let name = unique_name("reenter-late");
    dlock_core::scope(async {
        let outer = (locker.lock(name.as_str()))
            .lease(Duration::from_millis(300))
            .await
            .expect("outer");
        // The check's script loaded first (a first call's NOSCRIPT would send it again late).
        let warm = locker.lock(name.as_str()).await.expect("a first re-entry");
        drop(warm);
        // The check reaches Redis at once; its answer comes once the 300 ms lease is over.
        line.stall_replies();
        let (reentry, ()) = tokio::join!(locker.lock(name.as_str()).into_future(), async {
            tokio::time::sleep(Duration::from_millis(500)).await;
            line.unstall_replies();
        });
        match reentry {
            Err(err) => assert!(err.is_lost(), "{err}"),
            Ok(guard) => panic!(
                "re-entered a hold whose lease ran out before the answer (lost: {})",
                guard.is_lost()
            ),
        }
        assert!(outer.is_lost());
    })
    .await;
}

#[tokio::test]
async fn re_entry_in_one_scope_never_spans_two_tasks() {
    let server = RedisServer::start();
    let locker = Locker::connect(&server.url()).await.expect("connect");
    let name = unique_name("reenter-task");
    dlock_core::scope(async {
        let outer = locker.lock(name.as_str()).await.expect("outer");
        let other = tokio::spawn({
            let (locker, name) = (locker.clone(), name.clone());
            async move { locker.lock(name.as_str()).try_lock().await }
        });
        assert!(other.await.expect("task").expect("try_lock").is_none());
        assert!(outer.release().await.is_released());
    })
    .await;
}
