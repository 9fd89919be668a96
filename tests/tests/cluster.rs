//! A `Locker` over Redis Cluster, against a real cluster of three masters and three replicas:
//! mutual exclusion across slots, wake-ups through sharded pub/sub on the lock's shard only,
//! renewals of locks in many slots, multi-locks, inspection and fair locks. Faults (a slot
//! migrating, a failover, a cluster down at start) are in `cluster_faults.rs`.
//!
//! The harness blocks while it polls; tests that keep a `Locker` across a fault run on two worker
//! threads and call it inside `block_in_place`.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dlock_core::redis::{self, AsyncCommands as _};
use dlock_core::{LockError, Locker, ReplicaAck};
use dlock_tests::cluster::key_slot;
use dlock_tests::hold::HoldValue;
use dlock_tests::{RedisCluster, unique_name};
use tokio::task::block_in_place;

/// Calls of `command` a node has served, from `INFO commandstats`.
fn calls(cluster: &RedisCluster, port: u16, command: &str) -> u64 {
    (cluster.node(port).info_commandstats())
        .get(command)
        .copied()
        .unwrap_or(0)
}

/// The ports of the masters `names`' locks live on.
fn masters_of(cluster: &RedisCluster, locker: &Locker, names: &[String]) -> BTreeSet<u16> {
    (names.iter())
        .map(|name| {
            cluster
                .node_for_key(locker.key_of(name.as_str()).unwrap())
                .port
        })
        .collect()
}

