//! The scale-out harnesses do what they say: a real cluster forms, fails over, loses a master,
//! migrates a slot, and a cluster client follows each time; a real sentinel set-up reports its
//! master, fails over, replaces a killed master, and a sentinel client follows.
//!
//! What is guaranteed, and so asserted: a coordinated failover loses nothing; a write the replica
//! acknowledged (`WAIT 1`) survives its master's death. A write it had not acknowledged may be
//! lost when the master dies — there is no persistence and replication is asynchronous — so no
//! test counts on one.
//!
//! The harness blocks while it polls; tests that keep a client connection across a fault run on
//! two worker threads and call it inside `block_in_place`.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use dlock_core::redis::{self, AsyncCommands as _};
use dlock_tests::cluster::{ClusterNode, SLOTS, key_slot};
use dlock_tests::{RedisCluster, RedisSentinel, RedisServer};
use tokio::task::block_in_place;

/// Reads `key` through `con` until it answers (a cluster client errs while it finds a promoted
/// master), for at most `within`.
async fn read_until_answered(
    con: &mut redis::cluster_async::ClusterConnection,
    key: &str,
    within: Duration,
) -> Option<String> {
    let started = Instant::now();
    loop {
        match con.get(key).await {
            Ok(value) => return value,
            Err(err) if started.elapsed() < within => {
                eprintln!("GET {key} through the cluster client: {err}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(err) => panic!("GET {key} failed for {within:?}: {err}"),
        }
    }
}

/// A connection that waits up to 10 s for an answer (redis-rs's default is 500 ms), for `WAIT`.
async fn patient(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    (server.client())
        .get_multiplexed_async_connection_with_config(&patient_config())
        .await
        .unwrap()
}

fn patient_config() -> redis::AsyncConnectionConfig {
    redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(10)))
}

/// `SET key value` then `WAIT 1` on one connection to the master: once this returns, the
/// replica has the write.
async fn set_acknowledged(con: &mut redis::aio::MultiplexedConnection, key: &str, value: &str) {
    let () = con.set(key, value).await.unwrap();
    let acknowledged: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(5000)
        .query_async(con)
        .await
        .unwrap();
    assert_eq!(acknowledged, 1, "the replica did not acknowledge {key}");
}

/// The count of `error` replies (`ASK`, `MOVED`) a node has sent, from `INFO errorstats`.
fn errors_sent(cluster: &RedisCluster, port: u16, error: &str) -> u64 {
    let info = cluster.node(port).info("errorstats");
    let prefix = format!("errorstat_{error}:count=");
    (info.lines())
        .find_map(|line| line.trim().strip_prefix(prefix.as_str()))
        .map_or(0, |count| count.parse().unwrap())
}

fn other_master(cluster: &RedisCluster, than: &ClusterNode) -> ClusterNode {
    (cluster.masters().into_iter())
        .find(|m| m.id != than.id)
        .expect("three masters")
}

#[test]
fn a_cluster_forms_with_three_masters_serving_every_slot_and_a_replica_each() {
    let cluster = RedisCluster::start();
    let masters = cluster.masters();
    assert_eq!(masters.len(), 3, "{masters:#?}");
    let mut served = vec![false; usize::from(SLOTS)];
    for slot in masters
        .iter()
        .flat_map(|m| m.slots.iter().cloned().flatten())
    {
        assert!(!served[usize::from(slot)], "slot {slot} is served twice");
        served[usize::from(slot)] = true;
    }
    assert!(served.iter().all(|s| *s), "a slot is not served");
    let replicas = cluster.replicas();
    assert_eq!(replicas.len(), 3, "{replicas:#?}");
    let followed: BTreeSet<&str> = replicas
        .iter()
        .flat_map(|r| r.master_id.as_deref())
        .collect();
    let ids: BTreeSet<&str> = masters.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(followed, ids, "each master has one replica");
    assert_eq!(cluster.seed_urls().len(), 6);
    // Every node says so itself.
    for port in cluster.ports() {
        let info = cluster.node(port).info("cluster");
        assert!(info.contains("cluster_enabled:1"), "{port}: {info}");
        let mut con = cluster.node(port).client().get_connection().unwrap();
        let state: String = redis::cmd("CLUSTER").arg("INFO").query(&mut con).unwrap();
        assert!(state.contains("cluster_state:ok"), "{port}: {state}");
        assert!(state.contains("cluster_slots_ok:16384"), "{port}: {state}");
    }
}

