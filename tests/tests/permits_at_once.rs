//! Several permits of a semaphore taken at once (`Semaphore::acquire_many`), against real
//! Redis: all or none, renewed and given back together, not starved by requests for one, and a
//! waiter for several keeps free permits from others only while it waits. Each `Locker` stands
//! for a process.

use std::time::Duration;

use dlock_core::redis::AsyncCommands as _;
use dlock_core::{LockError, Locker, MemoryStore};
use dlock_tests::{RedisServer, unique_name};
use tokio::time::Instant;

/// The permits' sorted set of the semaphore `name`, and its claim key.
fn keys_of(name: &str) -> (String, String) {
    (
        format!("dlock:{{{name}}}:permits"),
        format!("dlock:{{{name}}}:permits:turn"),
    )
}

/// All or none, on any store: two of three held, two more are refused and nothing is written;
/// one given back, the two go in as one permit; with them the semaphore is full.
async fn all_or_none(a: &Locker, b: &Locker, name: &str) {
    let one = a.semaphore(name, 3);
    let first = one.acquire().try_lock().await.expect("try").expect("free");
    let second = one.acquire().try_lock().await.expect("try").expect("free");
    let two = b.semaphore(name, 3);
    assert!(two.acquire_many(2).try_lock().await.expect("try").is_none());
    assert_eq!(one.status().await.expect("status").held, 2, "nothing taken");
    assert!(first.release().await.is_released());
    let both = two
        .acquire_many(2)
        .try_lock()
        .await
        .expect("try")
        .expect("two free");
    assert_eq!(both.permits(), 2);
    assert_eq!(one.status().await.expect("status").held, 3);
    assert!(
        one.acquire().try_lock().await.expect("try").is_none(),
        "full"
    );
    assert!(both.release().await.is_released());
    assert_eq!(one.status().await.expect("status").held, 1, "both went");
    assert!(second.release().await.is_released());
}

#[tokio::test]
async fn permits_taken_at_once_are_all_or_none() {
    let server = RedisServer::start();
    let a = Locker::connect(&server.url()).await.expect("connect");
    let b = Locker::connect(&server.url()).await.expect("connect");
    all_or_none(&a, &b, &unique_name("many-all-or-none")).await;
    let store = MemoryStore::new();
    let (a, b) = (
        Locker::memory_with(store.clone()),
        Locker::memory_with(store),
    );
    all_or_none(&a, &b, "many-all-or-none").await;
}

#[tokio::test]
async fn a_request_for_none_or_more_than_the_count_is_refused() {
    let locker = Locker::memory();
    let semaphore = locker.semaphore("many-refused", 3);
    for n in [0, 4] {
        match semaphore.acquire_many(n).try_lock().await {
            Err(LockError::Config(msg)) => assert!(msg.contains("1 to 3"), "{msg}"),
            other => panic!("{n} permits: {other:?}"),
        }
    }
}

#[tokio::test]
async fn several_permits_are_renewed_and_given_back_together() {
    let server = RedisServer::start();
    let locker = Locker::connect(&server.url()).await.expect("connect");
    let name = unique_name("many-renewed");
    let semaphore = locker.semaphore(&name, 3);
    let permits = (semaphore.acquire_many(3))
        .watchdog_lease(Duration::from_millis(300))
        .try_lock()
        .await
        .expect("try")
        .expect("free");
    // Three leases long: the watchdog kept all three.
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(!permits.is_lost());
    let mut con = server.connection().await;
    let (set, _) = keys_of(&name);
    let scores: Vec<(String, f64)> = con.zrange_withscores(&set, 0, -1).await.expect("ZRANGE");
    assert_eq!(scores.len(), 3, "{scores:?}");
    let lowest = scores.iter().map(|(_, s)| *s).fold(f64::MAX, f64::min);
    let highest = scores.iter().map(|(_, s)| *s).fold(f64::MIN, f64::max);
    assert!(
        (highest - lowest).abs() < 1.0,
        "renewed together: {scores:?}"
    );
    assert!(semaphore.acquire().try_lock().await.expect("try").is_none());
    assert!(permits.release().await.is_released());
    let left: bool = con.exists(&set).await.expect("EXISTS");
    assert!(!left, "all three given back");
}

/// `lockers` each run `tasks` tasks taking one permit of `name` (count `count`) after another,
/// holding each `hold`, until `stop` is set.
fn churn(
    lockers: &[Locker],
    name: &str,
    count: u32,
    tasks: usize,
    hold: Duration,
) -> (
    tokio::sync::watch::Sender<bool>,
    Vec<tokio::task::JoinHandle<u32>>,
) {
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut handles = Vec::new();
    for locker in lockers {
        for _ in 0..tasks {
            let semaphore = locker.semaphore(name, count);
            let stopped = stopped.clone();
            handles.push(tokio::spawn(async move {
                let mut taken = 0;
                while !*stopped.borrow() {
                    let permit = (semaphore.acquire().wait(Duration::from_secs(10)))
                        .await
                        .expect("a permit for one");
                    taken += 1;
                    tokio::time::sleep(hold).await;
                    assert!(permit.release().await.is_released());
                }
                taken
            }));
        }
    }
    (stop, handles)
}

