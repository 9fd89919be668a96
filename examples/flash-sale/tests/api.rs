//! Bad input, answered with the right status and a problem+json message, and nothing written.

mod common;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::shop;
use dlock_core::LockName;
use flash_sale::now_ms;

#[tokio::test]
async fn bad_input_gets_clear_answers() {
    let shop = shop().await;
    let one = shop.login("one").await;
    let two = shop.login("two").await;
    let (status, body) = shop.buy(&one, 999).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(
        body["detail"].as_str().unwrap().contains("no voucher"),
        "{body}"
    );

    let open = shop.open_voucher(1).await;
    // A buyer is the session's user: an order takes no body. Bodies that don't parse are
    // refused where a body is read, as a cart addition reads one.
    let (status, body) = shop
        .call_as(&one, "POST", "/api/cart/items", "{not json")
        .await;
    assert!(body["detail"].is_string(), "{body}");
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, body) = shop
        .call_as(&one, "POST", "/api/cart/items", r#"{"sku":1}"#)
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        body["detail"].as_str().unwrap().contains("sku_id"),
        "{body}"
    );

    let later = shop.voucher(5, now_ms() + 60_000, now_ms() + 120_000).await;
    let (status, body) = shop.buy(&one, later).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body["detail"], "the sale has not started");

    let over = shop.voucher(5, now_ms() - 120_000, now_ms() - 60_000).await;
    let (status, body) = shop.buy(&one, over).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body["detail"], "the sale has ended");

    let (status, _) = shop.buy(&one, open).await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, body) = shop.buy(&one, open).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("one order per user"),
        "{body}"
    );
    let (status, body) = shop.buy(&two, open).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body["detail"], "sold out");

    // Nothing was written by the rejected requests.
    let stats = shop.stats().await;
    assert_eq!(stats["voucher_orders"], 1, "{stats}");

    let (status, body) = shop.checkout(&two).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["detail"], "the cart is empty");
}

#[tokio::test]
async fn bad_vouchers_and_carts_are_refused() {
    let shop = shop().await;
    let bad = [
        (
            r#"{"title":"","price_cents":1,"stock":1,"starts_at_ms":0,"ends_at_ms":1}"#,
            "title",
        ),
        (
            r#"{"title":"x","price_cents":1,"stock":-1,"starts_at_ms":0,"ends_at_ms":1}"#,
            "stock",
        ),
        (
            r#"{"title":"x","price_cents":1,"stock":1,"starts_at_ms":5,"ends_at_ms":5}"#,
            "end after",
        ),
    ];
    for (json, why) in bad {
        let (status, body) = shop.operator("POST", "/api/vouchers", json).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{json}: {body}");
        assert!(body["detail"].as_str().unwrap().contains(why), "{body}");
    }
    // Not JSON at all.
    let answer = shop
        .send(
            Request::post("/api/vouchers")
                .header(
                    "authorization",
                    format!("Bearer {}", common::OPERATOR_TOKEN),
                )
                .body(Body::from("title=x"))
                .unwrap(),
        )
        .await;
    assert_eq!(answer.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);

    let seven = shop.login("seven").await;
    let eight = shop.login("eight").await;
    let (status, body) = shop.add(&seven, 42, 1).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["detail"], "no sku 42");
    let sku = shop.sku("mug", 1).await;
    let (status, body) = shop.add(&seven, sku, 0).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["detail"], "qty must be from 1 to 100");

    // Two in the cart, one in stock: 409, and the cart is kept.
    let (status, cart) = shop.add(&seven, sku, 2).await;
    assert_eq!(status, StatusCode::OK, "{cart}");
    assert_eq!(cart["items"][0]["qty"], 2, "{cart}");
    let (status, body) = shop.checkout(&seven).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(
        body["detail"],
        "mug is out of stock (1 left, 2 in the cart)"
    );
    let (_, cart) = shop.call_as(&seven, "GET", "/api/cart", "").await;
    assert_eq!(cart["items"][0]["qty"], 2, "{cart}");

    // One fits: the order snapshots it, the stock drops, the cart empties.
    let (status, _) = shop.add(&eight, sku, 1).await;
    assert_eq!(status, StatusCode::OK);
    let (status, order) = shop.checkout(&eight).await;
    assert_eq!(status, StatusCode::CREATED, "{order}");
    assert_eq!(order["items"][0]["sku_id"], sku, "{order}");
    assert_eq!(order["total_cents"], 250, "{order}");
    let (_, skus) = shop.call("GET", "/api/skus", "").await;
    assert_eq!(skus[0]["stock"], 0, "{skus}");
    let (_, cart) = shop.call_as(&eight, "GET", "/api/cart", "").await;
    assert_eq!(
        cart,
        serde_json::json!({"items": [], "total_cents": 0, "currency": "EUR"})
    );
}

