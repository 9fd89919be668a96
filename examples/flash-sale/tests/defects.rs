//! One regression test per defect of the shop reported from outside, against a real
//! `redis-server` and a SQLite file (the PostgreSQL ones are in `postgres.rs`, the ones that
//! need instances as processes in `ops.rs`).

mod common;

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::{Shop, shop};
use serde_json::{Value, json};

/// Polls `PUBSUB CHANNELS` until `n` wake-up channels are subscribed: a request is waiting for
/// a lock (its key function has run).
async fn waiting_for_locks(shop: &Shop, n: usize) {
    let mut con = shop.redis.connection().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let channels: Vec<String> = dlock_core::redis::cmd("PUBSUB")
            .arg("CHANNELS")
            .query_async(&mut con)
            .await
            .unwrap();
        if channels.len() >= n {
            return;
        }
        assert!(Instant::now() < deadline, "nobody waits for a lock");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn stock_of(skus: &Value, id: i64) -> i64 {
    skus.as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == id)
        .unwrap()["stock"]
        .as_i64()
        .unwrap()
}

/// Defect 1: the layer chose the SKUs to lock from the cart before it waited; a SKU that came
/// into the cart meanwhile was written with no lock and no transaction, and units vanished.
/// Now the checkout refuses with 409 "cart changed", writes nothing, and the retry buys both.
#[tokio::test]
async fn a_sku_added_while_the_checkout_waits_is_refused_not_lost() {
    let shop = shop().await;
    let user = shop.login("two-tabs").await;
    let (a, b) = (shop.sku("a", 10).await, shop.sku("b", 10).await);
    assert_eq!(shop.add(&user, a, 1).await.0, StatusCode::OK);

    // Another instance is editing this cart: it holds the cart lock.
    let other = dlock_core::Locker::connect(&shop.redis.url())
        .await
        .unwrap();
    let edit = other
        .lock(flash_sale::cart_lock_name(user.id).unwrap())
        .await
        .unwrap();
    let checkout = {
        let router = shop.router.clone();
        let cookie = user.cookie.clone();
        tokio::spawn(async move {
            use tower::ServiceExt as _;
            let request = Request::post("/api/cart/checkout")
                .header("cookie", cookie)
                .body(Body::empty())
                .unwrap();
            router.oneshot(request).await.unwrap()
        })
    };
    // The checkout has read the cart ({a}) and waits; the edit adds b and lets go.
    waiting_for_locks(&shop, 1).await;
    sqlx::query("INSERT INTO cart_items (user_id, sku_id, qty) VALUES ($1, $2, 1)")
        .bind(user.id)
        .bind(b)
        .execute(&shop.app.db)
        .await
        .unwrap();
    assert!(edit.release().await.is_released());

    let response = checkout.await.unwrap();
    assert_eq!(response.status(), StatusCode::CONFLICT);
    let body = http_body_util::BodyExt::collect(response.into_body())
        .await
        .unwrap()
        .to_bytes();
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        body["detail"],
        "cart changed during checkout; nothing was bought, retry"
    );
    // Nothing was written: not even the stock of the SKU it did hold.
    let (_, skus) = shop.call("GET", "/api/skus", "").await;
    assert_eq!((stock_of(&skus, a), stock_of(&skus, b)), (10, 10), "{skus}");
    let (status, order) = shop.checkout(&user).await;
    assert_eq!(status, StatusCode::CREATED, "{order}");
    assert_eq!(order["items"].as_array().unwrap().len(), 2, "{order}");
    let stats = shop.stats().await;
    assert_eq!(stats["units_lost"], 0, "{stats}");
    assert_eq!(stats["units_sold"], 2, "{stats}");
    assert_eq!(stats["stale_refused"], 0, "{stats}");
}

