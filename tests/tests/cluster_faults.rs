//! A `Locker` over Redis Cluster through faults, against a real cluster of three masters and
//! three replicas: a held lock survives its slot migrating and its master failing over, and a
//! lazy `Locker` builds while the cluster is down and locks once it is back.
//!
//! The harness blocks while it polls; these tests keep a `Locker` across a fault, so they run
//! on two worker threads and call it inside `block_in_place`.

use std::time::{Duration, Instant};

use dlock_core::redis;
use dlock_core::redis::AsyncCommands as _;
use dlock_core::{LockGuard, Locker, ReplicaAck};
use dlock_tests::cluster::{ClusterNode, key_slot};
use dlock_tests::{RedisCluster, unique_name};
use tokio::task::block_in_place;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_lock_survives_its_slot_migrating_to_another_master() {
    let cluster = block_in_place(RedisCluster::start);
    let lease = Duration::from_millis(900);
    let locker = cluster.locker(lease).await;
    let rival = cluster.locker(Duration::from_secs(30)).await;
    let name = unique_name("cluster-migrate");
    let key = locker.key_of(name.as_str()).unwrap();
    let slot = key_slot(key.as_bytes());
    let (_, to) = move_from_to(&cluster, slot);

    let guard = locker.lock(name.as_str()).await.expect("lock");
    block_in_place(|| cluster.migrate_slot(slot, to.port));
    assert_eq!(cluster.master_for_slot(slot).port, to.port);
    tokio::time::sleep(lease * 2).await;
    assert!(!guard.is_lost(), "the hold was lost in the move");
    assert!(
        rival
            .lock(name.as_str())
            .try_lock()
            .await
            .unwrap()
            .is_none(),
        "a rival got it"
    );
    let pttl: i64 = cluster
        .node(to.port)
        .connection()
        .await
        .pttl(&key)
        .await
        .unwrap();
    assert!(
        pttl > 0,
        "the lock is renewed on its new master (PTTL {pttl})"
    );
    assert!(guard.release().await.is_released());
    let guard = rival
        .lock(name.as_str())
        .try_lock()
        .await
        .unwrap()
        .expect("free again");
    assert!(guard.release().await.is_released());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_lock_survives_a_coordinated_failover_of_its_master() {
    let cluster = block_in_place(RedisCluster::start);
    // Renewed every 800 ms: the failover's pause of the master's clients, its election and the
    // client's move to the new master must fit within the lease (they took over 600 ms on a
    // busy machine) — and renewals must then land on the new master.
    let lease = Duration::from_millis(2_400);
    let locker = cluster.locker(lease).await;
    let rival = cluster.locker(Duration::from_secs(30)).await;
    let name = unique_name("cluster-failover");
    let key = locker.key_of(name.as_str()).unwrap();
    let master = cluster.node_for_key(&key);
    let replica = cluster.replica_of(&master);

    let guard = locker.lock(name.as_str()).await.expect("lock");
    let first = guard.fencing_token().await.unwrap();
    block_in_place(|| cluster.failover(replica.port));
    assert_eq!(cluster.node_for_key(&key).port, replica.port);
    tokio::time::sleep(lease * 2).await;
    assert!(!guard.is_lost(), "the hold was lost in the failover");
    assert!(
        rival
            .lock(name.as_str())
            .try_lock()
            .await
            .unwrap()
            .is_none(),
        "a rival got it"
    );
    assert!(guard.release().await.is_released());
    let guard = (rival.lock(name.as_str()))
        .wait(Duration::from_secs(5))
        .await
        .expect("free again");
    assert!(guard.fencing_token().await.unwrap() > first);
    assert!(guard.release().await.is_released());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lazy_cluster_locker_builds_while_the_cluster_is_down_and_locks_once_it_is_back() {
    let mut cluster = block_in_place(RedisCluster::start);
    let ports = cluster.ports();
    for &port in &ports {
        cluster.pause(port);
    }
    let started = Instant::now();
    let locker = Locker::builder()
        .cluster(cluster.seed_urls())
        .connect_lazily(true)
        .command_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_millis(300))
        .build()
        .await
        .expect("a lazy locker builds without the cluster");
    assert!(
        started.elapsed() < Duration::from_millis(300),
        "build waited for the cluster"
    );
    let name = unique_name("cluster-lazy");
    let err = locker.lock(name.as_str()).try_lock().await.unwrap_err();
    assert!(err.is_backend(), "{err}");
    for &port in &ports {
        cluster.resume(port);
    }
    let guard = (locker.lock(name.as_str()))
        .wait(Duration::from_secs(10))
        .await
        .expect("lock once the cluster is back");
    assert!(guard.release().await.is_released());
}

/// Names for `locker` until every master serves at least `per_master` of them.
fn names_on_every_master(
    cluster: &RedisCluster,
    locker: &Locker,
    prefix: &str,
    per_master: usize,
) -> Vec<(String, u16)> {
    let masters = cluster.masters();
    let mut count = std::collections::BTreeMap::<u16, usize>::new();
    let mut names = Vec::new();
    for i in 0.. {
        if masters
            .iter()
            .all(|m| count.get(&m.port).copied().unwrap_or(0) >= per_master)
        {
            break;
        }
        let name = format!("{prefix}:{i}");
        let key = locker.key_of(name.as_str()).unwrap();
        let port = (masters.iter())
            .find(|m| m.serves(key_slot(key.as_bytes())))
            .map(|m| m.port)
            .unwrap();
        *count.entry(port).or_default() += 1;
        names.push((name, port));
    }
    names
}

/// A hold of each of `names` (a fresh name is free), with the port of its master.
async fn hold_all(locker: &Locker, names: &[(String, u16)]) -> Vec<(LockGuard, u16)> {
    let mut guards = Vec::new();
    for (name, port) in names {
        let guard = locker.lock(name.as_str()).try_lock().await.unwrap();
        guards.push((guard.expect("a fresh name is free"), *port));
    }
    guards
}

/// The names whose holds are lost, on masters other than `failed`.
fn lost_elsewhere<'a>(
    names: &'a [(String, u16)],
    guards: &[(LockGuard, u16)],
    failed: u16,
) -> Vec<&'a str> {
    (names.iter().zip(guards))
        .filter(|(_, (guard, port))| *port != failed && guard.is_lost())
        .map(|((name, _), _)| name.as_str())
        .collect()
}

