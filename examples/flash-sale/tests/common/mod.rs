//! A shop in the test process over a real `redis-server` and a SQLite file, called through its
//! router; every answer that is not a success is checked to be problem+json.

#![allow(dead_code, unreachable_pub)]

pub mod table;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use flash_sale::{NewVoucher, now_ms};
use http_body_util::BodyExt as _;
use serde_json::Value;
use tower::ServiceExt as _;

pub struct Shop {
    pub router: Router,
    pub app: flash_sale::App,
    pub redis: dlock_tests::RedisServer,
    pub _dir: tempfile::TempDir,
}

/// A shop with locks over a fresh Redis and a fresh SQLite file.
pub async fn shop() -> Shop {
    shop_with(true).await
}

/// The operator's token of every test shop.
pub const OPERATOR_TOKEN: &str = "test-operator-token-0123456789";

pub async fn shop_with(locks: bool) -> Shop {
    let redis = dlock_tests::RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("shop.db").display());
    let locker = flash_sale::server::locker(&redis.url()).await.unwrap();
    let mut app = flash_sale::app(&url, locker, locks).await.unwrap();
    app.operator = Some(flash_sale::auth::OperatorToken::new(OPERATOR_TOKEN).unwrap());
    Shop {
        router: flash_sale::router(app.clone()),
        app,
        redis,
        _dir: dir,
    }
}

/// A signed-in shopper: its id and its session cookie (`shop_session=…`).
#[derive(Debug, Clone)]
pub struct Shopper {
    pub id: i64,
    pub cookie: String,
}

/// One answer.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: axum::http::HeaderMap,
    pub body: Value,
    pub text: String,
}

/// Checks the one error format: problem+json with `type`, `title`, `status`, `detail`.
pub fn assert_problem(answer: &Answer) {
    let ct = answer
        .headers
        .get("content-type")
        .map(|v| v.to_str().unwrap_or_default().to_owned())
        .unwrap_or_default();
    assert_eq!(ct, "application/problem+json", "{answer:?}");
    let body = &answer.body;
    assert_eq!(body["type"], "about:blank", "{answer:?}");
    assert_eq!(body["status"], answer.status.as_u16(), "{answer:?}");
    assert!(body["title"].is_string(), "{answer:?}");
    assert!(
        body["detail"].as_str().is_some_and(|d| !d.is_empty()),
        "{answer:?}"
    );
    assert!(answer.headers.contains_key("x-request-id"), "{answer:?}");
}

impl Shop {
    pub async fn send(&self, request: Request<Body>) -> Answer {
        let response = self.router.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let answer = Answer {
            status,
            headers,
            body,
            text,
        };
        if !status.is_success() {
            assert_problem(&answer);
        }
        answer
    }

    pub async fn call(&self, method: &str, uri: &str, body: &str) -> (StatusCode, Value) {
        let answer = self
            .send(
                Request::builder()
                    .method(method)
                    .uri(uri)
                    .header("content-type", "application/json")
                    .body(Body::from(body.to_owned()))
                    .unwrap(),
            )
            .await;
        (answer.status, answer.body)
    }

    /// [`Shop::call`] as the operator (`Authorization: Bearer`).
    pub async fn operator(&self, method: &str, uri: &str, body: &str) -> (StatusCode, Value) {
        let answer = self
            .send(
                Request::builder()
                    .method(method)
                    .uri(uri)
                    .header("content-type", "application/json")
                    .header("authorization", format!("Bearer {OPERATOR_TOKEN}"))
                    .body(Body::from(body.to_owned()))
                    .unwrap(),
            )
            .await;
        (answer.status, answer.body)
    }

    /// Signs in as `name`: the user and its session cookie.
    pub async fn login(&self, name: &str) -> Shopper {
        let answer = self
            .send(
                Request::post("/api/login")
                    .header("content-type", "application/json")
                    .body(Body::from(serde_json::json!({ "name": name }).to_string()))
                    .unwrap(),
            )
            .await;
        assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
        let set = answer.headers["set-cookie"].to_str().unwrap();
        Shopper {
            id: answer.body["id"].as_i64().unwrap(),
            cookie: set.split(';').next().unwrap().to_owned(),
        }
    }

    /// [`Shop::call`] as the signed-in `user` (its session cookie).
    pub async fn call_as(
        &self,
        user: &Shopper,
        method: &str,
        uri: &str,
        body: &str,
    ) -> (StatusCode, Value) {
        let answer = self
            .send(
                Request::builder()
                    .method(method)
                    .uri(uri)
                    .header("content-type", "application/json")
                    .header("cookie", &user.cookie)
                    .body(Body::from(body.to_owned()))
                    .unwrap(),
            )
            .await;
        (answer.status, answer.body)
    }

    /// Buys `voucher` as `user`.
    pub async fn buy(&self, user: &Shopper, voucher: i64) -> (StatusCode, Value) {
        self.call_as(user, "POST", &format!("/api/vouchers/{voucher}/orders"), "")
            .await
    }

    /// Checks out `user`'s cart.
    pub async fn checkout(&self, user: &Shopper) -> (StatusCode, Value) {
        self.call_as(user, "POST", "/api/cart/checkout", "").await
    }

    pub async fn voucher(&self, stock: i64, starts_at_ms: i64, ends_at_ms: i64) -> i64 {
        let new = NewVoucher {
            title: "v".into(),
            price_cents: 100,
            stock,
            starts_at_ms,
            ends_at_ms,
        };
        let (status, body) = self
            .operator(
                "POST",
                "/api/vouchers",
                &serde_json::to_string(&new).unwrap(),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        body["id"].as_i64().unwrap()
    }

    pub async fn open_voucher(&self, stock: i64) -> i64 {
        self.voucher(stock, now_ms() - 1_000, now_ms() + 600_000)
            .await
    }

    pub async fn sku(&self, name: &str, stock: i64) -> i64 {
        let (status, sku) = self
            .operator(
                "POST",
                "/api/skus",
                &format!(r#"{{"name":"{name}","price_cents":250,"stock":{stock}}}"#),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{sku}");
        sku["id"].as_i64().unwrap()
    }

    pub async fn add(&self, user: &Shopper, sku: i64, qty: i64) -> (StatusCode, Value) {
        self.call_as(
            user,
            "POST",
            "/api/cart/items",
            &format!(r#"{{"sku_id":{sku},"qty":{qty}}}"#),
        )
        .await
    }

    pub async fn stats(&self) -> Value {
        let (status, stats) = self.operator("GET", "/api/stats", "").await;
        assert_eq!(status, StatusCode::OK, "{stats}");
        stats
    }
}
