//! Bad input, answered with the right status and a message, and nothing written.

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use flash_sale::{NewVoucher, now_ms};
use http_body_util::BodyExt as _;
use tower::ServiceExt as _;

struct Shop {
    router: Router,
    _redis: dlock_tests::RedisServer,
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
        _redis: redis,
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
    let (status, _) = call(
        &shop,
        "POST",
        &format!("/api/vouchers/{open}/orders"),
        "{not json",
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) = call(
        &shop,
        "POST",
        &format!("/api/vouchers/{open}/orders"),
        r#"{"user":1}"#,
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);

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
    let (status, _) = call(
        &shop,
        "POST",
        "/api/carts/7/items",
        r#"{"sku_id":1,"qty":0}"#,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
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
