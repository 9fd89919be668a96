//! Locks across independent masters (`MasterSet`), against real `redis-server` processes: a
//! majority set keeps granting with one of three (two of five) masters down, refuses cleanly
//! with a majority down and leaves nothing behind, never lets a rival in through a master that
//! restarted empty, and excludes contenders; an all-masters set needs every master.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dlock_core::redis::AsyncCommands as _;
use dlock_core::{LockError, Locker, MasterSet};
use dlock_tests::{Proxy, RedisServer, unique_name};

fn servers(n: usize) -> Vec<RedisServer> {
    (0..n).map(|_| RedisServer::start()).collect()
}

async fn lockers(servers: &[RedisServer], lease: Duration) -> Vec<Locker> {
    let mut out = Vec::new();
    for server in servers {
        out.push(
            Locker::builder()
                .url(server.url())
                .default_lease(dlock_core::Lease::watchdog(lease))
                .command_timeout(Duration::from_millis(500))
                .build()
                .await
                .expect("connect"),
        );
    }
    out
}

async fn held_on(server: &RedisServer, key: &str) -> bool {
    server.connection().await.exists(key).await.expect("EXISTS")
}

#[tokio::test]
async fn a_majority_set_grants_with_one_of_three_down_and_refuses_a_rival() {
    let mut masters = servers(3);
    let set = MasterSet::majority(lockers(&masters, Duration::from_secs(30)).await).unwrap();
    let rival = MasterSet::majority(lockers(&masters, Duration::from_secs(30)).await).unwrap();
    assert_eq!(set.needed(), 2);
    let name = unique_name("majority");

    let guard = set.lock(name.as_str()).await.expect("lock");
    assert_eq!(guard.granted(), vec![0, 1, 2]);
    assert!(
        matches!(guard.fencing_token().await, Err(LockError::Config(_))),
        "no single token for a majority set"
    );
    assert_eq!(guard.fencing_tokens().await.len(), 3);
    assert!(
        rival
            .lock(name.as_str())
            .try_lock()
            .await
            .unwrap()
            .is_none()
    );
    let err = (rival.lock(name.as_str()))
        .wait(Duration::from_millis(200))
        .await
        .unwrap_err();
    assert!(err.is_busy(), "{err}");
    let LockError::Masters(detail) = &err else {
        panic!("{err}")
    };
    assert_eq!(detail.busy(), vec![0, 1, 2], "{detail}");
    for outcome in guard.release_each().await.into_iter().flatten() {
        assert!(outcome.is_released(), "{outcome:?}");
    }

    masters[1].kill();
    let started = Instant::now();
    let guard = set
        .lock(name.as_str())
        .await
        .expect("lock with one master down");
    eprintln!("granted by 2 of 3 in {:?}", started.elapsed());
    assert_eq!(guard.granted(), vec![0, 2]);
    assert!(!guard.is_lost());
    let outcomes = guard.release_each().await;
    assert!(outcomes[1].is_none());
}

#[tokio::test]
async fn a_majority_set_grants_with_two_of_five_down() {
    let mut masters = servers(5);
    let set = MasterSet::majority(lockers(&masters, Duration::from_secs(30)).await).unwrap();
    assert_eq!(set.needed(), 3);
    masters[0].kill();
    masters[3].kill();
    let guard = set
        .lock(unique_name("two-of-five").as_str())
        .await
        .expect("lock");
    assert_eq!(guard.granted(), vec![1, 2, 4]);
    guard.release_each().await;
}

#[tokio::test]
async fn a_majority_down_is_a_clean_typed_error_within_the_wait_that_leaves_nothing() {
    let mut masters = servers(3);
    let each = lockers(&masters, Duration::from_secs(30)).await;
    let name = unique_name("majority-down");
    let key = each[0].key_of(name.as_str()).unwrap();
    let set = MasterSet::majority(each).unwrap();
    let guard = set
        .lock(name.as_str())
        .await
        .expect("lock while all are up");
    guard.release_each().await;
    masters[0].kill();
    masters[2].kill();
    let wait = Duration::from_millis(800);
    let started = Instant::now();
    let err = set.lock(name.as_str()).wait(wait).await.unwrap_err();
    let took = started.elapsed();
    assert!(
        took < wait + Duration::from_secs(1),
        "gave up after {took:?}"
    );
    assert!(err.is_backend() && !err.is_busy(), "{err}");
    let LockError::Masters(detail) = &err else {
        panic!("{err}")
    };
    assert_eq!(detail.failed(), vec![0, 2], "{detail}");
    assert_eq!(detail.granted(), vec![1], "{detail}");
    eprintln!("{err} (after {took:?})");
    // The survivor's grant was given back.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !held_on(&masters[1], &key).await,
        "the survivor still holds {key}"
    );
}

