//! Wake-ups on Redis Cluster after the lock's slot changed hands, against a real cluster of
//! three masters and three replicas: a waiter subscribed on the slot's old master is told when
//! that master drops its subscription (`sunsubscribe`), retries, and subscribes again on the new
//! one, so a release after a slot move or a failover wakes it within a second, not when the
//! holder's lease would have run out.
//!
//! The harness blocks while it polls; these tests keep `Locker`s across a fault, so they run on
//! two worker threads and call it inside `block_in_place`.

use std::time::{Duration, Instant};

use dlock_core::redis;
use dlock_core::redis::AsyncCommands as _;
use dlock_core::{LockGuard, LockRequest, Locker};
use dlock_tests::cluster::key_slot;
use dlock_tests::{RedisCluster, unique_name, until_waiting};
use tokio::task::{JoinHandle, block_in_place};

/// The longest a waiter may take to get the lock after its release.
const WOKEN_WITHIN: Duration = Duration::from_secs(1);

/// A waiter for `name` (up to 20 s) in `locker`: when it got the lock, and the guard.
fn waiter(locker: &Locker, name: &str) -> JoinHandle<(Instant, LockGuard)> {
    waiting(locker.lock(name))
}

/// `request` waiting (up to 20 s) in a task of its own: when it got the lock, and the guard.
fn waiting(request: LockRequest) -> JoinHandle<(Instant, LockGuard)> {
    tokio::spawn(async move {
        let guard =
            (request.wait(Duration::from_secs(20)).await).expect("the waiter gets the lock");
        (Instant::now(), guard)
    })
}

/// Releases `guard` and checks that `waiting` got the lock within [`WOKEN_WITHIN`].
async fn release_wakes(guard: LockGuard, waiting: JoinHandle<(Instant, LockGuard)>, what: &str) {
    let released = Instant::now();
    assert!(guard.release().await.is_released());
    let (got, guard) = tokio::time::timeout(Duration::from_secs(25), waiting)
        .await
        .expect("the waiter ends")
        .expect("the waiter's task");
    let took = got.duration_since(released);
    eprintln!("{what}: the waiter got the lock {took:?} after the release");
    assert!(
        took < WOKEN_WITHIN,
        "{what}: the waiter got the lock {took:?} after the release"
    );
    assert!(guard.release().await.is_released());
}

/// A name held by one `Locker` and waited for by another, on `cluster`.
struct Waited {
    /// Kept for as long as its guard.
    _holder: Locker,
    key: String,
    guard: LockGuard,
    waiting: JoinHandle<(Instant, LockGuard)>,
}

/// A fresh name held by a `Locker` (the default 30 s lease: a waiter that is not woken sleeps
/// until it runs out) and waited for, once the waiter is subscribed, by another.
async fn held_and_waited_for(cluster: &RedisCluster, prefix: &str) -> Waited {
    held_and_waited_for_on(cluster, prefix, &[]).await
}

