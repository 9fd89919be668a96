//! Turns across processes for a read-write lock's writers and a semaphore's permits, against
//! real Redis: a waiter that finds the hold taken claims the next turn for its process, the
//! release keeps the write lock or the permit for that process, and a process farther from
//! Redis gets its share where, racing after each release, it would get next to nothing. Each
//! `Locker` stands for a process.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_core::redis::{self, AsyncCommands as _};
use dlock_core::{LockGuard, Locker, Permit};
use dlock_tests::hold::{ClaimValue, HoldValue};
use dlock_tests::shares::contend;
use dlock_tests::{Proxy, RedisServer, unique_name};

/// The kinds that take turns here.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Write,
    Permit,
}

/// A held write lock or permit.
enum Held {
    Write(LockGuard),
    Permit(Permit),
}

impl Held {
    async fn release(self) -> bool {
        match self {
            Held::Write(g) => g.release().await.is_released(),
            Held::Permit(g) => g.release().await.is_released(),
        }
    }
}

async fn take(locker: &Locker, kind: Kind, name: &str, wait: Duration) -> Held {
    match kind {
        Kind::Write => Held::Write(
            (locker.read_write_lock(name).write())
                .wait(wait)
                .await
                .expect("write lock")
                .into_lock_guard(),
        ),
        Kind::Permit => Held::Permit(
            (locker.semaphore(name, 1).acquire())
                .wait(wait)
                .await
                .expect("permit"),
        ),
    }
}

/// The claim to the next turn for `kind` on `key` (the name's plain lock key), if any.
async fn claim_on(
    con: &mut redis::aio::MultiplexedConnection,
    kind: Kind,
    key: &str,
) -> Option<ClaimValue> {
    match kind {
        Kind::Write => HoldValue::read(con, &format!("{key}:write"))
            .await
            .expect("GET")
            .and_then(|h| h.claim_value()),
        Kind::Permit => {
            let value: Option<String> = con.get(format!("{key}:permits:turn")).await.expect("GET");
            value.and_then(|v| ClaimValue::parse(&v))
        }
    }
}

