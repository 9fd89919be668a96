//! The shop on PostgreSQL (`DATABASE_URL=postgres://…`): the same flow as on SQLite, against a
//! real server started for the test; and the demo with its locks in PostgreSQL too, no Redis.

use std::time::{Duration, Instant};

use dlock_tests::PostgresServer as Postgres;

use flash_sale::demo;
use flash_sale::loadgen::LoadConfig;
use flash_sale::server::LockTarget;

mod common;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shop_runs_on_postgres_without_duplicates_or_oversell() {
    let pg = Postgres::start();
    let redis = dlock_tests::RedisServer::start();
    let started = Instant::now();
    let instances = on_postgres(&pg, &redis, 2)
        .await
        .expect("instances on postgres");
    let load = LoadConfig {
        targets: instances.urls.clone(),
        operator: Some(instances.operator.clone()),
        users: 150,
        concurrency: 50,
        ..LoadConfig::default()
    };
    let report = flash_sale::loadgen::run(&load)
        .await
        .expect("the load runs");
    assert!(started.elapsed() < Duration::from_secs(120));
    assert_eq!(report.errors, 0, "{report:?}");
    assert!(report.clean(), "{report:?}");
    assert_eq!(report.stats.voucher_orders, 100, "{report:?}");
    assert_eq!(report.stats.duplicate_orders, 0, "{report:?}");

    // The operator's plots read every instance's seconds back from PostgreSQL: together they
    // count every voucher sold, with the lock waits of each second.
    let url = format!("{}/api/stats/series?since_ms=0", instances.urls[0]);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, series) = http("GET", &url, serde_json::Value::Null).await;
        assert_eq!(status, 200, "{series}");
        let instances = series["instances"].as_array().cloned().unwrap_or_default();
        let samples: Vec<&serde_json::Value> = instances
            .iter()
            .flat_map(|i| i["samples"].as_array().into_iter().flatten())
            .collect();
        let sold: u64 = samples.iter().filter_map(|s| s["purchases"].as_u64()).sum();
        if instances.len() == 2 && sold == 100 {
            assert!(
                samples
                    .iter()
                    .any(|s| s["wait_p99_ms"].as_f64() > Some(0.0)),
                "{series}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "{sold} of 100 sold: {series}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The operator's token the instances are started with; every request of [`http`] carries it.
const OPERATOR: &str = "test-operator-token-0123456789";

/// `count` instances of the shop on `pg`, locking on `redis`, with the operator's token.
async fn on_postgres(
    pg: &Postgres,
    redis: &dlock_tests::RedisServer,
    count: usize,
) -> Result<demo::Instances, String> {
    let server = demo::ServerCommand::binary(env!("CARGO_BIN_EXE_flash-sale"))
        .with_operator(flash_sale::auth::OperatorToken::new(OPERATOR).unwrap());
    let redis = LockTarget::Server(redis.url());
    demo::start(&server, count, &redis, Some(&pg.url()), true).await
}

async fn http(method: &str, url: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
    http_as(None, method, url, body).await
}

/// [`http`], with a shopper's session cookie when `cookie` is given.
async fn http_as(
    cookie: Option<&str>,
    method: &str,
    url: &str,
    body: serde_json::Value,
) -> (u16, serde_json::Value) {
    use http_body_util::BodyExt as _;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http();
    let mut request = hyper::Request::builder()
        .method(method)
        .uri(url)
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {OPERATOR}"));
    if let Some(cookie) = cookie {
        request = request.header("cookie", cookie);
    }
    let request = request
        .body(http_body_util::Full::new(bytes::Bytes::from(
            body.to_string(),
        )))
        .unwrap();
    let response = client.request(request).await.unwrap();
    let status = response.status().as_u16();
    if status >= 400 {
        assert_eq!(
            response.headers()["content-type"],
            "application/problem+json"
        );
    }
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap_or_default())
}

/// Defect 9: three instances started at once on a fresh database crashed on concurrent
/// `CREATE TABLE IF NOT EXISTS`; the migrations now take sqlx's advisory lock. Defects 4, 5
/// and 6 on PostgreSQL: NUL in a text, huge quantities and stock are 400, never 500, and the
/// stats stay readable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_start_together_on_a_fresh_postgres_and_refuse_bad_input() {
    let pg = Postgres::start();
    let redis = dlock_tests::RedisServer::start();
    let instances = on_postgres(&pg, &redis, 3)
        .await
        .expect("three instances start together on a fresh database");
    let url = &instances.urls[2];
    let now = flash_sale::now_ms();
    for body in [
        serde_json::json!({"title": "nul\u{0}", "price_cents": 1, "stock": 1,
                           "starts_at_ms": now, "ends_at_ms": now + 1000}),
        serde_json::json!({"title": "x", "price_cents": 1, "stock": i64::MAX,
                           "starts_at_ms": now, "ends_at_ms": now + 1000}),
    ] {
        let (status, problem) = http("POST", &format!("{url}/api/vouchers"), body).await;
        assert_eq!(status, 400, "{problem}");
    }
    let (status, problem) = http(
        "POST",
        &format!("{url}/api/login"),
        serde_json::json!({"name": "a\u{0}b"}),
    )
    .await;
    assert_eq!(status, 400, "{problem}");
    let (_, user) = flash_sale::loadgen::login(url, "pg").await.unwrap();
    let (_, sku) = http(
        "POST",
        &format!("{url}/api/skus"),
        serde_json::json!({"name": "s", "price_cents": 5, "stock": 10}),
    )
    .await;
    let sku = sku["id"].as_i64().unwrap();
    for _ in 0..2 {
        let (status, problem) = http_as(
            Some(&user),
            "POST",
            &format!("{url}/api/cart/items"),
            serde_json::json!({"sku_id": sku, "qty": i64::MAX}),
        )
        .await;
        assert_eq!(status, 400, "{problem}");
    }
    let (status, stats) = http("GET", &format!("{url}/api/stats"), serde_json::json!(null)).await;
    assert_eq!(status, 200, "{stats}");
}