/// A hold that still believes it holds does hold: a rival can't take any of them. Then every
/// guard lets go.
async fn live_guards_hold(
    cluster: &RedisCluster,
    lease: Duration,
    names: &[(String, u16)],
    guards: Vec<(LockGuard, u16)>,
) {
    let rival = cluster.locker(lease).await;
    for ((name, _), (guard, _)) in names.iter().zip(&guards) {
        if !guard.is_lost() {
            let got = rival.lock(name.as_str()).try_lock().await.unwrap();
            assert!(got.is_none(), "a rival got `{name}`, held by a live guard");
        }
    }
    for (guard, _) in guards {
        let _ = guard.release().await;
    }
}

/// A master that stops answering costs only the holds it keeps: the watchdog renews each
/// slot's holds on their own, so the holds on the other masters are renewed while it hangs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_master_costs_no_hold_on_the_other_masters() {
    // Hung (SIGSTOP) for two leases, well within the node timeout: no failover, no CLUSTERDOWN;
    // every tick meets the hung master's slots unanswered.
    let mut cluster =
        block_in_place(|| RedisCluster::start_with_node_timeout(Duration::from_secs(30)));
    let lease = Duration::from_secs(2);
    let locker = cluster.locker(lease).await;
    let names = names_on_every_master(&cluster, &locker, &unique_name("cluster-hung"), 12);
    let guards = hold_all(&locker, &names).await;
    let hung = cluster.masters()[1].port;
    cluster.pause(hung);
    tokio::time::sleep(lease * 2).await;
    let lost_elsewhere = lost_elsewhere(&names, &guards, hung);
    let lost_there = (guards.iter())
        .filter(|(guard, port)| *port == hung && guard.is_lost())
        .count();
    cluster.resume(hung);
    assert!(
        lost_elsewhere.is_empty(),
        "{} holds on healthy masters were lost while another hung: {lost_elsewhere:?}",
        lost_elsewhere.len()
    );
    assert!(
        lost_there > 0,
        "the hung master's holds are told they are lost"
    );
    live_guards_hold(&cluster, lease, &names, guards).await;
}

