//! The harness itself: servers start, die, restart, pause; the proxy forwards and cuts.

use std::time::Duration;

use dlock_core::redis::{self, AsyncCommands as _};
use dlock_tests::{Proxy, RedisServer};

#[tokio::test]
async fn a_server_starts_restarts_on_the_same_port_and_forgets_its_data() {
    let mut server = RedisServer::start();
    let port = server.port();
    let mut con = server.connection().await;
    let () = con.set("k", 1).await.unwrap();
    server.restart();
    assert_eq!(server.port(), port);
    let mut con = server.connection().await;
    let value: Option<i64> = con.get("k").await.unwrap();
    assert_eq!(value, None);
    assert!(server.log().contains("Ready to accept connections"));
}

#[tokio::test]
async fn a_paused_server_answers_nothing_until_resumed() {
    let server = RedisServer::start();
    let mut con = server.connection().await;
    server.pause();
    let ping = tokio::time::timeout(
        Duration::from_millis(300),
        redis::cmd("PING").query_async::<String>(&mut con),
    )
    .await;
    assert!(ping.is_err(), "a paused server answered");
    server.resume();
    let pong = tokio::time::timeout(
        Duration::from_secs(5),
        redis::cmd("PING").query_async::<String>(&mut con),
    )
    .await
    .expect("the resumed server answers")
    .unwrap();
    assert_eq!(pong, "PONG");
}

#[tokio::test]
async fn the_proxy_forwards_cuts_and_restores() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.addr()).await;
    let client = redis::Client::open(proxy.url()).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let () = con.set("through", 7).await.unwrap();
    proxy.cut();
    let cut = tokio::time::timeout(Duration::from_secs(2), con.get::<_, i64>("through")).await;
    assert!(matches!(cut, Ok(Err(_))), "a cut connection still answered");
    let refused = tokio::time::timeout(
        Duration::from_secs(2),
        client.get_multiplexed_async_connection(),
    )
    .await;
    assert!(
        !matches!(refused, Ok(Ok(_))),
        "a new connection got through a cut proxy"
    );
    proxy.restore();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let value: i64 = con.get("through").await.unwrap();
    assert_eq!(value, 7);
}

