//! The test harness: real `redis-server` processes on free loopback ports, a proxy that can cut
//! connections, lock holders in processes of their own, and the cross-crate tests.
//!
//! - [`RedisServer`] spawns `redis-server` (the binary named by `DLOCK_REDIS_SERVER`, default
//!   `redis-server`), kills it on drop, and can kill, restart, pause and resume it; [`Proxy`]
//!   forwards a loopback port to a server and can cut every connection through it;
//!   [`RedisCluster`] ([`cluster`]) is a Redis Cluster of three masters and three replicas,
//!   [`RedisSentinel`] ([`sentinel`]) a master, a replica and three sentinels.
//! - [`checker`] is the randomized, seeded, replayable history checker for dlock-core.
//!
//! Those two live in the `dlock-checker` crate, so that the `dlock` command line can run the
//! checker without this crate; they are re-exported here under the paths the tests use.
//!
//! - [`holder`] runs a lock holder in a process of its own (the `holder` binary), to be killed and
//!   stopped for real; it writes to a [`fenced`] resource that refuses stale fencing tokens.
//! - [`capture`] keeps every span and event, [`tls`] starts a server that speaks TLS, and
//!   [`handover`] releases a lock to a waiter.
//!
//! A missing `redis-server` binary is a loud failure naming the command that installs it.

use std::process::{Command, Stdio};
use std::time::Duration;

pub mod capture;
pub mod fenced;
pub mod handover;
pub mod holder;
pub mod shares;
pub mod tls;

pub use dlock_checker as checker;
use dlock_checker::redis_server_binary;
pub use dlock_checker::{
    PostgresServer, Proxy, REDIS_SERVER_ENV, RedisCluster, RedisSentinel, RedisServer, cluster,
    free_port, hold, layouts, require_redis_server, script_calls, sentinel, unique_name,
};

/// The Redis to use for a demo: `DLOCK_URL` if set, otherwise a `redis-server` started here
/// (announced on stdout, killed when the returned server is dropped). A missing binary is an
/// error message naming the install command, for the caller to print.
pub fn redis_from_env_or_start() -> Result<(String, Option<RedisServer>), String> {
    if let Some(url) = std::env::var("DLOCK_URL")
        .ok()
        .filter(|u| !u.trim().is_empty())
    {
        return Ok((url, None));
    }
    let binary = redis_server_binary();
    let found = Command::new(&binary)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        return Err(format!(
            "`{binary}` was not found: install it with `apt-get install redis-server`, \
             or set DLOCK_URL to a running server"
        ));
    }
    let server = RedisServer::start();
    println!("started redis-server on port {}", server.port());
    Ok((server.url(), Some(server)))
}

/// `CLIENT PAUSE <ms> WRITE` on `con`: the server holds every write (every dlock script) for
/// `ms`, and key expiry with it, while reads go on — a slow server, for real.
pub async fn pause_writes(con: &mut redis::aio::MultiplexedConnection, ms: u64) {
    let () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(ms)
        .arg("WRITE")
        .query_async(con)
        .await
        .expect("CLIENT PAUSE");
}

/// `CLIENT UNPAUSE` on `con`.
pub async fn unpause(con: &mut redis::aio::MultiplexedConnection) {
    let () = redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query_async(con)
        .await
        .expect("CLIENT UNPAUSE");
}

/// Exits the process as soon as its standard input closes: for helper binaries that tests
/// start, so that none outlives the test that started it.
pub fn exit_when_stdin_closes() {
    std::thread::spawn(|| {
        use std::io::Read as _;
        let mut sink = [0u8; 64];
        let mut stdin = std::io::stdin();
        while matches!(stdin.read(&mut sink), Ok(n) if n > 0) {}
        std::process::exit(3);
    });
}

/// Waits (up to 3 s) until `inspect` counts `n` `Locker`s waiting for `name`; returns the last
/// reading, whether or not it got there.
pub async fn until_waiting(
    locker: &dlock_core::Locker,
    name: &str,
    n: u64,
) -> dlock_core::LockInfo {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    loop {
        let info = locker.inspect(name).await.expect("inspect");
        if info.waiting_lockers == n || tokio::time::Instant::now() >= deadline {
            return info;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