/// A renewal waiting on a hung master does not hold back a shorter hold taken meanwhile: the
/// watchdog's next tick comes on time, whether or not the one before has had its answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_hold_taken_while_a_renewal_waits_on_a_hung_master_is_renewed() {
    let mut cluster =
        block_in_place(|| RedisCluster::start_with_node_timeout(Duration::from_secs(30)));
    // A renewal of this lease waits up to a third of it (1 s) for a master's answer.
    let lease = Duration::from_secs(3);
    let locker = cluster.locker(lease).await;
    let hung = cluster.masters()[1].port;
    let healthy = cluster.masters()[0].port;
    let long_name = name_on(&cluster, &locker, hung, "hung-long");
    let long = locker.lock(long_name.as_str()).try_lock().await.unwrap();
    let long = long.expect("a fresh name is free");
    let before = locker.stats().renewal_round_trips;
    cluster.pause(hung);
    // The long hold's first renewal starts a third of its lease after it was taken, and waits.
    let since = Instant::now();
    while locker.stats().renewal_round_trips == before {
        assert!(since.elapsed() < lease, "the watchdog never renewed");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let short = Duration::from_millis(300);
    let short_name = name_on(&cluster, &locker, healthy, "hung-short");
    let request = locker.lock(short_name.as_str()).watchdog_lease(short);
    let guard = request
        .try_lock()
        .await
        .unwrap()
        .expect("a fresh name is free");
    tokio::time::sleep(short * 3).await;
    let lost = guard.is_lost();
    cluster.resume(hung);
    assert!(
        !lost,
        "a {short:?} hold on a healthy master was lost while a renewal waited on a hung master"
    );
    assert!(guard.release().await.is_released());
    drop(long);
}

/// A fresh name whose lock lives on the master on `port`.
fn name_on(cluster: &RedisCluster, locker: &Locker, port: u16, prefix: &str) -> String {
    let master = (cluster.masters().into_iter())
        .find(|m| m.port == port)
        .unwrap_or_else(|| panic!("no master on port {port}"));
    (0..)
        .map(|i| format!("{}:{i}", unique_name(prefix)))
        .find(|name| master.serves(key_slot(locker.key_of(name.as_str()).unwrap().as_bytes())))
        .unwrap()
}

/// A dead master costs only the holds it kept, and the `Locker` reaches its promoted replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_master_costs_no_hold_on_the_other_masters() {
    // The dead master is noticed after the node timeout, longer than the lease: the holds on
    // the other masters must be renewed throughout, while every tick meets the dead master's
    // slots failing. From when the master is marked failing until its replica takes over
    // (about a second), the whole cluster refuses commands (`CLUSTERDOWN`, as Redis does by
    // default): the lease must outlast that and a renewal period, with room for a loaded
    // machine, where the election can take a second or two more.
    let mut cluster =
        block_in_place(|| RedisCluster::start_with_node_timeout(Duration::from_secs(6)));
    let lease = Duration::from_secs(5);
    let locker = cluster.locker(lease).await;
    let names = names_on_every_master(&cluster, &locker, &unique_name("cluster-death"), 12);
    let guards = hold_all(&locker, &names).await;
    let victim = cluster.masters()[1].port;
    let heir = cluster.replica_of(&cluster.masters()[1]).port;
    let killed = Instant::now();
    block_in_place(|| {
        cluster.kill(victim);
        cluster.wait_ok();
    });
    // The `Locker` had traffic to the dead master all along (the watchdog's renewals, and the
    // acquisitions before the kill): it must reach the promoted replica soon after the cluster
    // is ok again.
    let ok = Instant::now();
    let fresh = name_on(&cluster, &locker, heir, "cluster-death-after");
    let guard = loop {
        match locker.lock(fresh.as_str()).try_lock().await {
            Ok(Some(guard)) => break guard,
            Ok(None) => panic!("`{fresh}` is busy"),
            Err(err) => assert!(
                ok.elapsed() < Duration::from_secs(2),
                "the promoted replica still unreachable {:?} after the cluster was ok: {err}",
                ok.elapsed()
            ),
        }
    };
    eprintln!(
        "reached the promoted replica {:?} after the cluster was ok",
        ok.elapsed()
    );
    assert!(guard.release().await.is_released());
    tokio::time::sleep(lease).await;
    // And the holds on the healthy masters were renewed all along.
    let lost_elsewhere = lost_elsewhere(&names, &guards, victim);
    assert!(
        lost_elsewhere.is_empty(),
        "{} holds on healthy masters were lost {:?} after the kill: {lost_elsewhere:?}",
        lost_elsewhere.len(),
        killed.elapsed()
    );
    let lost_there = (guards.iter())
        .filter(|(guard, port)| *port == victim && guard.is_lost())
        .count();
    eprintln!("{lost_there} of the dead master's holds were lost (its replica had the others)");
    live_guards_hold(&cluster, lease, &names, guards).await;
}