/// Defect 2: the checkout deleted the whole cart, so an item added while it ran vanished. Now
/// the add waits for the checkout's cart lock and the checkout takes out exactly what it
/// bought: the item is in the cart afterwards, and not in the order.
#[tokio::test]
async fn an_item_added_during_a_checkout_stays_in_the_cart() {
    let shop = shop().await;
    let user = shop.login("adds-during-checkout").await;
    let (a, b) = (shop.sku("a", 10).await, shop.sku("b", 10).await);
    assert_eq!(shop.add(&user, a, 1).await.0, StatusCode::OK);
    let other = dlock_core::Locker::connect(&shop.redis.url())
        .await
        .unwrap();
    // Someone else's checkout holds `a`: this one takes the cart and waits for `a`.
    let held = other
        .lock(flash_sale::sku_lock_name(a).unwrap())
        .await
        .unwrap();
    let call = |method: &'static str, uri: String, body: String| {
        let router = shop.router.clone();
        let cookie = user.cookie.clone();
        tokio::spawn(async move {
            use tower::ServiceExt as _;
            let request = Request::builder()
                .method(method)
                .uri(uri)
                .header("content-type", "application/json")
                .header("cookie", cookie)
                .body(Body::from(body))
                .unwrap();
            router.oneshot(request).await.unwrap().status()
        })
    };
    let checkout = call("POST", "/api/cart/checkout".to_owned(), String::new());
    waiting_for_locks(&shop, 1).await;
    let added = call(
        "POST",
        "/api/cart/items".to_owned(),
        format!(r#"{{"sku_id":{b},"qty":2}}"#),
    );
    waiting_for_locks(&shop, 2).await;
    assert!(held.release().await.is_released());
    assert_eq!(checkout.await.unwrap(), StatusCode::CREATED);
    assert_eq!(added.await.unwrap(), StatusCode::OK);
    let (_, cart) = shop.call_as(&user, "GET", "/api/cart", "").await;
    assert_eq!(cart["items"].as_array().unwrap().len(), 1, "{cart}");
    assert_eq!(cart["items"][0]["sku_id"], b, "{cart}");
    assert_eq!(cart["items"][0]["qty"], 2, "{cart}");
    let (_, orders) = shop.call_as(&user, "GET", "/api/orders", "").await;
    let bought = &orders["carts"][0]["items"];
    assert_eq!(bought.as_array().unwrap().len(), 1, "{orders}");
    assert_eq!(bought[0]["sku_id"], a, "{orders}");
}

/// Defect 3: an unknown SKU was stored (204) and then broke every checkout of the cart; items
/// could not be removed, carts not emptied.
#[tokio::test]
async fn unknown_skus_are_not_stored_and_items_can_be_removed() {
    let shop = shop().await;
    let user = shop.login("remover").await;
    let (a, b) = (shop.sku("a", 10).await, shop.sku("b", 10).await);
    let (status, body) = shop.add(&user, 4242, 1).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM cart_items")
        .fetch_one(&shop.app.db)
        .await
        .unwrap();
    assert_eq!(rows, 0, "nothing stored");
    for sku in [a, b] {
        assert_eq!(shop.add(&user, sku, 3).await.0, StatusCode::OK);
    }
    let (status, cart) = shop
        .call_as(&user, "DELETE", &format!("/api/cart/items/{a}"), "")
        .await;
    assert_eq!(status, StatusCode::OK, "{cart}");
    assert_eq!(cart["items"].as_array().unwrap().len(), 1, "{cart}");
    assert_eq!(cart["items"][0]["sku_id"], b, "{cart}");
    assert_eq!(cart["total_cents"], 750, "{cart}");
    let (status, cart) = shop.call_as(&user, "DELETE", "/api/cart/items", "").await;
    assert_eq!(status, StatusCode::OK, "{cart}");
    assert_eq!(
        cart,
        json!({"items": [], "total_cents": 0, "currency": "EUR"})
    );
    assert_eq!(shop.add(&user, a, 1).await.0, StatusCode::OK);
    let (status, order) = shop.checkout(&user).await;
    assert_eq!(status, StatusCode::CREATED, "{order}");
}