/// Until a claim to the next turn is on `key` for `kind` (or a second passed).
async fn claimed(
    con: &mut redis::aio::MultiplexedConnection,
    kind: Kind,
    key: &str,
) -> Option<ClaimValue> {
    let until = Instant::now() + Duration::from_secs(1);
    while Instant::now() < until {
        if let Some(claim) = claim_on(con, kind, key).await {
            return Some(claim);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    None
}

/// Whether the write lock or a permit of `key` is kept for the `Locker` with turn id `locker`.
async fn kept_for(
    con: &mut redis::aio::MultiplexedConnection,
    kind: Kind,
    key: &str,
    locker: &str,
) -> bool {
    match kind {
        Kind::Write => HoldValue::read(con, &format!("{key}:write"))
            .await
            .expect("GET")
            .is_some_and(|h| h.kept_for.as_deref() == Some(locker)),
        Kind::Permit => {
            let score: Option<f64> = con
                .zscore(format!("{key}:permits"), format!("#r:{locker}"))
                .await
                .expect("ZSCORE");
            score.is_some()
        }
    }
}

async fn the_waiter_of_another_process_is_next(kind: Kind) {
    let server = RedisServer::start();
    let mut con = server.connection().await;
    let near = Locker::connect(&server.url()).await.expect("connect");
    let far = Locker::connect(&server.url()).await.expect("connect");
    let name = unique_name("turn-kind");
    let key = near.key_of(name.as_str()).expect("key");

    let held = take(&near, kind, &name, Duration::ZERO).await;
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let far_wait = tokio::spawn({
        let (far, name, order) = (far.clone(), name.clone(), order.clone());
        async move {
            let guard = take(&far, kind, &name, Duration::from_secs(5)).await;
            order.lock().unwrap().push("far");
            assert!(guard.release().await);
        }
    });
    let claim = claimed(&mut con, kind, &key)
        .await
        .unwrap_or_else(|| panic!("{kind:?}: the far waiter never claimed the next turn"));

    // Another waiter of the holder's own process, which a race after the release would serve
    // first: it is nearer, and its wake-up is its own process's.
    let near_wait = tokio::spawn({
        let (near, name, order) = (near.clone(), name.clone(), order.clone());
        async move {
            let guard = take(&near, kind, &name, Duration::from_secs(5)).await;
            order.lock().unwrap().push("near");
            tokio::time::sleep(Duration::from_millis(20)).await;
            assert!(guard.release().await);
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The far waiter claimed first, and keeps the claim.
    assert_eq!(
        claim_on(&mut con, kind, &key).await.map(|c| c.locker),
        Some(claim.locker.clone()),
        "{kind:?}: the later waiter took the claim over"
    );
    assert!(held.release().await);
    far_wait.await.expect("far");
    near_wait.await.expect("near");
    assert_eq!(*order.lock().unwrap(), ["far", "near"], "{kind:?}");
    assert_eq!(claim_on(&mut con, kind, &key).await, None, "{kind:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_of_another_process_that_waits_is_next() {
    the_waiter_of_another_process_is_next(Kind::Write).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_waiter_of_another_process_is_next() {
    the_waiter_of_another_process_is_next(Kind::Permit).await;
}

async fn the_release_keeps_it_for_the_claimant_and_a_waiter_that_leaves_gives_it_up(kind: Kind) {
    let server = RedisServer::start();
    let mut con = server.connection().await;
    let holder = Locker::connect(&server.url()).await.expect("connect");
    // The waiting process is cut off from Redis after its claim: it can't take its turn.
    let line = Proxy::start(server.addr()).await;
    let gone = Locker::builder()
        .url(line.url())
        .command_timeout(Duration::from_millis(300))
        .build()
        .await
        .expect("connect");
    let other = Locker::connect(&server.url()).await.expect("connect");
    let name = unique_name("turn-kind-kept");
    let key = holder.key_of(name.as_str()).expect("key");

    let held = take(&holder, kind, &name, Duration::ZERO).await;
    let waiting = tokio::spawn({
        let (gone, name) = (gone.clone(), name.clone());
        async move {
            let _ = take(&gone, kind, &name, Duration::from_secs(30)).await;
        }
    });
    let claim = claimed(&mut con, kind, &key)
        .await
        .unwrap_or_else(|| panic!("{kind:?}: the waiter never claimed the next turn"));
    // Cut off for good before the request is dropped: its claim, taken back in the
    // background, must not reach Redis through a connection the proxy has not closed yet.
    line.cut();
    tokio::time::sleep(Duration::from_millis(50)).await;
    waiting.abort();
    let _ = waiting.await;
    drop(gone);

    let released = Instant::now();
    assert!(held.release().await);
    assert!(
        kept_for(&mut con, kind, &key, &claim.locker).await,
        "{kind:?}: the release did not keep it for the claimant"
    );
    assert_eq!(claim_on(&mut con, kind, &key).await, None, "{kind:?}");
    // Another process finds it taken for the claimant's turn, then gets it once the turn
    // passed: the claim's window, a fraction of a second. The turn is kept from when the
    // release ran, after it was sent (less a millisecond: Redis counts whole ones).
    let started = Instant::now();
    let guard = take(&other, kind, &name, Duration::from_secs(2)).await;
    let (kept, waited) = (released.elapsed(), started.elapsed());
    assert!(
        kept >= Duration::from_millis(claim.ms.saturating_sub(1))
            && waited <= Duration::from_millis(claim.ms + 300),
        "{kind:?}: got it {kept:?} after the release, having waited {waited:?}, for a turn of \
         {} ms",
        claim.ms
    );
    assert!(guard.release().await);

    // A waiter that gives up takes its claim back.
    let held = take(&holder, kind, &name, Duration::ZERO).await;
    let quitter = Locker::connect(&server.url()).await.expect("connect");
    let err = match kind {
        Kind::Write => (quitter.read_write_lock(name.as_str()).write())
            .wait(Duration::from_millis(200))
            .await
            .map(|_| ())
            .expect_err("held"),
        Kind::Permit => (quitter.semaphore(name.as_str(), 1).acquire())
            .wait(Duration::from_millis(200))
            .await
            .map(|_| ())
            .expect_err("held"),
    };
    assert!(err.is_busy(), "{err}");
    assert_eq!(
        claim_on(&mut con, kind, &key).await,
        None,
        "{kind:?}: the claim outlived the request"
    );
    assert!(held.release().await);
    let free = match kind {
        Kind::Write => {
            let exists: bool = con.exists(format!("{key}:write")).await.expect("EXISTS");
            !exists
        }
        Kind::Permit => {
            let n: u64 = con.zcard(format!("{key}:permits")).await.expect("ZCARD");
            n == 0
        }
    };
    assert!(
        free,
        "{kind:?}: the release kept it for a waiter that gave up"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_lock_is_kept_for_the_claimant_and_a_writer_that_leaves_gives_it_up() {
    the_release_keeps_it_for_the_claimant_and_a_waiter_that_leaves_gives_it_up(Kind::Write).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_is_kept_for_the_claimant_and_a_waiter_that_leaves_gives_it_up() {
    the_release_keeps_it_for_the_claimant_and_a_waiter_that_leaves_gives_it_up(Kind::Permit).await;
}

async fn a_farther_process_gets_its_share(kind: Kind) {
    let server = RedisServer::start();
    let proxy = Proxy::start_delayed(server.addr(), Duration::from_millis(3)).await;
    // Two tasks in one process, one in another 3 ms farther from Redis: after each release the
    // near ones' attempts arrive first.
    let near = Locker::connect(&server.url()).await.expect("connect");
    let far = Locker::connect(&proxy.url()).await.expect("connect");
    let name = unique_name("turn-kind-share");
    let shares = contend(
        &near,
        &far,
        Duration::from_secs(2),
        move |locker: Locker| {
            let name = name.clone();
            async move {
                let asked = Instant::now();
                let guard = take(&locker, kind, &name, Duration::from_secs(3)).await;
                let waited = asked.elapsed();
                tokio::time::sleep(Duration::from_millis(5)).await;
                assert!(guard.release().await);
                waited
            }
        },
    )
    .await;
    let (counts, longest) = (&shares.counts, shares.longest_ms);
    eprintln!("{kind:?}: acquisitions per task {counts:?}, the longest wait {longest} ms");
    assert!(
        shares.far_share() >= 0.5,
        "{kind:?}: acquisitions per task {counts:?}: the far one got less than half its share"
    );
    assert!(
        longest < 1_000,
        "{kind:?}: a wait took {longest} ms ({counts:?})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_farther_writer_gets_its_share() {
    a_farther_process_gets_its_share(Kind::Write).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_farther_permit_waiter_gets_its_share() {
    a_farther_process_gets_its_share(Kind::Permit).await;
}