/// A release while its slot migrates answers at once, wherever its key is then: still on the
/// old master, or moved already (`ASK`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_during_a_slot_migration_answers_at_once() {
    let cluster = block_in_place(RedisCluster::start);
    let holder = cluster.locker(Duration::from_secs(30)).await;
    let rival = cluster.locker(Duration::from_secs(30)).await;
    let prefix = unique_name("cluster-migrating");
    // Two names of one slot: one released while its key is still on the old master, one after
    // its key moved.
    let first = format!("{prefix}:a");
    let key_a = holder.key_of(first.as_str()).unwrap();
    let slot = key_slot(key_a.as_bytes());
    let second = (0..)
        .map(|i| format!("{prefix}:b{i}"))
        .find(|n| key_slot(holder.key_of(n.as_str()).unwrap().as_bytes()) == slot)
        .unwrap();
    let key_b = holder.key_of(second.as_str()).unwrap();
    let (_, to) = move_from_to(&cluster, slot);
    let a = holder.lock(first.as_str()).await.expect("lock a");
    let b = holder.lock(second.as_str()).await.expect("lock b");
    // Someone waited on each, so each release wakes waiters (the release that publishes).
    for name in [&first, &second] {
        assert!(
            rival
                .lock(name.as_str())
                .try_lock()
                .await
                .unwrap()
                .is_none()
        );
    }
    let migration = block_in_place(|| cluster.begin_migration(slot, to.port));

    let started = Instant::now();
    let outcome = a.release().await;
    assert!(
        outcome.is_released(),
        "on the old master: {outcome:?} after {:?}",
        started.elapsed()
    );
    block_in_place(|| cluster.migrate_keys(&migration, &[&key_b]));
    let started = Instant::now();
    let outcome = b.release().await;
    assert!(
        outcome.is_released(),
        "moved: {outcome:?} after {:?}",
        started.elapsed()
    );
    block_in_place(|| cluster.finish_migration(migration));
    for name in [&first, &second] {
        let guard = (rival.lock(name.as_str()).try_lock().await.unwrap())
            .unwrap_or_else(|| panic!("`{name}` is free after its release"));
        assert!(guard.release().await.is_released());
    }
}

/// Awaits a release made while its slot migrates, and asserts that it answered `Released`.
async fn released_at_once(what: &str, release: impl Future<Output = dlock_core::ReleaseOutcome>) {
    let started = Instant::now();
    let outcome = release.await;
    assert!(
        outcome.is_released(),
        "{what}: {outcome:?} after {:?}",
        started.elapsed()
    );
}

/// A permit's and a reader's release while their slot migrates answer at once too, with the
/// set still on the old master and after it moved (`ASK`): they name their set alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_or_reader_released_during_a_slot_migration_answers_at_once() {
    let cluster = block_in_place(RedisCluster::start);
    let locker = cluster.locker(Duration::from_secs(30)).await;
    let name = unique_name("cluster-migrating-sets");
    let lock_key = locker.key_of(name.as_str()).unwrap();
    let slot = key_slot(lock_key.as_bytes());
    let (_, to) = move_from_to(&cluster, slot);
    let semaphore = locker.semaphore(name.as_str(), 2);
    let rw = locker.read_write_lock(name.as_str());
    let permits = [
        semaphore.acquire().await.expect("a permit"),
        semaphore.acquire().await.expect("a second permit"),
    ];
    let readers = [
        rw.read().await.expect("a reader"),
        rw.read().await.expect("a second reader"),
    ];
    let migration = block_in_place(|| cluster.begin_migration(slot, to.port));
    let [permit_here, permit_moved] = permits;
    let [reader_here, reader_moved] = readers;
    released_at_once("a permit on the old master", permit_here.release()).await;
    released_at_once("a reader on the old master", reader_here.release()).await;
    let sets = [format!("{lock_key}:permits"), format!("{lock_key}:read")];
    block_in_place(|| cluster.migrate_keys(&migration, &[&sets[0], &sets[1]]));
    released_at_once("a permit moved", permit_moved.release()).await;
    released_at_once("a reader moved", reader_moved.release()).await;
    block_in_place(|| cluster.finish_migration(migration));
    let write = (rw.write().try_lock().await.expect("try")).expect("no reader left");
    assert!(write.release().await.is_released());
    assert_eq!(semaphore.status().await.expect("status").held, 0);
}