/// Defect 4: `qty: 9223372036854775807` twice overflowed the cart line (500, and the cart
/// stayed broken). Quantities are bounded: 400 for the request, 422 past 100 in a line.
#[tokio::test]
async fn huge_quantities_are_refused_and_the_cart_still_checks_out() {
    let shop = shop().await;
    let user = shop.login("greedy").await;
    let sku = shop.sku("a", 1_000).await;
    for _ in 0..2 {
        let (status, body) = shop.add(&user, sku, i64::MAX).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(body["detail"], "qty must be from 1 to 100");
    }
    let (status, body) = shop
        .call_as(
            &user,
            "POST",
            "/api/cart/items",
            &format!(r#"{{"sku_id":{sku},"qty":99999999999999999999999}}"#),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(shop.add(&user, sku, 100).await.0, StatusCode::OK);
    let (status, body) = shop.add(&user, sku, 1).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["detail"].as_str().unwrap().contains("at most 100"),
        "{body}"
    );
    let (status, order) = shop.checkout(&user).await;
    assert_eq!(status, StatusCode::CREATED, "{order}");
    assert_eq!(order["total_cents"], 25_000, "{order}");
}

/// Defect 5: a voucher with stock 2⁶³ − 1 was accepted and `/api/stats` answered 500 from then
/// on. Stock and prices are bounded; stats stay readable.
#[tokio::test]
async fn out_of_bounds_numbers_are_refused_and_stats_stay_readable() {
    let shop = shop().await;
    let now = flash_sale::now_ms();
    let voucher = |price: i64, stock: i64| {
        json!({"title": "x", "price_cents": price, "stock": stock,
               "starts_at_ms": now, "ends_at_ms": now + 1000})
        .to_string()
    };
    for (body, why) in [
        (voucher(1, i64::MAX), "stock"),
        (voucher(1, 1_000_001), "stock"),
        (voucher(-1, 1), "price_cents"),
        (voucher(100_000_001, 1), "price_cents"),
    ] {
        let (status, problem) = shop.operator("POST", "/api/vouchers", &body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {problem}");
        assert!(
            problem["detail"].as_str().unwrap().contains(why),
            "{problem}"
        );
    }
    for body in [
        r#"{"name":"a","price_cents":-5,"stock":1}"#,
        r#"{"name":"a","price_cents":5,"stock":9223372036854775807}"#,
    ] {
        let (status, problem) = shop.operator("POST", "/api/skus", body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {problem}");
    }
    shop.voucher(1_000_000, now - 1000, now + 60_000).await;
    let stats = shop.stats().await;
    assert_eq!(stats["voucher_initial_stock"], 1_000_000, "{stats}");
}

/// Defect 6: NUL (and other control characters) in a title or a name: stored on SQLite, 500
/// on PostgreSQL. Now 400 everywhere; blank, over-long and megabyte texts too.
#[tokio::test]
async fn texts_with_control_characters_blank_or_huge_are_refused() {
    let shop = shop().await;
    let now = flash_sale::now_ms();
    for title in ["a\u{0}b", "line\nbreak", "   ", &"x".repeat(121)] {
        let body = json!({"title": title, "price_cents": 1, "stock": 1,
                          "starts_at_ms": now, "ends_at_ms": now + 1000});
        let (status, problem) = shop
            .operator("POST", "/api/vouchers", &body.to_string())
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{title:?}: {problem}");
    }
    for name in ["nul\u{0}", "", "\t", &"n".repeat(81)] {
        let (status, _) = shop
            .call("POST", "/api/login", &json!({ "name": name }).to_string())
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{name:?}");
        let body = json!({"name": name, "price_cents": 1, "stock": 1});
        let (status, _) = shop.operator("POST", "/api/skus", &body.to_string()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{name:?}");
    }
    let megabyte = json!({"title": "x".repeat(1 << 20), "price_cents": 1, "stock": 1,
                          "starts_at_ms": now, "ends_at_ms": now + 1000});
    let (status, _) = shop
        .operator("POST", "/api/vouchers", &megabyte.to_string())
        .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    let (_, vouchers) = shop.call("GET", "/api/vouchers", "").await;
    assert_eq!(vouchers, json!([]), "nothing stored");
    // Names are trimmed; the same name logs in as the same user.
    let first = shop.login(" alice ").await;
    assert_eq!(shop.login("alice").await.id, first.id);
}

/// Format characters (Unicode Cf) in a title or a name: a right-to-left override shows a name
/// backwards, a zero-width joiner makes two names look alike. 400, as control characters are.
#[tokio::test]
async fn texts_with_format_characters_are_refused() {
    let shop = shop().await;
    let now = flash_sale::now_ms();
    for text in ["evil\u{202E}gpj.exe", "ad\u{200D}min"] {
        let body = json!({"title": text, "price_cents": 1, "stock": 1,
                          "starts_at_ms": now, "ends_at_ms": now + 1000});
        let (status, problem) = shop
            .operator("POST", "/api/vouchers", &body.to_string())
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{text:?}: {problem}");
        assert!(
            problem["detail"]
                .as_str()
                .unwrap()
                .contains("format characters"),
            "{problem}"
        );
        let (status, problem) = shop
            .call("POST", "/api/login", &json!({ "name": text }).to_string())
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{text:?}: {problem}");
        let body = json!({"name": text, "price_cents": 1, "stock": 1});
        let (status, _) = shop.operator("POST", "/api/skus", &body.to_string()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{text:?}");
    }
    let (_, vouchers) = shop.call("GET", "/api/vouchers", "").await;
    assert_eq!(vouchers, json!([]), "nothing stored");
    let (_, skus) = shop.call("GET", "/api/skus", "").await;
    assert_eq!(skus, json!([]), "nothing stored");
}

/// Ids must be positive, everywhere.
#[tokio::test]
async fn ids_of_zero_or_below_are_refused() {
    let shop = shop().await;
    let user = shop.login("ids").await;
    for (method, uri, body) in [
        ("POST", "/api/vouchers/0/orders".to_owned(), String::new()),
        ("POST", "/api/vouchers/-2/orders".to_owned(), String::new()),
        (
            "POST",
            "/api/cart/items".to_owned(),
            r#"{"sku_id":0,"qty":1}"#.to_owned(),
        ),
        ("DELETE", "/api/cart/items/-3".to_owned(), String::new()),
        ("DELETE", "/api/cart/items/abc".to_owned(), String::new()),
        ("GET", "/api/events?user=0".to_owned(), String::new()),
    ] {
        let (status, body) = shop.call_as(&user, method, &uri, &body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{method} {uri}: {body}");
    }
}

/// Every purchase for a voucher that doesn't exist left a fencing counter in Redis for 7 days.
/// The voucher is looked up before any lock: Redis stays empty.
#[tokio::test]
async fn orders_for_unknown_vouchers_leave_nothing_in_redis() {
    let shop = shop().await;
    let user = shop.login("ghost-buyer").await;
    for voucher in 1000..1050 {
        let (status, _) = shop.buy(&user, voucher).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
    }
    // Without a session, a checkout is refused before any lock.
    let (status, _) = shop.call("POST", "/api/cart/checkout", "").await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "no session, before any lock"
    );
    let mut con = shop.redis.connection().await;
    let keys: i64 = dlock_core::redis::cmd("DBSIZE")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(keys, 0);
}

/// Defect 10 (and the one error format): a database failure is a 500 whose body says nothing
/// of the database; axum's own rejections are problem+json like the rest.
#[tokio::test]
async fn internal_errors_never_reach_the_body_and_every_error_is_a_problem() {
    let shop = shop().await;
    sqlx::query("DROP TABLE counters")
        .execute(&shop.app.db)
        .await
        .unwrap();
    let answer = shop
        .send(
            Request::get("/api/stats")
                .header(
                    "authorization",
                    format!("Bearer {}", common::OPERATOR_TOKEN),
                )
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(answer.status, StatusCode::INTERNAL_SERVER_ERROR);
    for leak in ["counters", "table", "sqlite", "SQL", "error returned"] {
        assert!(!answer.text.contains(leak), "{leak}: {}", answer.text);
    }
    // Every rejection below is checked to be problem+json by `send`.
    let cases = [
        ("GET", "/no/such/route", "", StatusCode::NOT_FOUND),
        ("PUT", "/api/vouchers", "", StatusCode::METHOD_NOT_ALLOWED),
        ("GET", "/api/events?user=abc", "", StatusCode::BAD_REQUEST),
        ("POST", "/api/login", "{", StatusCode::BAD_REQUEST),
        (
            "POST",
            "/api/login",
            r#"{"nom":"x"}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
    ];
    for (method, uri, body, status) in cases {
        let answer = shop
            .send(
                Request::builder()
                    .method(method)
                    .uri(uri)
                    .header("content-type", "application/json")
                    .body(Body::from(body))
                    .unwrap(),
            )
            .await;
        assert_eq!(answer.status, status, "{method} {uri}: {answer:?}");
    }
}

/// Every answer carries a request id: the caller's when sensible, a fresh one otherwise.
#[tokio::test]
async fn request_ids_are_taken_or_made_and_echoed() {
    let shop = shop().await;
    let answer = shop
        .send(
            Request::get("/healthz")
                .header("x-request-id", "trace-42.a_b")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(answer.headers["x-request-id"], "trace-42.a_b");
    let answer = shop
        .send(
            Request::get("/healthz")
                .header("x-request-id", "bad id with spaces")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    let made = answer.headers["x-request-id"].to_str().unwrap();
    assert_eq!(made.len(), 16, "{made}");
    assert_eq!(answer.body, json!({"status": "ok"}));
}