#[tokio::test]
async fn a_stalled_proxy_answers_nothing_until_it_is_unstalled() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.addr()).await;
    let client = redis::Client::open(proxy.url()).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let () = con.set("held", 3).await.unwrap();
    proxy.stall();
    let mut reading = con.clone();
    let read = tokio::spawn(async move { reading.get::<_, i64>("held").await });
    let connecting = tokio::spawn({
        let client = client.clone();
        async move { client.get_multiplexed_async_connection().await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!read.is_finished(), "a stalled proxy answered");
    assert!(
        !connecting.is_finished(),
        "a stalled proxy let a handshake through"
    );
    proxy.unstall();
    let value = tokio::time::timeout(Duration::from_secs(2), read)
        .await
        .expect("answered once unstalled")
        .expect("task");
    assert_eq!(value.unwrap(), 3);
    let mut fresh = tokio::time::timeout(Duration::from_secs(2), connecting)
        .await
        .expect("connected once unstalled")
        .expect("task")
        .unwrap();
    let value: i64 = fresh.get("held").await.unwrap();
    assert_eq!(value, 3);
}

#[tokio::test]
async fn commandstats_count_commands() {
    let server = RedisServer::start();
    let mut con = server.connection().await;
    for _ in 0..3 {
        let () = con.set("c", 1).await.unwrap();
    }
    assert_eq!(server.info_commandstats().get("set"), Some(&3));
}

#[tokio::test]
async fn a_server_answers_ping_on_its_loopback_port() {
    let server = RedisServer::start();
    assert_eq!(
        server.url(),
        format!("redis://127.0.0.1:{}/", server.port())
    );
    assert_eq!(server.addr().port(), server.port());
    assert!(server.addr().ip().is_loopback());
    assert!(server.pid().is_some());
    let mut con = server.connection().await;
    let pong: String = redis::cmd("PING").query_async(&mut con).await.unwrap();
    assert_eq!(pong, "PONG");
    let mut sync = server.client().get_connection().unwrap();
    let pong: String = redis::cmd("PING").query(&mut sync).unwrap();
    assert_eq!(pong, "PONG");
}

#[test]
fn servers_started_at_once_get_ports_of_their_own() {
    let servers: Vec<RedisServer> = std::thread::scope(|s| {
        let starting: Vec<_> = (0..8).map(|_| s.spawn(RedisServer::start)).collect();
        starting.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut ports: Vec<u16> = servers.iter().map(RedisServer::port).collect();
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len(), servers.len());
    for server in &servers {
        let name = dlock_tests::unique_name("own");
        let mut con = server.client().get_connection().unwrap();
        let () = redis::cmd("SET")
            .arg(&name)
            .arg(server.port())
            .query(&mut con)
            .unwrap();
        let pid: String = redis::cmd("INFO").arg("server").query(&mut con).unwrap();
        let expected = format!("process_id:{}", server.pid().unwrap());
        assert!(pid.lines().any(|l| l.trim() == expected), "{pid}");
    }
}

fn is_running(pid: u32) -> bool {
    std::process::Command::new("kill")
        .arg("-0")
        .arg(pid.to_string())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap()
        .success()
}

#[test]
fn drop_kills_the_process_even_when_paused() {
    let server = RedisServer::start();
    let pid = server.pid().unwrap();
    assert!(is_running(pid));
    drop(server);
    assert!(!is_running(pid), "redis-server {pid} outlived its handle");

    let server = RedisServer::start();
    let pid = server.pid().unwrap();
    server.pause();
    let started = std::time::Instant::now();
    drop(server);
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(
        !is_running(pid),
        "paused redis-server {pid} outlived its handle"
    );
}

#[tokio::test]
async fn kill_stops_the_server_and_restart_brings_it_back_empty() {
    let mut server = RedisServer::start();
    let port = server.port();
    let mut con = server.connection().await;
    let () = con.set("gone", 1).await.unwrap();
    server.kill();
    assert!(server.pid().is_none());
    // Nothing answers on the port: a connection is closed at once, as by a dead server.
    if let Ok(mut stream) = std::net::TcpStream::connect(server.addr()) {
        use std::io::{Read as _, Write as _};
        let _ = stream.write_all(b"PING\r\n");
        let mut buf = [0u8; 16];
        assert!(matches!(stream.read(&mut buf), Ok(0) | Err(_)), "an answer");
    }
    // And no other server can take the port while this one is down.
    assert!(std::net::TcpListener::bind(server.addr()).is_err());
    server.restart();
    assert_eq!(server.port(), port);
    let mut con = server.connection().await;
    assert!(!con.exists::<_, bool>("gone").await.unwrap());
    // The log keeps both runs.
    assert_eq!(
        server.log().matches("Ready to accept connections").count(),
        2
    );
}

#[tokio::test]
async fn extra_arguments_reach_the_server_and_survive_a_restart() {
    let mut server = RedisServer::start_with_args(&["--requirepass", "pw"]);
    let client = redis::Client::open(server.url()).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let denied = redis::cmd("PING").query_async::<String>(&mut con).await;
    assert!(denied.is_err(), "no password was asked for");
    server.restart();
    let url = format!("redis://:pw@127.0.0.1:{}/", server.port());
    let client = redis::Client::open(url).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let pong: String = redis::cmd("PING").query_async(&mut con).await.unwrap();
    assert_eq!(pong, "PONG");
}

/// One `PING` over raw TCP; `None` when the connection is closed or reset.
async fn raw_ping(stream: &mut tokio::net::TcpStream) -> Option<String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    stream.write_all(b"PING\r\n").await.ok()?;
    let mut buf = [0u8; 16];
    match stream.read(&mut buf).await {
        Ok(n) if n > 0 => Some(String::from_utf8_lossy(&buf[..n]).into_owned()),
        _ => None,
    }
}

#[tokio::test]
async fn a_cut_closes_raw_connections_at_once() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.addr()).await;
    assert_eq!(proxy.addr().port(), proxy.port());
    let mut stream = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(raw_ping(&mut stream).await.as_deref(), Some("+PONG\r\n"));

    proxy.cut();
    let after_cut = tokio::time::timeout(Duration::from_secs(1), raw_ping(&mut stream)).await;
    assert_eq!(after_cut, Ok(None), "the open connection survived the cut");
    for _ in 0..3 {
        let fresh = tokio::time::timeout(Duration::from_secs(1), async {
            match tokio::net::TcpStream::connect(proxy.addr()).await {
                Ok(mut stream) => raw_ping(&mut stream).await,
                Err(_) => None,
            }
        })
        .await;
        assert_eq!(fresh, Ok(None), "a new connection got through the cut");
    }

    proxy.restore();
    let mut stream = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(raw_ping(&mut stream).await.as_deref(), Some("+PONG\r\n"));

    let port = proxy.port();
    drop(proxy);
    let after_drop = tokio::time::timeout(Duration::from_secs(1), raw_ping(&mut stream)).await;
    assert_eq!(after_drop, Ok(None), "a connection outlived the proxy");
    // The accept loop stops once the runtime polls its aborted task.
    let mut refused = false;
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(refused, "the dropped proxy still accepts");
}

const PANIC_CHILD_ENV: &str = "DLOCK_TESTS_PANIC_CHILD";

/// Run only as a child of `a_panic_message_ends_with_the_server_log`.
#[test]
#[ignore = "run by a_panic_message_ends_with_the_server_log in a child process"]
fn panic_with_a_live_server() {
    if std::env::var_os(PANIC_CHILD_ENV).is_none() {
        return;
    }
    let _server = RedisServer::start();
    panic!("deliberate panic for the harness test");
}

#[test]
fn a_panic_message_ends_with_the_server_log() {
    let output = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "panic_with_a_live_server",
            "--exact",
            "--ignored",
            "--nocapture",
        ])
        .env(PANIC_CHILD_ENV, "1")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(!output.status.success(), "{text}");
    let panic_at = text.find("deliberate panic").expect(&text);
    let log_at = text.find("--- redis-server on port").expect(&text);
    assert!(panic_at < log_at, "{text}");
    assert!(
        text[log_at..].contains("Ready to accept connections"),
        "{text}"
    );
}