/// A fair lock's and a writer's release while their slot migrates answer too, though their
/// line's keys can't be named then: they are released by the lock's key alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_lock_or_writer_released_during_a_slot_migration_answers() {
    let cluster = block_in_place(RedisCluster::start);
    let locker = cluster.locker(Duration::from_secs(30)).await;
    let rival = cluster.locker(Duration::from_secs(30)).await;
    let name = unique_name("cluster-migrating-lines");
    let slot = key_slot(locker.key_of(name.as_str()).unwrap().as_bytes());
    let (_, to) = move_from_to(&cluster, slot);
    let (fair, write) = lines_held(&locker, &rival, &name).await;
    let migration = block_in_place(|| cluster.begin_migration(slot, to.port));
    released_at_once("the fair lock", fair.release()).await;
    released_at_once("the writer", write.release()).await;
    block_in_place(|| cluster.finish_migration(migration));
    // The rival's waiter gives up in the background; if that came while the slot moved, its
    // place stays at the head of the line (a release by the key alone leaves the line as it
    // is) until the dead-waiter timeout, and the fair lock goes to nobody else before then.
    let within = dlock_core::DEFAULT_DEAD_WAITER_TIMEOUT + Duration::from_secs(2);
    let again = (rival.fair_lock(name.as_str()).wait(within).await).expect("free again");
    assert!(again.release().await.is_released());
    let read = (rival
        .read_write_lock(name.as_str())
        .read()
        .try_lock()
        .await
        .expect("try"))
    .expect("no writer left");
    assert!(read.release().await.is_released());
}

/// The same over an application's cluster connection with redis-rs's default retries, which
/// go on retrying `TRYAGAIN` for seconds, past the command timeout: the line's keys are named
/// only for part of it, and the lock's key alone in the rest. With the lock's key moved already
/// and the line's keys still on the old master, a script naming them all can't run until the
/// move ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_lock_or_writer_released_during_a_slot_migration_answers_over_an_applications_connection()
 {
    let cluster = block_in_place(RedisCluster::start);
    let locker = app_locker(&cluster).await;
    let rival = cluster.locker(Duration::from_secs(30)).await;
    let name = unique_name("cluster-migrating-lines-app");
    let lock_key = locker.key_of(name.as_str()).unwrap();
    let slot = key_slot(lock_key.as_bytes());
    let (_, to) = move_from_to(&cluster, slot);
    let (fair, write) = lines_held(&locker, &rival, &name).await;
    let migration = block_in_place(|| cluster.begin_migration(slot, to.port));
    let write_key = format!("{lock_key}:write");
    block_in_place(|| cluster.migrate_keys(&migration, &[&lock_key, &write_key]));
    released_at_once("the fair lock, its key moved", fair.release()).await;
    released_at_once("the writer, its key moved", write.release()).await;
    block_in_place(|| cluster.finish_migration(migration));
}

/// A `Locker` over an application's own cluster connection, with redis-rs's default retries (and
/// an 800 ms command timeout).
async fn app_locker(cluster: &RedisCluster) -> Locker {
    let client = redis::cluster::ClusterClient::new(cluster.seed_urls()).expect("a cluster client");
    let conn = (client.get_async_connection().await).expect("a cluster connection");
    (Locker::builder()
        .cluster_connection(conn)
        .wake_by_polling()
        .command_timeout(Duration::from_millis(800))
        .build())
    .await
    .expect("a locker over an application's cluster connection")
}

