//! Shoppers' sessions: the user of every shopper's route is the session's, another shopper's
//! data can't be reached, signing out ends the session, and other sites' pages can't act.

mod common;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::{Shopper, shop};
use serde_json::json;

#[tokio::test]
async fn login_sets_an_http_only_same_site_session_cookie_with_an_expiry() {
    let shop = shop().await;
    let answer = shop
        .send(
            Request::post("/api/login")
                .header("content-type", "application/json")
                .body(Body::from(r#"{"name":"alice"}"#))
                .unwrap(),
        )
        .await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.body["name"], "alice");
    let set = answer.headers["set-cookie"].to_str().unwrap();
    for part in [
        "shop_session=",
        "HttpOnly",
        "SameSite=Strict",
        "Path=/",
        "Max-Age=43200",
    ] {
        assert!(set.contains(part), "{part}: {set}");
    }
    // The database keeps a digest of the token, not the token.
    let token = set
        .split(';')
        .next()
        .unwrap()
        .trim_start_matches("shop_session=");
    assert_eq!(token.len(), 64, "{set}");
    let kept: Vec<String> = sqlx::query_scalar("SELECT token_digest FROM sessions")
        .fetch_all(&shop.app.db)
        .await
        .unwrap();
    assert_eq!(kept.len(), 1);
    assert_ne!(kept[0], token);
    let alice = Shopper {
        id: answer.body["id"].as_i64().unwrap(),
        cookie: format!("shop_session={token}"),
    };
    let (status, me) = shop.call_as(&alice, "GET", "/api/me", "").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(me, json!({"id": alice.id, "name": "alice"}));

    // Behind a proxy that terminates HTTPS, the cookie is sent over HTTPS only.
    let answer = shop
        .send(
            Request::post("/api/login")
                .header("content-type", "application/json")
                .header("x-forwarded-proto", "https")
                .body(Body::from(r#"{"name":"alice"}"#))
                .unwrap(),
        )
        .await;
    let set = answer.headers["set-cookie"].to_str().unwrap();
    assert!(set.ends_with("; Secure"), "{set}");
    assert!(set.contains("HttpOnly; SameSite=Strict"), "{set}");
}

#[tokio::test]
async fn without_a_session_every_shoppers_route_is_401() {
    let shop = shop().await;
    let voucher = shop.open_voucher(5).await;
    let sku = shop.sku("mug", 5).await;
    let routes = [
        ("GET", "/api/me".to_owned(), String::new()),
        ("GET", "/api/cart".to_owned(), String::new()),
        ("GET", "/api/orders".to_owned(), String::new()),
        (
            "POST",
            "/api/cart/items".to_owned(),
            format!(r#"{{"sku_id":{sku},"qty":1}}"#),
        ),
        ("DELETE", format!("/api/cart/items/{sku}"), String::new()),
        ("DELETE", "/api/cart/items".to_owned(), String::new()),
        ("POST", "/api/cart/checkout".to_owned(), String::new()),
        (
            "POST",
            format!("/api/vouchers/{voucher}/orders"),
            String::new(),
        ),
    ];
    let forged = Shopper {
        id: 1,
        cookie: format!("shop_session={}", "0".repeat(64)),
    };
    for (method, uri, body) in &routes {
        let (status, problem) = shop.call(method, uri, body).await;
        assert_eq!(
            status,
            StatusCode::UNAUTHORIZED,
            "{method} {uri}: {problem}"
        );
        let (status, problem) = shop.call_as(&forged, method, uri, body).await;
        assert_eq!(
            status,
            StatusCode::UNAUTHORIZED,
            "{method} {uri}: {problem}"
        );
    }
    let stats = shop.stats().await;
    assert_eq!(stats["voucher_orders"], 0, "{stats}");
}

/// The user is the session's: a path or a body naming another user names nothing.
#[tokio::test]
async fn another_shoppers_cart_orders_and_stream_are_out_of_reach() {
    let shop = shop().await;
    let alice = shop.login("alice").await;
    let bob = shop.login("bob").await;
    let voucher = shop.open_voucher(5).await;
    let sku = shop.sku("mug", 5).await;
    assert_eq!(shop.add(&alice, sku, 2).await.0, StatusCode::OK);

    // Bob sees his own (empty) cart, and a body naming Alice buys for Bob.
    let (_, cart) = shop.call_as(&bob, "GET", "/api/cart", "").await;
    assert_eq!(cart["items"], json!([]), "{cart}");
    let (status, order) = shop
        .call_as(
            &bob,
            "POST",
            &format!("/api/vouchers/{voucher}/orders"),
            &format!(r#"{{"user_id":{}}}"#, alice.id),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{order}");
    assert_eq!(order["user_id"], bob.id, "{order}");
    let (_, orders) = shop.call_as(&alice, "GET", "/api/orders", "").await;
    assert_eq!(orders["vouchers"], json!([]), "{orders}");

    // The routes that named a user in the path are gone.
    for uri in [
        format!("/api/carts/{}", alice.id),
        format!("/api/carts/{}/checkout", alice.id),
        format!("/api/users/{}/orders", alice.id),
    ] {
        let (status, _) = shop.call_as(&bob, "GET", &uri, "").await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{uri}");
    }
    // Alice's stream: not Bob's to open.
    let (status, _) = shop
        .call_as(&bob, "GET", &format!("/api/events?user={}", alice.id), "")
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = shop
        .call("GET", &format!("/api/events?user={}", alice.id), "")
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    // A shopper is not the operator.
    let (status, problem) = shop.call_as(&bob, "GET", "/api/stats", "").await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{problem}");
    let (status, _) = shop
        .call_as(
            &bob,
            "POST",
            "/api/skus",
            r#"{"name":"x","price_cents":0,"stock":9}"#,
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);

    // Alice's cart is as she left it.
    let (_, cart) = shop.call_as(&alice, "GET", "/api/cart", "").await;
    assert_eq!(cart["items"][0]["qty"], 2, "{cart}");
}

#[tokio::test]
async fn logging_out_ends_the_session_and_so_does_its_expiry() {
    let shop = shop().await;
    let alice = shop.login("alice").await;
    let other_tab = shop.login("alice").await;
    let answer = shop
        .send(
            Request::post("/api/logout")
                .header("cookie", &alice.cookie)
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(answer.status, StatusCode::NO_CONTENT);
    let set = answer.headers["set-cookie"].to_str().unwrap();
    assert!(
        set.starts_with("shop_session=;") && set.contains("Max-Age=0"),
        "{set}"
    );
    // The cookie, kept or copied, opens nothing any more.
    let (status, _) = shop.call_as(&alice, "GET", "/api/cart", "").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // Another sign-in of the same user is its own session.
    let (status, _) = shop.call_as(&other_tab, "GET", "/api/cart", "").await;
    assert_eq!(status, StatusCode::OK);

    // Signing in again from a browser that had a session ends the one it had.
    let answer = shop
        .send(
            Request::post("/api/login")
                .header("content-type", "application/json")
                .header("cookie", &other_tab.cookie)
                .body(Body::from(r#"{"name":"alice"}"#))
                .unwrap(),
        )
        .await;
    assert_eq!(answer.status, StatusCode::OK);
    let (status, _) = shop.call_as(&other_tab, "GET", "/api/cart", "").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "the old session lives on");
    let other_tab = common::Shopper {
        id: other_tab.id,
        cookie: answer.headers["set-cookie"]
            .to_str()
            .unwrap()
            .split(';')
            .next()
            .unwrap()
            .to_owned(),
    };

    // An expired session opens nothing either.
    sqlx::query("UPDATE sessions SET expires_at_ms = $1")
        .bind(flash_sale::now_ms() - 1)
        .execute(&shop.app.db)
        .await
        .unwrap();
    let (status, _) = shop.call_as(&other_tab, "GET", "/api/cart", "").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // Logging out without a session is harmless.
    let (status, _) = shop.call("POST", "/api/logout", "").await;
    assert_eq!(status, StatusCode::NO_CONTENT);
}

/// A page of another site can't change anything, even if the browser sent the cookie: a
/// browser says where a request comes from, and the shop listens.
#[tokio::test]
async fn requests_from_other_sites_pages_are_refused() {
    let shop = shop().await;
    let alice = shop.login("alice").await;
    let sku = shop.sku("mug", 5).await;
    let add = |header: (&str, &str)| {
        Request::post("/api/cart/items")
            .header("host", "shop.example")
            .header("content-type", "application/json")
            .header("cookie", &alice.cookie)
            .header(header.0, header.1)
            .body(Body::from(format!(r#"{{"sku_id":{sku},"qty":1}}"#)))
            .unwrap()
    };
    for header in [
        ("sec-fetch-site", "cross-site"),
        ("sec-fetch-site", "same-site"),
        ("origin", "http://evil.example"),
        ("origin", "null"),
    ] {
        let answer = shop.send(add(header)).await;
        assert_eq!(
            answer.status,
            StatusCode::FORBIDDEN,
            "{header:?}: {answer:?}"
        );
    }
    let (_, cart) = shop.call_as(&alice, "GET", "/api/cart", "").await;
    assert_eq!(cart["items"], json!([]), "nothing added: {cart}");
    for header in [
        ("sec-fetch-site", "same-origin"),
        ("origin", "http://shop.example"),
    ] {
        let answer = shop.send(add(header)).await;
        assert_eq!(answer.status, StatusCode::OK, "{header:?}: {answer:?}");
    }
    // A login from another site's page is refused as well (no session is planted).
    let answer = shop
        .send(
            Request::post("/api/login")
                .header("content-type", "application/json")
                .header("sec-fetch-site", "cross-site")
                .body(Body::from(r#"{"name":"mallory"}"#))
                .unwrap(),
        )
        .await;
    assert_eq!(answer.status, StatusCode::FORBIDDEN);
    assert!(!answer.headers.contains_key("set-cookie"));
}

/// Signing out ends the session's event stream too, within a few seconds: a stream opened
/// before doesn't go on carrying the cart and the orders.
#[tokio::test]
async fn signing_out_ends_the_sessions_event_stream() {
    use http_body_util::BodyExt as _;
    let shop = shop().await;
    let alice = shop.login("alice").await;
    let response = tower::ServiceExt::oneshot(
        shop.router.clone(),
        Request::get("/api/events")
            .header("cookie", &alice.cookie)
            .body(Body::empty())
            .unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let mut seen = String::new();
    while !(seen.contains("event: orders") && seen.contains("event: cart")) {
        let frame = tokio::time::timeout(std::time::Duration::from_secs(5), body.frame())
            .await
            .expect("the state on connect")
            .expect("a frame")
            .unwrap();
        if let Ok(data) = frame.into_data() {
            seen.push_str(&String::from_utf8_lossy(&data));
        }
    }
    let (status, _) = shop.call_as(&alice, "POST", "/api/logout", "").await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let ended = tokio::time::timeout(std::time::Duration::from_secs(5), async {
        while let Some(frame) = body.frame().await {
            frame.unwrap();
        }
    })
    .await;
    assert!(ended.is_ok(), "the stream outlived the session");
}
