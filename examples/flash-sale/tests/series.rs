//! `GET /api/stats/series`, the operator's plots' data: each instance's seconds, from the
//! database every instance writes to, refused without the operator's credential, and bad input
//! a 400; and the script that draws them, the operator's too.

mod common;

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::{Shop, shop};
use serde_json::Value;

/// Sums `field` over the samples of the instance called `name`.
fn total(series: &Value, name: &str, field: &str) -> u64 {
    instance(series, name).map_or(0, |instance| {
        instance["samples"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|sample| sample[field].as_u64().unwrap_or(0))
            .sum()
    })
}

fn instance<'a>(series: &'a Value, name: &str) -> Option<&'a Value> {
    series["instances"]
        .as_array()?
        .iter()
        .find(|instance| instance["name"] == name)
}

async fn fetch(shop: &Shop, query: &str) -> Value {
    let (status, series) = shop
        .operator("GET", &format!("/api/stats/series{query}"), "")
        .await;
    assert_eq!(status, StatusCode::OK, "{series}");
    series
}

/// Polls the series until `done` accepts it (instances write a sample a second).
async fn series_until(shop: &Shop, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let series = fetch(shop, "").await;
        if done(&series) {
            return series;
        }
        assert!(Instant::now() < deadline, "{what}, never: {series}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Purchases, checkouts, 409s and lock waits show in the instance's seconds; a second instance
/// over the same database shows as a series of its own, and stops reporting once it is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_instance_reports_its_seconds_until_it_stops() {
    let shop = shop().await;
    let name = shop.app.counters.name();
    let voucher = shop.open_voucher(2).await;
    let sku = shop.sku("mug", 5).await;
    let (ann, bob, cy) = (
        shop.login("ann").await,
        shop.login("bob").await,
        shop.login("cy").await,
    );
    for buyer in [&ann, &bob] {
        assert_eq!(shop.buy(buyer, voucher).await.0, StatusCode::CREATED);
    }
    assert_eq!(shop.buy(&cy, voucher).await.0, StatusCode::CONFLICT);
    assert_eq!(shop.add(&cy, sku, 2).await.0, StatusCode::OK);
    assert_eq!(shop.checkout(&cy).await.0, StatusCode::CREATED);

    // A second instance: its own counters and name, the same Redis and database.
    let url = format!(
        "sqlite://{}?mode=rwc",
        shop._dir.path().join("shop.db").display()
    );
    let locker = flash_sale::server::locker(&shop.redis.url()).await.unwrap();
    let other = flash_sale::app(&url, locker, true).await.unwrap();
    other.counters.set_name("the other instance");
    let other_router = flash_sale::router(other.clone());
    let request = Request::post(format!("/api/vouchers/{voucher}/orders"))
        .header("cookie", &ann.cookie)
        .body(Body::empty())
        .unwrap();
    let answer = tower::ServiceExt::oneshot(other_router, request)
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::CONFLICT, "ann has one already");

    let series = series_until(&shop, "every request in a sample", |series| {
        total(series, &name, "requests") == 4
            && total(series, &name, "checkouts") == 1
            && total(series, "the other instance", "conflicts") == 1
    })
    .await;
    assert_eq!(total(&series, &name, "purchases"), 2, "{series}");
    assert_eq!(total(&series, &name, "conflicts"), 1, "{series}");
    assert_eq!(total(&series, &name, "locked"), 3, "{series}");
    assert_eq!(total(&series, &name, "stale_refused"), 0, "{series}");
    assert_eq!(total(&series, "the other instance", "requests"), 1);
    assert_eq!(series["answered_by"], name, "{series}");
    assert_eq!(series["window_ms"], 300_000, "{series}");
    assert_eq!(series["step_ms"], 1_000, "{series}");
    let names: Vec<&str> = series["instances"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i["name"].as_str())
        .collect();
    let mut expected = vec![name.as_str(), "the other instance"];
    expected.sort_unstable();
    assert_eq!(names, expected, "one series per instance, by name");
    let mine = instance(&series, &name).unwrap();
    assert_eq!(mine["reporting"], true, "{mine}");
    let samples = mine["samples"].as_array().unwrap();
    let mut previous = 0;
    for sample in samples {
        let at = sample["at_ms"].as_i64().unwrap();
        assert_eq!(at % 1_000, 0, "a whole second: {sample}");
        assert!(at > previous, "oldest first: {samples:?}");
        previous = at;
        let ms = sample["ms"].as_i64().unwrap();
        assert!((500..=5_000).contains(&ms), "about a second: {sample}");
        // Percentiles over the last few seconds: none before the first request got its locks.
        match (
            sample["wait_p50_ms"].as_f64(),
            sample["wait_p99_ms"].as_f64(),
        ) {
            (Some(p50), Some(p99)) => {
                assert!(0.0 < p50 && p50 <= p99 && p99 < 5_000.0, "{sample}");
            }
            (None, None) => assert_eq!(sample["locked"], 0, "{sample}"),
            _ => panic!("a p50 without a p99: {sample}"),
        }
    }
    assert!(
        samples.iter().any(|s| s["wait_p99_ms"].is_number()),
        "{samples:?}"
    );

    // Asked for what came after its newest sample, the page gets only newer ones, and every
    // instance is still listed.
    let newest = mine["last_ms"].as_i64().unwrap();
    assert_eq!(newest, previous);
    let newer = fetch(&shop, &format!("?since_ms={newest}")).await;
    for listed in newer["instances"].as_array().unwrap() {
        for sample in listed["samples"].as_array().unwrap() {
            assert!(sample["at_ms"].as_i64().unwrap() > newest, "{newer}");
        }
    }
    assert!(instance(&newer, "the other instance").is_some(), "{newer}");

    // The other instance goes away: a few seconds on, it is listed as not reporting, with its
    // newest sample's time; this one goes on.
    drop(other);
    let series = series_until(&shop, "the other instance silent", |series| {
        instance(series, "the other instance").is_some_and(|i| i["reporting"] == false)
    })
    .await;
    let gone = instance(&series, "the other instance").unwrap();
    let now = series["now_ms"].as_i64().unwrap();
    assert!(now - gone["last_ms"].as_i64().unwrap() > 5_000, "{gone}");
    assert_eq!(instance(&series, &name).unwrap()["reporting"], true);
}