/// A purchase whose lock is held elsewhere (another instance) waits, then gets 409 with
/// `Retry-After`: the buy through `#[distributed_lock]`, the checkout through `LockLayer`.
#[tokio::test]
async fn busy_locks_answer_409_with_retry_after() {
    let shop = shop().await;
    let user = shop.login("three").await;
    let voucher = shop.open_voucher(5).await;
    let sku = shop.sku("mug", 5).await;
    let (status, _) = shop.add(&user, sku, 1).await;
    assert_eq!(status, StatusCode::OK);

    let other = dlock_core::Locker::connect(&shop.redis.url())
        .await
        .unwrap();
    let order_lock = LockName::builder()
        .literal("order:")
        .value(user.id)
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
        "/api/cart/checkout".to_owned(),
    ] {
        let answer = shop
            .send(
                Request::post(&uri)
                    .header("cookie", &user.cookie)
                    .body(Body::empty())
                    .unwrap(),
            )
            .await;
        assert_eq!(answer.status, StatusCode::CONFLICT, "{uri}");
        assert!(
            answer.headers.contains_key("retry-after"),
            "{uri}: {:?}",
            answer.headers
        );
        // The lock's name holds the user id: it stays out of the body.
        assert!(answer.body.get("lock").is_none(), "{uri}: {answer:?}");
        let retry: u64 = answer.headers["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!((1..=2).contains(&retry), "{uri}: {answer:?}");
    }
    assert!(held.release().await.is_released());

    let (status, order) = shop.buy(&user, voucher).await;
    assert_eq!(status, StatusCode::CREATED, "{order}");
    assert!(order["fencing_token"].as_i64().unwrap() > 0, "{order}");
    let (status, _) = shop.checkout(&user).await;
    assert_eq!(status, StatusCode::CREATED);
    let stats = shop.stats().await;
    assert_eq!(stats["requests"], 4, "{stats}");
    assert_eq!(stats["conflicts"], 2, "{stats}");
    assert_eq!(stats["locked"], 2, "{stats}");
}

