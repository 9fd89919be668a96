//! Semaphores with expiring permits (`Locker::semaphore`): never more permits held than the
//! count, under contention from several `Locker`s; a killed holder's permit comes back after its
//! lease; the count changes at run time; renewal, loss and cancellation — against real Redis.

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use dlock_core::redis::AsyncCommands as _;
use dlock_core::{LockError, Locker, ReleaseOutcome};
use dlock_tests::{RedisServer, unique_name};
use tokio::time::Instant;

/// Runs `tasks` tasks over `lockers`, each taking a permit of `name` (count `permits`) and
/// holding it briefly; returns the most permits held at once, counted in the test.
async fn contend(lockers: &[Locker], name: &str, permits: u32, tasks: usize) -> u32 {
    let now = Arc::new(AtomicU32::new(0));
    let most = Arc::new(AtomicU32::new(0));
    let mut handles = Vec::new();
    for i in 0..tasks {
        let semaphore = lockers[i % lockers.len()].semaphore(name, permits);
        let (now, most) = (now.clone(), most.clone());
        handles.push(tokio::spawn(async move {
            let permit = (semaphore.acquire().wait(Duration::from_secs(30)))
                .await
                .expect("a permit");
            let held = now.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(held, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(2)).await;
            now.fetch_sub(1, Ordering::SeqCst);
            assert!(permit.release().await.is_released());
        }));
    }
    for handle in handles {
        handle.await.expect("task");
    }
    most.load(Ordering::SeqCst)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_held_never_exceed_the_count_under_contention() {
    let server = RedisServer::start();
    let mut lockers = Vec::new();
    for _ in 0..3 {
        lockers.push(Locker::connect(&server.url()).await.expect("connect"));
    }
    let name = unique_name("sem-contention");
    let most = contend(&lockers, &name, 4, 150).await;
    assert_eq!(most, 4, "at most 4 at once, and 4 were reached");
    // The last permit given back takes the set with it.
    let mut con = server.connection().await;
    let keys: Vec<String> = con.keys(format!("dlock:{{{name}}}*")).await.expect("KEYS");
    assert!(keys.is_empty(), "left behind: {keys:?}");
}

#[tokio::test]
async fn the_memory_store_counts_permits_the_same_way() {
    let store = dlock_core::MemoryStore::new();
    let lockers = [
        Locker::memory_with(store.clone()),
        Locker::memory_with(store),
    ];
    assert_eq!(contend(&lockers, "sem-memory", 3, 60).await, 3);
}

#[tokio::test]
async fn a_killed_holders_permit_comes_back_after_its_lease() {
    const LEASE: Duration = Duration::from_millis(600);
    let server = RedisServer::start();
    let locker = Locker::connect(&server.url()).await.expect("connect");
    let name = unique_name("sem-killed");
    let mut holder = Command::new(env!("CARGO_BIN_EXE_permit_holder"))
        .args([
            server.url(),
            name.clone(),
            "1".into(),
            LEASE.as_millis().to_string(),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn permit_holder");
    let mut line = String::new();
    let stdout = holder.stdout.take().expect("stdout");
    BufReader::new(stdout).read_line(&mut line).expect("a line");
    assert!(line.starts_with("acquired id="), "{line}");
    // Held through the watchdog well past its lease.
    tokio::time::sleep(LEASE * 2).await;
    let semaphore = locker.semaphore(name.as_str(), 1);
    assert!(semaphore.acquire().try_lock().await.expect("try").is_none());
    holder.kill().expect("kill");
    let killed = Instant::now();
    let _ = holder.wait();

    let permit = (semaphore.acquire().wait(Duration::from_secs(5)))
        .await
        .expect("the permit comes back");
    let waited = killed.elapsed();
    // The holder renewed a third of the lease at most before it was killed.
    assert!(
        waited >= LEASE * 2 / 3 - Duration::from_millis(50),
        "{waited:?}"
    );
    assert!(waited <= LEASE + Duration::from_millis(300), "{waited:?}");
    assert!(permit.release().await.is_released());
}

#[tokio::test]
async fn the_count_changes_at_run_time_for_every_handle() {
    let server = RedisServer::start();
    let a = Locker::connect(&server.url()).await.expect("connect");
    let b = Locker::connect(&server.url()).await.expect("connect");
    let name = unique_name("sem-count");
    let (one, other) = (a.semaphore(name.as_str(), 1), b.semaphore(name.as_str(), 1));
    let first = one.acquire().await.expect("first");
    let waiter = tokio::spawn({
        let other = other.clone();
        async move { other.acquire().wait(Duration::from_secs(5)).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiter.is_finished(), "a second permit out of one");
    let raised = Instant::now();
    one.set_permits(2).await.expect("set");
    let second = waiter
        .await
        .expect("task")
        .expect("let in by the new count");
    assert!(
        raised.elapsed() < Duration::from_millis(500),
        "{:?}",
        raised.elapsed()
    );
    let status = other.status().await.expect("status");
    assert_eq!((status.held, status.permits, status.set), (2, 2, true));

    // Lowered: the permits out stay valid; no new one until fewer than the count are held.
    other.set_permits(1).await.expect("set");
    assert!(
        a.semaphore(name.as_str(), 5)
            .acquire()
            .try_lock()
            .await
            .expect("try")
            .is_none()
    );
    assert!(first.release().await.is_released());
    assert!(one.acquire().try_lock().await.expect("try").is_none());
    assert!(second.release().await.is_released());
    let third = one.acquire().try_lock().await.expect("try").expect("free");
    one.reset_permits().await.expect("reset");
    let status = a
        .semaphore(name.as_str(), 3)
        .status()
        .await
        .expect("status");
    assert_eq!((status.held, status.permits, status.set), (1, 3, false));
    assert!(third.release().await.is_released());
}

#[tokio::test]
async fn a_permit_is_renewed_while_held_and_lost_when_removed() {
    let server = RedisServer::start();
    let locker = Locker::connect(&server.url()).await.expect("connect");
    let name = unique_name("sem-renewed");
    let semaphore = locker.semaphore(name.as_str(), 2);
    let permit = (semaphore
        .acquire()
        .watchdog_lease(Duration::from_millis(300)))
    .await
    .expect("permit");
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(!permit.is_lost());
    assert_eq!(semaphore.status().await.expect("status").held, 1);

    let mut con = server.connection().await;
    let key = format!("{}:permits", locker.key_of(name.as_str()).expect("key"));
    let removed: i64 = con.zrem(&key, permit.id()).await.expect("ZREM");
    assert_eq!(removed, 1);
    let noticed = tokio::time::timeout(Duration::from_millis(300), permit.lost()).await;
    assert!(noticed.is_ok(), "the loss was not noticed within a renewal");
    assert!(matches!(permit.release().await, ReleaseOutcome::Expired));
}

#[tokio::test]
async fn dropped_acquisitions_leave_no_permit_behind() {
    let server = RedisServer::start();
    let locker = Locker::connect(&server.url()).await.expect("connect");
    let name = unique_name("sem-dropped");
    let semaphore = locker.semaphore(name.as_str(), 3);
    let mut tasks = Vec::new();
    for i in 0..60u64 {
        let semaphore = semaphore.clone();
        tasks.push(tokio::spawn(async move {
            let within = Duration::from_micros(i * 70);
            let request = semaphore.acquire().wait(Duration::from_millis(200));
            if let Ok(Ok(permit)) = tokio::time::timeout(within, request.into_future()).await {
                tokio::time::sleep(Duration::from_millis(1)).await;
                drop(permit);
            }
        }));
    }
    for task in tasks {
        task.await.expect("task");
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    while semaphore.status().await.expect("status").held != 0 {
        assert!(Instant::now() < deadline, "a permit was left behind");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_semaphore_and_a_lock_of_one_name_are_apart() {
    let server = RedisServer::start();
    let locker = Locker::connect(&server.url()).await.expect("connect");
    let name = unique_name("sem-apart");
    let guard = locker.lock(name.as_str()).await.expect("lock");
    let permit = (locker.semaphore(name.as_str(), 1).acquire().try_lock())
        .await
        .expect("try")
        .expect("a permit beside the lock");
    assert!(permit.release().await.is_released());
    assert!(guard.release().await.is_released());
    let none = locker
        .semaphore(name.as_str(), 0)
        .acquire()
        .try_lock()
        .await;
    assert!(matches!(none, Err(LockError::Config(_))), "{none:?}");
}

/// A handle made with no permits is refused even while a count is set at run time (its status
/// reads that count); a count of 0 set at run time closes the semaphore until it is raised.
#[tokio::test]
async fn zero_permits_on_a_handle_is_refused_and_zero_at_run_time_closes() {
    let server = RedisServer::start();
    let locker = Locker::connect(&server.url()).await.expect("connect");
    let name = unique_name("sem-zero");
    let sem = locker.semaphore(name.as_str(), 2);
    sem.set_permits(3).await.expect("set");
    let zero = locker.semaphore(name.as_str(), 0);
    let status = zero.status().await.expect("status");
    assert_eq!((status.permits, status.set), (3, true));
    let refused = zero.acquire().try_lock().await;
    assert!(matches!(refused, Err(LockError::Config(_))), "{refused:?}");

    sem.set_permits(0).await.expect("close");
    let none = sem.acquire().try_lock().await.expect("try");
    assert!(none.is_none(), "a permit under a count of 0");
    let waited = sem.acquire().wait(Duration::from_millis(200)).await;
    assert!(matches!(waited, Err(LockError::Busy { .. })), "{waited:?}");
    // Raised again: a waiter gets in at once.
    let waiter = tokio::spawn({
        let sem = sem.clone();
        async move { sem.acquire().wait(Duration::from_secs(10)).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    sem.set_permits(1).await.expect("open");
    let permit = waiter.await.expect("waiter").expect("a permit once opened");
    assert!(permit.release().await.is_released());
}

/// A permit whose fixed lease ran out before its guard let go was gone: its release says
/// `Expired`, on Redis as in memory — also while another permit keeps the set (and the expired
/// member, until an acquisition sweeps it) in Redis.
#[tokio::test]
async fn an_expired_permit_released_beside_a_live_one_is_expired_on_both_backends() {
    async fn outcome(locker: &Locker, name: &str) -> ReleaseOutcome {
        let sem = locker.semaphore(name, 2);
        let other = (sem.acquire().lease(Duration::from_secs(30)).await).expect("other");
        let permit = (sem.acquire().lease(Duration::from_millis(50)).await).expect("permit");
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(permit.is_lost(), "the permit's lease ran out");
        assert_eq!(sem.status().await.expect("status").held, 1);
        let outcome = permit.release().await;
        assert!(other.release().await.is_released());
        outcome
    }
    let server = RedisServer::start();
    let redis = Locker::connect(&server.url()).await.expect("connect");
    let name = unique_name("sem-expired-release");
    let on_redis = outcome(&redis, &name).await;
    let on_memory = outcome(&Locker::memory(), &name).await;
    assert!(matches!(on_redis, ReleaseOutcome::Expired), "{on_redis:?}");
    assert!(
        matches!(on_memory, ReleaseOutcome::Expired),
        "{on_memory:?}"
    );
    let mut con = server.connection().await;
    let permits: usize = con
        .zcard(format!("dlock:{{{name}}}:permits"))
        .await
        .expect("zcard");
    assert_eq!(
        permits, 0,
        "the expired permit left the set with its release"
    );
}
