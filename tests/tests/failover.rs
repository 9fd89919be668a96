//! What a failover does to locks, with real master and replica processes: a promoted replica that
//! missed the latest grants still hands out fencing tokens above every token granted before.

use std::time::Duration;

use dlock_core::redis::{self, AsyncCommands as _};
use dlock_core::{Locker, ReplicaAck};
use dlock_tests::hold::HoldValue;
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
        last = guard.fencing_token().await.unwrap().get();
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
        let token = guard.fencing_token().await.unwrap().get();
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
    let token = guard.fencing_token().await.unwrap().get();
    assert!(
        token > last,
        "the promoted replica granted token {token}, not above the dead master's last {last}"
    );
    assert!(guard.release().await.is_released());
}

/// A master with a replica behind a proxy that can cut replication, and a `Locker` on the
/// master whose writes must be acknowledged by that replica.
struct Acked {
    master: RedisServer,
    replica: RedisServer,
    link: Proxy,
    locker: Locker,
}

const ACK_TIMEOUT: Duration = Duration::from_millis(400);

async fn acked(lease: Duration) -> Acked {
    let args = ["--repl-diskless-sync-delay", "0"];
    let master = RedisServer::start_with_args(&args);
    let replica = RedisServer::start_with_args(&args);
    let link = Proxy::start(master.addr()).await;
    replicate(&master, &replica, &link).await;
    let locker = Locker::builder()
        .url(master.url())
        .replica_ack(ReplicaAck::new(1, ACK_TIMEOUT))
        .default_lease(dlock_core::Lease::watchdog(lease))
        .build()
        .await
        .expect("connect");
    Acked {
        master,
        replica,
        link,
        locker,
    }
}

