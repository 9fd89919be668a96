//! Operator tools against real Redis: `Locker::inspect` matches what Redis holds (and never shows
//! a whole owner token), `Locker::force_release` frees a name whoever holds it and wakes its
//! waiters, a fair lock's head of the line included.

use std::time::Duration;

use dlock_core::redis::AsyncCommands as _;
use dlock_core::{LockError, Locker};
use dlock_tests::hold::HoldValue;
use dlock_tests::{RedisServer, unique_name};
use tokio::time::Instant;

async fn labelled(server: &RedisServer, label: &str, lease: Duration) -> Locker {
    Locker::builder()
        .url(server.url())
        .holder_label(label)
        .default_lease(dlock_core::Lease::watchdog(lease))
        .build()
        .await
        .expect("connect")
}

#[tokio::test]
async fn inspect_shows_the_holder_its_label_tokens_and_ttl_as_redis_has_them() {
    let server = RedisServer::start();
    let locker = labelled(&server, "web-3:4711", Duration::from_secs(30)).await;
    let name = unique_name("inspect");
    let key = locker.key_of(name.as_str()).expect("key");

    let free = locker.inspect(name.as_str()).await.expect("inspect");
    assert!(!free.is_taken() && free.holders.is_empty(), "{free:?}");
    assert_eq!(
        (free.ttl, free.fencing_token, free.last_fencing_token),
        (None, None, None)
    );

    let guard = locker.lock(name.as_str()).await.expect("lock");
    // No token until the holder asks for one.
    let unasked = locker.inspect(name.as_str()).await.expect("inspect");
    assert_eq!(
        (unasked.fencing_token, unasked.last_fencing_token),
        (None, None),
        "{unasked:?}"
    );
    let token = guard.fencing_token().await.expect("a token");
    let info = locker.inspect(name.as_str()).await.expect("inspect");
    let mut con = server.connection().await;
    let pttl: u64 = con.pttl(&key).await.expect("PTTL");
    let hold = HoldValue::read(&mut con, &key).await.expect("GET");
    let owner = hold.and_then(|h| h.owner).expect("an owner");

    assert!(info.is_taken() && !info.kept && !info.foreign, "{info:?}");
    assert_eq!(info.holders.len(), 1);
    assert_eq!(info.holders[0].label.as_deref(), Some("web-3:4711"));
    // The first 8 hex digits, after the layout's tag.
    let hex = owner.strip_prefix(dlock_core::protocol::layout::TAG);
    assert_eq!(info.holders[0].token_prefix, hex.expect("tagged")[..8]);
    assert_eq!(info.fencing_token, Some(token));
    assert_eq!(info.last_fencing_token, Some(token));
    let ttl = info.ttl.expect("a TTL").as_millis() as u64;
    // Read first, then PTTL: at most a moment apart.
    assert!(
        ttl <= 30_000 && ttl >= pttl && ttl - pttl < 1_000,
        "ttl {ttl} ms, PTTL {pttl} ms"
    );
    // The token's secret part is never shown.
    let secret = owner.split('@').next().expect("a token");
    assert!(!format!("{info:?}").contains(secret), "{info:?}");
    assert!(guard.release().await.is_released());

    // Released within a period: kept, by nobody; the last token stays readable.
    let guard = (locker.lock(name.as_str()).at_least(Duration::from_secs(2))).await;
    let guard = guard.expect("lock");
    let token = guard.fencing_token().await.unwrap();
    assert!(guard.release().await.is_released());
    let kept = locker.inspect(name.as_str()).await.expect("inspect");
    assert!(
        kept.kept && kept.is_taken() && kept.holders.is_empty(),
        "{kept:?}"
    );
    assert_eq!(
        (kept.fencing_token, kept.last_fencing_token),
        (None, Some(token))
    );
}

#[tokio::test]
async fn inspect_counts_waiting_lockers_and_reports_kept_and_foreign_keys() {
    let server = RedisServer::start();
    let locker = labelled(&server, "a", Duration::from_secs(30)).await;
    let rival = labelled(&server, "b", Duration::from_secs(30)).await;
    let name = unique_name("inspect-wait");
    let key = locker.key_of(name.as_str()).expect("key");

    let guard = (locker.lock(name.as_str()).at_least(Duration::from_secs(2))).await;
    let guard = guard.expect("lock");
    let waiter = tokio::spawn({
        let (rival, name) = (rival.clone(), name.clone());
        async move {
            rival
                .lock(name.as_str())
                .wait(Duration::from_secs(10))
                .await
        }
    });
    let info = dlock_tests::until_waiting(&locker, name.as_str(), 1).await;
    assert_eq!(info.waiting_lockers, 1, "no waiter counted: {info:?}");
    assert!(guard.release().await.is_released());
    let kept = locker.inspect(name.as_str()).await.expect("inspect");
    assert!(
        kept.kept && kept.holders.is_empty() && kept.is_taken(),
        "{kept:?}"
    );
    assert!(
        kept.ttl.is_some_and(|t| t <= Duration::from_secs(2)),
        "{kept:?}"
    );
    let next = waiter
        .await
        .expect("waiter")
        .expect("granted after the period");
    // The waiter's subscription lingers 100 ms after its wait ended.
    tokio::time::sleep(Duration::from_millis(250)).await;
    let info = locker.inspect(name.as_str()).await.expect("inspect");
    assert_eq!(info.holders[0].label.as_deref(), Some("b"));
    assert_eq!(info.waiting_lockers, 0, "{info:?}");
    assert!(next.release().await.is_released());

    let mut con = server.connection().await;
    let () = con.set(&key, "not a lock").await.expect("SET");
    let foreign = locker.inspect(name.as_str()).await.expect("inspect");
    assert!(foreign.foreign && foreign.is_taken() && foreign.holders.is_empty());
}

