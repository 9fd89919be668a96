//! The shop on a Redis Cluster: instances as real processes locking on three masters (with a
//! replica each), a few hundred buyers at once. Every invariant holds, the locks are spread over
//! the masters, and `/readyz` answers ready through the cluster; with the cluster gone, `/readyz`
//! and the locked routes answer 503. Bad cluster settings stop an instance with a reason, not a
//! panic.

use std::process::Stdio;
use std::time::Duration;

use bytes::Bytes;
use dlock_tests::RedisCluster;
use flash_sale::demo::{self, ServerCommand};
use flash_sale::loadgen::LoadConfig;
use flash_sale::server::{LockTarget, REDIS_CLUSTER_URLS_ENV, REDIS_URL_ENV};
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::Client;
use serde_json::{Value, json};

mod common;

/// The operator's token the instances are started with; every request below carries it.
const OPERATOR: &str = "test-operator-token-0123456789";

fn server() -> ServerCommand {
    ServerCommand::binary(env!("CARGO_BIN_EXE_flash-sale"))
        .with_operator(flash_sale::auth::OperatorToken::new(OPERATOR).unwrap())
}

async fn http(method: &str, url: &str, body: Option<Value>) -> (u16, Value) {
    http_as(None, method, url, body).await
}

/// [`http`], with a shopper's session cookie when `cookie` is given.
async fn http_as(
    cookie: Option<&str>,
    method: &str,
    url: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let client = Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let mut request = hyper::Request::builder()
        .method(method)
        .uri(url)
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {OPERATOR}"));
    if let Some(cookie) = cookie {
        request = request.header("cookie", cookie);
    }
    let request = request.body(Full::new(Bytes::from(body))).unwrap();
    let response = tokio::time::timeout(Duration::from_secs(10), client.request(request))
        .await
        .expect("an answer within 10 s")
        .expect("the instance answers");
    let status = response.status().as_u16();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

/// Lock script calls each master has served.
fn script_calls_per_master(cluster: &RedisCluster) -> Vec<(u16, u64)> {
    (cluster.masters().iter())
        .map(|m| {
            let stats = cluster.node(m.port).info_commandstats();
            (m.port, dlock_tests::script_calls(&stats))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_on_a_redis_cluster_never_duplicate_or_oversell() {
    let cluster = tokio::task::spawn_blocking(RedisCluster::start)
        .await
        .unwrap();
    let store = demo::Store::Redis(
        LockTarget::Cluster(cluster.seed_urls()),
        demo::OwnRedis::None,
    );
    let load = LoadConfig {
        users: 200,
        requests_per_user: 3,
        concurrency: 100,
        ..LoadConfig::default()
    };
    let server = server();
    let round = demo::round(&server, 3, &store, true, &load);
    let (report, instances) = tokio::time::timeout(Duration::from_secs(120), round)
        .await
        .expect("the round ends within 120 s")
        .expect("the round runs");
    let stats = &report.stats;
    assert_eq!(report.errors, 0, "{report:?}");
    // Each buyer: 3 voucher orders and a checkout.
    assert_eq!(report.purchases, 200 * 4, "{report:?}");
    assert_eq!(stats.duplicate_orders, 0, "{report:?}");
    assert_eq!(stats.oversold_vouchers, 0, "{report:?}");
    assert_eq!(stats.units_oversold, 0, "{report:?}");
    assert_eq!(stats.negative_stock_rows, 0, "{report:?}");
    assert_eq!(stats.units_lost, 0, "{report:?}");
    assert_eq!(stats.units_double_sold, 0, "{report:?}");
    // 200 buyers for 100 vouchers: all sold, one each; SKU units sold, never beyond the stock.
    assert_eq!(stats.voucher_orders, 100, "{report:?}");
    assert!(stats.units_sold > 0, "{report:?}");
    assert!(stats.units_sold <= stats.sku_initial_stock, "{report:?}");
    // Every purchase ran under its locks, and nothing was stale in a healthy run.
    assert_eq!(stats.requests, report.purchases, "{report:?}");
    assert!(stats.locked > 0, "{report:?}");
    assert_eq!(stats.stale_refused, 0, "{report:?}");
    assert!(report.clean(), "{report:?}");

    // The locks lived on the cluster, in the slots of every master: user, voucher and SKU
    // names hash all over the key space.
    let calls = script_calls_per_master(&cluster);
    assert!(
        calls.iter().all(|(_, n)| *n > 0),
        "lock scripts per master: {calls:?}"
    );

    for url in &instances.urls {
        let (status, ready) = http("GET", &format!("{url}/readyz"), None).await;
        assert_eq!(status, 200, "{url}: {ready}");
        assert_eq!(
            ready,
            json!({"status": "ready", "redis": "up", "database": "up"}),
            "{url}"
        );
    }

    // The whole cluster gone: not ready, and a locked purchase is a 503, not a 500.
    let url = &instances.urls[0];
    let (user, voucher) = user_and_voucher(url, "late").await;
    drop(cluster);
    let (status, ready) = http("GET", &format!("{url}/readyz"), None).await;
    assert_eq!(status, 503, "{ready}");
    assert_eq!(
        (&ready["redis"], &ready["database"]),
        (&json!("down"), &json!("up")),
        "{ready}"
    );
    let orders = format!("{url}/api/vouchers/{}/orders", voucher["id"]);
    let (status, problem) = http_as(Some(&user), "POST", &orders, None).await;
    assert_eq!(status, 503, "{problem}");
    assert_eq!(problem["status"], 503, "{problem}");
}

/// A user called `name` (its session cookie) and a voucher on sale now (neither needs Redis).
async fn user_and_voucher(url: &str, name: &str) -> (String, Value) {
    let (_, user) = flash_sale::loadgen::login(url, name)
        .await
        .expect("the login answers");
    let now = flash_sale::now_ms();
    let voucher = json!({"title": "v", "price_cents": 100, "stock": 1,
                         "starts_at_ms": now - 1000, "ends_at_ms": now + 600_000});
    let (status, voucher) = http("POST", &format!("{url}/api/vouchers"), Some(voucher)).await;
    assert_eq!(status, 201, "{voucher}");
    (user, voucher)
}

/// An instance whose cluster can't be reached starts all the same: `/healthz` answers, `/readyz`
/// says Redis is down, a locked purchase is a 503 problem, the unlocked routes work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_starts_while_its_cluster_is_down() {
    let nobody = format!("redis://127.0.0.1:{}/", dlock_tests::free_port());
    let shop = demo::start(&server(), 1, &LockTarget::Cluster(vec![nobody]), None, true)
        .await
        .expect("the instance starts without its cluster");
    let url = &shop.urls[0];
    let (status, health) = http("GET", &format!("{url}/healthz"), None).await;
    assert_eq!((status, health), (200, json!({"status": "ok"})));
    let (status, ready) = http("GET", &format!("{url}/readyz"), None).await;
    assert_eq!(status, 503, "{ready}");
    assert_eq!(ready["redis"], "down", "{ready}");
    let (user, voucher) = user_and_voucher(url, "u").await;
    let orders = format!("{url}/api/vouchers/{}/orders", voucher["id"]);
    let (status, problem) = http_as(Some(&user), "POST", &orders, None).await;
    assert_eq!(status, 503, "{problem}");
    assert_eq!(problem["status"], 503, "{problem}");
}

/// Runs one instance with `env` and returns its exit status and stderr (it must exit by itself).
async fn instance_exits_with(env: &[(&str, &str)]) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let database = format!("sqlite://{}?mode=rwc", dir.path().join("shop.db").display());
    let port = dlock_tests::free_port().to_string();
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_flash-sale"));
    command
        .args(["--port", &port])
        .env_remove(REDIS_URL_ENV)
        .env_remove(REDIS_CLUSTER_URLS_ENV)
        .env("DATABASE_URL", &database)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(20), command.output())
        .await
        .expect("the instance exits within 20 s")
        .expect("the instance starts");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_cluster_settings_stop_an_instance_with_a_reason() {
    let cases = [
        (vec![(REDIS_CLUSTER_URLS_ENV, " , ")], "names no URL"),
        (
            vec![(REDIS_CLUSTER_URLS_ENV, "127.0.0.1:7000")],
            "DLOCK_CLUSTER_URLS: entry 1 is not a URL",
        ),
        (
            vec![
                (REDIS_URL_ENV, "redis://127.0.0.1:6379/"),
                (REDIS_CLUSTER_URLS_ENV, "redis://127.0.0.1:7000/"),
            ],
            "set one",
        ),
    ];
    for (env, reason) in cases {
        let (code, stderr) = instance_exits_with(&env).await;
        assert_eq!(code, Some(2), "{env:?}: {stderr}");
        assert!(stderr.contains(reason), "{env:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{env:?}: {stderr}");
    }
}

/// `demo --cluster`, at small scale: a cluster of its own, both rounds, the table with every
/// invariant holding with the locks on, exit status 0, and no cluster node left running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_on_a_cluster_prints_the_table_and_leaves_no_node_running() {
    let (stdout, stderr) = common::table::run_demo(
        &["--exit", "--cluster", "--users", "300", "--instances", "2"],
        Duration::from_secs(180),
    )
    .await;
    let first = stdout.lines().next().unwrap_or_default();
    let ports: Vec<u16> = first
        .strip_prefix("started a Redis Cluster (3 masters, 3 replicas) on ports ")
        .unwrap_or_else(|| panic!("{stdout}"))
        .split(", ")
        .map(|p| p.parse().unwrap())
        .collect();
    assert_eq!(ports.len(), 6, "{stdout}");
    assert!(stdout.contains("one Redis Cluster"), "{stdout}");

    common::table::assert_locked_round_holds(&stdout, &stderr);

    // The demo killed its nodes on the way out: nothing answers on their ports.
    for port in ports {
        assert!(
            std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
            "a cluster node still listens on {port}"
        );
    }
}
