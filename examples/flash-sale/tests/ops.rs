//! Instances as processes, with Redis down, killed and restarted, and replicas starting
//! together.

use std::time::{Duration, Instant};

use bytes::Bytes;
use flash_sale::demo::{self, ServerCommand};
use flash_sale::server::LockTarget;
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::Client;
use serde_json::{Value, json};

/// The operator's token the instances are started with; every request below carries it.
const OPERATOR: &str = "test-operator-token-0123456789";

fn server() -> ServerCommand {
    ServerCommand::binary(env!("CARGO_BIN_EXE_flash-sale"))
        .with_operator(flash_sale::auth::OperatorToken::new(OPERATOR).unwrap())
}

async fn http(method: &str, url: &str, body: Option<Value>) -> (u16, String, Value) {
    http_as(None, method, url, body).await
}

/// [`http`], with a shopper's session cookie when `cookie` is given.
async fn http_as(
    cookie: Option<&str>,
    method: &str,
    url: &str,
    body: Option<Value>,
) -> (u16, String, Value) {
    let client = Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let mut request = hyper::Request::builder()
        .method(method)
        .uri(url)
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {OPERATOR}"));
    if let Some(cookie) = cookie {
        request = request.header("cookie", cookie);
    }
    let request = request
        .body(Full::new(Bytes::from(
            body.map(|b| b.to_string()).unwrap_or_default(),
        )))
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(30), client.request(request))
        .await
        .expect("an answer within 30 s")
        .expect("the instance answers");
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    if status >= 400 {
        assert_eq!(content_type, "application/problem+json", "{method} {url}");
    }
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    (
        status,
        text.clone(),
        serde_json::from_str(&text).unwrap_or(Value::Null),
    )
}

/// Signs in as "ops": the session cookie; and a voucher.
async fn setup(url: &str) -> (String, i64) {
    let (_, user) = flash_sale::loadgen::login(url, "ops")
        .await
        .expect("the login answers");
    let now = flash_sale::now_ms();
    let (status, _, voucher) = http(
        "POST",
        &format!("{url}/api/vouchers"),
        Some(json!({"title": "v", "price_cents": 100, "stock": 100,
                    "starts_at_ms": now - 1000, "ends_at_ms": now + 600_000})),
    )
    .await;
    assert_eq!(status, 201, "{voucher}");
    (user, voucher["id"].as_i64().unwrap())
}

/// A purchase (a new voucher each time, so that one order per user doesn't get in the way).
async fn buy(url: &str, user: &str) -> (u16, String) {
    let now = flash_sale::now_ms();
    let (_, _, voucher) = http(
        "POST",
        &format!("{url}/api/vouchers"),
        Some(json!({"title": "v", "price_cents": 100, "stock": 1,
                    "starts_at_ms": now - 1000, "ends_at_ms": now + 600_000})),
    )
    .await;
    let id = voucher["id"].as_i64().unwrap();
    let (status, text, _) = http_as(
        Some(user),
        "POST",
        &format!("{url}/api/vouchers/{id}/orders"),
        None,
    )
    .await;
    (status, text)
}

async fn add(url: &str, user: &str, sku: i64) {
    let (status, text, _) = http_as(
        Some(user),
        "POST",
        &format!("{url}/api/cart/items"),
        Some(json!({"sku_id": sku, "qty": 1})),
    )
    .await;
    assert_eq!(status, 200, "{text}");
}

async fn checkout(url: &str, user: &str) -> (u16, String) {
    let url = format!("{url}/api/cart/checkout");
    let (status, text, _) = http_as(Some(user), "POST", &url, None).await;
    (status, text)
}

/// One instance on `redis`, a user and a SKU of 100 units.
async fn shop_with_a_sku(redis: &dlock_tests::RedisServer) -> (demo::Instances, String, i64) {
    let shop = demo::start(&server(), 1, &LockTarget::Server(redis.url()), None, true)
        .await
        .expect("the instance starts");
    let url = &shop.urls[0];
    let (user, _) = setup(url).await;
    let (_, _, sku) = http(
        "POST",
        &format!("{url}/api/skus"),
        Some(json!({"name": "s", "price_cents": 1, "stock": 100})),
    )
    .await;
    let sku = sku["id"].as_i64().unwrap();
    (shop, user, sku)
}

fn assert_no_internals(text: &str) {
    for leak in [
        "refused",
        "os error",
        "Connection",
        "127.0.0.1",
        "redis://",
        "broken pipe",
    ] {
        assert!(!text.contains(leak), "{leak} in {text}");
    }
}

