//! Where a failover is what the set-up is for — Sentinel and a Cluster — a `Locker`'s lock
//! writes wait for a replica unless told not to; over masters without replicas they don't (there
//! is nothing to wait for); on one server they never do unless asked.
//!
//! A replica paused with `SIGSTOP` stays listed (until the deployment counts it down) and
//! acknowledges nothing: a grant that waits for it fails, one that doesn't goes through. A
//! replica that died is, once the deployment lists it down, no longer waited for: its master
//! goes on granting, without the outage that waiting for a replica that can't answer would be.
//!
//! The harness blocks while it polls; these tests run on two worker threads and call it inside
//! `block_in_place`.

use std::time::{Duration, Instant};

use dlock_core::{LockError, Locker, ReplicaAck};
use dlock_tests::{RedisCluster, RedisSentinel, RedisServer, unique_name};
use tokio::task::block_in_place;

/// How long after the deployment lists a replica down a `Locker` may still wait for it: it
/// reads the list every second.
const RELISTED_WITHIN: Duration = Duration::from_millis(2500);

/// The error of a grant that no replica acknowledged.
fn not_replicated(got: Result<dlock_core::LockGuard, LockError>) -> bool {
    matches!(got, Err(LockError::Backend(ref e)) if e.is_not_replicated())
}

