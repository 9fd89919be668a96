//! Bad input, answered with the right status and a message, and nothing written.

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use dlock_core::LockName;
use flash_sale::{NewVoucher, now_ms};
use http_body_util::BodyExt as _;
use tower::ServiceExt as _;

struct Shop {
    router: Router,
    redis: dlock_tests::RedisServer,
    _dir: tempfile::TempDir,
}

async fn shop() -> Shop {
    let redis = dlock_tests::RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("shop.db").display());
    let locker = dlock_core::Locker::connect(&redis.url()).await.unwrap();
    let app = flash_sale::app(&url, locker, true).await.unwrap();
    Shop {
        router: flash_sale::router(app),
        redis,
        _dir: dir,
    }
}

async fn call(shop: &Shop, method: &str, uri: &str, body: &str) -> (StatusCode, serde_json::Value) {
    let response = shop
        .router
        .clone()
        .oneshot(
            Request::builder()
                .method(method)
                .uri(uri)
                .header("content-type", "application/json")
                .body(Body::from(body.to_owned()))
                .unwrap(),
        )
        .await
        .unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let json = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
    (status, json)
}

async fn voucher(shop: &Shop, stock: i64, begin_at: i64, end_at: i64) -> i64 {
    let new = NewVoucher {
        title: "v".into(),
        price: 100,
        stock,
        begin_at,
        end_at,
    };
    let (status, body) = call(
        shop,
        "POST",
        "/api/vouchers",
        &serde_json::to_string(&new).unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    body["id"].as_i64().unwrap()
}

#[tokio::test]
async fn bad_input_gets_clear_answers() {
    let shop = shop().await;
    let (status, body) = call(
        &shop,
        "POST",
        "/api/vouchers/999/orders",
        r#"{"user_id":1}"#,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(
        body["error"].as_str().unwrap().contains("no voucher"),
        "{body}"
    );

    let open = voucher(&shop, 1, now_ms() - 1_000, now_ms() + 60_000).await;
    let (status, body) = call(
        &shop,
        "POST",
        &format!("/api/vouchers/{open}/orders"),
        "{not json",
    )
    .await;
    assert!(body["error"].is_string(), "{body}");
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, body) = call(
        &shop,
        "POST",
        &format!("/api/vouchers/{open}/orders"),
        r#"{"user":1}"#,
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        body["error"].as_str().unwrap().contains("user_id"),
        "{body}"
    );

    let later = voucher(&shop, 5, now_ms() + 60_000, now_ms() + 120_000).await;
    let (status, body) = call(
        &shop,
        "POST",
        &format!("/api/vouchers/{later}/orders"),
        r#"{"user_id":1}"#,
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body["error"], "the sale has not started");

    let over = voucher(&shop, 5, now_ms() - 120_000, now_ms() - 60_000).await;
    let (status, body) = call(
        &shop,
        "POST",
        &format!("/api/vouchers/{over}/orders"),
        r#"{"user_id":1}"#,
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body["error"], "the sale has ended");

    let (status, _) = call(
        &shop,
        "POST",
        &format!("/api/vouchers/{open}/orders"),
        r#"{"user_id":1}"#,
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, body) = call(
        &shop,
        "POST",
        &format!("/api/vouchers/{open}/orders"),
        r#"{"user_id":1}"#,
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("one order per user"),
        "{body}"
    );
    let (status, body) = call(
        &shop,
        "POST",
        &format!("/api/vouchers/{open}/orders"),
        r#"{"user_id":2}"#,
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body["error"], "out of stock");

    // Nothing was written by the rejected requests.
    let (_, stats) = call(&shop, "GET", "/api/stats", "").await;
    assert_eq!(stats["voucher_orders"], 1, "{stats}");

    let (status, body) = call(&shop, "POST", "/api/carts/7/checkout", "").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"], "the cart is empty");
}