/// An instance starts while Redis is down (it used to refuse to): the locked routes answer
/// 503 problem+json without socket errors, `/readyz` names Redis, everything else works; once
/// Redis is up the very first locked request goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_starts_without_redis_and_locks_once_it_is_back() {
    let mut redis = dlock_tests::RedisServer::start();
    redis.kill();
    let shop = demo::start(&server(), 1, &LockTarget::Server(redis.url()), None, true)
        .await
        .expect("the instance starts without Redis");
    let url = &shop.urls[0];
    let (status, _, health) = http("GET", &format!("{url}/healthz"), None).await;
    assert_eq!((status, health), (200, json!({"status": "ok"})));
    let (status, text, ready) = http("GET", &format!("{url}/readyz"), None).await;
    assert_eq!(status, 503, "{text}");
    assert_eq!(ready["redis"], "down", "{ready}");
    assert_eq!(ready["database"], "up", "{ready}");
    assert!(
        ready["detail"].as_str().unwrap().contains("redis"),
        "{ready}"
    );
    assert_no_internals(&text);

    let (user, _) = setup(url).await;
    let (status, text) = buy(url, &user).await;
    assert_eq!(status, 503, "{text}");
    assert_no_internals(&text);
    let (status, _, _) = http("GET", &format!("{url}/api/vouchers"), None).await;
    assert_eq!(status, 200);

    redis.restart();
    let (status, text) = buy(url, &user).await;
    assert_eq!(
        status, 201,
        "the first locked request after Redis is back: {text}"
    );
    let (status, _, ready) = http("GET", &format!("{url}/readyz"), None).await;
    assert_eq!(status, 200, "{ready}");
}

/// Redis killed under a running instance, then restarted: 503 while it is down, and the first
/// locked request after it is back succeeds (it used to get 503 too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_locked_request_after_redis_restarts_succeeds() {
    let mut redis = dlock_tests::RedisServer::start();
    let (shop, user, sku) = shop_with_a_sku(&redis).await;
    let url = &shop.urls[0];
    assert_eq!(buy(url, &user).await.0, 201);
    for round in 0..3 {
        redis.kill();
        let (status, text) = buy(url, &user).await;
        assert_eq!(status, 503, "round {round}: {text}");
        assert_no_internals(&text);
        redis.restart();
        let (status, text) = buy(url, &user).await;
        assert_eq!(
            status, 201,
            "round {round}: the first request after the restart: {text}"
        );
        // The checkout's layer (several locks at once) too.
        add(url, &user, sku).await;
        redis.kill();
        let (status, text) = checkout(url, &user).await;
        assert_eq!(status, 503, "round {round}: {text}");
        redis.restart();
        let (status, text) = checkout(url, &user).await;
        assert_eq!(
            status, 201,
            "round {round}: the first checkout after the restart: {text}"
        );
    }
    // Restarted while nobody asked: the connection the instance holds is dead, and the first
    // request finds out.
    for round in 0..3 {
        redis.restart();
        let (status, text) = buy(url, &user).await;
        assert_eq!(status, 201, "idle restart {round}: {text}");
        add(url, &user, sku).await;
        redis.restart();
        let (status, text) = checkout(url, &user).await;
        assert_eq!(status, 201, "idle restart {round}: {text}");
    }
    // A paused Redis (SIGSTOP) is unavailable too, and resumes cleanly.
    redis.pause();
    let started = Instant::now();
    let (status, text) = buy(url, &user).await;
    assert_eq!(status, 503, "{text}");
    assert!(started.elapsed() < Duration::from_secs(20));
    redis.resume();
    let (status, text) = buy(url, &user).await;
    assert_eq!(status, 201, "after the pause: {text}");
}

/// `--no-locks` needs no Redis at all: it starts and sells with Redis down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_without_locks_runs_without_redis() {
    let mut redis = dlock_tests::RedisServer::start();
    redis.kill();
    let shop = demo::start(&server(), 1, &LockTarget::Server(redis.url()), None, false)
        .await
        .expect("the instance starts without Redis");
    let url = &shop.urls[0];
    let (status, _, ready) = http("GET", &format!("{url}/readyz"), None).await;
    assert_eq!(status, 200, "{ready}");
    assert_eq!(ready["redis"], "unused", "{ready}");
    let (user, _) = setup(url).await;
    assert_eq!(buy(url, &user).await.0, 201);
    let (_, _, stats) = http("GET", &format!("{url}/api/stats"), None).await;
    assert_eq!(stats["locks"], false, "{stats}");
}

