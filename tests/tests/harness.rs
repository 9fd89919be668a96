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
async fn commandstats_count_commands() {
    let server = RedisServer::start();
    let mut con = server.connection().await;
    for _ in 0..3 {
        let () = con.set("c", 1).await.unwrap();
    }
    assert_eq!(server.info_commandstats().get("set"), Some(&3));
}