/// A permit whose lease ran out, released while its slot migrates over an application's cluster
/// connection, says it expired. Its release can't name the claim key then (redis-rs retries the
/// refusal until the half of the command timeout ends), and the permit's set alone then finds it
/// gone: whether or not the first try ran, the hold was lost already, as `lost()` said.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_permit_released_during_a_slot_migration_over_an_applications_connection_says_expired()
 {
    let cluster = block_in_place(RedisCluster::start);
    let locker = app_locker(&cluster).await;
    let name = unique_name("cluster-migrating-lost-permit");
    let slot = key_slot(locker.key_of(name.as_str()).unwrap().as_bytes());
    let (_, to) = move_from_to(&cluster, slot);
    let semaphore = locker.semaphore(name.as_str(), 1);
    let permit = (semaphore.acquire().lease(Duration::from_millis(200)))
        .await
        .expect("a permit");
    tokio::time::timeout(Duration::from_secs(2), permit.lost())
        .await
        .expect("the permit is lost once its lease runs out");
    let migration = block_in_place(|| cluster.begin_migration(slot, to.port));
    let started = Instant::now();
    let outcome = permit.release().await;
    block_in_place(|| cluster.finish_migration(migration));
    assert!(
        matches!(outcome, dlock_core::ReleaseOutcome::Expired),
        "{outcome:?} after {:?}",
        started.elapsed()
    );
}

/// With writes that wait for a replica and the replica paused, a fair lock's or a writer's
/// release runs on the master, and only its wait for the replica is late: the release by the
/// lock's key alone that follows then finds the hold gone. That is no loss — the first let it go
/// — and the release never says it was taken over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_line_release_whose_replica_is_paused_never_says_taken_over() {
    let mut cluster = block_in_place(RedisCluster::start);
    // The wait for the replica is longer than half the command timeout (which counts it).
    let ack = ReplicaAck::new(1, Duration::from_millis(700));
    let locker = (Locker::builder().cluster(cluster.seed_urls()))
        .replica_ack(ack)
        .command_timeout(Duration::from_millis(800))
        .build()
        .await
        .expect("a locker on the cluster");
    let rival = cluster.locker(Duration::from_secs(30)).await;
    let name = unique_name("cluster-line-release-acked");
    let slot = key_slot(locker.key_of(name.as_str()).unwrap().as_bytes());
    let replica = cluster.replica_of(&cluster.master_for_slot(slot)).port;
    // A fresh replica may acknowledge the first writes late, and a write no replica
    // acknowledged in time fails the acquisition: a first lock waits until it does.
    let first = (locker.lock(name.as_str()))
        .wait(Duration::from_secs(10))
        .await
        .expect("a first lock, acknowledged");
    assert!(first.release().await.is_released());
    let (fair, write) = lines_held(&locker, &rival, &name).await;
    block_in_place(|| cluster.pause(replica));
    let (fair, write) = (fair.release().await, write.release().await);
    block_in_place(|| cluster.resume(replica));
    for (what, outcome) in [("the fair lock", fair), ("the writer", write)] {
        assert!(
            !matches!(outcome, dlock_core::ReleaseOutcome::TakenOver),
            "{what}: {outcome:?}"
        );
    }
}

/// `name`'s fair lock and write lock, held by `locker`, with a line behind the fair lock:
/// someone of `rival` stood in it and gave up, so the line's keys exist.
async fn lines_held(
    locker: &Locker,
    rival: &Locker,
    name: &str,
) -> (LockGuard, dlock_core::WriteGuard) {
    let fair = locker.fair_lock(name).await.expect("the fair lock");
    let write = (locker.read_write_lock(name).write().await).expect("the write lock");
    let tried = rival.fair_lock(name).wait(Duration::from_millis(50)).await;
    assert!(tried.is_err(), "the fair lock is held");
    (fair, write)
}

/// Holds in a slot that stays migrating for longer than their lease — some keys moved, some not
/// (a large slot being resharded) — are renewed wherever their keys are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_in_a_slot_that_stays_migrating_are_renewed_on_both_sides() {
    let cluster = block_in_place(RedisCluster::start);
    let lease = Duration::from_millis(900);
    let locker = cluster.locker(lease).await;
    let prefix = unique_name("cluster-long-move");
    let first = format!("{prefix}:a");
    let slot = key_slot(locker.key_of(first.as_str()).unwrap().as_bytes());
    let second = (0..)
        .map(|i| format!("{prefix}:b{i}"))
        .find(|n| key_slot(locker.key_of(n.as_str()).unwrap().as_bytes()) == slot)
        .unwrap();
    let (from, to) = move_from_to(&cluster, slot);
    let a = locker.lock(first.as_str()).await.expect("lock a");
    let b = locker.lock(second.as_str()).await.expect("lock b");
    let migration = block_in_place(|| cluster.begin_migration(slot, to.port));
    let moved = locker.key_of(second.as_str()).unwrap();
    block_in_place(|| cluster.migrate_keys(&migration, &[&moved]));
    tokio::time::sleep(lease * 3).await;
    assert!(!a.is_lost(), "the hold whose key stayed was lost");
    assert!(!b.is_lost(), "the hold whose key moved was lost");
    // On the target, a key of an importing slot is served after `ASKING`.
    let stayed = locker.key_of(first.as_str()).unwrap();
    for (key, port) in [(stayed, from.port), (moved, to.port)] {
        let (pttl,): (i64,) = redis::pipe()
            .cmd("ASKING")
            .ignore()
            .pttl(&key)
            .query_async(&mut cluster.node(port).connection().await)
            .await
            .unwrap();
        assert!(pttl > 0, "{key} on {port}: PTTL {pttl}");
    }
    block_in_place(|| cluster.finish_migration(migration));
    assert!(a.release().await.is_released());
    assert!(b.release().await.is_released());
}