/// Three replicas started at once on a fresh SQLite file all come up (the schema is migrated
/// once), and their counters add up in `/api/stats` whichever instance answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_start_together_on_a_fresh_sqlite_file() {
    let redis = dlock_tests::RedisServer::start();
    for _ in 0..3 {
        let shop = demo::start(&server(), 3, &LockTarget::Server(redis.url()), None, true)
            .await
            .expect("three instances start together");
        let (user, _) = setup(&shop.urls[0]).await;
        for url in &shop.urls {
            assert_eq!(buy(url, &user).await.0, 201);
        }
        // Each instance writes its counters every few hundred milliseconds.
        for url in &shop.urls {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let (_, _, stats) = http("GET", &format!("{url}/api/stats"), None).await;
                assert_eq!(stats["voucher_orders"], 3, "{url}: {stats}");
                if stats["requests"] == 3 && stats["locked"] == 3 {
                    break;
                }
                assert!(Instant::now() < deadline, "{url}: {stats}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Instances that serve go by their addresses in the operator's plots, and any instance answers
/// for every one of them: a purchase on each shows in its own series, whichever is asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_served_instance_is_plotted_under_its_address() {
    let redis = dlock_tests::RedisServer::start();
    let shop = demo::start(&server(), 2, &LockTarget::Server(redis.url()), None, true)
        .await
        .expect("two instances start");
    let (user, _) = setup(&shop.urls[0]).await;
    for url in &shop.urls {
        assert_eq!(buy(url, &user).await.0, 201);
    }
    let names: Vec<&str> = shop
        .urls
        .iter()
        .map(|url| url.trim_start_matches("http://"))
        .collect();
    for (url, name) in shop.urls.iter().zip(&names) {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let (status, _, series) = http("GET", &format!("{url}/api/stats/series"), None).await;
            assert_eq!(status, 200, "{series}");
            assert_eq!(series["answered_by"], *name, "{series}");
            let purchases = |name: &str| -> u64 {
                let instances = series["instances"].as_array().into_iter().flatten();
                instances
                    .filter(|instance| instance["name"] == name)
                    .flat_map(|instance| instance["samples"].as_array().into_iter().flatten())
                    .map(|sample| sample["purchases"].as_u64().unwrap_or(0))
                    .sum()
            };
            if names.iter().all(|name| purchases(name) == 1) {
                break;
            }
            assert!(Instant::now() < deadline, "{url}: {series}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// `/metrics` exports dlock's metrics, the lock layer's and the shop's in Prometheus's format,
/// and every query of every panel of the Grafana dashboard (`grafana/flash-sale.json`) names
/// metrics, and label values, that an instance really exports after a little traffic: a
/// voucher bought, a cart checked out, a checkout refused 409 on a busy lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_query_names_exported_metrics() {
    let redis = dlock_tests::RedisServer::start();
    let (shop, user, sku) = shop_with_a_sku(&redis).await;
    let url = &shop.urls[0];
    assert_eq!(buy(url, &user).await.0, 201);
    add(url, &user, sku).await;
    assert_eq!(checkout(url, &user).await.0, 201);
    // The SKU held elsewhere: the checkout waits, then 409.
    let other = dlock_core::Locker::connect(&redis.url()).await.unwrap();
    let held = other
        .lock(flash_sale::sku_lock_name(sku).unwrap())
        .await
        .unwrap();
    add(url, &user, sku).await;
    assert_eq!(checkout(url, &user).await.0, 409);
    assert!(held.release().await.is_released());

    let client = Client::builder(hyper_util::rt::TokioExecutor::new()).build_http::<Full<Bytes>>();
    let response = client
        .get(format!("{url}/metrics").parse().unwrap())
        .await
        .expect("the instance answers");
    assert_eq!(response.status(), 200);
    assert!(
        (response.headers()["content-type"].to_str().unwrap()).starts_with("text/plain"),
        "{:?}",
        response.headers()
    );
    let exported =
        String::from_utf8((response.into_body().collect().await.unwrap().to_bytes()).to_vec())
            .unwrap();
    let series: Vec<&str> = (exported.lines())
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .collect();

    let dashboard: Value =
        serde_json::from_str(include_str!("../grafana/flash-sale.json")).expect("JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(!panels.is_empty());
    let mut checked = 0;
    for panel in panels {
        let title = panel["title"].as_str().unwrap_or_default();
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title}: no query");
        for target in targets {
            let expr = target["expr"].as_str().expect("expr");
            let selectors = selectors(expr);
            assert!(!selectors.is_empty(), "{title}: no metric in {expr}");
            for (metric, labels) in selectors {
                let found = series.iter().any(|line| {
                    let (name, rest) = line.split_at(line.find(['{', ' ']).unwrap_or(line.len()));
                    name == metric && labels.iter().all(|l| rest.contains(l.as_str()))
                });
                assert!(
                    found,
                    "{title}: `{metric}` with {labels:?} is not exported:\n{exported}"
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= panels.len(), "{checked} selectors");
}

/// The metric selectors of a PromQL expression: each `dlock_…` or `flash_sale_…` name, with
/// the `label="value"` matchers in the braces after it.
fn selectors(expr: &str) -> Vec<(String, Vec<String>)> {
    let mut found = Vec::new();
    let mut rest = expr;
    while let Some(at) = ["dlock_", "flash_sale_"]
        .iter()
        .filter_map(|p| rest.find(p))
        .min()
    {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        let metric = tail[..end].to_owned();
        let after = &tail[end..];
        let labels = match after.strip_prefix('{') {
            Some(inside) => inside[..inside.find('}').unwrap_or(inside.len())]
                .split(',')
                .map(str::trim)
                .filter(|m| !m.is_empty())
                .map(str::to_owned)
                .collect(),
            None => Vec::new(),
        };
        found.push((metric, labels));
        rest = after;
    }
    found
}