#[tokio::test]
async fn bad_vouchers_and_carts_are_refused() {
    let shop = shop().await;
    let bad = [
        (
            r#"{"title":"","price":1,"stock":1,"begin_at":0,"end_at":1}"#,
            "title",
        ),
        (
            r#"{"title":"x","price":1,"stock":-1,"begin_at":0,"end_at":1}"#,
            "stock",
        ),
        (
            r#"{"title":"x","price":1,"stock":1,"begin_at":5,"end_at":5}"#,
            "end after",
        ),
    ];
    for (json, why) in bad {
        let (status, body) = call(&shop, "POST", "/api/vouchers", json).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{json}: {body}");
        assert!(body["error"].as_str().unwrap().contains(why), "{body}");
    }
    // Not JSON at all.
    let response = shop
        .router
        .clone()
        .oneshot(
            Request::post("/api/vouchers")
                .body(Body::from("title=x"))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);

    let (status, body) = call(
        &shop,
        "POST",
        "/api/carts/7/items",
        r#"{"sku_id":42,"qty":1}"#,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"], "no sku 42");
    let (status, sku) = call(&shop, "POST", "/api/skus", r#"{"name":"mug","stock":1}"#).await;
    assert_eq!(status, StatusCode::CREATED, "{sku}");
    let sku = sku["id"].as_i64().unwrap();
    let (status, body) = call(
        &shop,
        "POST",
        "/api/carts/7/items",
        &format!(r#"{{"sku_id":{sku},"qty":0}}"#),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"], "qty must be positive");

    // Two in the cart, one in stock: 409, and the cart is kept.
    let (status, _) = call(
        &shop,
        "POST",
        "/api/carts/7/items",
        &format!(r#"{{"sku_id":{sku},"qty":2}}"#),
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, body) = call(&shop, "POST", "/api/carts/7/checkout", "").await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body["error"], format!("sku {sku} is out of stock"));
    let (_, cart) = call(&shop, "GET", "/api/carts/7", "").await;
    assert_eq!(cart[0]["qty"], 2, "{cart}");

    // One fits: the order snapshots it, the stock drops, the cart empties.
    let (status, _) = call(
        &shop,
        "POST",
        "/api/carts/8/items",
        &format!(r#"{{"sku_id":{sku},"qty":1}}"#),
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, order) = call(&shop, "POST", "/api/carts/8/checkout", "").await;
    assert_eq!(status, StatusCode::CREATED, "{order}");
    assert_eq!(order["items"][0]["sku_id"], sku, "{order}");
    let (_, skus) = call(&shop, "GET", "/api/skus", "").await;
    assert_eq!(skus[0]["stock"], 0, "{skus}");
    let (_, cart) = call(&shop, "GET", "/api/carts/8", "").await;
    assert_eq!(cart, serde_json::json!([]));
}

/// A purchase whose lock is held elsewhere (another instance) waits, then gets 409 with
/// `Retry-After`: the buy through `#[distributed_lock]`, the checkout through `LockLayer`.
#[tokio::test]
async fn busy_locks_answer_409_with_retry_after() {
    let shop = shop().await;
    let voucher = voucher(&shop, 5, now_ms() - 1_000, now_ms() + 60_000).await;
    let (_, sku) = call(&shop, "POST", "/api/skus", r#"{"name":"mug","stock":5}"#).await;
    let sku = sku["id"].as_i64().unwrap();
    let (status, _) = call(
        &shop,
        "POST",
        "/api/carts/3/items",
        &format!(r#"{{"sku_id":{sku},"qty":1}}"#),
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT);

    let other = dlock_core::Locker::connect(&shop.redis.url())
        .await
        .unwrap();
    let order_lock = LockName::builder()
        .literal("order:")
        .value(3)
        .literal(":")
        .value(voucher)
        .build()
        .unwrap();
    let held = other
        .lock_all([order_lock, flash_sale::sku_lock_name(sku).unwrap()])
        .await
        .unwrap();

    for uri in [
        format!("/api/vouchers/{voucher}/orders"),
        "/api/carts/3/checkout".to_owned(),
    ] {
        let response = shop
            .router
            .clone()
            .oneshot(
                Request::post(&uri)
                    .header("content-type", "application/json")
                    .body(Body::from(r#"{"user_id":3}"#))
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::CONFLICT, "{uri}");
        assert!(
            response.headers().contains_key("retry-after"),
            "{uri}: {:?}",
            response.headers()
        );
    }
    assert!(held.release().await.iter().all(|o| o.is_released()));

    let (status, order) = call(
        &shop,
        "POST",
        &format!("/api/vouchers/{voucher}/orders"),
        r#"{"user_id":3}"#,
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{order}");
    assert!(order["fencing_token"].as_i64().unwrap() > 0, "{order}");
    let (status, _) = call(&shop, "POST", "/api/carts/3/checkout", "").await;
    assert_eq!(status, StatusCode::CREATED);
    let (_, stats) = call(&shop, "GET", "/api/stats", "").await;
    assert_eq!(stats["requests"], 4, "{stats}");
    assert_eq!(stats["conflicts"], 2, "{stats}");
    assert_eq!(stats["locked"], 2, "{stats}");
}

#[tokio::test]
async fn the_page_is_served() {
    let shop = shop().await;
    let response = shop
        .router
        .clone()
        .oneshot(Request::get("/").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&body).contains("Flash sale"));
}