/// A killed master that comes back (as a replica of the replica that took its place, after
/// the cluster is ok again) costs no hold on the other masters either, while it rejoins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_master_coming_back_costs_no_hold_on_the_other_masters() {
    let mut cluster = block_in_place(RedisCluster::start);
    let lease = Duration::from_millis(900);
    let locker = cluster.locker(lease).await;
    let names = names_on_every_master(&cluster, &locker, &unique_name("cluster-back"), 12);
    let victim = cluster.masters()[1].port;
    block_in_place(|| {
        cluster.kill(victim);
        cluster.wait_ok();
    });
    // Taken once the cluster is ok again: the cluster refuses every command while a master
    // is failing (`CLUSTERDOWN`), longer than this lease.
    let guards = hold_all(&locker, &names).await;
    let back = Instant::now();
    block_in_place(|| {
        cluster.restart(victim);
        cluster.wait_ok();
    });
    tokio::time::sleep(lease * 3).await;
    let lost: Vec<&str> = (guards.iter().zip(&names))
        .filter(|((guard, _), _)| guard.is_lost())
        .map(|(_, (name, _))| name.as_str())
        .collect();
    assert!(
        lost.is_empty(),
        "{} of {} holds were lost {:?} after the killed master came back: {lost:?}",
        lost.len(),
        names.len(),
        back.elapsed()
    );
}