/// PostgreSQL stopped under a running instance: the routes that need it answer 503 problem+json
/// within 2 s (not a 500 after the pool's wait), and `/readyz` says the database is down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_down_is_a_503_within_two_seconds() {
    let pg = Postgres::start();
    let redis = dlock_tests::RedisServer::start();
    let instances = on_postgres(&pg, &redis, 1)
        .await
        .expect("an instance on postgres");
    let url = &instances.urls[0];
    let (_, user) = flash_sale::loadgen::login(url, "pg").await.unwrap();
    let now = flash_sale::now_ms();
    let (status, voucher) = http(
        "POST",
        &format!("{url}/api/vouchers"),
        serde_json::json!({"title": "v", "price_cents": 1, "stock": 5,
                           "starts_at_ms": now - 1000, "ends_at_ms": now + 600_000}),
    )
    .await;
    assert_eq!(status, 201, "{voucher}");
    drop(pg);
    for (cookie, method, path) in [
        (None, "GET", "/api/vouchers".to_owned()),
        (Some(user.as_str()), "GET", "/api/cart".to_owned()),
        (
            Some(user.as_str()),
            "POST",
            format!("/api/vouchers/{}/orders", voucher["id"]),
        ),
        (None, "GET", "/api/stats".to_owned()),
        (None, "GET", "/readyz".to_owned()),
    ] {
        let started = Instant::now();
        let (status, problem) = http_as(
            cookie,
            method,
            &format!("{url}{path}"),
            serde_json::Value::Null,
        )
        .await;
        let took = started.elapsed();
        assert_eq!(status, 503, "{path}: {problem}");
        assert!(took < Duration::from_secs(2), "{path}: {took:?}");
        let text = problem.to_string().to_lowercase();
        for leak in ["pool", "postgres", "connection refused", "sqlx"] {
            assert!(!text.contains(leak), "{path}: {problem}");
        }
    }
}

/// `demo --locks postgres`, at small scale: one PostgreSQL server for the orders and the locks
/// (no Redis started or named), both rounds, the table with every invariant holding with the
/// locks on, and exit status 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_with_its_locks_in_postgres_prints_the_table_without_redis() {
    let (stdout, stderr) = common::table::run_demo(
        &[
            "--exit",
            "--locks",
            "postgres",
            "--users",
            "300",
            "--instances",
            "2",
        ],
        Duration::from_secs(180),
    )
    .await;
    assert!(
        stdout.starts_with("started a PostgreSQL server on port "),
        "{stdout}"
    );
    assert!(
        !stdout.contains("redis-server"),
        "a Redis started: {stdout}"
    );
    assert!(
        stdout
            .contains("locks in PostgreSQL beside the orders (no Redis), one PostgreSQL database"),
        "{stdout}"
    );
    common::table::assert_locked_round_holds(&stdout, &stderr);
    // A wrong pairing is refused with the reason.
    let both = tokio::process::Command::new(env!("CARGO_BIN_EXE_demo"))
        .args(["--exit", "--locks", "postgres", "--cluster"])
        .output()
        .await
        .expect("the demo starts");
    assert_eq!(both.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&both.stderr).contains("not with --locks postgres"));
}