/// As [`held_and_waited_for`], for a name served by one of the nodes on `ports` (any node if
/// none is given).
async fn held_and_waited_for_on(cluster: &RedisCluster, prefix: &str, ports: &[u16]) -> Waited {
    let holder = cluster.locker(Duration::from_secs(30)).await;
    let rival = cluster.locker(Duration::from_secs(30)).await;
    let (name, key) = loop {
        let name = unique_name(prefix);
        let key = holder.key_of(name.as_str()).unwrap();
        if ports.is_empty() || ports.contains(&cluster.node_for_key(&key).port) {
            break (name, key);
        }
    };
    let guard = holder.lock(name.as_str()).await.expect("lock");
    let waiting = waiter(&rival, &name);
    assert_eq!(until_waiting(&holder, &name, 1).await.waiting_lockers, 1);
    Waited {
        _holder: holder,
        key,
        guard,
        waiting,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_after_the_slot_moved_wakes_its_waiter() {
    let cluster = block_in_place(RedisCluster::start);
    let Waited {
        key,
        guard,
        waiting,
        ..
    } = held_and_waited_for(&cluster, "cluster-move-wake").await;
    let slot = key_slot(key.as_bytes());
    let from = cluster.master_for_slot(slot);
    let to = (cluster.masters().into_iter())
        .find(|m| m.id != from.id)
        .unwrap();
    block_in_place(|| cluster.migrate_slot(slot, to.port));
    let pttl: i64 = (cluster.node(to.port).connection().await)
        .pttl(&key)
        .await
        .unwrap();
    assert!(pttl > 0, "the lock moved with its slot (PTTL {pttl})");
    // The waiter subscribes again, on the slot's new master.
    let channel = format!("{key}:wake");
    let mut on_new = cluster.node(to.port).connection().await;
    let moved = Instant::now();
    loop {
        let (_, subscribers): (String, u64) = redis::cmd("PUBSUB")
            .arg("SHARDNUMSUB")
            .arg(&channel)
            .query_async(&mut on_new)
            .await
            .expect("PUBSUB SHARDNUMSUB");
        if subscribers == 1 {
            break;
        }
        assert!(
            moved.elapsed() < Duration::from_secs(2),
            "the waiter did not subscribe on the new master"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    release_wakes(guard, waiting, "slot moved").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_after_a_failover_wakes_its_waiter() {
    let cluster = block_in_place(RedisCluster::start);
    let Waited {
        key,
        guard,
        waiting,
        ..
    } = held_and_waited_for(&cluster, "cluster-failover-wake").await;
    let replica = cluster.replica_of(&cluster.node_for_key(&key));
    block_in_place(|| cluster.failover(replica.port));
    assert_eq!(cluster.node_for_key(&key).port, replica.port);
    release_wakes(guard, waiting, "failover").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_after_a_master_died_wakes_its_waiter() {
    let mut cluster = block_in_place(RedisCluster::start);
    let Waited {
        key,
        guard,
        waiting,
        ..
    } = held_and_waited_for(&cluster, "cluster-death-wake").await;
    let master = cluster.node_for_key(&key);
    let replica = cluster.replica_of(&master);
    // The hold reached the replica, so it outlives its master.
    let mut on_replica = cluster.node(replica.port).connection().await;
    let () = redis::cmd("READONLY")
        .query_async(&mut on_replica)
        .await
        .unwrap();
    let copied = Instant::now();
    while !on_replica.exists::<_, bool>(&key).await.unwrap() {
        assert!(copied.elapsed() < Duration::from_secs(5), "not replicated");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    block_in_place(|| {
        cluster.kill(master.port);
        cluster.wait_ok();
    });
    assert_eq!(cluster.node_for_key(&key).port, replica.port);
    release_wakes(guard, waiting, "master died").await;
}

/// Waits (up to 5 s) until the node on `port` says it is a replica; whether it did.
async fn until_replica(cluster: &RedisCluster, port: u16) -> bool {
    let mut conn = cluster.node(port).connection().await;
    let asked = Instant::now();
    loop {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut conn)
            .await
            .expect("INFO replication");
        if info.contains("role:slave") {
            return true;
        }
        if asked.elapsed() > Duration::from_secs(5) {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Each shard's master and replica ports.
fn shards(cluster: &RedisCluster) -> Vec<[u16; 2]> {
    (cluster.masters().iter())
        .map(|m| [m.port, cluster.replica_of(m).port])
        .collect()
}

/// Fails over the shard that serves `key` (a coordinated failover to its replica), and waits
/// until the old master has heard of it. A release the old master would hold back (it pauses
/// writes until it hears of the new master) proves nothing about wake-ups. Now and then (Redis
/// 7.0) it has not heard seconds later, and the cluster may end up with it as master again:
/// then this waits until the cluster agrees, and a release must wake its waiter all the same.
async fn fail_over(cluster: &RedisCluster, key: &str, round: impl std::fmt::Display) {
    let master = cluster.node_for_key(key);
    let replica = cluster.replica_of(&master);
    block_in_place(|| cluster.promote(replica.port, None));
    if !until_replica(cluster, master.port).await {
        eprintln!("round {round}: the old master did not hear of the failover in time");
        block_in_place(|| cluster.wait_ok());
    }
}

/// Releases made in the moments after a failover, while the new master has not yet heard
/// that the old one is now its replica. The old master drops the waiter's subscription; taken
/// again where a stale slot map points, it would land on the old master, now a replica that
/// the new master does not yet send its messages to, and the release's wake-up would be lost.
///
/// Each round fails over the next shard in turn: a master may refuse to vote for the failover of
/// a master it voted about within twice the node timeout, so a shard fails over again only
/// three rounds later, and back to the same master only six rounds later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_just_after_a_failover_wakes_its_waiter() {
    let cluster = block_in_place(RedisCluster::start);
    let shards = shards(&cluster);
    for round in 0..6u64 {
        let shard = shards[usize::try_from(round).unwrap() % shards.len()];
        let prefix = format!("cluster-promoted-wake-{round}");
        let Waited {
            key,
            guard,
            waiting,
            ..
        } = held_and_waited_for_on(&cluster, &prefix, &shard).await;
        fail_over(&cluster, &key, round).await;
        tokio::time::sleep(Duration::from_millis(round * 40)).await;
        release_wakes(
            guard,
            waiting,
            &format!("round {round}, just after a failover"),
        )
        .await;
        block_in_place(|| cluster.wait_ok());
    }
}

/// A `Locker` whose subscriber connection was up before a failover, and that first waits for a
/// name of the failed-over shard just after it. Its subscription goes where its slot map
/// points, which may still name the old master, now a replica that the new master does not yet
/// send its messages to; and no push tells the subscriber so. A release made then must wake the
/// waiter all the same, within the bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_wait_just_after_a_failover_is_woken() {
    let cluster = block_in_place(RedisCluster::start);
    let shards = shards(&cluster);
    for (round, shard) in shards.iter().enumerate() {
        let holder = cluster.locker(Duration::from_secs(30)).await;
        let rival = cluster.locker(Duration::from_secs(30)).await;
        let name_on_shard = |prefix: String| loop {
            let name = unique_name(&prefix);
            let key = holder.key_of(name.as_str()).unwrap();
            if shard.contains(&cluster.node_for_key(&key).port) {
                break name;
            }
        };
        // The rival's subscriber connects before the failover: it waits once, for another name
        // of the shard, and reads the slot map then.
        let early = name_on_shard(format!("cluster-early-{round}"));
        let guard = holder.lock(early.as_str()).await.expect("lock");
        let waiting = waiter(&rival, &early);
        assert_eq!(until_waiting(&holder, &early, 1).await.waiting_lockers, 1);
        release_wakes(
            guard,
            waiting,
            &format!("round {round}, before the failover"),
        )
        .await;
        // A name of the same shard, held; its shard fails over.
        let name = name_on_shard(format!("cluster-first-wait-{round}"));
        let key = holder.key_of(name.as_str()).unwrap();
        let guard = holder.lock(name.as_str()).await.expect("lock");
        fail_over(&cluster, &key, round).await;
        // The rival's first wait for the name: it finds it held and subscribes; the release
        // comes at once.
        let waiting = waiter(&rival, &name);
        tokio::time::sleep(Duration::from_millis(60)).await;
        release_wakes(guard, waiting, &format!("round {round}, a first wait")).await;
        block_in_place(|| cluster.wait_ok());
    }
}

/// A cluster whose node timeout is long (no failover ends a fault within a test), a holder and
/// a rival `Locker`, and two masters' ports: one for the fault, one left alone.
struct TwoMasters {
    cluster: RedisCluster,
    holder: Locker,
    rival: Locker,
    faulty: u16,
    live: u16,
}

async fn two_masters() -> TwoMasters {
    let cluster = block_in_place(|| RedisCluster::start_with_node_timeout(Duration::from_secs(30)));
    let masters = cluster.masters();
    TwoMasters {
        holder: cluster.locker(Duration::from_secs(30)).await,
        rival: cluster.locker(Duration::from_secs(30)).await,
        faulty: masters[0].port,
        live: masters[1].port,
        cluster,
    }
}

/// A fresh name whose lock lives on the master on `port`.
fn name_on(cluster: &RedisCluster, locker: &Locker, port: u16, prefix: &str) -> String {
    loop {
        let name = unique_name(prefix);
        let key = locker.key_of(name.as_str()).unwrap();
        if cluster.node_for_key(&key).port == port {
            return name;
        }
    }
}

/// A master that dies while a waiting `Locker` watches channels on it holds back no wake-up on
/// the live masters: the subscriber hears of the death, takes every channel for dropped and
/// subscribes them again, the live masters' at once and the dead master's over and over (the
/// node timeout is long: no failover ends those tries during the test), reading its pushes all
/// along.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_master_holds_back_no_wake_up_on_the_live_masters() {
    let TwoMasters {
        mut cluster,
        holder,
        rival,
        faulty: dying,
        live,
    } = two_masters().await;
    let on = |port: u16, prefix: &str| name_on(&cluster, &holder, port, prefix);
    // Several names on the dying master, each waited for: each is a channel to subscribe again.
    let mut doomed = Vec::new();
    for _ in 0..3 {
        let name = on(dying, "dead-master-wake-doomed");
        let guard = holder.lock(name.as_str()).await.expect("lock");
        doomed.push((guard, waiter(&rival, &name)));
        assert_eq!(until_waiting(&holder, &name, 1).await.waiting_lockers, 1);
    }
    let name = on(live, "dead-master-wake-live");
    let guard = holder.lock(name.as_str()).await.expect("lock");
    let waiting = waiter(&rival, &name);
    assert_eq!(until_waiting(&holder, &name, 1).await.waiting_lockers, 1);
    cluster.kill(dying);
    // Long enough for the subscriber to hear of the death and be retrying the dead channels.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    release_wakes(guard, waiting, "a master dead elsewhere").await;
    drop(doomed);
}

/// A waiter that subscribes on a hung master (`SIGSTOP`) holds back no wake-up on the live
/// masters: its subscription waits up to the command timeout, and the subscriber reads its
/// pushes meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_master_holds_back_no_wake_up_on_the_live_masters() {
    let TwoMasters {
        mut cluster,
        holder,
        rival,
        faulty: hung,
        live,
    } = two_masters().await;
    let on = |port: u16, prefix: &str| name_on(&cluster, &holder, port, prefix);
    let stuck = on(hung, "hung-master-wake-stuck");
    let name = on(live, "hung-master-wake-live");
    let guard = holder.lock(name.as_str()).await.expect("lock");
    let waiting = waiter(&rival, &name);
    assert_eq!(until_waiting(&holder, &name, 1).await.waiting_lockers, 1);
    cluster.pause(hung);
    // Waits on the hung master's name, each a subscription there that gets no answer.
    let stuck: Vec<_> = (0..3)
        .map(|_| {
            let (rival, stuck) = (rival.clone(), stuck.clone());
            tokio::spawn(async move {
                let _ = rival
                    .lock(stuck.as_str())
                    .wait(Duration::from_secs(5))
                    .await;
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    release_wakes(guard, waiting, "a master hung elsewhere").await;
    cluster.resume(hung);
    for task in stuck {
        let _ = task.await;
    }
}

/// A subscription waiting on a hung master holds up no other: the subscriber subscribes again
/// a channel on the hung master (its connection there was dropped), and a new fair waiter on a
/// live master, which stands in line only once its own channel is subscribed, is subscribed
/// meanwhile: a release wakes it at once, not once the hung master's subscription timed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_stuck_on_a_hung_master_holds_up_no_other() {
    let TwoMasters {
        mut cluster,
        holder,
        rival,
        faulty: hung,
        live,
    } = two_masters().await;
    let stuck = name_on(&cluster, &holder, hung, "hung-master-subscribe-stuck");
    let name = name_on(&cluster, &holder, live, "hung-master-subscribe-live");
    let stuck_guard = holder.lock(stuck.as_str()).await.expect("lock");
    let stuck_waiting = waiter(&rival, &stuck);
    assert_eq!(until_waiting(&holder, &stuck, 1).await.waiting_lockers, 1);
    // The subscriber's connection to that master drops, and the master hangs: the subscriber
    // subscribes every channel again (after a short pause), and the hung master's gets no
    // answer.
    let mut conn = cluster.node(hung).connection().await;
    let before = resp3_clients(&mut conn).await;
    let killed: i64 = (redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("pubsub"))
        .query_async(&mut conn)
        .await
        .expect("CLIENT KILL TYPE pubsub");
    assert!(killed > 0, "the subscriber had a connection to the master");
    // The cluster client connects to the master again at once; the master hangs only once it
    // has (a client connecting to a hung node would hold up every command it sends anywhere,
    // which is the cluster client's doing, not the subscriber's).
    let killed_at = Instant::now();
    loop {
        let now = resp3_clients(&mut conn).await;
        if now.iter().any(|id| !before.contains(id)) {
            break;
        }
        assert!(
            killed_at.elapsed() < Duration::from_secs(2),
            "the subscriber did not connect to the master again"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    eprintln!("connected again after {:?}", killed_at.elapsed());
    cluster.pause(hung);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let guard = holder.fair_lock(name.as_str()).await.expect("lock");
    let waiting = waiting(rival.fair_lock(name.as_str()));
    tokio::time::sleep(Duration::from_millis(300)).await;
    release_wakes(guard, waiting, "a subscription stuck elsewhere").await;
    cluster.resume(hung);
    assert!(stuck_guard.release().await.is_released());
    let _ = tokio::time::timeout(Duration::from_secs(25), stuck_waiting).await;
}

/// The ids of the clients of a node that speak RESP3 (the subscribers') and have said who they
/// are (their handshake is done).
async fn resp3_clients(conn: &mut redis::aio::MultiplexedConnection) -> Vec<String> {
    let list: String = (redis::cmd("CLIENT").arg("LIST"))
        .query_async(conn)
        .await
        .expect("CLIENT LIST");
    (list.lines())
        .filter(|l| l.contains(" resp=3") && !l.contains(" lib-name= "))
        .filter_map(|l| l.split(' ').find_map(|f| f.strip_prefix("id=")))
        .map(str::to_owned)
        .collect()
}
