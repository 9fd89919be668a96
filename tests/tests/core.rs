//! dlock-core against real `redis-server` processes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dlock_core::redis::{self, AsyncCommands as _};
use dlock_core::{LockError, Locker, ReleaseOutcome};
use dlock_tests::{Proxy, RedisServer, unique_name};

async fn locker(server: &RedisServer) -> Locker {
    Locker::connect(&server.url()).await.expect("connect")
}

async fn locker_with_lease(server: &RedisServer, lease: Duration) -> Locker {
    Locker::builder()
        .url(server.url())
        .default_lease(dlock_core::Lease::watchdog(lease))
        .build()
        .await
        .expect("connect")
}

async fn exists(con: &mut redis::aio::MultiplexedConnection, key: &str) -> bool {
    con.exists(key).await.expect("EXISTS")
}

/// Polls `cond` every few milliseconds until it holds or `within` passes.
async fn eventually<F, Fut>(within: Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    loop {
        if cond().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mutual_exclusion_across_three_lockers() {
    const LOCKERS: usize = 3;
    const TASKS: usize = 16;
    const ROUNDS: u64 = 300;
    let server = RedisServer::start();
    let name = unique_name("mutex");
    let counter_key = unique_name("counter");
    let holder = Arc::new(AtomicBool::new(false));
    let overlaps = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..LOCKERS {
        let locker = locker(&server).await;
        for _ in 0..TASKS {
            let (locker, name, counter_key) = (locker.clone(), name.clone(), counter_key.clone());
            let (holder, overlaps) = (holder.clone(), overlaps.clone());
            let mut con = server.connection().await;
            tasks.push(tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    let guard = locker
                        .lock(name.as_str())
                        .wait(Duration::from_secs(60))
                        .await?;
                    if holder.swap(true, Ordering::SeqCst) {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    // A non-atomic read-modify-write across awaits.
                    let value: Option<u64> = con.get(&counter_key).await.expect("GET");
                    tokio::task::yield_now().await;
                    let () = con
                        .set(&counter_key, value.unwrap_or(0) + 1)
                        .await
                        .expect("SET");
                    holder.store(false, Ordering::SeqCst);
                    assert!(guard.release().await.is_released());
                }
                Ok::<_, LockError>(())
            }));
        }
    }
    for task in tasks {
        task.await.expect("task panicked").expect("lock error");
    }
    let mut con = server.connection().await;
    let total: u64 = con.get(&counter_key).await.expect("GET");
    assert_eq!(total, LOCKERS as u64 * TASKS as u64 * ROUNDS);
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two holders overlapped");
}

#[tokio::test]
async fn fixed_lease_expires_after_the_holder_forgets() {
    let server = RedisServer::start();
    let a = locker(&server).await;
    let b = locker(&server).await;
    let name = unique_name("forgotten");
    let guard = a
        .lock(name.as_str())
        .lease(Duration::from_millis(300))
        .await
        .unwrap();
    std::mem::forget(guard);
    assert!(b.lock(name.as_str()).try_lock().await.unwrap().is_none());
    let started = Instant::now();
    let guard = b
        .lock(name.as_str())
        .wait(Duration::from_secs(5))
        .await
        .unwrap();
    let waited = started.elapsed();
    assert!(waited < Duration::from_secs(1), "{waited:?}");
    assert!(guard.release().await.is_released());
}