/// A waiter gets a lock released while its slot migrates within a second, wherever its keys
/// are then, though the migration goes on for longer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_gets_a_lock_released_during_a_slot_migration_at_once() {
    let cluster = block_in_place(RedisCluster::start);
    let holder = cluster.locker(Duration::from_secs(30)).await;
    let waiter = cluster.locker(Duration::from_secs(30)).await;
    let prefix = unique_name("cluster-migrating-waiter");
    // Two names of one slot: one released with its key still on the old master, one after its
    // key moved; each with a fencing counter (a first grant mints one) on the old master.
    let first = format!("{prefix}:a");
    let slot = key_slot(holder.key_of(first.as_str()).unwrap().as_bytes());
    let second = (0..)
        .map(|i| format!("{prefix}:b{i}"))
        .find(|n| key_slot(holder.key_of(n.as_str()).unwrap().as_bytes()) == slot)
        .unwrap();
    let (_, to) = move_from_to(&cluster, slot);
    for name in [&first, &second] {
        let guard = holder.lock(name.as_str()).await.expect("a first lock");
        guard.fencing_token().await.expect("a first token");
        assert!(guard.release().await.is_released());
    }
    let a = holder.lock(first.as_str()).await.expect("lock a");
    let b = holder.lock(second.as_str()).await.expect("lock b");
    let waits: Vec<_> = [&first, &second]
        .into_iter()
        .map(|name| {
            let (waiter, name) = (waiter.clone(), name.clone());
            tokio::spawn(async move {
                let guard = waiter
                    .lock(name.as_str())
                    .wait(Duration::from_secs(20))
                    .await;
                (guard, Instant::now())
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let migration = block_in_place(|| cluster.begin_migration(slot, to.port));
    let key_b = holder.key_of(second.as_str()).unwrap();
    block_in_place(|| cluster.migrate_keys(&migration, &[&key_b]));
    let mut released = Vec::new();
    for guard in [a, b] {
        let outcome = guard.release().await;
        assert!(outcome.is_released(), "{outcome:?}");
        released.push(Instant::now());
    }
    // The migration goes on for a while yet.
    let mut took = Vec::new();
    for (wait, released) in waits.into_iter().zip(released) {
        let (guard, at) = wait.await.unwrap();
        let guard = guard.expect("the waiter gets the lock");
        took.push(at.saturating_duration_since(released));
        drop(guard);
    }
    block_in_place(|| cluster.finish_migration(migration));
    assert!(
        took.iter().all(|t| *t < Duration::from_secs(1)),
        "the waiters got the locks {took:?} after their releases"
    );
}

/// With writes that wait for a replica, a release grants nothing: it keeps the lock for the
/// `Locker` whose waiter claimed the next turn, for as long as that claim asked — four of the
/// waiter's last round trips, up to a second. While the lock's slot migrates with its keys
/// split between two masters, the waiter's attempt can't run a script naming the lock and its
/// fencing counter; naming the lock's key alone, it takes the kept lock at once rather than
/// wait for the keeping to end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acknowledged_waiter_takes_a_lock_kept_for_it_during_a_slot_migration() {
    let mut cluster = block_in_place(RedisCluster::start);
    let ack = ReplicaAck::new(1, Duration::from_millis(400));
    let connect = || async {
        (Locker::builder().cluster(cluster.seed_urls()))
            .replica_ack(ack)
            .build()
            .await
            .expect("a locker on the cluster")
    };
    let (holder, waiter) = (connect().await, connect().await);
    let name = unique_name("cluster-kept-while-migrating");
    let key = holder.key_of(name.as_str()).unwrap();
    let slot = key_slot(key.as_bytes());
    let (from, to) = move_from_to(&cluster, slot);
    let replica = cluster.replica_of(&from).port;
    // A first grant mints a fencing counter, which stays on the old master while the key moves.
    // It waits: on a loaded machine the replica may acknowledge the very first write after the
    // 400 ms, and a write no replica acknowledged is tried again within the wait.
    let guard = (holder
        .lock(name.as_str())
        .wait(Duration::from_secs(10))
        .await)
        .expect("a first lock");
    guard.fencing_token().await.expect("a first token");
    assert!(guard.release().await.is_released());
    let held = holder.lock(name.as_str()).await.expect("lock");

    // The waiter's attempts wait for a paused replica: their round trips, and so the turn its
    // claim asks to be kept, grow to the acknowledgement wait.
    block_in_place(|| cluster.pause(replica));
    let wait = {
        let (waiter, name) = (waiter.clone(), name.clone());
        tokio::spawn(async move {
            let guard = waiter
                .lock(name.as_str())
                .wait(Duration::from_secs(20))
                .await;
            (guard, Instant::now())
        })
    };
    tokio::time::sleep(Duration::from_millis(700)).await;
    // A wake-up with nothing released: the waiter tries again and claims the turn, asking it
    // kept for four of those round trips.
    let mut con = cluster.node(from.port).connection().await;
    let channel = format!("{key}:wake");
    let _: i64 = (redis::cmd("SPUBLISH").arg(&channel).arg("1"))
        .query_async(&mut con)
        .await
        .expect("SPUBLISH");
    tokio::time::sleep(Duration::from_millis(700)).await;
    block_in_place(|| cluster.resume(replica));
    tokio::time::sleep(Duration::from_millis(300)).await;

    let migration = block_in_place(|| cluster.begin_migration(slot, to.port));
    block_in_place(|| cluster.migrate_keys(&migration, &[&key]));
    let outcome = held.release().await;
    let released = Instant::now();
    assert!(outcome.is_released(), "{outcome:?}");
    let (guard, at) = wait.await.unwrap();
    let took = at.saturating_duration_since(released);
    block_in_place(|| cluster.finish_migration(migration));
    let guard = guard.expect("the waiter gets the lock");
    assert!(guard.release().await.is_released());
    assert!(
        took < Duration::from_millis(500),
        "the waiter got the lock kept for it {took:?} after the release"
    );
}

/// The master that serves `slot` now, and another one to move it to.
fn move_from_to(cluster: &RedisCluster, slot: u16) -> (ClusterNode, ClusterNode) {
    let from = cluster.master_for_slot(slot);
    let to = (cluster.masters().into_iter())
        .find(|m| m.id != from.id)
        .expect("another master");
    (from, to)
}