/// How many `WAIT`s the server on `port` answered.
async fn waits(server: &RedisServer) -> u64 {
    let mut con = server.connection().await;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut con)
        .await
        .expect("INFO commandstats");
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_wait:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().expect("a count of calls"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_locker_waits_for_a_replica_unless_told_not_to() {
    let mut cluster = block_in_place(RedisCluster::start);
    block_in_place(|| cluster.wait_replicas_listed());
    let by_default = (Locker::builder().cluster(cluster.seed_urls()).build())
        .await
        .expect("a locker on the cluster");
    let unacked = (Locker::builder().cluster(cluster.seed_urls()))
        .replica_ack(ReplicaAck::none())
        .build()
        .await
        .expect("a locker that doesn't wait for replicas");
    let over_conn = over_connection(&cluster).await;
    let name = unique_name("acked-by-default");

    // Healthy: all lock, and the default's grants waited for the replica.
    let master = cluster.node_for_key(by_default.key_of(name.as_str()).expect("a key"));
    let replica = cluster.replica_of(&master);
    for locker in [&by_default, &over_conn] {
        let before = waits(cluster.node(master.port)).await;
        let guard = locker.lock(name.as_str()).await.expect("lock");
        assert!(waits(cluster.node(master.port)).await > before);
        assert!(guard.release().await.is_released());
    }
    let before = waits(cluster.node(master.port)).await;
    let guard = unacked.lock(name.as_str()).await.expect("lock");
    assert!(guard.release().await.is_released());
    assert_eq!(waits(cluster.node(master.port)).await, before);

    block_in_place(|| cluster.pause(replica.port));
    let got = by_default.lock(name.as_str()).await;
    let refused = not_replicated(got);
    // Not acknowledged — or the application's client gave up on the node first (its own
    // response timeout, while it reads its slot map around the paused replica): no guard either
    // way, and the opted-out lock below finds the name free.
    let got = over_conn.lock(name.as_str()).await;
    let refused_over_conn = matches!(got, Err(LockError::Backend(_)));
    // Within a wait: a cluster connection can stall for up to a node timeout around a paused
    // replica while it reads the slot map (the checker's `SlotMapStall`), whatever the lock.
    let unacked_got = (unacked.lock(name.as_str()))
        .wait(Duration::from_secs(6))
        .await;
    block_in_place(|| cluster.resume(replica.port));
    assert!(
        refused,
        "a grant its replica could not acknowledge was not refused"
    );
    assert!(
        refused_over_conn,
        "over an application's connection, a grant its replica could not acknowledge was not \
         refused"
    );
    let guard = unacked_got.expect("a lock that doesn't wait for replicas");
    assert!(guard.release().await.is_released());
}

/// A `Locker` over an application's own cluster connection (which lists the replicas through
/// that connection). Its client waits at most 500 ms on a node and retries 3 times, as dlock's
/// own does: with redis-rs's defaults, a connection can stall every command for seconds around
/// a paused replica while it reads the slot map.
async fn over_connection(cluster: &RedisCluster) -> Locker {
    let client = redis::cluster::ClusterClient::builder(cluster.seed_urls())
        .response_timeout(Duration::from_millis(500))
        .retries(3)
        .build()
        .expect("a cluster client");
    let conn = (client.get_async_connection().await).expect("a cluster connection");
    // It brings no subscriber: refused unless polling is chosen.
    let refused = (Locker::builder().cluster_connection(conn.clone()).build())
        .await
        .expect_err("no subscriber, no polling chosen");
    assert!(
        refused.to_string().contains("cluster(seed URLs)"),
        "{refused}"
    );
    (Locker::builder()
        .cluster_connection(conn)
        .wake_by_polling()
        .build())
    .await
    .expect("a locker over an application's cluster connection")
}

/// Polls `listed` (up to 30 s) until it says `true`.
async fn until(what: &str, mut listed: impl FnMut() -> bool) {
    let give_up = Instant::now() + Duration::from_secs(30);
    while !block_in_place(&mut listed) {
        assert!(Instant::now() < give_up, "{what}: not within 30 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Locks and releases `name` five times in a row, every grant on time, and says how many
/// `WAIT`s `server` answered meanwhile.
async fn five_grants(locker: &Locker, name: &str, server: &RedisServer) -> u64 {
    let before = waits(server).await;
    for _ in 0..5 {
        let guard = locker.lock(name).await.expect("lock");
        assert!(guard.release().await.is_released());
    }
    waits(server).await - before
}

/// Tries `name` (free) until a grant goes through, within [`RELISTED_WITHIN`] of the call,
/// and says how long that took.
async fn granted_again(locker: &Locker, name: &str) -> Duration {
    let unlisted = Instant::now();
    loop {
        match locker.lock(name).try_lock().await {
            Ok(Some(guard)) => {
                assert!(guard.release().await.is_released());
                return unlisted.elapsed();
            }
            Ok(None) => panic!("{name} is held by nobody"),
            Err(err) => assert!(
                unlisted.elapsed() < RELISTED_WITHIN,
                "still refused {:?} after the replica was listed down: {err}",
                unlisted.elapsed()
            ),
        }
    }
}

/// A master whose only replica died goes on granting once the cluster marks the replica
/// failed, and its writes stop waiting for it: no outage beyond the time the cluster takes to
/// tell, and the `Locker`'s next read of the list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_master_whose_replica_died_grants_without_waiting_for_it() {
    let mut cluster = block_in_place(RedisCluster::start);
    block_in_place(|| cluster.wait_replicas_listed());
    let locker = (Locker::builder().cluster(cluster.seed_urls()).build())
        .await
        .expect("a locker on the cluster");
    let over_conn = over_connection(&cluster).await;
    let name = unique_name("replica-died");
    let master = cluster.node_for_key(locker.key_of(name.as_str()).expect("a key"));
    let replica = cluster.replica_of(&master);
    assert!(five_grants(&locker, &name, cluster.node(master.port)).await >= 5);
    assert!(five_grants(&over_conn, &name, cluster.node(master.port)).await >= 5);

    block_in_place(|| cluster.kill(replica.port));
    let listed = |cluster: &RedisCluster| {
        let client = redis::Client::open(cluster.node(master.port).url()).expect("a client");
        let mut con = client.get_connection().expect("a connection");
        let slots: Vec<redis::Value> = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query(&mut con)
            .expect("CLUSTER SLOTS");
        // Each range: first, last, master (host, port, ..), then one entry per replica listed.
        slots.iter().any(|range| match range {
            redis::Value::Array(parts) => {
                let port = match parts.get(2) {
                    Some(redis::Value::Array(m)) => m.get(1).cloned(),
                    _ => None,
                };
                let port: Option<u16> = port.and_then(|p| redis::from_redis_value(p).ok());
                port == Some(master.port) && parts.len() > 3
            }
            _ => false,
        })
    };
    until("the dead replica is left out of CLUSTER SLOTS", || {
        !listed(&cluster)
    })
    .await;
    // Within the next read of the list, a grant goes through; from then on none waits.
    for locker in [&locker, &over_conn] {
        let first = granted_again(locker, &name).await;
        eprintln!("granted {first:?} after the cluster listed the replica failed");
        assert_eq!(
            five_grants(locker, &name, cluster.node(master.port)).await,
            0
        );
    }
}

/// As on a cluster, through Sentinel: once the sentinels hold the dead replica down, the
/// master grants without waiting for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_master_whose_replica_died_grants_without_waiting_for_it() {
    let mut set_up = block_in_place(RedisSentinel::start);
    block_in_place(|| set_up.wait_replica_listed_in_sync());
    let locker = (Locker::builder().sentinel(set_up.sentinel_urls(), set_up.master_name()))
        .build()
        .await
        .expect("a locker on sentinel");
    let name = unique_name("sentinel-replica-died");
    assert!(five_grants(&locker, &name, set_up.master()).await >= 5);

    let replica = set_up.replica().port();
    block_in_place(|| set_up.kill(replica));
    until("the sentinels hold the dead replica down", || {
        set_up.replica_down_everywhere(replica)
    })
    .await;
    let first = granted_again(&locker, &name).await;
    eprintln!("granted {first:?} after the sentinels held the replica down");
    assert_eq!(five_grants(&locker, &name, set_up.master()).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_masters_without_replicas_writes_do_not_wait() {
    let cluster = block_in_place(RedisCluster::start_without_replicas);
    let locker = (Locker::builder().cluster(cluster.seed_urls()).build())
        .await
        .expect("a locker on a cluster without replicas");
    let over_conn = over_connection(&cluster).await;
    for locker in [&locker, &over_conn] {
        for i in 0..20 {
            let name = unique_name(&format!("unreplicated-{i}"));
            let guard = locker.lock(name.as_str()).await.expect("lock");
            assert!(guard.release().await.is_released());
        }
    }
    for port in cluster.ports() {
        assert_eq!(waits(cluster.node(port)).await, 0, "WAIT sent to {port}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_locker_waits_for_the_replica_unless_told_not_to() {
    let mut set_up = block_in_place(RedisSentinel::start);
    block_in_place(|| set_up.wait_replica_listed_in_sync());
    let builder = || Locker::builder().sentinel(set_up.sentinel_urls(), set_up.master_name());
    let by_default = builder().build().await.expect("a locker on sentinel");
    let unacked = (builder().replica_ack(ReplicaAck::none()).build())
        .await
        .expect("a locker that doesn't wait for replicas");
    let name = unique_name("sentinel-acked-by-default");
    let before = waits(set_up.master()).await;
    let guard = by_default.lock(name.as_str()).await.expect("lock");
    assert!(waits(set_up.master()).await > before);
    assert!(guard.release().await.is_released());

    block_in_place(|| set_up.pause_replica());
    let got = by_default.lock(name.as_str()).await;
    let refused = not_replicated(got);
    let unacked_got = unacked.lock(name.as_str()).await;
    block_in_place(|| set_up.resume_replica());
    assert!(
        refused,
        "a grant its replica could not acknowledge was not refused"
    );
    let guard = unacked_got.expect("a lock that doesn't wait for replicas");
    assert!(guard.release().await.is_released());
}

/// Whether every sentinel last read the replica on `port` as out of sync with its master
/// (`master-link-status err`) while it still calls itself a replica.
async fn listed_out_of_sync(set_up: &RedisSentinel, port: u16) -> bool {
    for sentinel in set_up.sentinels() {
        let mut con = sentinel.connection().await;
        let replicas: Vec<Vec<String>> = redis::cmd("SENTINEL")
            .arg("REPLICAS")
            .arg(set_up.master_name())
            .query_async(&mut con)
            .await
            .expect("SENTINEL REPLICAS");
        let field = |r: &[String], name: &str| {
            (r.chunks(2)).find_map(|kv| (kv[0] == name).then(|| kv[1].clone()))
        };
        let seen = replicas
            .iter()
            .find(|r| field(r, "port") == Some(port.to_string()));
        let out_of_sync = seen.is_some_and(|r| {
            field(r, "master-link-status").as_deref() == Some("err")
                && field(r, "role-reported").as_deref() == Some("slave")
        });
        if !out_of_sync {
            return false;
        }
    }
    true
}

/// A replica that is up and calls itself a replica, but can't sync with its master (here it
/// can no longer authenticate, as after a password rotated on one side only), is still waited
/// for once the sentinels have read it out of sync (they read a replica every ten seconds):
/// its master grants nothing alone, where it granted without waiting before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_master_whose_replica_cannot_sync_grants_nothing_alone() {
    let set_up = block_in_place(RedisSentinel::start);
    block_in_place(|| set_up.wait_replica_listed_in_sync());
    let locker = (Locker::builder().sentinel(set_up.sentinel_urls(), set_up.master_name()))
        .build()
        .await
        .expect("a locker on sentinel");
    let name = unique_name("sentinel-replica-cut-off");
    assert!(five_grants(&locker, &name, set_up.master()).await >= 5);

    let replica = set_up.replica();
    let mut con = replica.connection().await;
    let cut_off = |user: &str, password: &str| {
        let mut pipe = redis::pipe();
        pipe.cmd("CONFIG")
            .arg("SET")
            .arg("masteruser")
            .arg(user)
            .ignore();
        pipe.cmd("CONFIG")
            .arg("SET")
            .arg("masterauth")
            .arg(password)
            .ignore();
        pipe.cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("master")
            .ignore();
        pipe
    };
    let () = (cut_off("nobody", "wrong").query_async(&mut con).await)
        .expect("the replica set to fail its master's AUTH");
    let port = replica.port();
    let give_up = Instant::now() + Duration::from_secs(30);
    while !listed_out_of_sync(&set_up, port).await {
        assert!(
            Instant::now() < give_up,
            "the sentinels did not read the replica out of sync within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Long enough for the Locker to read the list again.
    tokio::time::sleep(RELISTED_WITHIN).await;
    let got = locker.lock(name.as_str()).try_lock().await;
    let refused = matches!(got, Err(LockError::Backend(ref e)) if e.is_not_replicated());
    if let Ok(Some(guard)) = got {
        let _ = guard.release().await;
    }
    let () = (cut_off("", "").query_async(&mut con).await).expect("the replica's AUTH restored");
    assert!(
        refused,
        "a master granted alone while its listed replica could not sync"
    );
}

#[tokio::test]
async fn on_one_server_writes_do_not_wait() {
    let server = RedisServer::start();
    let locker = Locker::connect(&server.url()).await.expect("connect");
    let guard = locker.lock(unique_name("single").as_str()).await;
    assert!(guard.expect("lock").release().await.is_released());
    assert_eq!(waits(&server).await, 0);
}