#[tokio::test]
async fn watchdog_keeps_a_three_second_section_alive_with_a_one_second_lease() {
    let server = RedisServer::start();
    let holder = locker_with_lease(&server, Duration::from_secs(1)).await;
    let rival = locker(&server).await;
    let name = unique_name("long");
    let guard = holder.lock(name.as_str()).await.unwrap();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(3) {
        assert!(
            rival
                .lock(name.as_str())
                .try_lock()
                .await
                .unwrap()
                .is_none()
        );
        assert!(!guard.is_lost());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut con = server.connection().await;
    let pttl: i64 = con
        .pttl(holder.key_of(name.as_str()).unwrap())
        .await
        .unwrap();
    assert!(pttl > 0 && pttl <= 1_000, "pttl {pttl}");
    assert!(guard.release().await.is_released());
}

#[tokio::test]
async fn deleting_the_key_is_detected_within_one_tick_and_cancels_the_work() {
    let server = RedisServer::start();
    let locker = locker_with_lease(&server, Duration::from_millis(900)).await;
    let name = unique_name("doomed");
    let guard = locker.lock(name.as_str()).await.unwrap();
    let key = locker.key_of(name.as_str()).unwrap();
    let mut con = server.connection().await;
    let deleted_at = Instant::now();
    let () = con.del(&key).await.unwrap();
    let cancelled = Arc::new(AtomicBool::new(true));
    let result = guard
        .run({
            let cancelled = cancelled.clone();
            async move {
                tokio::time::sleep(Duration::from_secs(30)).await;
                cancelled.store(false, Ordering::SeqCst);
            }
        })
        .await;
    let detected = deleted_at.elapsed();
    assert!(matches!(result, Err(LockError::Lost { .. })), "{result:?}");
    assert!(cancelled.load(Ordering::SeqCst));
    // One tick is a third of the lease (300 ms); allow for the round trip.
    assert!(detected < Duration::from_millis(600), "{detected:?}");
    assert!(guard.is_lost());
    tokio::time::timeout(Duration::from_millis(10), guard.lost())
        .await
        .expect("lost() resolves once lost");
    assert!(matches!(guard.release().await, ReleaseOutcome::Expired));
}

#[tokio::test]
async fn fencing_tokens_strictly_increase_across_lockers() {
    let server = RedisServer::start();
    let lockers = [
        locker(&server).await,
        locker(&server).await,
        locker(&server).await,
    ];
    let name = unique_name("fence");
    let mut last = 0;
    for i in 0..1_000 {
        let guard = lockers[i % 3]
            .lock(name.as_str())
            .wait(Duration::from_secs(5))
            .await
            .unwrap();
        let token = guard.fencing_token().await.unwrap().get();
        assert!(token > last, "token {token} after {last}");
        last = token;
        assert!(guard.release().await.is_released());
    }
}

#[tokio::test]
async fn release_after_expiry_and_after_takeover_are_distinct_and_harmless() {
    let server = RedisServer::start();
    let a = locker(&server).await;
    let b = locker(&server).await;
    let mut con = server.connection().await;

    let expired = unique_name("expired");
    let guard = a
        .lock(expired.as_str())
        .lease(Duration::from_millis(100))
        .await
        .unwrap();
    let key = a.key_of(expired.as_str()).unwrap();
    assert!(
        eventually(Duration::from_secs(2), || {
            let mut c = con.clone();
            let k = key.clone();
            async move { !exists(&mut c, &k).await }
        })
        .await
    );
    assert!(matches!(guard.release().await, ReleaseOutcome::Expired));

    let taken = unique_name("taken");
    let old = a
        .lock(taken.as_str())
        .lease(Duration::from_millis(100))
        .await
        .unwrap();
    let old_token = old.fencing_token().await.unwrap();
    let new = b
        .lock(taken.as_str())
        .wait(Duration::from_secs(2))
        .await
        .unwrap();
    assert!(new.fencing_token().await.unwrap() > old_token);
    // The old holder's lease ran out: its token is no authority any more.
    assert!(old.fencing_token().await.unwrap_err().is_lost());
    assert!(matches!(old.release().await, ReleaseOutcome::TakenOver));
    // The new holder's lock is untouched.
    let key = b.key_of(taken.as_str()).unwrap();
    assert!(exists(&mut con, &key).await);
    assert!(a.lock(taken.as_str()).try_lock().await.unwrap().is_none());
    assert!(new.release().await.is_released());
    assert!(!exists(&mut con, &key).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_acquisitions_never_leak_a_lock() {
    let server = RedisServer::start();
    let locker = locker(&server).await;
    let name = unique_name("cancel");
    let key = locker.key_of(name.as_str()).unwrap();
    let mut con = server.connection().await;
    let mut completed = 0;
    for i in 0..1_000u64 {
        // Budgets from 0 to ~400 µs: the future is dropped before, during and after the
        // round trip.
        let budget = Duration::from_micros((i * 37) % 400);
        match tokio::time::timeout(budget, locker.lock(name.as_str()).into_future()).await {
            Ok(Ok(guard)) => {
                completed += 1;
                assert!(guard.release().await.is_released());
            }
            Ok(Err(err)) => {
                // Busy because a dropped attempt's clean-up has not run yet.
                assert!(err.is_busy(), "{err}");
            }
            Err(_) => {}
        }
    }
    let gone = eventually(Duration::from_secs(2), || {
        let (mut c, k) = (con.clone(), key.clone());
        async move { !exists(&mut c, &k).await }
    })
    .await;
    assert!(gone, "a dropped acquisition left the lock behind");
    assert!(!exists(&mut con, &key).await);
    eprintln!("{completed} of 1000 acquisitions completed within their budget");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_dropped_mid_wait_and_mid_handover_never_leak_a_lock() {
    let server = RedisServer::start();
    let other = locker(&server).await;
    let locker = locker(&server).await;
    let name = unique_name("cancel-wait");
    let key = locker.key_of(name.as_str()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    // A busy holder on the same Locker (hand-overs to local waiters) and one on another.
    let mut churners = Vec::new();
    for churner in [locker.clone(), other.clone()] {
        let (stop, name) = (stop.clone(), name.clone());
        churners.push(tokio::spawn(async move {
            let mut rounds = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let guard = churner
                    .lock(name.as_str())
                    .wait(Duration::from_secs(5))
                    .await?;
                tokio::time::sleep(Duration::from_micros(300)).await;
                assert!(guard.release().await.is_released());
                rounds += 1;
            }
            Ok::<_, LockError>(rounds)
        }));
    }
    for i in 0..400u64 {
        let budget = Duration::from_micros((i * 53) % 3_000);
        let attempt = locker.lock(name.as_str()).wait(Duration::from_secs(1));
        if let Ok(Ok(guard)) = tokio::time::timeout(budget, attempt.into_future()).await {
            assert!(guard.release().await.is_released());
        }
    }
    stop.store(true, Ordering::SeqCst);
    for (i, churner) in churners.into_iter().enumerate() {
        let rounds = churner.await.expect("churner panicked");
        let rounds = match rounds {
            Ok(r) => r,
            Err(e) => {
                let mut con = server.connection().await;
                let hold: Option<String> = redis::cmd("GET")
                    .arg(&key)
                    .query_async(&mut con)
                    .await
                    .unwrap();
                panic!("churner {i}: {e}; the lock is held by {hold:?}");
            }
        };
        assert!(rounds > 0);
    }
    let mut con = server.connection().await;
    let gone = eventually(Duration::from_secs(2), || {
        let (mut c, k) = (con.clone(), key.clone());
        async move { !exists(&mut c, &k).await }
    })
    .await;
    assert!(gone, "a dropped waiter left the lock behind");
    assert!(!exists(&mut con, &key).await);
}

#[tokio::test]
async fn a_waiter_is_woken_by_the_release_without_polling() {
    let server = RedisServer::start();
    let holder = locker(&server).await;
    let waiter = locker(&server).await;
    let name = unique_name("wake");
    // A 30 s lease: the waiter's fallback timer is far away.
    let guard = holder
        .lock(name.as_str())
        .lease(Duration::from_secs(30))
        .await
        .unwrap();
    let before = server.info_commandstats();
    let waiting = tokio::spawn({
        let name = name.clone();
        async move {
            let guard = waiter
                .lock(name.as_str())
                .wait(Duration::from_secs(20))
                .await?;
            let acquired_at = Instant::now();
            assert!(guard.release().await.is_released());
            Ok::<_, LockError>(acquired_at)
        }
    });
    // Let the waiter subscribe and settle into its wait.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released_at = Instant::now();
    assert!(guard.release().await.is_released());
    let acquired_at = waiting.await.unwrap().unwrap();
    let handoff = acquired_at.duration_since(released_at);
    assert!(handoff < Duration::from_millis(50), "{handoff:?}");
    let after = server.info_commandstats();
    let scripts = dlock_tests::script_calls;
    // Holder release + waiter: first attempt, attempt after subscribing, attempt after the
    // wake-up, its release. A polling loop would make dozens.
    let calls = scripts(&after) - scripts(&before);
    assert!(calls <= 8, "{calls} script calls: the waiter polled");
}

#[tokio::test]
async fn reentrancy_inside_a_scope_but_never_across_tasks() {
    let server = RedisServer::start();
    let locker = locker(&server).await;
    let name = unique_name("reenter");
    dlock_core::scope(async {
        let outer = locker.lock(name.as_str()).await.unwrap();
        let inner = locker.lock(name.as_str()).await.unwrap();
        assert!(inner.is_reentrant());
        assert_eq!(
            inner.fencing_token().await.unwrap(),
            outer.fencing_token().await.unwrap()
        );
        assert_eq!(
            dlock_core::scope::fencing_token().await.unwrap(),
            outer.fencing_token().await.unwrap()
        );
        let other = locker.clone();
        let name2 = name.clone();
        let other_task = tokio::spawn(dlock_core::scope(async move {
            other
                .lock(name2.as_str())
                .try_lock()
                .await
                .map(|g| g.is_none())
        }));
        assert!(
            other_task.await.unwrap().unwrap(),
            "another task shared the hold"
        );
        assert!(inner.release().await.is_released());
        let mut con = server.connection().await;
        assert!(exists(&mut con, &locker.key_of(name.as_str()).unwrap()).await);
        assert!(outer.release().await.is_released());
        assert!(!exists(&mut con, &locker.key_of(name.as_str()).unwrap()).await);
    })
    .await;
}

#[tokio::test]
async fn redis_restart_reconnects_and_reports_the_loss_of_held_locks() {
    let mut server = RedisServer::start();
    let locker = locker_with_lease(&server, Duration::from_millis(900)).await;
    let held = unique_name("held");
    let guard = locker.lock(held.as_str()).await.unwrap();
    server.kill();
    server.restart();
    // The held lock is gone with the restart (no persistence): the watchdog notices.
    tokio::time::timeout(Duration::from_secs(3), guard.lost())
        .await
        .expect("loss reported after the restart");
    // New acquisitions work once the connection is re-established.
    let fresh = unique_name("fresh");
    let ok = eventually(Duration::from_secs(5), || {
        let locker = locker.clone();
        let fresh = fresh.clone();
        async move {
            match locker.lock(fresh.as_str()).await {
                Ok(guard) => guard.release().await.is_released(),
                Err(_) => false,
            }
        }
    })
    .await;
    assert!(ok, "the locker did not reconnect");
}

#[tokio::test]
async fn a_cut_connection_is_a_backend_error_then_recovers() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.addr()).await;
    let locker = Locker::builder()
        .url(proxy.url())
        .command_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap();
    let name = unique_name("cut");
    proxy.cut();
    let started = Instant::now();
    let err = locker.lock(name.as_str()).await.unwrap_err();
    assert!(err.is_backend(), "{err}");
    assert!(started.elapsed() < Duration::from_secs(3));
    proxy.restore();
    let ok = eventually(Duration::from_secs(5), || {
        let locker = locker.clone();
        let name = name.clone();
        async move { locker.lock(name.as_str()).await.is_ok() }
    })
    .await;
    assert!(ok);
}

#[tokio::test]
async fn unreachable_server_is_a_clear_error_within_the_connect_timeout() {
    let server = RedisServer::start();
    let url = server.url();
    drop(server);
    let started = Instant::now();
    let err = Locker::builder()
        .url(url)
        .connect_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap_err();
    assert!(err.is_backend(), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    let err = Locker::connect("not a url").await.unwrap_err();
    assert!(err.is_config(), "{err}");
}

#[tokio::test]
async fn invalid_names_are_typed_errors() {
    let server = RedisServer::start();
    let locker = locker(&server).await;
    for bad in ["", "a\nb", "x{y}"] {
        let err = locker.lock(bad).await.unwrap_err();
        assert!(err.is_invalid_name(), "{bad:?}: {err}");
    }
    let long = "k".repeat(dlock_core::MAX_NAME_LEN + 1);
    assert!(locker.lock(long).await.unwrap_err().is_invalid_name());
}

#[tokio::test]
async fn pool_and_multiplexed_backends_behave_the_same() {
    let server = RedisServer::start();
    let manager = bb8_redis::RedisConnectionManager::new(server.url()).unwrap();
    let pool = bb8::Pool::builder()
        .max_size(4)
        .build(manager)
        .await
        .unwrap();
    let pooled = Locker::builder()
        .bb8_pool(pool)
        .subscriber(server.client())
        .build()
        .await
        .unwrap();
    let multiplexed = Locker::builder()
        .multiplexed(server.connection().await)
        .wake_by_polling()
        .build()
        .await
        .unwrap();
    let name = unique_name("shared");
    let guard = pooled.lock(name.as_str()).await.unwrap();
    assert!(
        multiplexed
            .lock(name.as_str())
            .try_lock()
            .await
            .unwrap()
            .is_none()
    );
    dlock_tests::handover::release_to_waiter(guard, &multiplexed, Duration::from_millis(50))
        .await
        .unwrap();
}

#[tokio::test]
async fn passwords_never_show_in_debug_output() {
    let server = RedisServer::start_with_args(&["--requirepass", "s3cret-pw"]);
    let url = format!("redis://:s3cret-pw@127.0.0.1:{}/", server.port());
    let locker = Locker::connect(&url).await.unwrap();
    let shown = format!("{locker:?}");
    assert!(!shown.contains("s3cret-pw"), "{shown}");
    assert!(shown.contains("***"), "{shown}");
    let guard = locker.lock("pw").await.unwrap();
    assert!(guard.release().await.is_released());
    let err = Locker::connect(&format!("redis://:wrong@127.0.0.1:{}/", server.port()))
        .await
        .unwrap_err();
    assert!(!err.to_string().contains("wrong@"), "{err}");
}

/// redis-rs reads a unix socket's password from the query string (`?pass=`): it is as secret
/// there as in the authority, in `Debug` and in every configuration error.
#[tokio::test]
async fn a_password_in_the_query_string_never_shows() {
    let dir = tempfile::tempdir().expect("socket directory");
    let socket = dir.path().join("redis.sock");
    let socket = socket.to_str().expect("utf-8 path");
    let server =
        RedisServer::start_with_args(&["--unixsocket", socket, "--requirepass", "q-s3cret"]);
    let url = format!("redis+unix://{socket}?pass=q-s3cret");
    let locker = Locker::connect(&url).await.expect("over the socket");
    let shown = format!("{locker:?}");
    assert!(!shown.contains("q-s3cret"), "{shown}");
    let guard = locker.lock(unique_name("unix").as_str()).await.unwrap();
    assert!(guard.release().await.is_released());
    let builder = Locker::builder().url(url.as_str());
    let shown = format!("{builder:?}");
    assert!(!shown.contains("q-s3cret"), "{shown}");
    assert!(shown.contains("pass=***"), "{shown}");
    // A URL redis-rs refuses: the error names it, without the password.
    let bad = format!("redis+unix://{socket}?pass=q-s3cret&protocol=resp9");
    let err = Locker::connect(&bad).await.unwrap_err();
    assert!(err.to_string().contains("protocol"), "{err}");
    assert!(!err.to_string().contains("q-s3cret"), "{err}");
    drop(server);
}

#[tokio::test]
async fn a_paused_server_past_the_lease_makes_the_guard_lost() {
    let server = RedisServer::start();
    let locker = Locker::builder()
        .url(server.url())
        .default_lease(dlock_core::Lease::watchdog(Duration::from_millis(600)))
        .command_timeout(Duration::from_millis(300))
        .build()
        .await
        .unwrap();
    let name = unique_name("paused");
    let guard = locker.lock(name.as_str()).await.unwrap();
    server.pause();
    let started = Instant::now();
    let lost = tokio::time::timeout(Duration::from_secs(3), guard.lost()).await;
    server.resume();
    assert!(lost.is_ok(), "no loss reported while Redis was paused");
    // Reported at the validity deadline, not later.
    assert!(
        started.elapsed() < Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );
    assert!(guard.is_lost());
}

#[tokio::test]
async fn fencing_tokens_keep_rising_after_the_counter_expires() {
    let server = RedisServer::start();
    let locker = locker(&server).await;
    let name = unique_name("fence-expiry");
    let first = locker.lock(name.as_str()).await.unwrap();
    let t1 = first.fencing_token().await.unwrap();
    assert!(first.release().await.is_released());
    // An idle counter expiring is the same as it being deleted.
    let mut con = server.connection().await;
    let fence_key = format!("{}:fence", locker.key_of(name.as_str()).unwrap());
    let removed: i64 = con.del(&fence_key).await.unwrap();
    assert_eq!(removed, 1);
    let second = locker.lock(name.as_str()).await.unwrap();
    assert!(
        second.fencing_token().await.unwrap() > t1,
        "{} after {t1}",
        second.fencing_token().await.unwrap()
    );
    // The counter carries a TTL, so an idle one does not stay forever.
    let ttl: i64 = con.pttl(&fence_key).await.unwrap();
    assert!(ttl > 0, "fence counter ttl {ttl}");
    assert!(second.release().await.is_released());
}

/// A holder gets no token for a lock it no longer holds: asked first after the hold was deleted
/// from Redis (the hold is then marked lost), or after its lease ran out — on Redis, and on the
/// memory store, whose tokens come with the grant.
#[tokio::test]
async fn a_lost_hold_gets_no_fencing_token() {
    let server = RedisServer::start();
    let redis = locker(&server).await;
    let mut con = server.connection().await;

    // Gone from Redis before the first ask: the ask finds it out.
    let name = unique_name("token-deleted");
    let guard = redis.lock(name.as_str()).await.expect("lock");
    let _: i64 = con
        .del(redis.key_of(name.as_str()).unwrap())
        .await
        .expect("DEL");
    let err = guard.fencing_token().await.unwrap_err();
    assert!(err.is_lost(), "{err}");
    assert!(guard.is_lost(), "the failed ask marks the hold lost");
    assert!(matches!(
        err,
        LockError::Lost {
            fencing_token: None,
            ..
        }
    ));

    // Past its fixed lease, with a token already known (the memory store's comes with the
    // grant; on Redis one asked for while held): no token any more.
    for locker in [redis.clone(), Locker::memory()] {
        let name = unique_name("token-expired");
        let guard = locker
            .lock(name.as_str())
            .lease(Duration::from_millis(100))
            .await
            .expect("lock");
        let token = guard.fencing_token().await.expect("a token while held");
        tokio::time::sleep(Duration::from_millis(150)).await;
        let err = guard.fencing_token().await.unwrap_err();
        assert!(err.is_lost(), "{err}");
        assert!(matches!(
            err,
            LockError::Lost { fencing_token: Some(t), .. } if t == token
        ));
    }
}
