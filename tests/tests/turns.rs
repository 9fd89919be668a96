//! Turns across processes, against real Redis: a waiter that was woken and still found the lock
//! taken is next in turn — the holder's process does not hand the lock to its own waiters past
//! it, the release keeps the lock for it; one that gives up takes its claim back, and one that
//! dies delays the lock by its turn only. Each
//! `Locker` stands for a process (its own connections, its own local queue).

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_core::redis::{self, AsyncCommands as _};
use dlock_core::{Locker, LockerBuilder};
use dlock_tests::handover::offered_token;
use dlock_tests::hold::HoldValue;
use dlock_tests::shares::contend;
use dlock_tests::{Proxy, RedisServer, unique_name};

/// Wakes the waiters of `name` as a release would, while the lock stays held: each finds it
/// taken again, which is a lost race.
async fn wake(con: &mut redis::aio::MultiplexedConnection, key: &str) {
    let _: i64 = con
        .publish(format!("{key}:wake"), "1")
        .await
        .expect("PUBLISH");
}

/// Until `key`'s hold has a waiter marked next in turn (or a second passed).
async fn marked(con: &mut redis::aio::MultiplexedConnection, key: &str) -> bool {
    let until = Instant::now() + Duration::from_secs(1);
    while Instant::now() < until {
        let hold = HoldValue::read(con, key).await.expect("GET");
        if hold.is_some_and(|h| h.claim.is_some()) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    false
}

fn locker(url: String) -> LockerBuilder {
    Locker::builder().url(url)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_lost_a_race_gets_the_lock_before_the_holders_own_waiters() {
    let server = RedisServer::start();
    let mut con = server.connection().await;
    let near = locker(server.url()).build().await.expect("connect");
    let far = locker(server.url()).build().await.expect("connect");
    let name = unique_name("turn");
    let key = near.key_of(name.as_str()).expect("key");

    let held = near.lock(name.as_str()).await.expect("lock");
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let far_wait = tokio::spawn({
        let (far, name, order) = (far.clone(), name.clone(), order.clone());
        async move {
            let guard = far
                .lock(name.as_str())
                .wait(Duration::from_secs(5))
                .await
                .expect("far waiter");
            order.lock().unwrap().push("far");
            assert!(guard.release().await.is_released());
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    wake(&mut con, &key).await;
    assert!(
        marked(&mut con, &key).await,
        "the far waiter never marked the hold"
    );

    // A waiter of the holder's own process, which a hand-over would serve first.
    let near_wait = tokio::spawn({
        let (near, name, order) = (near.clone(), name.clone(), order.clone());
        async move {
            let guard = near
                .lock(name.as_str())
                .wait(Duration::from_secs(5))
                .await
                .expect("near waiter");
            order.lock().unwrap().push("near");
            tokio::time::sleep(Duration::from_millis(20)).await;
            assert!(guard.release().await.is_released());
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(held.release().await.is_released());
    far_wait.await.expect("far");
    near_wait.await.expect("near");
    assert_eq!(*order.lock().unwrap(), ["far", "near"]);
    // Nothing kept once both are done.
    let exists: bool = con.exists(&key).await.expect("EXISTS");
    assert!(!exists, "the lock key outlived its holders");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_marked_waiter_that_died_delays_the_lock_by_its_turn_only() {
    let server = RedisServer::start();
    let mut con = server.connection().await;
    let holder = locker(server.url()).build().await.expect("connect");
    // The process that will die, reached through a proxy that can cut it off.
    let line = Proxy::start(server.addr()).await;
    // A fresh claim is granted for twice its window (a quarter more than the waiter's command
    // timeout): that is the turn.
    let gone = locker(line.url())
        .command_timeout(Duration::from_millis(300))
        .build()
        .await
        .expect("connect");
    let other = locker(server.url()).build().await.expect("connect");
    let name = unique_name("turn-left");
    let key = holder.key_of(name.as_str()).expect("key");

    let held = holder.lock(name.as_str()).await.expect("lock");
    let waiting = tokio::spawn({
        let (gone, name) = (gone.clone(), name.clone());
        async move {
            let _ = gone.lock(name.as_str()).wait(Duration::from_secs(30)).await;
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    wake(&mut con, &key).await;
    assert!(
        marked(&mut con, &key).await,
        "the waiter never marked the hold"
    );
    // Its head's claim, which follows its first attempt's (a claim without a hand-over token)
    // and offers its token: read before, the first claim would name none, and the release
    // would grant the lock to a token this test never saw.
    let offered = Some(offered_token(&mut con, &key).await);
    // Its process dies (cut off, then gone): the mark stays. Cut off first, for good: the
    // request, dropped, takes its claim back in the background, which must not reach Redis
    // through a connection the proxy has not closed yet.
    line.cut();
    tokio::time::sleep(Duration::from_millis(50)).await;
    waiting.abort();
    let _ = waiting.await;
    drop(gone);

    assert!(held.release().await.is_released());
    // Kept for the one that left (or granted to its hand-over token, its claim being fresh),
    // for a fraction of a second only (twice its grant window at most: 750 ms).
    let pttl: i64 = con.pttl(&key).await.expect("PTTL");
    assert!((1..=1_000).contains(&pttl), "kept for {pttl} ms");
    let passed_on = HoldValue::read(&mut con, &key).await.expect("GET");
    assert!(
        passed_on
            .is_some_and(|h| h.kept_for.is_some() || (h.owner.is_some() && h.owner == offered)),
        "the release did not keep the lock for the waiter nor grant it to its claim"
    );
    assert!(
        other
            .lock(name.as_str())
            .try_lock()
            .await
            .expect("try_lock")
            .is_none()
    );
    let started = Instant::now();
    let guard = other
        .lock(name.as_str())
        .wait(Duration::from_secs(2))
        .await
        .expect("the lock comes back once the turn has passed");
    let waited = started.elapsed();
    assert!(
        waited <= Duration::from_millis(pttl as u64 + 300),
        "waited {waited:?} for a turn of {pttl} ms"
    );
    assert!(guard.release().await.is_released());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_gives_up_or_is_dropped_takes_its_claim_back() {
    let server = RedisServer::start();
    let mut con = server.connection().await;
    let holder = locker(server.url()).build().await.expect("connect");
    let waiter = locker(server.url()).build().await.expect("connect");
    let name = unique_name("turn-back");
    let key = holder.key_of(name.as_str()).expect("key");

    // Gives up: when the call returns, the claim is gone, and a release leaves the name free.
    let held = holder.lock(name.as_str()).await.expect("lock");
    let err = waiter
        .lock(name.as_str())
        .wait(Duration::from_millis(200))
        .await
        .expect_err("the lock is held");
    assert!(err.is_busy(), "{err}");
    let mark = HoldValue::read(&mut con, &key).await.expect("GET");
    assert_eq!(
        mark.and_then(|h| h.claim),
        None,
        "the claim outlived the request"
    );
    assert!(held.release().await.is_released());
    let exists: bool = con.exists(&key).await.expect("EXISTS");
    assert!(
        !exists,
        "the release kept the name for a waiter that gave up"
    );

    // Dropped while waiting: the claim goes in the background.
    let held = holder.lock(name.as_str()).await.expect("lock");
    let waiting = tokio::spawn({
        let (waiter, name) = (waiter.clone(), name.clone());
        async move {
            let _ = waiter
                .lock(name.as_str())
                .wait(Duration::from_secs(30))
                .await;
        }
    });
    assert!(
        marked(&mut con, &key).await,
        "the waiter never marked the hold"
    );
    waiting.abort();
    let _ = waiting.await;
    let until = Instant::now() + Duration::from_secs(2);
    loop {
        let hold = HoldValue::read(&mut con, &key).await.expect("GET");
        if hold.is_none_or(|h| h.claim.is_none()) {
            break;
        }
        assert!(Instant::now() < until, "the dropped waiter's claim stayed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(held.release().await.is_released());
    let exists: bool = con.exists(&key).await.expect("EXISTS");
    assert!(
        !exists,
        "the release kept the name for a waiter that was dropped"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_farther_from_redis_gets_its_share_against_hand_overs() {
    let server = RedisServer::start();
    let proxy = Proxy::start_delayed(server.addr(), Duration::from_millis(3)).await;
    // Two tasks in one process hand the lock to each other; one task in another process,
    // 3 ms farther from Redis, wants it too.
    let near = locker(server.url()).build().await.expect("connect");
    let far = locker(proxy.url()).build().await.expect("connect");
    let name = unique_name("turn-share");
    let shares = contend(
        &near,
        &far,
        Duration::from_secs(2),
        move |locker: Locker| {
            let name = name.clone();
            async move {
                let asked = Instant::now();
                let guard = locker
                    .lock(name.as_str())
                    .wait(Duration::from_secs(3))
                    .await
                    .expect("lock");
                let waited = asked.elapsed();
                tokio::time::sleep(Duration::from_millis(2)).await;
                assert!(guard.release().await.is_released());
                waited
            }
        },
    )
    .await;
    let (counts, longest) = (&shares.counts, shares.longest_ms);
    eprintln!("acquisitions per task {counts:?}, the longest wait {longest} ms");
    // Without turns the far task gets next to nothing: the near process's waiters win every
    // race and hand the lock to each other. With them it gets about its share.
    assert!(
        shares.far_share() >= 0.5,
        "acquisitions per task {counts:?}: the far one got less than half its share"
    );
    assert!(longest < 1_000, "a wait took {longest} ms ({counts:?})");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_grants_the_lock_to_the_waiter_next_in_turn_in_its_wake_up() {
    let server = RedisServer::start();
    let mut con = server.connection().await;
    let holder = locker(server.url()).build().await.expect("connect");
    let waiter = locker(server.url()).build().await.expect("connect");
    let name = unique_name("turn-grant");
    let key = holder.key_of(name.as_str()).expect("key");

    let held = holder.lock(name.as_str()).await.expect("lock");
    let first = held.fencing_token().await.expect("token").get();
    let (granted_tx, granted_rx) = tokio::sync::oneshot::channel();
    let waiting = tokio::spawn({
        let (waiter, name) = (waiter.clone(), name.clone());
        async move {
            let guard = waiter
                .lock(name.as_str())
                .wait(Duration::from_secs(5))
                .await
                .expect("waiter");
            let _ = granted_tx.send(Instant::now());
            guard
        }
    });
    // The waiter's head offers its hand-over token with its claim.
    let offered = offered_token(&mut con, &key).await;
    let released_at = Instant::now();
    assert!(held.release().await.is_released());
    let granted_at = granted_rx.await.expect("granted");
    let guard = waiting.await.expect("waiter task");
    // The release granted it: the token the claim offered holds the lock (an attempt of the
    // waiter's would have taken it with an owner of its own), its fencing token minted with the
    // grant and known to the guard.
    let hold = HoldValue::read(&mut con, &key)
        .await
        .expect("GET")
        .expect("held");
    assert_eq!(hold.owner.as_deref(), Some(offered.as_str()));
    let minted = guard.minted_fencing_token().map(|t| t.get());
    assert!(
        minted.is_some() && minted == hold.token,
        "{minted:?} vs {hold:?}"
    );
    eprintln!(
        "granted {:?} after the release began",
        granted_at - released_at
    );
    // The guard extends the short grant to its own lease, after a grace of a quarter of what
    // that extension needs (a hold given back sooner never asks: see `costs.rs`).
    let until = Instant::now() + Duration::from_secs(2);
    while guard.remaining() < Duration::from_secs(5) {
        assert!(
            Instant::now() < until,
            "the granted hold was not extended: {:?} left",
            guard.remaining()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let pttl: i64 = con.pttl(&key).await.expect("PTTL");
    assert!(pttl > 5_000, "Redis keeps the granted hold for {pttl} ms");
    // Its fencing token is above the last holder's.
    let token = guard.fencing_token().await.expect("token").get();
    assert!(token > first, "token {token} after {first}");
    assert!(guard.release().await.is_released());
    let exists: bool = con.exists(&key).await.expect("EXISTS");
    assert!(!exists, "the lock key outlived its holders");
}

/// A grant its waiter did not hear of: a holder holds `name`, a waiter of another `Locker`
/// (its wake-ups through `line`, polling every 20 ms when they fail) waits for it and claims
/// the next turn, the line stalls, and the holder's release grants the lock to the waiter's
/// hand-over token.
struct UnheardGrant {
    line: Proxy,
    key: String,
    waiting: tokio::task::JoinHandle<Result<dlock_core::LockGuard, dlock_core::LockError>>,
    /// The hold right after the release: the grant.
    granted: HoldValue,
    /// The grant's PTTL right after the release.
    pttl: i64,
}

async fn unheard_grant(
    server: &RedisServer,
    con: &mut redis::aio::MultiplexedConnection,
    name: &str,
) -> UnheardGrant {
    let holder = locker(server.url()).build().await.expect("connect");
    let line = Proxy::start(server.addr()).await;
    let waiter = locker(server.url())
        .subscriber(redis::Client::open(line.url()).expect("client"))
        .poll_interval(Duration::from_millis(20))
        .build()
        .await
        .expect("connect");
    let key = holder.key_of(name).expect("key");
    let held = holder.lock(name).await.expect("lock");
    let waiting = tokio::spawn({
        let name = name.to_owned();
        async move { waiter.lock(name).wait(Duration::from_secs(30)).await }
    });
    let offered = offered_token(con, &key).await;
    // The waiter sleeps on: its fallback timer is the holder's lease away.
    line.stall();
    assert!(held.release().await.is_released());
    let granted = HoldValue::read(con, &key)
        .await
        .expect("GET")
        .expect("granted");
    assert_eq!(granted.owner.as_deref(), Some(offered.as_str()));
    let pttl: i64 = con.pttl(&key).await.expect("PTTL");
    UnheardGrant {
        line,
        key,
        waiting,
        granted,
        pttl,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_whose_wake_up_was_lost_is_taken_over_by_the_next_attempt() {
    let server = RedisServer::start();
    let mut con = server.connection().await;
    let name = unique_name("turn-lost");
    let grant = unheard_grant(&server, &mut con, name.as_str()).await;
    let (key, pttl) = (&grant.key, grant.pttl);
    // The stalled wake-up is lost with the connection.
    let started = Instant::now();
    grant.line.cut();
    let guard = grant.waiting.await.expect("waiter task").expect("waiter");
    // Its subscriber gone, the waiter tried again (and polls): that attempt took the grant
    // over — its own owner, a token minted, its own lease.
    let hold = HoldValue::read(&mut con, key)
        .await
        .expect("GET")
        .expect("held");
    assert_ne!(
        hold.owner, grant.granted.owner,
        "the grant was not taken over"
    );
    assert!(hold.token.is_some(), "no token minted by the take-over");
    assert!(
        started.elapsed() < Duration::from_millis(u64::try_from(pttl).unwrap_or(0)),
        "the waiter waited out the grant ({pttl} ms) instead of taking it over"
    );
    assert!(guard.remaining() > Duration::from_secs(5));
    assert!(guard.release().await.is_released());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_leaves_lets_a_grant_to_it_go() {
    let server = RedisServer::start();
    let mut con = server.connection().await;
    let name = unique_name("turn-leave-grant");
    let grant = unheard_grant(&server, &mut con, name.as_str()).await;
    let pttl = grant.pttl;
    // The waiter is dropped before it learns of the grant: the grant goes with its claim.
    let dropped = Instant::now();
    grant.waiting.abort();
    let _ = grant.waiting.await;
    loop {
        let exists: bool = con.exists(&grant.key).await.expect("EXISTS");
        if !exists {
            break;
        }
        assert!(
            dropped.elapsed() < Duration::from_millis(u64::try_from(pttl).unwrap_or(0) / 2),
            "the grant to a dropped waiter stayed (granted for {pttl} ms)"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// A head waiter's claim can reach Redis just after a hand-over inside its own `Locker` gave it
/// the lock: the attempt that carried it went out while the hand-over's answer was on its way.
/// The claim then sits on the hold the waiter now has. Left there, the waiter's own release
/// would grant the lock to its old hand-over token, which nobody waits on any more, and the name
/// would stay taken for the grant's window. The waiter takes such a claim back before it
/// returns, so its release leaves the name free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_lands_after_a_hand_over_is_taken_back() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.addr()).await;
    let mut con = server.connection().await;
    let near = locker(proxy.url()).build().await.expect("connect");
    let other = locker(server.url()).build().await.expect("connect");
    let name = unique_name("turn-late-claim");
    let key = near.key_of(name.as_str()).expect("key");

    // The waiter's fallback timer goes off when the first hold's 600 ms run out: its attempt
    // then is the one that lands late.
    let first = (near.lock(name.as_str()))
        .lease(Duration::from_millis(600))
        .await
        .expect("lock");
    let began = Instant::now();
    let waiting = tokio::spawn({
        let (near, name) = (near.clone(), name.clone());
        async move {
            let guard = near.lock(name.as_str()).wait(Duration::from_secs(10)).await;
            guard.expect("the waiter gets the lock")
        }
    });
    assert!(marked(&mut con, &key).await, "the waiter never claimed");
    let before = HoldValue::read(&mut con, &key).await.expect("GET");
    let before = before.and_then(|h| h.owner).expect("held");
    tokio::time::sleep(Duration::from_millis(300).saturating_sub(began.elapsed())).await;

    // The hand-over runs in Redis; its answer is held back on the way.
    proxy.stall_replies();
    let release = tokio::spawn(first.release());
    let until = Instant::now() + Duration::from_secs(2);
    loop {
        let hold = HoldValue::read(&mut con, &key).await.expect("GET");
        let hold = hold.expect("the lock stays held");
        // Handed over, and then claimed by the waiter's late attempt.
        if hold.owner.as_deref() != Some(before.as_str()) && hold.claim.is_some() {
            break;
        }
        assert!(
            Instant::now() < until,
            "the late claim never landed on the handed-over hold: {hold:?}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    proxy.unstall_replies();
    let _ = release.await.expect("the release task");
    let guard = waiting.await.expect("the waiting task");

    let hold = HoldValue::read(&mut con, &key).await.expect("GET");
    assert_eq!(
        hold.and_then(|h| h.claim),
        None,
        "the waiter's late claim is still on the hold it was handed"
    );
    assert!(guard.release().await.is_released());
    let exists: bool = con.exists(&key).await.expect("EXISTS");
    assert!(
        !exists,
        "the release granted the name to a token nobody waits on"
    );
    let taken = other.lock(name.as_str()).wait(Duration::ZERO).await;
    assert!(
        taken.is_ok(),
        "another process could not take the free name"
    );
}

/// Until `key`'s hold says that waiters of more than one `Locker` found it taken (its bare ` l`
/// flag), or two seconds passed.
async fn flagged_by_several(con: &mut redis::aio::MultiplexedConnection, key: &str) {
    let until = Instant::now() + Duration::from_secs(2);
    loop {
        let hold = HoldValue::read(con, key).await.expect("GET");
        if hold
            .as_ref()
            .is_some_and(|h| h.waited_for && h.waited_by.is_none())
        {
            return;
        }
        assert!(
            Instant::now() < until,
            "the hold never said two Lockers wait: {hold:?}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// A waiter of another process whose claim lost to an older one of the holder's process still
/// found the hold taken, and said so on it: the holder's release then goes through Redis (the
/// older claim is granted, and the wake-up tells the other waiter to claim the turn after), so
/// the holder's process does not hand the lock from task to task past it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_claim_lost_to_an_older_one_is_not_passed_by_hand_overs() {
    let server = RedisServer::start();
    let mut con = server.connection().await;
    let near = locker(server.url()).build().await.expect("connect");
    let far = locker(server.url()).build().await.expect("connect");
    let name = unique_name("turn-flag");
    let key = near.key_of(name.as_str()).expect("key");
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let wait_for = |locker: &Locker, who: &'static str| {
        let (locker, name, order) = (locker.clone(), name.clone(), order.clone());
        tokio::spawn(async move {
            let guard = (locker.lock(name.as_str()))
                .wait(Duration::from_secs(5))
                .await
                .expect(who);
            order.lock().unwrap().push(who);
            tokio::time::sleep(Duration::from_millis(20)).await;
            assert!(guard.release().await.is_released());
        })
    };

    let held = near.lock(name.as_str()).await.expect("lock");
    // The holder's process waits first: its claim is the older one.
    let first = wait_for(&near, "near, first");
    assert!(
        marked(&mut con, &key).await,
        "the near waiter never claimed"
    );
    offered_token(&mut con, &key).await;
    let other = wait_for(&far, "far");
    flagged_by_several(&mut con, &key).await;
    // Behind the first one in its process's local line.
    let second = wait_for(&near, "near, second");
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(held.release().await.is_released());
    for task in [first, other, second] {
        task.await.expect("waiter task");
    }
    assert_eq!(
        *order.lock().unwrap(),
        ["near, first", "far", "near, second"]
    );
}

/// A subscriber to a name's wake-ups that does not wait (a `Locker` whose subscription lingers
/// after its wait, an operator's `SUBSCRIBE`) does not stop a hand-over inside the holder's
/// process: only a waiter that found the hold taken, or a claim, does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_that_does_not_wait_leaves_hand_overs_inside_a_process_alone() {
    let server = RedisServer::start();
    let mut con = server.connection().await;
    let near = locker(server.url()).build().await.expect("connect");
    let name = unique_name("turn-listener");
    let key = near.key_of(name.as_str()).expect("key");
    let client = redis::Client::open(server.url()).expect("client");
    let mut listener = client.get_async_pubsub().await.expect("pub/sub");
    listener
        .subscribe(format!("{key}:wake"))
        .await
        .expect("SUBSCRIBE");

    let held = near.lock(name.as_str()).await.expect("lock");
    let waiting = tokio::spawn({
        let (near, name) = (near.clone(), name.clone());
        async move {
            let guard = (near.lock(name.as_str()))
                .wait(Duration::from_secs(5))
                .await
                .expect("the local waiter");
            assert!(guard.release().await.is_released());
        }
    });
    offered_token(&mut con, &key).await;
    let (_, listeners): (String, u64) = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(format!("{key}:wake"))
        .query_async(&mut con)
        .await
        .expect("PUBSUB NUMSUB");
    assert_eq!(listeners, 2, "the waiting Locker and the listener");
    assert!(held.release().await.is_released());
    waiting.await.expect("waiter task");
    assert_eq!(near.stats().handed_over, 1, "{:?}", near.stats());
}