/// The series is the operator's, and its one parameter is checked: a 401 without the
/// credential (whatever the query), a 400 for a `since_ms` that is not a whole number from 0
/// to 2⁵³ − 1, never a 500.
#[tokio::test]
async fn the_series_is_the_operators_and_bad_input_is_a_400() {
    let shop = shop().await;
    for query in ["", "?since_ms=0", "?since_ms=abc"] {
        let answer = shop
            .send(
                Request::get(format!("/api/stats/series{query}"))
                    .body(Body::empty())
                    .unwrap(),
            )
            .await;
        assert_eq!(
            answer.status,
            StatusCode::UNAUTHORIZED,
            "{query}: {answer:?}"
        );
    }
    let shopper = shop.login("ann").await;
    let (status, _) = shop.call_as(&shopper, "GET", "/api/stats/series", "").await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "a shopper is not the operator"
    );

    for query in [
        "?since_ms=abc",
        "?since_ms=-1",
        "?since_ms=1.5",
        "?since_ms=",
        "?since_ms=9007199254740992",
        "?since_ms=99999999999999999999999",
        "?since_ms=1&since_ms=2",
    ] {
        let (status, problem) = shop
            .operator("GET", &format!("/api/stats/series{query}"), "")
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {problem}");
    }
    for query in ["", "?since_ms=0", "?since_ms=9007199254740991", "?other=1"] {
        let series = fetch(&shop, query).await;
        assert!(series["instances"].is_array(), "{query}: {series}");
    }
    let (status, _) = shop.operator("POST", "/api/stats/series", "").await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
}

/// The script that draws the plots is served to the operator alone, as JavaScript.
#[tokio::test]
async fn the_plots_script_is_the_operators() {
    let shop = shop().await;
    let get = |credential: Option<String>| {
        let mut request = Request::get("/operator/plots.js");
        if let Some(credential) = credential {
            request = request.header("authorization", credential);
        }
        request.body(Body::empty()).unwrap()
    };
    let answer = shop.send(get(None)).await;
    assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "{answer:?}");
    let wrong = Some("Bearer not-the-operator-token".to_owned());
    let answer = shop.send(get(wrong)).await;
    assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "{answer:?}");
    let right = Some(format!("Bearer {}", common::OPERATOR_TOKEN));
    let answer = shop.send(get(right)).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(
        answer.headers["content-type"],
        "text/javascript; charset=utf-8"
    );
    assert!(answer.text.contains("/api/stats/series"), "{}", answer.text);
}