#[tokio::test]
async fn force_release_frees_a_name_and_its_holder_learns_within_a_tick() {
    let server = RedisServer::start();
    let lease = Duration::from_millis(900);
    let holder = labelled(&server, "holder", lease).await;
    let operator = Locker::connect(&server.url()).await.expect("connect");
    let waiter_locker = labelled(&server, "waiter", Duration::from_secs(30)).await;
    let name = unique_name("force");
    let guard = holder.lock(name.as_str()).await.expect("lock");
    let first = guard.fencing_token().await.unwrap();
    let waiter = tokio::spawn({
        let name = name.clone();
        async move {
            let g = waiter_locker
                .lock(name.as_str())
                .wait(Duration::from_secs(10))
                .await;
            (g, Instant::now())
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;

    let forced = Instant::now();
    assert!(operator.force_release(name.as_str()).await.expect("force"));
    // The waiter is woken by the release, not by the holder's 900 ms lease.
    let (next, at) = waiter.await.expect("waiter");
    let next = next.expect("granted after the forced release");
    assert!(
        at - forced < Duration::from_millis(500),
        "granted {:?} after",
        at - forced
    );
    assert!(next.fencing_token().await.unwrap() > first);
    // The holder learns at its next renewal: a third of its lease.
    tokio::time::timeout(lease / 3 + Duration::from_millis(200), guard.lost())
        .await
        .expect("the holder learned of the loss within a tick");
    assert!(next.release().await.is_released());
    assert!(
        !operator.force_release(name.as_str()).await.expect("force"),
        "nothing left"
    );
}

/// A forced release wakes the head of a fair lock's line too (it listens on a channel of its
/// own), on Redis and in memory: the waiter gets the lock at once, not at its next heartbeat or
/// the holder's lease.
#[tokio::test]
async fn force_release_wakes_the_head_of_a_fair_line() {
    async fn forced_wait(
        holder: &Locker,
        waiter: Locker,
        operator: &Locker,
        name: &str,
    ) -> Duration {
        let guard = (holder.fair_lock(name).lease(Duration::from_secs(60)).await).expect("holder");
        let waiting = tokio::spawn({
            let name = name.to_owned();
            async move {
                let got = waiter
                    .fair_lock(name.as_str())
                    .wait(Duration::from_secs(20))
                    .await;
                (got, Instant::now())
            }
        });
        let deadline = Instant::now() + Duration::from_secs(5);
        while operator
            .inspect(name)
            .await
            .expect("inspect")
            .queued_waiters
            != 1
        {
            assert!(
                Instant::now() < deadline,
                "the waiter never joined the line"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Past the waiter's first heartbeat timer's start: only the wake-up can be quick now.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let forced = Instant::now();
        assert!(operator.force_release(name).await.expect("force"));
        let (next, at) = waiting.await.expect("waiter");
        let next = next.expect("granted after the forced release");
        assert!(next.release().await.is_released());
        drop(guard);
        at - forced
    }
    let server = RedisServer::start();
    // A long dead-waiter timeout: the head's heartbeat comes only every 10 s.
    let connect = || async {
        (Locker::builder().url(server.url()))
            .dead_waiter_timeout(Duration::from_secs(30))
            .build()
            .await
            .expect("connect")
    };
    let (holder, waiter, operator) = (connect().await, connect().await, connect().await);
    let name = unique_name("force-fair");
    let on_redis = forced_wait(&holder, waiter, &operator, &name).await;
    assert!(
        on_redis < Duration::from_millis(500),
        "Redis: granted {on_redis:?} after"
    );
    let memory = Locker::memory();
    let in_memory = forced_wait(&memory, memory.clone(), &memory, &name).await;
    assert!(
        in_memory < Duration::from_millis(500),
        "memory: granted {in_memory:?} after"
    );
}

#[tokio::test]
async fn a_bad_holder_label_is_a_configuration_error() {
    let server = RedisServer::start();
    for label in ["", "has space", "x".repeat(65).as_str(), "tab\there"] {
        let built = Locker::builder()
            .url(server.url())
            .holder_label(label)
            .build()
            .await;
        assert!(matches!(built, Err(LockError::Config(_))), "{label:?}");
    }
}

#[tokio::test]
async fn list_scans_one_prefix_and_matches_names_by_glob() {
    let server = RedisServer::start();
    // A prefix with a glob character matches itself only.
    let starred = Locker::builder()
        .url(server.url())
        .prefix("app*:")
        .build()
        .await
        .expect("connect");
    let other = Locker::builder()
        .url(server.url())
        .prefix("app-b:")
        .build()
        .await
        .expect("connect");
    let mut guards = Vec::new();
    for name in ["order:1", "order:2", "cart:1"] {
        guards.push(starred.lock(name).await.expect("lock"));
    }
    guards.push(other.lock("order:9").await.expect("lock"));
    let kept = (starred.lock("report:1").at_least(Duration::from_secs(5))).await;
    assert!(kept.expect("lock").release().await.is_released());

    assert_eq!(
        starred.list("*").await.expect("list"),
        ["cart:1", "order:1", "order:2", "report:1"]
    );
    assert_eq!(
        starred.list("order:*").await.expect("list"),
        ["order:1", "order:2"]
    );
    assert_eq!(other.list("*").await.expect("list"), ["order:9"]);
    for guard in guards {
        assert!(guard.release().await.is_released());
    }
    assert_eq!(starred.list("*").await.expect("list"), ["report:1"]);
}

/// A read-write lock and a semaphore live beside the lock of the same name: `list` names them,
/// `inspect` shows their writer, readers and permits, and `force_release` frees them all, wakes
/// their waiters, and their holders learn of the loss at their next renewal.
#[tokio::test]
async fn every_kind_is_listed_inspected_and_freed_by_force() {
    let server = RedisServer::start();
    let lease = Duration::from_millis(900);
    let holder = labelled(&server, "kinds", lease).await;
    let operator = Locker::connect(&server.url()).await.expect("connect");
    let base = unique_name("kinds");
    let (rw_name, sem_name) = (format!("{base}:rw"), format!("{base}:sem"));

    let rw = holder.read_write_lock(rw_name.as_str());
    let writer = rw.write().await.expect("write");
    let sem = holder.semaphore(sem_name.as_str(), 3);
    let permits = [
        sem.acquire().await.expect("permit"),
        sem.acquire().await.expect("permit"),
    ];
    let listed = operator.list(&format!("{base}:*")).await.expect("list");
    assert_eq!(listed, [rw_name.clone(), sem_name.clone()]);

    let info = operator.inspect(rw_name.as_str()).await.expect("inspect");
    let shown = info.writer.as_ref().expect("the writer is shown");
    assert_eq!(shown.label.as_deref(), Some("kinds"));
    assert_eq!(shown.token_prefix.len(), 8);
    assert!(info.writer_ttl.is_some_and(|t| t <= lease), "{info:?}");
    assert!(
        info.holders.is_empty() && !info.is_taken(),
        "no plain lock: {info:?}"
    );
    assert!(info.is_held_by_any_kind());
    let info = operator.inspect(sem_name.as_str()).await.expect("inspect");
    assert_eq!(info.permits_taken, 2, "{info:?}");
    assert_eq!(info.permit_limit, None);
    sem.set_permits(5).await.expect("set permits");
    assert_eq!(
        operator
            .inspect(sem_name.as_str())
            .await
            .unwrap()
            .permit_limit,
        Some(5)
    );

    // A writer waits for the writer, and a permit for a full semaphore.
    let reader_side = operator.read_write_lock(rw_name.as_str());
    let waiting_reader = tokio::spawn(async move {
        let guard = reader_side.read().wait(Duration::from_secs(10)).await;
        (guard, Instant::now())
    });
    sem.set_permits(2).await.expect("set permits");
    let full = operator.semaphore(sem_name.as_str(), 2);
    let waiting_permit = tokio::spawn(async move {
        let permit = full.acquire().wait(Duration::from_secs(10)).await;
        (permit, Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(200)).await;

    let forced = Instant::now();
    assert!(
        operator
            .force_release(rw_name.as_str())
            .await
            .expect("force")
    );
    assert!(
        operator
            .force_release(sem_name.as_str())
            .await
            .expect("force")
    );
    for (what, at) in [
        ("the reader", {
            let (guard, at) = waiting_reader.await.expect("reader task");
            let guard = guard.expect("read after the forced release");
            let info = operator.inspect(rw_name.as_str()).await.unwrap();
            assert_eq!((info.readers, info.writer.is_none()), (1, true), "{info:?}");
            drop(guard);
            at
        }),
        ("the permit", {
            let (permit, at) = waiting_permit.await.expect("permit task");
            drop(permit.expect("a permit after the forced release"));
            at
        }),
    ] {
        // Woken by the release, not by the holders' 900 ms lease.
        assert!(
            at - forced < Duration::from_millis(500),
            "{what} came {:?} after",
            at - forced
        );
    }
    // The holders learn at their next renewal: a third of their lease.
    let within = lease / 3 + Duration::from_millis(200);
    tokio::time::timeout(within, writer.lost())
        .await
        .expect("the writer learned of the loss");
    for permit in &permits {
        tokio::time::timeout(within, permit.lost())
            .await
            .expect("each permit's holder learned of the loss");
    }
}
