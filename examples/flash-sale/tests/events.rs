//! The event stream: the state on connect, then changes made on another instance.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty, Full};
use hyper_util::client::legacy::Client;
use serde_json::{Value, json};

async fn serve(app: flash_sale::App) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, flash_sale::router(app)).await });
    url
}

/// The operator's token of the instances; every request of [`post`] carries it.
const OPERATOR: &str = "test-operator-token-0123456789";

async fn post(url: &str, body: Value) -> Value {
    post_as(None, url, body).await
}

/// [`post`], with a shopper's session cookie when `cookie` is given.
async fn post_as(cookie: Option<&str>, url: &str, body: Value) -> Value {
    let client = Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let mut request = hyper::Request::post(url)
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {OPERATOR}"));
    if let Some(cookie) = cookie {
        request = request.header("cookie", cookie);
    }
    let request = request
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let response = client.request(request).await.unwrap();
    assert!(
        response.status().is_success(),
        "{url}: {}",
        response.status()
    );
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&bytes).unwrap()
}

/// Reads server-sent events: (name, data).
struct Events {
    body: hyper::body::Incoming,
    buffer: String,
}

impl Events {
    async fn next(&mut self) -> (String, Value) {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let mut name = String::new();
                let mut data = String::new();
                for line in block.lines() {
                    if let Some(n) = line.strip_prefix("event: ") {
                        name = n.to_owned();
                    } else if let Some(d) = line.strip_prefix("data: ") {
                        data.push_str(d);
                    }
                }
                if name.is_empty() {
                    continue; // a keep-alive comment
                }
                return (name, serde_json::from_str(&data).unwrap());
            }
            let frame = tokio::time::timeout(Duration::from_secs(15), self.body.frame())
                .await
                .expect("an event within 15 s")
                .expect("the stream goes on")
                .unwrap();
            if let Ok(data) = frame.into_data() {
                self.buffer.push_str(&String::from_utf8_lossy(&data));
            }
        }
    }

    /// Skips events until one called `name` satisfies `ok`.
    async fn until(&mut self, name: &str, ok: impl Fn(&Value) -> bool) -> Value {
        loop {
            let (n, data) = self.next().await;
            if n == name && ok(&data) {
                return data;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_sees_changes_made_on_another_instance() {
    let redis = dlock_tests::RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}?mode=rwc", dir.path().join("shop.db").display());
    let mut urls = Vec::new();
    for _ in 0..2 {
        let locker = flash_sale::server::locker(&redis.url()).await.unwrap();
        let mut app = flash_sale::app(&db, locker, true).await.unwrap();
        app.operator = Some(flash_sale::auth::OperatorToken::new(OPERATOR).unwrap());
        urls.push(serve(app).await);
    }
    let (a, b) = (&urls[0], &urls[1]);
    let (watcher, cookie) = flash_sale::loadgen::login(a, "watcher").await.unwrap();
    let user = watcher.id;
    let (_, other) = flash_sale::loadgen::login(a, "someone else").await.unwrap();
    let now = flash_sale::now_ms();
    let voucher = post(
        &format!("{a}/api/vouchers"),
        json!({"title": "Watched", "price_cents": 300, "stock": 4,
               "starts_at_ms": now - 1000, "ends_at_ms": now + 600_000}),
    )
    .await["id"]
        .as_i64()
        .unwrap();

    let client = Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    // Another user's stream: refused, signed in (403) or not (401).
    for (cookie, status) in [(Some(other.as_str()), 403), (None, 401)] {
        let mut request = hyper::Request::get(format!("{a}/api/events?user={user}"));
        if let Some(cookie) = cookie {
            request = request.header("cookie", cookie);
        }
        let response = client
            .request(request.body(Empty::<Bytes>::new()).unwrap())
            .await
            .unwrap();
        assert_eq!(response.status(), status);
        assert_eq!(
            response.headers()["content-type"],
            "application/problem+json"
        );
    }
    // One's own, by the session (`?user=` may name it).
    let response = client
        .request(
            hyper::Request::get(format!("{a}/api/events?user={user}"))
                .header("cookie", &cookie)
                .body(Empty::<Bytes>::new())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut events = Events {
        body: response.into_body(),
        buffer: String::new(),
    };
    // On connect: the catalog, the cart, the orders.
    let catalog = events.until("catalog", |_| true).await;
    assert_eq!(catalog["vouchers"][0]["stock"], 4, "{catalog}");
    let cart = events.until("cart", |_| true).await;
    assert_eq!(cart["items"], json!([]), "{cart}");
    events.until("orders", |_| true).await;

    // The purchase happens on the other instance.
    post_as(
        Some(&cookie),
        &format!("{b}/api/vouchers/{voucher}/orders"),
        Value::Null,
    )
    .await;
    // Both come, in either order.
    let (mut stock_dropped, mut ordered) = (false, false);
    while !(stock_dropped && ordered) {
        let (name, data) = events.next().await;
        match name.as_str() {
            "catalog" => stock_dropped |= data["vouchers"][0]["stock"] == 3,
            "orders" => ordered |= data["vouchers"][0]["voucher_id"] == voucher,
            _ => {}
        }
    }

    // A cart edit on the other instance.
    let sku = post(
        &format!("{b}/api/skus"),
        json!({"name": "s", "price_cents": 5, "stock": 3}),
    )
    .await["id"]
        .as_i64()
        .unwrap();
    post_as(
        Some(&cookie),
        &format!("{b}/api/cart/items"),
        json!({"sku_id": sku, "qty": 2}),
    )
    .await;
    let cart = events
        .until("cart", |c| {
            c["items"].as_array().is_some_and(|i| !i.is_empty())
        })
        .await;
    assert_eq!(cart["total_cents"], 10, "{cart}");
}
