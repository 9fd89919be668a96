//! A real browser (headless Chromium through chromedriver) opens the page, buys a voucher, and
//! sees the stock drop and the order appear.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use flash_sale::{NewVoucher, now_ms};
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::{Value, json};

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

fn require(binary: &str) -> String {
    for candidate in [format!("/usr/bin/{binary}"), binary.to_owned()] {
        let ok = Command::new(&candidate)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return candidate;
        }
    }
    panic!(
        "`{binary}` is needed for the browser test: install it with \
         `apt-get install chromium chromium-driver`"
    );
}

#[derive(Clone)]
struct Driver {
    client: Client<HttpConnector, Full<Bytes>>,
    base: String,
}

impl Driver {
    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let request = hyper::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(
                body.map(|b| b.to_string()).unwrap_or_default(),
            )))
            .unwrap();
        let response = tokio::time::timeout(Duration::from_secs(30), self.client.request(request))
            .await
            .expect("chromedriver answers")
            .expect("chromedriver request");
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        serde_json::from_slice(&bytes).unwrap_or(Value::Null)
    }

    async fn find_all(&self, session: &str, css: &str) -> Vec<String> {
        let found = self
            .call(
                "POST",
                &format!("/session/{session}/elements"),
                Some(json!({"using": "css selector", "value": css})),
            )
            .await;
        found["value"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|e| e[ELEMENT].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    }

    async fn text(&self, session: &str, element: &str) -> String {
        let text = self
            .call(
                "GET",
                &format!("/session/{session}/element/{element}/text"),
                None,
            )
            .await;
        text["value"].as_str().unwrap_or_default().to_owned()
    }
}

/// Polls `probe` until it returns `Some` or 15 s pass.
async fn eventually<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_buys_a_voucher_and_sees_stock_drop() {
    let chromium = require("chromium");
    let chromedriver = require("chromedriver");

    // The shop, with a voucher of 3 on sale.
    let redis = dlock_tests::RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}?mode=rwc", dir.path().join("shop.db").display());
    let locker = dlock_core::Locker::connect(&redis.url()).await.unwrap();
    let app = flash_sale::app(&db, locker, true).await.unwrap();
    let voucher = NewVoucher {
        title: "Browser voucher".into(),
        price: 500,
        stock: 3,
        begin_at: now_ms() - 1_000,
        end_at: now_ms() + 600_000,
    };
    sqlx::query(
        "INSERT INTO vouchers (title, price, stock, initial_stock, begin_at, end_at)
         VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(&voucher.title)
    .bind(voucher.price)
    .bind(voucher.stock)
    .bind(voucher.stock)
    .bind(voucher.begin_at)
    .bind(voucher.end_at)
    .execute(&app.db)
    .await
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let shop = format!("http://{}/", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, flash_sale::router(app)).await });

    // chromedriver on a free port.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut driver_process = tokio::process::Command::new(&chromedriver)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start chromedriver");
    let driver = Driver {
        client: Client::builder(hyper_util::rt::TokioExecutor::new()).build_http(),
        base: format!("http://127.0.0.1:{port}"),
    };
    eventually("chromedriver", || async {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        let status = driver.call("GET", "/status", None).await;
        status["value"]["ready"].as_bool().filter(|r| *r)
    })
    .await;
    let profile = tempfile::tempdir().unwrap();
    let session = driver
        .call(
            "POST",
            "/session",
            Some(json!({"capabilities": {"alwaysMatch": {
                "browserName": "chrome",
                "goog:chromeOptions": {
                    "binary": chromium,
                    "args": [
                        "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                        "--disable-background-networking", "--disable-component-update",
                        "--disable-sync", "--no-first-run", "--disable-quic",
                        format!("--user-data-dir={}", profile.path().display()),
                    ]
                }
            }}})),
        )
        .await;
    let session = session["value"]["sessionId"]
        .as_str()
        .unwrap_or_else(|| panic!("no browser session: {session}"))
        .to_owned();

    // The steps run in a task of their own so that the browser is closed even when one fails.
    let steps = tokio::spawn(buy_and_watch(driver.clone(), session.clone(), shop));
    let outcome = steps.await;
    driver
        .call("DELETE", &format!("/session/{session}"), None)
        .await;
    let _ = driver_process.kill().await;
    if let Err(failed) = outcome {
        std::panic::resume_unwind(failed.into_panic());
    }
}

/// On the page: the voucher with 3 in stock, Buy, the stock drops and the order appears; Buy
/// again: refused with a message.
async fn buy_and_watch(driver: Driver, session: String, shop: String) {
    driver
        .call(
            "POST",
            &format!("/session/{session}/url"),
            Some(json!({"url": shop})),
        )
        .await;
    let stock = eventually("the voucher row", || async {
        let cells = driver.find_all(&session, "td.stock").await;
        match cells.first() {
            Some(cell) => Some(driver.text(&session, cell).await),
            None => None,
        }
    })
    .await;
    assert_eq!(stock, "3");
    assert!(driver.find_all(&session, "li.order").await.is_empty());

    let button = driver.find_all(&session, "button.buy").await;
    let button = button.first().expect("a buy button");
    driver
        .call(
            "POST",
            &format!("/session/{session}/element/{button}/click"),
            Some(json!({})),
        )
        .await;

    eventually("the stock to drop to 2", || async {
        let cells = driver.find_all(&session, "td.stock").await;
        let cell = cells.first()?;
        (driver.text(&session, cell).await == "2").then_some(())
    })
    .await;
    let order = eventually("the order to appear", || async {
        let orders = driver.find_all(&session, "li.order").await;
        let order = orders.first()?;
        Some(driver.text(&session, order).await)
    })
    .await;
    assert!(order.contains("Browser voucher"), "{order}");
    assert!(order.contains("fencing token"), "{order}");

    // A second click: one order per user, said on the page; the stock stays.
    driver
        .call(
            "POST",
            &format!("/session/{session}/element/{button}/click"),
            Some(json!({})),
        )
        .await;
    eventually("the refusal to show", || async {
        let message = driver.find_all(&session, "#message").await;
        let message = driver.text(&session, message.first()?).await;
        message.contains("one order per user").then_some(())
    })
    .await;
    eventually("the counters to show both requests and the 409", || async {
        let requests = driver.find_all(&session, "#c-requests").await;
        let conflicts = driver.find_all(&session, "#c-conflicts").await;
        let requests = driver.text(&session, requests.first()?).await;
        let conflicts = driver.text(&session, conflicts.first()?).await;
        (requests == "2" && conflicts == "1").then_some(())
    })
    .await;
    let cells = driver.find_all(&session, "td.stock").await;
    assert_eq!(driver.text(&session, &cells[0]).await, "2");
    assert_eq!(driver.find_all(&session, "li.order").await.len(), 1);
}
