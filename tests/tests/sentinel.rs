//! A `Locker` over Redis Sentinel, against a real master, replica and three sentinels: it finds
//! the master, follows a `SENTINEL FAILOVER` at once (while the old master is still writable),
//! rides out a killed master within a request's wait, and its waiters keep being woken after
//! the master moved.
//!
//! The harness blocks while it polls; these tests run on two worker threads and call it inside
//! `block_in_place`.

use std::time::{Duration, Instant};

use dlock_core::Locker;
use dlock_core::redis::AsyncCommands as _;
use dlock_tests::{RedisSentinel, unique_name};
use tokio::task::block_in_place;

async fn locker(set_up: &RedisSentinel) -> Locker {
    Locker::builder()
        .sentinel(set_up.sentinel_urls(), set_up.master_name())
        .build()
        .await
        .expect("a locker on the sentinels' master")
}

/// Whether the data node on `port` has `key`.
async fn has_key(set_up: &RedisSentinel, port: u16, key: &str) -> bool {
    let mut con = set_up.data_node(port).connection().await;
    con.exists(key).await.expect("EXISTS")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_locker_locks_on_the_master_and_follows_a_failover_at_once() {
    let set_up = block_in_place(RedisSentinel::start);
    let locker = locker(&set_up).await;
    let old = set_up.master_port();
    let name = unique_name("sentinel");
    let key = locker.key_of(name.as_str()).unwrap();

    let guard = locker.lock(name.as_str()).await.expect("lock");
    assert!(
        has_key(&set_up, old, &key).await,
        "the lock is on the master"
    );
    let first = guard.fencing_token().await.unwrap();
    assert!(guard.release().await.is_released());

    let new = block_in_place(|| set_up.failover());
    assert_ne!(new, old);
    // The old master stays writable for ~10 s after a `SENTINEL FAILOVER`: a locker still on it
    // would keep granting there. Shortly after the sentinels switched, grants go to the new
    // master only.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let guard = locker
        .lock(name.as_str())
        .await
        .expect("lock after the failover");
    assert!(
        has_key(&set_up, new, &key).await,
        "the lock is on the new master {new}"
    );
    assert!(
        !has_key(&set_up, old, &key).await,
        "the old master {old} got a grant after the switch"
    );
    assert!(guard.fencing_token().await.unwrap() > first);
    assert!(guard.release().await.is_released());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_rides_out_a_killed_master_within_its_wait() {
    let mut set_up = block_in_place(RedisSentinel::start);
    let locker = locker(&set_up).await;
    let name = unique_name("sentinel-kill");
    let key = locker.key_of(name.as_str()).unwrap();
    let guard = locker.lock(name.as_str()).await.expect("lock");
    assert!(guard.release().await.is_released());

    let old = set_up.kill_master();
    let started = Instant::now();
    let guard = (locker.lock(name.as_str()))
        .wait(Duration::from_secs(20))
        .await
        .expect("lock once a replica is promoted");
    let took = started.elapsed();
    let new = block_in_place(|| set_up.wait_promotion(old, Duration::from_secs(20)));
    assert!(
        has_key(&set_up, new, &key).await,
        "the lock is on the new master {new}"
    );
    assert!(took < Duration::from_secs(15), "took {took:?}");
    eprintln!("granted {took:?} after the master was killed");
    assert!(guard.release().await.is_released());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_woken_on_the_new_master_after_a_failover() {
    let set_up = block_in_place(RedisSentinel::start);
    let holder = locker(&set_up).await;
    let waiter = locker(&set_up).await;
    let name = unique_name("sentinel-wake");

    // The waiter's subscriber connects to the first master.
    let guard = holder.lock(name.as_str()).await.expect("lock");
    let busy = (waiter.lock(name.as_str()))
        .wait(Duration::from_millis(200))
        .await;
    assert!(busy.unwrap_err().is_busy());
    assert!(guard.release().await.is_released());

    block_in_place(|| set_up.failover());
    tokio::time::sleep(Duration::from_millis(200)).await;

    // A 30 s watchdog lease: without a wake-up the waiter would wait for it to run out.
    let guard = holder
        .lock(name.as_str())
        .await
        .expect("lock on the new master");
    let waiting = tokio::spawn({
        let waiter = waiter.clone();
        let name = name.clone();
        async move {
            let guard = (waiter.lock(name.as_str()))
                .wait(Duration::from_secs(10))
                .await
                .expect("the waiter gets the lock");
            let at = Instant::now();
            assert!(guard.release().await.is_released());
            at
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    assert!(guard.release().await.is_released());
    let granted = waiting.await.unwrap();
    let woken = granted - released;
    assert!(
        woken < Duration::from_secs(1),
        "the waiter got the lock {woken:?} after the release"
    );
}

/// With one of three sentinels mute (`SIGSTOP`: it keeps its connections and answers nothing) —
/// the first of the URLs, the one a client that listens to a single sentinel picks — a
/// `Locker` still follows a `SENTINEL FAILOVER` within two seconds, and never grants on the old
/// master — which stays writable for about ten seconds — beside a holder on the new one: its
/// grants there wait for the replica the sentinels promoted, and fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locker_follows_a_failover_with_one_sentinel_mute() {
    let mut set_up = block_in_place(RedisSentinel::start);
    let locker = locker(&set_up).await;
    let old = set_up.master_port();
    let name = unique_name("sentinel-mute");
    // Connected to the old master (and listening) before the fault.
    let guard = locker.lock(name.as_str()).await.expect("lock");
    assert!(guard.release().await.is_released());

    set_up.pause_sentinel(0);
    let new = block_in_place(|| set_up.failover());
    let switched = Instant::now();
    assert_ne!(new, old);
    // A holder on the new master, as any client the sentinels sent there would be.
    let rival = Locker::builder()
        .url(set_up.data_node(new).url())
        .build()
        .await
        .expect("a locker on the new master");
    let held = rival
        .lock(name.as_str())
        .await
        .expect("lock on the new master");
    let mut overlaps = 0;
    let followed = loop {
        match locker.lock(name.as_str()).try_lock().await {
            // Busy: it asked the new master.
            Ok(None) => break switched.elapsed(),
            // Granted while the rival holds it: it asked the old master.
            Ok(Some(guard)) => {
                overlaps += 1;
                let _ = guard.release().await;
            }
            Err(_) => {}
        }
        assert!(
            switched.elapsed() < Duration::from_secs(2),
            "still granting on the old master {old} {:?} after the switch ({overlaps} overlaps)",
            switched.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    eprintln!("followed the failover {followed:?} after the switch; {overlaps} overlaps before");
    // The old master's grants wait for its replica, which the promotion took away: none counts.
    assert_eq!(overlaps, 0, "granted on the old master beside the rival");
    assert!(held.release().await.is_released());
    set_up.resume_sentinel(0);
}