#[tokio::test]
async fn a_master_that_restarts_empty_cannot_let_a_rival_in() {
    let mut masters = servers(3);
    let set = MasterSet::majority(lockers(&masters, Duration::from_secs(30)).await).unwrap();
    let rival = MasterSet::majority(lockers(&masters, Duration::from_secs(30)).await).unwrap();
    let name = unique_name("restart-empty");
    let guard = set.lock(name.as_str()).await.expect("lock");
    // Master 0 forgets everything (no persistence).
    masters[0].kill();
    masters[0].restart();
    let err = (rival.lock(name.as_str()))
        .wait(Duration::from_millis(500))
        .await
        .unwrap_err();
    let LockError::Masters(detail) = &err else {
        panic!("{err}")
    };
    assert!(
        detail.busy().contains(&1) && detail.busy().contains(&2),
        "{detail}"
    );
    assert!(!guard.is_lost(), "two masters still hold it");
    guard.release_each().await;
    let guard = rival
        .lock(name.as_str())
        .wait(Duration::from_secs(2))
        .await
        .expect("free");
    guard.release_each().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn majority_sets_exclude_each_other_under_contention() {
    const SETS: usize = 3;
    const TASKS: usize = 4;
    const ROUNDS: usize = 25;
    let masters = servers(3);
    let name = unique_name("contended");
    let inside = Arc::new(AtomicBool::new(false));
    let overlaps = Arc::new(AtomicU64::new(0));
    let count = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..SETS {
        let set = MasterSet::majority(lockers(&masters, Duration::from_secs(30)).await).unwrap();
        for _ in 0..TASKS {
            let (set, name) = (set.clone(), name.clone());
            let (inside, overlaps, count) = (inside.clone(), overlaps.clone(), count.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    let guard = set
                        .lock(name.as_str())
                        .wait(Duration::from_secs(60))
                        .await?;
                    if inside.swap(true, Ordering::SeqCst) {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    let seen = count.load(Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    count.store(seen + 1, Ordering::SeqCst);
                    inside.store(false, Ordering::SeqCst);
                    guard.release_each().await;
                }
                Ok::<_, LockError>(())
            }));
        }
    }
    for task in tasks {
        task.await.expect("task panicked").expect("lock error");
    }
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two holders overlapped");
    assert_eq!(count.load(Ordering::SeqCst), (SETS * TASKS * ROUNDS) as u64);
}

#[tokio::test]
async fn a_majority_hold_is_lost_when_a_majority_of_its_masters_go() {
    let lease = Duration::from_millis(900);
    let mut masters = servers(3);
    let set = MasterSet::majority(lockers(&masters, lease).await).unwrap();
    let guard = set
        .lock(unique_name("majority-loss").as_str())
        .await
        .expect("lock");
    masters[0].kill();
    tokio::time::sleep(lease).await;
    assert!(!guard.is_lost(), "two of three still hold it");
    masters[1].kill();
    let killed = Instant::now();
    tokio::time::timeout(lease + lease / 3 + Duration::from_millis(500), guard.lost())
        .await
        .expect("the loss is reported");
    eprintln!(
        "loss reported {:?} after the second master died",
        killed.elapsed()
    );
    assert!(guard.is_lost());
    let err = guard.run(async {}).await.unwrap_err();
    assert!(err.is_lost());
}

#[tokio::test]
async fn an_all_masters_set_needs_every_master_and_its_token_rises() {
    let mut masters = servers(3);
    let each = lockers(&masters, Duration::from_secs(30)).await;
    let name = unique_name("all");
    let key = each[0].key_of(name.as_str()).unwrap();
    let set = MasterSet::all(each).unwrap();
    assert_eq!(set.needed(), 3);
    let first = set.lock(name.as_str()).await.expect("lock");
    let token = first
        .fencing_token()
        .await
        .expect("one token for an all-masters set");
    first.release_each().await;
    let second = set.lock(name.as_str()).await.expect("lock");
    assert!(second.fencing_token().await.unwrap() > token);
    second.release_each().await;

    masters[2].kill();
    let err = set.lock(name.as_str()).try_lock().await.unwrap_err();
    let LockError::Masters(detail) = &err else {
        panic!("{err}")
    };
    assert_eq!(detail.failed(), vec![2], "{detail}");
    assert_eq!(detail.granted(), vec![0, 1], "{detail}");
    tokio::time::sleep(Duration::from_millis(100)).await;
    for server in &masters[..2] {
        assert!(!held_on(server, &key).await, "a grant was left behind");
    }
}