/// A request for all three permits while two processes keep taking one permit after another:
/// it gets them, each time, within a bound, whether it comes from a third process or from one
/// of the two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_for_several_is_not_starved_by_requests_for_one() {
    let server = RedisServer::start();
    let mut lockers = Vec::new();
    for _ in 0..3 {
        lockers.push(Locker::connect(&server.url()).await.expect("connect"));
    }
    let name = unique_name("many-starved");
    let (stop, handles) = churn(&lockers[..2], &name, 3, 16, Duration::from_millis(10));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut waits = Vec::new();
    for round in 0..10 {
        // From the third process, then from one of those taking one permit at a time.
        let semaphore = lockers[if round % 2 == 0 { 2 } else { 0 }].semaphore(&name, 3);
        let started = Instant::now();
        let all = (semaphore.acquire_many(3).wait(Duration::from_secs(5)))
            .await
            .unwrap_or_else(|err| panic!("round {round}: {err}"));
        waits.push(started.elapsed());
        tokio::time::sleep(Duration::from_millis(3)).await;
        assert!(all.release().await.is_released());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.send(true).expect("stop");
    let mut singles = 0;
    for handle in handles {
        singles += handle.await.expect("task");
    }
    let longest = waits.iter().max().copied().unwrap_or_default();
    let mean = waits.iter().sum::<Duration>() / 10;
    println!("waits for three: {waits:?}; {singles} single permits taken meanwhile");
    // 32 tasks wait for one permit each, holding it 10 ms: the request for three waits for
    // those that came before it, about 32 x 10 ms / 3 = 110 ms of holds. Without free permits
    // kept for it, it waits for a moment when all three happen to be free: about a second on
    // average here, often two.
    assert!(mean < Duration::from_millis(600), "mean wait {mean:?}");
    assert!(longest < Duration::from_secs(2), "longest wait {longest:?}");
    assert!(singles > 100, "the singles went on: {singles}");
}

/// A waiter for two of two, one held elsewhere: while it waits, the free permit is kept from a
/// later request for one (another process's); when it gives up, that request is woken and
/// gets the permit at once, and no claim is left.
#[tokio::test]
async fn a_waiter_for_several_keeps_free_permits_only_while_it_waits() {
    let server = RedisServer::start();
    let a = Locker::connect(&server.url()).await.expect("connect");
    let b = Locker::connect(&server.url()).await.expect("connect");
    let c = Locker::connect(&server.url()).await.expect("connect");
    let name = unique_name("many-keeps");
    let held = (a.semaphore(&name, 2).acquire().try_lock().await)
        .expect("try")
        .expect("free");
    let two = b.semaphore(&name, 2);
    let waiter = tokio::spawn(async move {
        let started = Instant::now();
        let outcome = two.acquire_many(2).wait(Duration::from_millis(500)).await;
        (outcome.map(|p| p.permits()), started.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let one = c.semaphore(&name, 2);
    assert!(
        one.acquire().try_lock().await.expect("try").is_none(),
        "the free permit is kept for the waiter for two"
    );
    let started = Instant::now();
    let permit = (one.acquire().wait(Duration::from_secs(3)))
        .await
        .expect("the free permit, once the waiter for two gave up");
    let waited = started.elapsed();
    let (outcome, gave_up_after) = waiter.await.expect("waiter");
    assert!(
        matches!(outcome, Err(LockError::Busy { .. })),
        "{outcome:?}"
    );
    // Woken by the waiter's leaving, not by a timer (its own wait ended 400 ms after this one
    // began).
    assert!(
        waited < Duration::from_millis(400 + 250),
        "waited {waited:?}; the waiter for two gave up after {gave_up_after:?}"
    );
    let mut con = server.connection().await;
    let (_, turn) = keys_of(&name);
    let claim: Option<String> = con.get(&turn).await.expect("GET");
    assert!(claim.is_none(), "claim left: {claim:?}");
    assert!(permit.release().await.is_released());
    assert!(held.release().await.is_released());
}

/// A claim of several whose waiter is gone (its process died before taking it back) keeps free
/// permits for the time it asked, no longer.
#[tokio::test]
async fn a_claim_of_several_whose_waiter_is_gone_ends_by_itself() {
    let server = RedisServer::start();
    let locker = Locker::connect(&server.url()).await.expect("connect");
    let name = unique_name("many-gone");
    let mut con = server.connection().await;
    let (_, turn) = keys_of(&name);
    let _: () = (con.pset_ex(&turn, "1:400:v2/gone:2", 400))
        .await
        .expect("PSETEX");
    let started = Instant::now();
    let semaphore = locker.semaphore(&name, 2);
    assert!(semaphore.acquire().try_lock().await.expect("try").is_none());
    let permit = (semaphore.acquire().wait(Duration::from_secs(3)))
        .await
        .expect("a permit once the claim ended");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(350) && waited < Duration::from_millis(900),
        "waited {waited:?}"
    );
    assert!(permit.release().await.is_released());
}

/// A count set below the request: the request waits, and keeps nothing from others.
#[tokio::test]
async fn a_request_above_the_count_in_force_keeps_nobody_out() {
    let server = RedisServer::start();
    let a = Locker::connect(&server.url()).await.expect("connect");
    let b = Locker::connect(&server.url()).await.expect("connect");
    let name = unique_name("many-lowered");
    a.semaphore(&name, 3).set_permits(1).await.expect("set");
    let three = a.semaphore(&name, 3);
    let waiter =
        tokio::spawn(async move { three.acquire_many(2).wait(Duration::from_millis(400)).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let one = (b.semaphore(&name, 3).acquire().try_lock().await)
        .expect("try")
        .expect("the one permit in force is free");
    let outcome = waiter.await.expect("waiter");
    assert!(
        matches!(outcome, Err(LockError::Busy { .. })),
        "{outcome:?}"
    );
    assert!(one.release().await.is_released());
}