#[tokio::test]
async fn the_pages_are_served() {
    let shop = shop().await;
    for (path, needle) in [("/", "Flash sale"), ("/operator/login", "Operator sign-in")] {
        let answer = shop
            .send(Request::get(path).body(Body::empty()).unwrap())
            .await;
        assert_eq!(answer.status, StatusCode::OK, "{path}");
        assert!(answer.text.contains(needle), "{path}");
    }
    // The operator's page is the operator's.
    let answer = shop
        .send(
            Request::get("/operator")
                .header(
                    "authorization",
                    format!("Bearer {}", common::OPERATOR_TOKEN),
                )
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(answer.status, StatusCode::OK);
    assert!(answer.text.contains("operator"));
}

/// Creating vouchers and SKUs, the operator's page and the numbers need the operator's token:
/// as a bearer token, or as the cookie the sign-in sets. Without it, 401 problem+json, and
/// nothing is created; the token is never in an answer.
#[tokio::test]
async fn only_the_operator_changes_the_catalogue_and_reads_the_numbers() {
    let shop = shop().await;
    let token = common::OPERATOR_TOKEN;
    let voucher = r#"{"title":"free","price_cents":0,"stock":1000000,"starts_at_ms":0,"ends_at_ms":9007199254740991}"#;
    let sku = r#"{"name":"free","price_cents":0,"stock":1000000}"#;
    let request = |method: &str, uri: &str, credential: Option<(&str, String)>, body: &str| {
        let mut request = Request::builder()
            .method(method)
            .uri(uri)
            .header("content-type", "application/json");
        if let Some((name, value)) = credential {
            request = request.header(name, value);
        }
        request.body(Body::from(body.to_owned())).unwrap()
    };
    let nobody = || None;
    let wrong = || Some(("authorization", "Bearer not-the-operator-token".to_owned()));
    for credential in [nobody(), wrong()] {
        for (method, uri, body) in [
            ("POST", "/api/vouchers", voucher),
            ("POST", "/api/skus", sku),
            ("GET", "/api/stats", ""),
            ("GET", "/operator", ""),
        ] {
            let answer = shop
                .send(request(method, uri, credential.clone(), body))
                .await;
            assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "{uri}: {answer:?}");
        }
    }
    let (_, vouchers) = shop.call("GET", "/api/vouchers", "").await;
    assert_eq!(vouchers, serde_json::json!([]), "nothing created");
    let (_, skus) = shop.call("GET", "/api/skus", "").await;
    assert_eq!(skus, serde_json::json!([]), "nothing created");

    // A browser without the credential is sent to the sign-in page.
    let redirect = tower::ServiceExt::oneshot(
        shop.router.clone(),
        Request::get("/operator")
            .header("accept", "text/html,application/xhtml+xml")
            .body(Body::empty())
            .unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(redirect.status(), StatusCode::SEE_OTHER);
    assert_eq!(redirect.headers()["location"], "/operator/login");

    // Signing in: a wrong token is refused, the right one sets a cookie that is not the token.
    let login = |token: &str| {
        request(
            "POST",
            "/api/operator/login",
            None,
            &serde_json::json!({ "token": token }).to_string(),
        )
    };
    let answer = shop.send(login("not-the-operator-token")).await;
    assert_eq!(answer.status, StatusCode::UNAUTHORIZED);
    assert!(!answer.headers.contains_key("set-cookie"), "{answer:?}");
    let answer = shop.send(login(token)).await;
    assert_eq!(answer.status, StatusCode::NO_CONTENT, "{answer:?}");
    let set = answer.headers["set-cookie"].to_str().unwrap().to_owned();
    for part in [
        "shop_operator=",
        "HttpOnly",
        "SameSite=Strict",
        "Path=/",
        "Max-Age=43200",
    ] {
        assert!(set.contains(part), "{part}: {set}");
    }
    assert!(!set.contains(token), "the cookie holds the token: {set}");
    let cookie = set.split(';').next().unwrap().to_owned();
    let with_cookie = || Some(("cookie", cookie.clone()));
    let answer = shop
        .send(request("GET", "/operator", with_cookie(), ""))
        .await;
    assert_eq!(answer.status, StatusCode::OK);
    let answer = shop
        .send(request("GET", "/api/stats", with_cookie(), ""))
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    let answer = shop
        .send(request("POST", "/api/skus", with_cookie(), sku))
        .await;
    assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
    let bearer = Some(("authorization", format!("Bearer {token}")));
    let answer = shop
        .send(request("POST", "/api/vouchers", bearer, voucher))
        .await;
    assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");

    // A forged cookie is refused; signing out removes the cookie.
    let forged = Some(("cookie", format!("shop_operator={token}")));
    let answer = shop.send(request("GET", "/api/stats", forged, "")).await;
    assert_eq!(answer.status, StatusCode::UNAUTHORIZED);
    let answer = shop
        .send(request("POST", "/api/operator/logout", with_cookie(), ""))
        .await;
    assert_eq!(answer.status, StatusCode::NO_CONTENT);
    let set = answer.headers["set-cookie"].to_str().unwrap();
    assert!(
        set.starts_with("shop_operator=;") && set.contains("Max-Age=0"),
        "{set}"
    );
}

/// An instance started without an operator token has no operator: every operator request is
/// 401, saying why.
#[tokio::test]
async fn without_an_operator_token_nobody_is_the_operator() {
    let mut shop = shop().await;
    shop.app.operator = None;
    shop.router = flash_sale::router(shop.app.clone());
    let (status, problem) = shop.operator("GET", "/api/stats", "").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("SHOP_OPERATOR_TOKEN"),
        "{problem}"
    );
    let (status, _) = shop
        .call(
            "POST",
            "/api/operator/login",
            &format!(r#"{{"token":"{}"}}"#, common::OPERATOR_TOKEN),
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}