#[tokio::test]
async fn an_empty_set_is_a_configuration_error() {
    let err = MasterSet::majority(Vec::new()).unwrap_err();
    assert!(err.is_config(), "{err}");
}

/// A hung master (`SIGSTOP`: connections open, nothing answered) costs a majority round one
/// master's budget — a small share of the lease — not the command timeout.
#[tokio::test]
async fn a_hung_master_costs_a_majority_round_one_budget_not_the_lease() {
    let masters = servers(3);
    let mut each = Vec::new();
    for server in &masters {
        // The default command timeout (2 s): longer than the lease.
        each.push(Locker::builder().url(server.url()).build().await.unwrap());
    }
    let set = MasterSet::majority(each).unwrap();
    let name = unique_name("majority-hung");
    // Connections to every master are open before the hang.
    let guard = set.lock(name.as_str()).try_lock().await.unwrap().unwrap();
    guard.release_each().await;
    masters[2].pause();
    let lease = Duration::from_secs(1);
    for round in 0..3 {
        let started = tokio::time::Instant::now();
        let guard = (set.lock(name.as_str()).lease(lease))
            .await
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        let took = started.elapsed();
        let left = guard.valid_until() - tokio::time::Instant::now();
        assert_eq!(guard.granted(), vec![0, 1], "round {round}");
        assert!(
            left >= lease.mul_f64(0.9),
            "round {round}: answered after {took:?}, keeping {left:?} of a {lease:?} lease"
        );
        for outcome in guard.release_each().await.into_iter().flatten() {
            assert!(outcome.is_released(), "{outcome:?}");
        }
    }
    masters[2].resume();
}

/// A master that stops answering right after it granted costs a failed round's give-back one
/// budget, not the command timeout: the grant is given back in the background, and is gone once
/// the master answers again.
#[tokio::test]
async fn a_master_that_hangs_after_granting_costs_the_give_back_one_budget() {
    let masters = servers(3);
    // Master 0 through a proxy, stalled once its grant is in.
    let proxy = Proxy::start(masters[0].addr()).await;
    let mut each = Vec::new();
    for url in [proxy.url(), masters[1].url(), masters[2].url()] {
        // The default command timeout (2 s): far longer than a budget.
        each.push(Locker::builder().url(url).build().await.unwrap());
    }
    let name = unique_name("majority-hang-after-grant");
    let key = each[0].key_of(name.as_str()).unwrap();
    let set = MasterSet::majority(each).unwrap();
    // Connections open everywhere, then master 1 held by a rival alone and master 2 hung: the
    // round gets master 0's grant and nothing else.
    set.lock(name.as_str())
        .try_lock()
        .await
        .unwrap()
        .unwrap()
        .release_each()
        .await;
    let rival = Locker::builder()
        .url(masters[1].url())
        .build()
        .await
        .unwrap();
    let rival_guard = rival.lock(name.as_str()).await.unwrap();
    masters[2].pause();
    let lease = Duration::from_millis(3_200);
    let budget = lease / 16;
    let started = tokio::time::Instant::now();
    let attempt = tokio::spawn({
        let set = set.clone();
        let name = name.clone();
        async move { set.lock(name.as_str()).lease(lease).try_lock().await }
    });
    tokio::time::sleep(budget / 4).await;
    proxy.stall();
    let answer = attempt.await.unwrap();
    let took = started.elapsed();
    assert!(matches!(answer, Ok(None)), "busy on master 1: {answer:?}");
    assert!(
        took <= budget * 2 + Duration::from_millis(150),
        "answered after {took:?}: a round ({budget:?}) and a give-back ({budget:?}) at most"
    );
    proxy.unstall();
    masters[2].resume();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
    while held_on(&masters[0], &key).await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "master 0 still holds {key} a second after it answers again"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(rival_guard);
}
