//! What a failover does to locks, with real master and replica processes: a promoted replica that
//! missed the latest grants still hands out fencing tokens above every token granted before.

use std::time::Duration;

use dlock_core::Locker;
use dlock_core::redis::{self, AsyncCommands as _};
use dlock_tests::{Proxy, RedisServer, unique_name};

/// A connection that waits up to 10 s for an answer (for `WAIT`).
async fn patient(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    let config =
        redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(10)));
    (server.client())
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .expect("connect")
}

/// Makes `replica` a replica of `master` through `link` and waits until it has everything
/// `master` has.
async fn replicate(master: &RedisServer, replica: &RedisServer, link: &Proxy) {
    let mut con = replica.connection().await;
    let () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(link.port())
        .query_async(&mut con)
        .await
        .expect("REPLICAOF");
    acknowledged(master).await;
}

/// Waits until the replica has acknowledged every write the master has.
async fn acknowledged(master: &RedisServer) {
    let mut con = patient(master).await;
    let () = con.set("dlock-test:sync", 1).await.expect("SET");
    for _ in 0..50 {
        let acked: i64 = (redis::cmd("WAIT").arg(1).arg(200))
            .query_async(&mut con)
            .await
            .expect("WAIT");
        if acked == 1 {
            return;
        }
    }
    panic!("the replica never acknowledged");
}

/// A replica cut off from its master while the master granted 50 more holds is promoted after
/// the master dies: its copy of the fencing counter is 50 grants behind, yet the next token is above
/// every token the dead master gave.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_keep_rising_across_a_failover_that_lost_the_latest_grants() {
    let args = ["--repl-diskless-sync-delay", "0"];
    let mut master = RedisServer::start_with_args(&args);
    let replica = RedisServer::start_with_args(&args);
    let link = Proxy::start(master.addr()).await;
    replicate(&master, &replica, &link).await;

    let name = unique_name("failover-fence");
    let on_master = Locker::connect(&master.url()).await.expect("connect");
    let fence_key = format!("{}:fence", on_master.key_of(name.as_str()).unwrap());
    let mut last = 0;
    for _ in 0..5 {
        let guard = on_master.lock(name.as_str()).await.expect("lock");
        last = guard.fencing_token().get();
        assert!(guard.release().await.is_released());
    }
    acknowledged(&master).await;
    let replicated: u64 = replica
        .connection()
        .await
        .hget(&fence_key, "n")
        .await
        .unwrap();
    assert_eq!(replicated, last, "the replica has the first five grants");

    link.cut();
    for _ in 0..50 {
        let guard = on_master.lock(name.as_str()).await.expect("lock");
        let token = guard.fencing_token().get();
        assert!(token > last, "token {token} after {last}");
        last = token;
        assert!(guard.release().await.is_released());
    }
    master.kill();
    let mut con = replica.connection().await;
    let () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query_async(&mut con)
        .await
        .expect("REPLICAOF NO ONE");
    let stale: u64 = con.hget(&fence_key, "n").await.unwrap();
    assert!(
        stale < last,
        "the promoted replica missed the latest grants (it has {stale}, the master gave {last})"
    );

    let on_replica = Locker::connect(&replica.url()).await.expect("connect");
    let guard = on_replica.lock(name.as_str()).await.expect("lock");
    let token = guard.fencing_token().get();
    assert!(
        token > last,
        "the promoted replica granted token {token}, not above the dead master's last {last}"
    );
    assert!(guard.release().await.is_released());
}