/// Waits until the replica lists no replica link to the master (the cut reached the master).
async fn replica_gone(master: &RedisServer) {
    for _ in 0..100 {
        let info = master.info("replication");
        if info.contains("connected_slaves:0") {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the master still lists its replica");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_grants_are_on_the_replica_when_the_call_returns() {
    let set_up = acked(Duration::from_secs(30)).await;
    let mut on_replica = set_up.replica.connection().await;
    for i in 0..20 {
        let name = format!("acked-{i}");
        let key = set_up.locker.key_of(name.as_str()).unwrap();
        let guard = (set_up.locker.lock(name.as_str()))
            .wait(Duration::from_secs(5))
            .await
            .expect("lock");
        // The grant is the owner on the lock's key (its token is minted later, when asked
        // for): the replica has it as soon as the call returns.
        let hold = HoldValue::read(&mut on_replica, &key)
            .await
            .expect("GET on the replica");
        assert!(
            hold.as_ref().is_some_and(|h| h.owner.is_some()),
            "the replica has grant {i}: {hold:?}"
        );
        let token = guard.fencing_token().await.expect("a token");
        assert!(guard.release().await.is_released());
        assert!(token.get() > 0);
    }
}

/// The roll-back of a grant no replica acknowledged is done when the call returns, so the
/// caller's next try finds the name free. On one thread, and the key read at once over a
/// blocking connection: a roll-back left to the background could not have run yet.
#[tokio::test(flavor = "current_thread")]
async fn a_grant_no_replica_acknowledges_is_rolled_back_before_the_call_returns() {
    let set_up = acked(Duration::from_secs(30)).await;
    set_up.link.cut();
    replica_gone(&set_up.master).await;
    let name = unique_name("unacked-at-once");
    let key = set_up.locker.key_of(name.as_str()).unwrap();
    let client = redis::Client::open(set_up.master.url()).expect("a client");
    let mut blocking = client.get_connection().expect("a blocking connection");
    for attempt in 0..2 {
        match set_up.locker.lock(name.as_str()).try_lock().await {
            Err(dlock_core::LockError::Backend(err)) => {
                assert!(err.is_not_replicated(), "attempt {attempt}: {err}")
            }
            Ok(None) => panic!("attempt {attempt}: told the name is taken by nobody"),
            Ok(Some(_)) => panic!("attempt {attempt}: granted without a replica"),
            Err(err) => panic!("attempt {attempt}: {err}"),
        }
        let left: bool = redis::cmd("EXISTS")
            .arg(&key)
            .query(&mut blocking)
            .expect("EXISTS");
        assert!(
            !left,
            "attempt {attempt}: the grant is still there when the call returns"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_no_replica_acknowledges_fails_cleanly_and_is_rolled_back() {
    let set_up = acked(Duration::from_secs(30)).await;
    set_up.link.cut();
    replica_gone(&set_up.master).await;
    let name = unique_name("unacked");
    let key = set_up.locker.key_of(name.as_str()).unwrap();

    let started = std::time::Instant::now();
    let err = set_up
        .locker
        .lock(name.as_str())
        .try_lock()
        .await
        .unwrap_err();
    let elapsed = started.elapsed();
    let dlock_core::LockError::Backend(backend) = &err else {
        panic!("expected a backend error, got {err}");
    };
    assert!(backend.is_not_replicated(), "{err}");
    assert_eq!(backend.acknowledgements(), Some((0, 1)));
    assert!(
        elapsed >= ACK_TIMEOUT && elapsed < ACK_TIMEOUT + Duration::from_secs(1),
        "answered after {elapsed:?}"
    );
    let mut con = set_up.master.connection().await;
    let mut left = true;
    for _ in 0..50 {
        left = con.exists(&key).await.unwrap();
        if !left {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!left, "the unacknowledged grant was not rolled back");

    // With a wait, the request retries within it and returns the error at its end.
    let started = std::time::Instant::now();
    let err = (set_up.locker.lock(name.as_str()))
        .wait(Duration::from_millis(700))
        .await
        .unwrap_err();
    assert!(err.is_backend(), "{err}");
    assert!(started.elapsed() < Duration::from_millis(700) + Duration::from_secs(2));

    // Replication back: grants count again.
    set_up.link.restore();
    acknowledged(&set_up.master).await;
    let guard = (set_up.locker.lock(name.as_str()))
        .wait(Duration::from_secs(5))
        .await
        .expect("lock");
    assert!(guard.release().await.is_released());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_renewals_are_not_acknowledged_reports_the_loss_at_its_deadline() {
    let lease = Duration::from_millis(900);
    let set_up = acked(lease).await;
    let name = unique_name("unacked-renewals");
    let guard = (set_up.locker.lock(name.as_str()))
        .wait(Duration::from_secs(5))
        .await
        .expect("lock");
    let valid_until = guard.valid_until();
    set_up.link.cut();
    tokio::time::timeout(lease + Duration::from_secs(1), guard.lost())
        .await
        .expect("the loss is reported");
    let reported = tokio::time::Instant::now();
    assert!(
        reported >= valid_until,
        "reported {:?} before the last acknowledged validity ended",
        valid_until - reported
    );
    assert!(guard.is_lost());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_no_replica_acknowledges_still_releases() {
    let set_up = acked(Duration::from_secs(30)).await;
    let name = unique_name("unacked-release");
    let key = set_up.locker.key_of(name.as_str()).unwrap();
    let guard = (set_up.locker.lock(name.as_str()))
        .wait(Duration::from_secs(5))
        .await
        .expect("lock");
    set_up.link.cut();
    replica_gone(&set_up.master).await;
    assert!(guard.release().await.is_released());
    let exists: bool = set_up.master.connection().await.exists(&key).await.unwrap();
    assert!(!exists);
}

#[tokio::test]
async fn replica_acknowledgement_that_cannot_work_is_refused_at_build() {
    let server = RedisServer::start();
    let cases = [
        (
            ReplicaAck::new(0, Duration::from_millis(100)),
            "at least one replica",
        ),
        (ReplicaAck::new(1, Duration::ZERO), "above zero"),
        (
            ReplicaAck::new(1, Duration::from_secs(2)),
            "under the command timeout",
        ),
    ];
    for (ack, expected) in cases {
        let err = Locker::builder()
            .url(server.url())
            .replica_ack(ack)
            .build()
            .await
            .unwrap_err();
        assert!(
            err.is_config() && err.to_string().contains(expected),
            "{err}"
        );
    }
    let err = Locker::builder()
        .memory(dlock_core::MemoryStore::new())
        .replica_ack(ReplicaAck::new(1, Duration::from_millis(100)))
        .build()
        .await
        .unwrap_err();
    assert!(
        err.is_config() && err.to_string().contains("needs Redis"),
        "{err}"
    );
}

/// Whether the server on `server` knows `WAITAOF` (Redis and Valkey 7.2 or newer).
async fn knows_waitaof(server: &RedisServer) -> bool {
    let mut con = server.connection().await;
    let info: Vec<redis::Value> = redis::cmd("COMMAND")
        .arg("INFO")
        .arg("WAITAOF")
        .query_async(&mut con)
        .await
        .expect("COMMAND INFO");
    info.first().is_some_and(|v| *v != redis::Value::Nil)
}

/// With fsync, a grant counts once the replica wrote it to its append-only file: granted when
/// the replica runs with `appendonly yes`, refused (and rolled back) when it does not. A server
/// without `WAITAOF` is refused when the `Locker` is built.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fsynced_acknowledgement_needs_waitaof_and_a_replica_with_an_append_only_file() {
    let args = ["--repl-diskless-sync-delay", "0"];
    let master = RedisServer::start_with_args(&args);
    let replica = RedisServer::start_with_args(&[
        "--repl-diskless-sync-delay",
        "0",
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
    ]);
    let link = Proxy::start(master.addr()).await;
    replicate(&master, &replica, &link).await;
    let ack = ReplicaAck::new(1, Duration::from_millis(300)).with_fsync();
    let built = Locker::builder()
        .url(master.url())
        .replica_ack(ack)
        .build()
        .await;
    if !knows_waitaof(&master).await {
        let err = built.unwrap_err();
        assert!(
            err.is_config() && err.to_string().contains("WAITAOF"),
            "{err}"
        );
        eprintln!("this server has no WAITAOF: refused at build ({err})");
        return;
    }
    let locker = built.expect("a locker with fsynced acknowledgement");
    let name = unique_name("fsynced");
    // A replica that just synced rewrites its append-only file before it reports fsyncs: the
    // first grants are refused until then, and the request retries within its wait.
    let guard = (locker.lock(name.as_str()))
        .wait(Duration::from_secs(10))
        .await
        .expect("lock");
    assert!(guard.release().await.is_released());

    // A replica without an append-only file never acknowledges an fsync.
    let mut con = replica.connection().await;
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("appendonly")
        .arg("no")
        .query_async(&mut con)
        .await
        .expect("CONFIG SET appendonly no");
    let err = locker.lock(name.as_str()).try_lock().await.unwrap_err();
    let dlock_core::LockError::Backend(backend) = &err else {
        panic!("expected a backend error, got {err}");
    };
    assert!(backend.is_not_replicated(), "{err}");
}