#[tokio::test]
async fn key_slots_and_owners_are_the_ones_the_servers_use() {
    let cluster = RedisCluster::start();
    let mut any = cluster.node(cluster.ports()[0]).connection().await;
    let mut keys: Vec<Vec<u8>> = [
        "",
        "foo",
        "123456789",
        "{user1000}.following",
        "{user1000}.followers",
        "foo{}{bar}",
        "foo{{bar}}zap",
        "foo{bar",
        "foo}bar{",
        "dlock:{order:1}:owner",
        "ünïcödé",
    ]
    .map(|k| k.as_bytes().to_vec())
    .to_vec();
    keys.push(vec![0xff, 0x00, b'{', 0x01, b'}', 0x80]);
    keys.extend((0..200).map(|i| format!("key-{i}").into_bytes()));
    for key in &keys {
        let slot: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key.as_slice())
            .query_async(&mut any)
            .await
            .unwrap();
        assert_eq!(key_slot(key), slot, "{:?}", String::from_utf8_lossy(key));
    }
    // The owner takes the key; another master sends the client to it.
    for key in ["foo", "{user1000}.following", "key-7"] {
        let owner = cluster.node_for_key(key);
        let mut con = cluster.node(owner.port).connection().await;
        let () = con.set(key, 1).await.unwrap();
        let other = other_master(&cluster, &owner);
        let mut con = cluster.node(other.port).connection().await;
        let err = con.set::<_, _, ()>(key, 1).await.unwrap_err();
        assert_eq!(err.code(), Some("MOVED"), "{err}");
        let to = format!("127.0.0.1:{}", owner.port);
        assert_eq!(
            err.redirect_node(),
            Some((to.as_str(), key_slot(key.as_bytes())))
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_client_reads_its_key_after_a_coordinated_failover() {
    let cluster = RedisCluster::start();
    let mut con = cluster.client().get_async_connection().await.unwrap();
    let key = "harness:failover";
    let () = con.set(key, "before").await.unwrap();
    let master = cluster.node_for_key(key);
    let replica = cluster.replica_of(&master);

    let started = Instant::now();
    block_in_place(|| cluster.failover(replica.port));
    eprintln!(
        "coordinated failover, until the cluster is ok: {:?}",
        started.elapsed()
    );

    let owner = cluster.node_for_key(key);
    assert_eq!(owner.port, replica.port, "the replica serves the slot");
    assert_eq!(
        cluster.replica_of(&owner).port,
        master.port,
        "the old master follows it"
    );
    // The same connection follows the old master's MOVED; nothing was lost.
    let value: Option<String> = con.get(key).await.unwrap();
    assert_eq!(value.as_deref(), Some("before"));
    let () = con.set(key, "after").await.unwrap();
    let mut direct = cluster.node(replica.port).connection().await;
    let value: Option<String> = direct.get(key).await.unwrap();
    assert_eq!(
        value.as_deref(),
        Some("after"),
        "the write went to the new master"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_the_replica_acknowledged_survives_killing_its_master() {
    let mut cluster = RedisCluster::start();
    let mut con = cluster.client().get_async_connection().await.unwrap();
    let key = "harness:kill";
    let master = cluster.node_for_key(key);
    let replica = cluster.replica_of(&master);
    let mut direct = patient(cluster.node(master.port)).await;
    set_acknowledged(&mut direct, key, "kept").await;
    assert_eq!(con.get::<_, String>(key).await.unwrap(), "kept");

    let started = Instant::now();
    cluster.kill(master.port);
    block_in_place(|| cluster.wait_ok());
    eprintln!(
        "master killed, until the cluster is ok: {:?}",
        started.elapsed()
    );
    assert_eq!(
        cluster.node_for_key(key).port,
        replica.port,
        "the replica is promoted"
    );
    let value = read_until_answered(&mut con, key, Duration::from_secs(30)).await;
    eprintln!(
        "master killed, until the client read: {:?}",
        started.elapsed()
    );
    assert_eq!(value.as_deref(), Some("kept"));

    // The killed master comes back, empty, as a replica of its successor, and syncs from it.
    cluster.restart(master.port);
    block_in_place(|| cluster.wait_ok());
    let owner = cluster.node_for_key(key);
    assert_eq!(owner.port, replica.port);
    assert_eq!(cluster.replica_of(&owner).port, master.port);
    let mut restarted = cluster.node(master.port).connection().await;
    let () = redis::cmd("READONLY")
        .query_async(&mut restarted)
        .await
        .unwrap();
    let value: Option<String> = restarted.get(key).await.unwrap();
    assert_eq!(value.as_deref(), Some("kept"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_demotes_a_paused_master_when_it_resumes() {
    let mut cluster = RedisCluster::start();
    let key = "harness:takeover";
    let master = cluster.node_for_key(key);
    let replica = cluster.replica_of(&master);
    let mut direct = patient(cluster.node(master.port)).await;
    set_acknowledged(&mut direct, key, "kept").await;

    cluster.pause(master.port);
    let started = Instant::now();
    block_in_place(|| cluster.takeover(replica.port));
    eprintln!("takeover from a paused master: {:?}", started.elapsed());
    assert_eq!(cluster.node_for_key(key).port, replica.port);

    cluster.resume(master.port);
    block_in_place(|| cluster.wait_ok());
    let owner = cluster.node_for_key(key);
    assert_eq!(
        cluster.replica_of(&owner).port,
        master.port,
        "the old master follows"
    );
    // A client still talking to the old master is sent to the new one.
    let err = direct.set::<_, _, ()>(key, "late").await.unwrap_err();
    assert_eq!(err.code(), Some("MOVED"), "{err}");
    let mut new = cluster.node(replica.port).connection().await;
    let value: Option<String> = new.get(key).await.unwrap();
    assert_eq!(value.as_deref(), Some("kept"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migrating_slot_answers_ask_then_moved_and_a_cluster_client_follows_both() {
    let cluster = RedisCluster::start();
    let mut con = cluster.client().get_async_connection().await.unwrap();
    let (moving, staying) = ("{harness:migrate}:moving", "{harness:migrate}:staying");
    let () = con.set(moving, "m").await.unwrap();
    let () = con.set(staying, "s").await.unwrap();
    let slot = key_slot(moving.as_bytes());
    let from = cluster.master_for_slot(slot);
    let to = other_master(&cluster, &from);
    let to_addr = format!("127.0.0.1:{}", to.port);
    let mut source = cluster.node(from.port).connection().await;

    // Half-way: one key moved, one not.
    let migration = block_in_place(|| cluster.begin_migration(slot, to.port));
    block_in_place(|| cluster.migrate_keys(&migration, &[moving]));
    let err = source.get::<_, String>(moving).await.unwrap_err();
    assert_eq!(err.code(), Some("ASK"), "{err}");
    assert_eq!(err.redirect_node(), Some((to_addr.as_str(), slot)));
    assert_eq!(source.get::<_, String>(staying).await.unwrap(), "s");
    let asks = errors_sent(&cluster, from.port, "ASK");
    assert_eq!(con.get::<_, String>(moving).await.unwrap(), "m");
    assert!(
        errors_sent(&cluster, from.port, "ASK") > asks,
        "the client was not sent on with ASK"
    );
    assert_eq!(con.get::<_, String>(staying).await.unwrap(), "s");

    // Done: the slot is the other master's.
    block_in_place(|| cluster.finish_migration(migration));
    assert_eq!(cluster.master_for_slot(slot).port, to.port);
    let err = source.get::<_, String>(staying).await.unwrap_err();
    assert_eq!(err.code(), Some("MOVED"), "{err}");
    assert_eq!(err.redirect_node(), Some((to_addr.as_str(), slot)));
    let moved = errors_sent(&cluster, from.port, "MOVED");
    assert_eq!(con.get::<_, String>(staying).await.unwrap(), "s");
    assert_eq!(con.get::<_, String>(moving).await.unwrap(), "m");
    assert!(
        errors_sent(&cluster, from.port, "MOVED") > moved,
        "the client was not sent on with MOVED"
    );
    // A whole-slot move in one call, back where it came from.
    block_in_place(|| cluster.migrate_slot(slot, from.port));
    assert_eq!(cluster.master_for_slot(slot).port, from.port);
    assert_eq!(con.get::<_, String>(moving).await.unwrap(), "m");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinels_know_the_master_the_replica_and_each_other() {
    let sentinel = RedisSentinel::start();
    let [first, second] = sentinel.data_ports()[..] else {
        panic!("two data nodes")
    };
    assert_eq!(sentinel.master_port(), first);
    assert_eq!(sentinel.replica().port(), second);
    assert_eq!(sentinel.sentinel_urls().len(), 3);
    for node in sentinel.sentinels() {
        let mut con = node.client().get_connection().unwrap();
        let state: Vec<String> = redis::cmd("SENTINEL")
            .arg("MASTER")
            .arg(sentinel.master_name())
            .query(&mut con)
            .unwrap();
        let value = |name: &str| {
            let at = state.iter().position(|s| s == name).unwrap();
            state[at + 1].clone()
        };
        assert_eq!(value("port"), first.to_string());
        assert_eq!(value("quorum"), "2");
        assert_eq!(value("num-other-sentinels"), "2");
        assert_eq!(value("num-slaves"), "1");
    }
    // A redis-rs sentinel client finds the master; the replica gets the write.
    let mut con = (sentinel.client())
        .get_async_connection_with_config(&patient_config())
        .await
        .unwrap();
    set_acknowledged(&mut con, "harness:sentinel", "v").await;
    let mut replica = sentinel.replica().connection().await;
    let value: Option<String> = replica.get("harness:sentinel").await.unwrap();
    assert_eq!(value.as_deref(), Some("v"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_failover_moves_the_master_and_a_sentinel_client_follows() {
    let sentinel = RedisSentinel::start();
    let old = sentinel.master_port();
    let replica = sentinel.replica().port();
    let mut client = sentinel.client();
    let mut con = (client.get_async_connection_with_config(&patient_config()))
        .await
        .unwrap();
    set_acknowledged(&mut con, "harness:failover", "before").await;

    let started = Instant::now();
    let new = block_in_place(|| sentinel.failover());
    eprintln!("SENTINEL FAILOVER, until promoted: {:?}", started.elapsed());
    assert_eq!(new, replica);
    assert_ne!(new, old);
    // A new connection from the same client goes to the new master.
    let mut con = client.get_async_connection().await.unwrap();
    let value: Option<String> = con.get("harness:failover").await.unwrap();
    assert_eq!(value.as_deref(), Some("before"));
    let () = con.set("harness:failover", "after").await.unwrap();
    let mut direct = sentinel.data_node(new).connection().await;
    let value: Option<String> = direct.get("harness:failover").await.unwrap();
    assert_eq!(value.as_deref(), Some("after"));

    // The sentinels make the old master a replica of the new one.
    block_in_place(|| sentinel.wait_ready());
    eprintln!("SENTINEL FAILOVER, until ready: {:?}", started.elapsed());
    assert_eq!(sentinel.replica().port(), old);
    let info = sentinel.data_node(old).info("replication");
    assert!(info.contains(&format!("master_port:{new}")), "{info}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_master_promotes_the_replica_within_twenty_seconds() {
    let mut sentinel = RedisSentinel::start();
    let replica = sentinel.replica().port();
    let mut con = patient(sentinel.master()).await;
    set_acknowledged(&mut con, "harness:kill", "kept").await;

    let started = Instant::now();
    let old = sentinel.kill_master();
    let new = block_in_place(|| sentinel.wait_promotion(old, Duration::from_secs(20)));
    eprintln!("master killed, until promoted: {:?}", started.elapsed());
    assert_eq!(new, replica);
    let mut con = sentinel.data_node(new).connection().await;
    let value: Option<String> = con.get("harness:kill").await.unwrap();
    assert_eq!(value.as_deref(), Some("kept"));

    // Restarted, the old master is empty until the sentinels make it follow the new one.
    sentinel.restart(old);
    let restarted = Instant::now();
    block_in_place(|| sentinel.wait_ready());
    eprintln!(
        "old master restarted, until ready: {:?}",
        restarted.elapsed()
    );
    assert_eq!(sentinel.replica().port(), old);
    let mut con = sentinel.data_node(old).connection().await;
    let value: Option<String> = con.get("harness:kill").await.unwrap();
    assert_eq!(value.as_deref(), Some("kept"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_replica_acknowledges_nothing_until_resumed() {
    let mut sentinel = RedisSentinel::start();
    let mut con = patient(sentinel.master()).await;
    let replica = sentinel.pause_replica();
    let () = con.set("harness:lag", "v").await.unwrap();
    let acknowledged: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(300)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(acknowledged, 0, "a paused replica acknowledged a write");
    sentinel.resume_replica();
    let acknowledged: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(5000)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(acknowledged, 1);
    let mut replica = sentinel.data_node(replica).connection().await;
    let value: Option<String> = replica.get("harness:lag").await.unwrap();
    assert_eq!(value.as_deref(), Some("v"));
}