/// `n` names whose locks live on at least two different masters (the first such set of names
/// `prefix-<try>-<i>`: a set of random names all on one master is not rare).
fn names_across_masters(
    cluster: &RedisCluster,
    locker: &Locker,
    prefix: &str,
    n: usize,
) -> Vec<String> {
    let base = unique_name(prefix);
    (0..100)
        .map(|attempt| -> Vec<String> { (0..n).map(|i| format!("{base}-{attempt}-{i}")).collect() })
        .find(|names| masters_of(cluster, locker, names).len() >= 2)
        .expect("names on two masters")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_on_a_cluster_exclude_each_other_in_every_slot() {
    const LOCKERS: usize = 3;
    const TASKS: usize = 6;
    const ROUNDS: usize = 40;
    let cluster = block_in_place(RedisCluster::start);
    let first = cluster.locker(Duration::from_secs(30)).await;
    let names = names_across_masters(&cluster, &first, "cluster-mutex", 4);
    let inside: Arc<Vec<AtomicBool>> =
        Arc::new(names.iter().map(|_| AtomicBool::new(false)).collect());
    let overlaps = Arc::new(AtomicU64::new(0));
    let counts: Arc<Vec<AtomicU64>> = Arc::new(names.iter().map(|_| AtomicU64::new(0)).collect());
    let mut tasks = Vec::new();
    for l in 0..LOCKERS {
        let locker = if l == 0 {
            first.clone()
        } else {
            cluster.locker(Duration::from_secs(30)).await
        };
        for t in 0..TASKS {
            let (locker, names) = (locker.clone(), names.clone());
            let (inside, overlaps, counts) = (inside.clone(), overlaps.clone(), counts.clone());
            tasks.push(tokio::spawn(async move {
                for r in 0..ROUNDS {
                    let i = (t + r) % names.len();
                    let guard = (locker.lock(names[i].as_str()))
                        .wait(Duration::from_secs(30))
                        .await?;
                    if inside[i].swap(true, Ordering::SeqCst) {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    let seen = counts[i].load(Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    counts[i].store(seen + 1, Ordering::SeqCst);
                    inside[i].store(false, Ordering::SeqCst);
                    assert!(guard.release().await.is_released());
                }
                Ok::<_, LockError>(())
            }));
        }
    }
    for task in tasks {
        task.await.expect("task panicked").expect("lock error");
    }
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two holders overlapped");
    let total: u64 = counts.iter().map(|c| c.load(Ordering::SeqCst)).sum();
    assert_eq!(
        total,
        (LOCKERS * TASKS * ROUNDS) as u64,
        "an update was lost"
    );
    // Nothing left behind but the fencing counters. A release may keep a name for the `Locker`
    // whose waiter claimed the next turn (no owner, for at most a second): such a key goes by
    // itself; a hold would stay for its 30 s lease.
    for name in &names {
        let key = first.key_of(name.as_str()).unwrap();
        let node = cluster.node_for_key(&key);
        let mut con = cluster.node(node.port).connection().await;
        let hold = HoldValue::read(&mut con, &key).await.unwrap();
        assert!(
            hold.as_ref().is_none_or(|h| h.owner.is_none()),
            "{key} is still held: {hold:?}"
        );
        let gone = async {
            while con.exists::<_, bool>(&key).await.unwrap() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        assert!(
            tokio::time::timeout(Duration::from_millis(1_500), gone)
                .await
                .is_ok(),
            "{key} was kept past any turn's window: {hold:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_woken_through_sharded_pub_sub_on_the_locks_shard_only() {
    let cluster = block_in_place(RedisCluster::start);
    // Writes counted once the master has them: the release grants the lock to the waiter's
    // claim (with a replica to acknowledge, it keeps it for the waiter's `Locker` instead).
    let unacked = || async {
        (Locker::builder().cluster(cluster.seed_urls()))
            .replica_ack(ReplicaAck::none())
            .build()
            .await
            .expect("a locker on the cluster")
    };
    let (holder, waiter) = (unacked().await, unacked().await);
    let name = unique_name("cluster-wake");
    let key = holder.key_of(name.as_str()).unwrap();
    let owner = cluster.node_for_key(&key).port;
    let before: Vec<(u16, u64, u64)> = (cluster.masters().iter())
        .map(|m| {
            (
                m.port,
                calls(&cluster, m.port, "spublish"),
                calls(&cluster, m.port, "publish"),
            )
        })
        .collect();

    let guard = holder.lock(name.as_str()).await.expect("lock");
    // The name has a fencing counter: on a cluster a release grants only on a counter that is
    // on its node (see the `protocol` module), and a first lock mints none until asked.
    guard.fencing_token().await.expect("a token");
    let waiting = tokio::spawn({
        let (waiter, name) = (waiter.clone(), name.clone());
        async move {
            let guard = (waiter.lock(name.as_str()))
                .wait(Duration::from_secs(10))
                .await
                .expect("the waiter gets the lock");
            (Instant::now(), guard)
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let channel = format!("{key}:wake");
    let mut on_owner = cluster.node(owner).connection().await;
    let subscribed: (String, u64) = redis::cmd("PUBSUB")
        .arg("SHARDNUMSUB")
        .arg(&channel)
        .query_async(&mut on_owner)
        .await
        .expect("PUBSUB SHARDNUMSUB");
    assert_eq!(subscribed.1, 1, "the waiter subscribed on the lock's shard");
    let claim = HoldValue::read(&mut on_owner, &key).await.expect("GET");
    let offered = claim.as_ref().and_then(|h| h.claim_token());
    assert!(
        offered.is_some(),
        "no claim offered a hand-over token: {claim:?}"
    );
    let released = Instant::now();
    assert!(guard.release().await.is_released());
    let (at, granted) = waiting.await.unwrap();
    let woken = at - released;
    // A 30 s lease: only a wake-up explains a grant this soon.
    assert!(
        woken < Duration::from_millis(500),
        "woken {woken:?} after the release"
    );
    // The release granted it to the waiter's claim, and the sharded wake-up said so: the
    // hold is the offered token's, its fencing token the guard's.
    let hold = HoldValue::read(&mut on_owner, &key).await.expect("GET");
    assert_eq!(hold.as_ref().and_then(|h| h.owner.clone()), offered);
    let minted = granted.minted_fencing_token().map(|t| t.get());
    assert!(minted.is_some() && minted == hold.and_then(|h| h.token));
    assert!(granted.release().await.is_released());

    for (port, spublish, publish) in before {
        let spublished = calls(&cluster, port, "spublish") - spublish;
        assert_eq!(
            calls(&cluster, port, "publish"),
            publish,
            "{port} broadcast a PUBLISH"
        );
        if port == owner {
            assert!(spublished >= 1, "the lock's master sent no SPUBLISH");
        } else {
            assert_eq!(
                spublished, 0,
                "{port} published a wake-up for another shard"
            );
        }
    }
}

/// `per_slot` names for each of `slots` slots (names whose keys share a slot, found by trying).
fn names_sharing_slots(
    locker: &Locker,
    prefix: &str,
    slots: usize,
    per_slot: usize,
) -> Vec<String> {
    let mut names = Vec::new();
    for s in 0..slots {
        let first = unique_name(&format!("{prefix}-{s}"));
        let slot = key_slot(locker.key_of(first.as_str()).unwrap().as_bytes());
        names.push(first.clone());
        let mut found = 1;
        for i in 0.. {
            if found == per_slot {
                break;
            }
            let candidate = format!("{first}-{i}");
            if key_slot(locker.key_of(candidate.as_str()).unwrap().as_bytes()) == slot {
                names.push(candidate);
                found += 1;
            }
        }
    }
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_renews_locks_in_many_slots_with_one_script_call_per_slot() {
    const SLOTS: usize = 4;
    const PER_SLOT: usize = 3;
    let cluster = block_in_place(RedisCluster::start);
    let lease = Duration::from_millis(900);
    let tick = lease / 3;
    let locker = cluster.locker(lease).await;
    let names = names_sharing_slots(&locker, "cluster-renew", SLOTS, PER_SLOT);
    let masters = masters_of(&cluster, &locker, &names);
    let mut guards = Vec::new();
    for name in &names {
        guards.push(locker.lock(name.as_str()).await.expect("lock"));
    }
    let scripts = |cluster: &RedisCluster| -> u64 {
        (cluster.masters().iter())
            .map(|m| dlock_tests::script_calls(&cluster.node(m.port).info_commandstats()))
            .sum()
    };
    let before = scripts(&cluster);
    let window = Instant::now();
    tokio::time::sleep(lease * 3).await;
    let renewals = scripts(&cluster) - before;
    let ticks = (window.elapsed().as_millis() / tick.as_millis()) as u64 + 1;
    for guard in &guards {
        assert!(!guard.is_lost(), "{} was lost", guard.name());
        let key = locker.key_of(guard.name()).unwrap();
        let node = cluster.node_for_key(&key);
        let pttl: i64 = cluster
            .node(node.port)
            .connection()
            .await
            .pttl(&key)
            .await
            .unwrap();
        assert!(pttl > 0, "{key} has PTTL {pttl} on its master");
    }
    eprintln!(
        "{} locks in {SLOTS} slots on {} masters: {renewals} renewal scripts in {ticks} ticks",
        names.len(),
        masters.len()
    );
    assert!(
        renewals >= SLOTS as u64 * (ticks - 2),
        "too few renewals: {renewals}"
    );
    assert!(
        renewals <= SLOTS as u64 * ticks,
        "{renewals} renewal scripts in {ticks} ticks: more than one per slot and tick"
    );
    for guard in guards {
        assert!(guard.release().await.is_released());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_acknowledged_grants_on_a_cluster_are_on_the_slots_replica() {
    let cluster = block_in_place(RedisCluster::start);
    let locker = Locker::builder()
        .cluster(cluster.seed_urls())
        .replica_ack(ReplicaAck::new(1, Duration::from_millis(500)))
        .build()
        .await
        .expect("a locker on the cluster");
    for i in 0..10 {
        let name = unique_name(&format!("cluster-acked-{i}"));
        let key = locker.key_of(name.as_str()).unwrap();
        let replica = cluster.replica_of(&cluster.node_for_key(&key));
        // A grant the replica does not acknowledge in time (a busy machine) is rolled back and
        // tried again within the wait.
        let guard = (locker.lock(name.as_str()))
            .wait(Duration::from_secs(5))
            .await
            .expect("lock");
        let mut on_replica = cluster.node(replica.port).connection().await;
        let () = redis::cmd("READONLY")
            .query_async(&mut on_replica)
            .await
            .unwrap();
        // The grant is the owner on the key (its token is minted when asked for, later).
        let hold = HoldValue::read(&mut on_replica, &key)
            .await
            .expect("GET on the replica");
        assert!(
            hold.as_ref().is_some_and(|h| h.owner.is_some()),
            "the replica has grant {i}: {hold:?}"
        );
        assert!(guard.fencing_token().await.expect("a token").get() > 0);
        assert!(guard.release().await.is_released());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_lock_across_masters_is_all_or_none() {
    let cluster = block_in_place(RedisCluster::start);
    let locker = cluster.locker(Duration::from_secs(30)).await;
    let rival = cluster.locker(Duration::from_secs(30)).await;
    let names = names_across_masters(&cluster, &locker, "cluster-multi", 6);
    let all = locker
        .lock_all(names.iter().map(String::as_str))
        .await
        .expect("lock all");
    assert_eq!(all.len(), names.len());
    for name in &names {
        assert!(
            rival
                .lock(name.as_str())
                .try_lock()
                .await
                .unwrap()
                .is_none(),
            "{name} is free"
        );
    }
    assert!(all.release().await.is_released());

    // One name held elsewhere: the others are given back, on whichever masters they live.
    let blocker = rival.lock(names[3].as_str()).await.expect("lock one");
    let busy = locker
        .lock_all(names.iter().map(String::as_str))
        .try_lock()
        .await
        .unwrap();
    assert!(busy.is_none());
    for (i, name) in names.iter().enumerate().filter(|(i, _)| *i != 3) {
        let key = locker.key_of(name.as_str()).unwrap();
        let port = cluster.node_for_key(&key).port;
        let left: bool = cluster
            .node(port)
            .connection()
            .await
            .exists(&key)
            .await
            .unwrap();
        assert!(!left, "name {i} was left held on {port}");
    }
    assert!(blocker.release().await.is_released());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_lock_takes_the_names_of_one_slot_in_one_script() {
    let cluster = block_in_place(RedisCluster::start);
    let locker = cluster.locker(Duration::from_secs(30)).await;
    let rival = cluster.locker(Duration::from_secs(30)).await;
    let slot = |name: &str| key_slot(locker.key_of(name).unwrap().as_bytes());
    // Two names that share a slot (found by trying), and a third that sorts after them (digits
    // before letters) in another slot.
    let base = unique_name("cluster-slot");
    let mut seen = std::collections::HashMap::new();
    let (a, b) = (0..20_000)
        .map(|i| format!("{base}-{i}"))
        .find_map(|name| (seen.insert(slot(&name), name.clone())).map(|other| (other, name)))
        .expect("two names in one slot");
    let c = format!("{base}-z");
    assert_ne!(slot(&c), slot(&a));
    // Scripts, and first attempts of a single name (`SET NX PX`; scripts write with `PSETEX`).
    let scripts = || {
        (cluster.masters().iter())
            .map(|m| {
                dlock_tests::script_calls(&cluster.node(m.port).info_commandstats())
                    + calls(&cluster, m.port, "set")
            })
            .sum::<u64>()
    };
    // Load the scripts on every master first; then count.
    for name in [&a, &c] {
        let all = locker.lock_all([name.as_str(), b.as_str()]).await;
        assert!(all.expect("warm up").release().await.is_released());
        let one = locker.lock(name.as_str()).await;
        assert!(one.expect("warm up").release().await.is_released());
    }
    tokio::time::sleep(Duration::from_millis(200)).await;

    let before = block_in_place(scripts);
    let pair = locker
        .lock_all([b.as_str(), a.as_str()])
        .await
        .expect("pair");
    assert_eq!(
        block_in_place(scripts) - before,
        1,
        "one script for one slot"
    );
    // Tokens are per name: two names taken in one script may share a value (the server's clock
    // does not move within a script on every server), each rises on its own.
    let earlier = pair.fencing_tokens().await.unwrap();
    assert!(pair.release().await.is_released());

    let before = block_in_place(scripts);
    let all = (locker.lock_all([c.as_str(), a.as_str(), b.as_str()]).await).expect("three");
    assert_eq!(
        block_in_place(scripts) - before,
        2,
        "one script for the slot of two names, one command for the third"
    );
    for name in [&a, &b, &c] {
        let busy = rival.lock(name.as_str()).try_lock().await.unwrap();
        assert!(busy.is_none(), "{name} is held");
    }
    // In key order: a, b, then c.
    let tokens = all.fencing_tokens().await.unwrap();
    assert!(
        tokens[0] > earlier[0] && tokens[1] > earlier[1],
        "{tokens:?} {earlier:?}"
    );
    assert!(all.release().await.is_released());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_and_force_release_work_on_the_slots_master() {
    let cluster = block_in_place(RedisCluster::start);
    let locker = cluster.locker(Duration::from_secs(30)).await;
    let rival = cluster.locker(Duration::from_secs(30)).await;
    let name = unique_name("cluster-inspect");
    let guard = locker.lock(name.as_str()).await.expect("lock");
    let token = guard.fencing_token().await.expect("a token");
    let waiter = tokio::spawn({
        let (rival, name) = (rival.clone(), name.clone());
        async move {
            rival
                .lock(name.as_str())
                .wait(Duration::from_secs(10))
                .await
        }
    });
    // The waiter's sharded subscription is counted on the shard that owns the name.
    let info = dlock_tests::until_waiting(&locker, name.as_str(), 1).await;
    assert_eq!(info.waiting_lockers, 1, "{info:?}");
    assert_eq!(info.fencing_token, Some(token));
    assert_eq!(info.holders.len(), 1);
    assert!(locker.force_release(name.as_str()).await.expect("force"));
    let next = waiter
        .await
        .expect("waiter")
        .expect("granted after the forced release");
    assert!(next.fencing_token().await.unwrap() > token);
    assert!(next.release().await.is_released());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_lock_on_a_cluster_goes_in_order_and_wakes_each_head_by_sharded_pub_sub() {
    let cluster = block_in_place(RedisCluster::start);
    // Waiters show they are alive every 10 s: a grant within the test is a wake-up.
    let build = || {
        Locker::builder()
            .cluster(cluster.seed_urls())
            .dead_waiter_timeout(Duration::from_secs(30))
            .build()
    };
    let (a, b) = (
        build().await.expect("locker"),
        build().await.expect("locker"),
    );
    let name = unique_name("cluster-fair");
    let holder = a.fair_lock(name.as_str()).await.expect("lock");
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..4u64 {
        let (locker, own, order) = (
            if i % 2 == 0 { &a } else { &b }.clone(),
            name.clone(),
            order.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let guard = (locker.fair_lock(own.as_str()).wait(Duration::from_secs(10)))
                .await
                .expect("fair lock");
            order.lock().unwrap().push(i);
            assert!(guard.release().await.is_released());
        }));
        let deadline = Instant::now() + Duration::from_secs(5);
        while a
            .inspect(name.as_str())
            .await
            .expect("inspect")
            .queued_waiters
            != i + 1
        {
            assert!(Instant::now() < deadline, "waiter {i} never queued");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let released = Instant::now();
    assert!(holder.release().await.is_released());
    for task in tasks {
        task.await.expect("task");
    }
    assert!(
        released.elapsed() < Duration::from_secs(3),
        "the heads were not woken: {:?}",
        released.elapsed()
    );
    assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3]);
    assert_eq!(
        a.inspect(name.as_str())
            .await
            .expect("inspect")
            .queued_waiters,
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_on_a_cluster_scans_every_master() {
    let cluster = block_in_place(RedisCluster::start);
    let locker = cluster.locker(Duration::from_secs(30)).await;
    let masters = block_in_place(|| cluster.masters());
    let master_of = |name: &str| {
        let slot = key_slot(locker.key_of(name).expect("a name").as_bytes());
        (masters.iter().find(|m| m.serves(slot)))
            .unwrap_or_else(|| panic!("no master serves slot {slot}"))
            .port
    };
    // Order names until every master has one, so each lives in a slot of its own master; and a
    // cart name, which the pattern leaves out.
    let base = unique_name("cluster-list");
    let mut by_master = std::collections::BTreeMap::new();
    for i in 0..1000 {
        let name = format!("{base}:order:{i}");
        by_master.entry(master_of(&name)).or_insert(name);
        if by_master.len() == masters.len() {
            break;
        }
    }
    assert_eq!(by_master.len(), 3, "names on every master: {by_master:?}");
    let orders: BTreeSet<String> = by_master.into_values().collect();
    let cart = format!("{base}:cart:1");
    let mut guards = Vec::new();
    for name in orders.iter().chain([&cart]) {
        guards.push(locker.lock(name.as_str()).await.expect("lock"));
    }

    let all = locker.list(&format!("{base}:*")).await.expect("list");
    let mut expected: Vec<String> = orders.iter().cloned().chain([cart.clone()]).collect();
    expected.sort();
    assert_eq!(all, expected);
    // The cluster is this test's own: `*` is these names and nothing else.
    assert_eq!(locker.list("*").await.expect("list"), expected);
    let listed = locker.list(&format!("{base}:order:*")).await.expect("list");
    assert_eq!(listed, orders.iter().cloned().collect::<Vec<_>>());

    for guard in guards {
        assert!(guard.release().await.is_released());
    }
    assert_eq!(
        locker.list(&format!("{base}:*")).await.expect("list"),
        Vec::<String>::new()
    );
}
