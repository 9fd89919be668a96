//! Real browsers (headless Chromium through chromedriver, WebDriver over HTTP) use the shop's
//! pages against real shop instances: processes of the `flash-sale` binary sharing one Redis and
//! one database.
//!
//! - A shopper signs in, buys a voucher while a second window on another instance sees the stock
//!   drop without reloading, fills a cart, is refused a checkout whose stock went meanwhile, checks
//!   out, and sees sold-out, not-started and ended sales; then the operator view. On SQLite and on
//!   PostgreSQL.
//! - Titles and names that are HTML payloads show as text and run nothing, in a page already open
//!   when they are created and in a page loaded after.
//! - A dead instance makes the pages say "reconnecting…" and "unknown", never stale numbers or
//!   "locks off"; once it is back, the pages are live again.
//! - A user remembered by the browser but unknown to the shop is signed out, not left
//!   "reconnecting…".
//! - The operator's plots draw every instance under load, say when one is unreachable, and
//!   pick its line up again when it is back ([`operator`]).
//!
//! The SQLite runs take a screenshot of each step (`01-signed-out.png`, …) into
//! `target/tmp/flash-sale-screenshots/`; with `UPDATE_SCREENSHOTS=1` they replace the committed
//! ones in `docs/`. (Countdowns and times differ on every run: writing `docs/` each time would
//! change tracked files on every test run.)

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::{Value, json};

#[path = "browser/operator.rs"]
mod operator;

/// The WebDriver key of an element reference.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";
/// How long anything the page should come to show may take.
const PATIENCE: Duration = Duration::from_secs(30);
/// The size of every window, and so of every screenshot.
const WINDOW: (u32, u32) = (1280, 900);

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

type HttpClient = Client<HttpConnector, Full<Bytes>>;

fn http_client() -> HttpClient {
    Client::builder(hyper_util::rt::TokioExecutor::new()).build_http()
}

/// The operator's token the instances are started with; every request of [`http`] carries it.
const OPERATOR: &str = "test-operator-token-0123456789";

/// One HTTP request with a JSON body, as the operator; the status and the JSON answer (`Null`
/// if not JSON).
async fn http(
    client: &HttpClient,
    method: &str,
    url: &str,
    body: Option<&Value>,
) -> Result<(u16, Value), String> {
    let request = hyper::Request::builder()
        .method(method)
        .uri(url)
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {OPERATOR}"))
        .body(Full::new(Bytes::from(
            body.map(Value::to_string).unwrap_or_default(),
        )))
        .map_err(|e| e.to_string())?;
    let response = tokio::time::timeout(PATIENCE, client.request(request))
        .await
        .map_err(|_| format!("{method} {url}: no answer within {PATIENCE:?}"))?
        .map_err(|e| format!("{method} {url}: {e}"))?;
    let status = response.status().as_u16();
    let bytes = response
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("{method} {url}: {e}"))?
        .to_bytes();
    Ok((
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    ))
}

/// Polls `probe` until it returns `Some`, for up to [`PATIENCE`].
async fn eventually<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

// ---------------------------------------------------------------------------------------------
// The shop: instances as processes, one Redis, one database.

/// One `flash-sale` process on a fixed port; it can be killed and started again on that port.
struct Instance {
    port: u16,
    child: Option<tokio::process::Child>,
}

impl Instance {
    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    async fn start(port: u16, redis_url: &str, database_url: &str) -> Self {
        let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_flash-sale"))
            .arg("--port")
            .arg(port.to_string())
            .env("DLOCK_URL", redis_url)
            .env("DATABASE_URL", database_url)
            .env("SHOP_OPERATOR_TOKEN", OPERATOR)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("start a flash-sale instance");
        let mut instance = Self {
            port,
            child: Some(child),
        };
        instance.wait_ready().await;
        instance
    }

    /// Polls `/readyz` until the instance is ready, failing at once if the process exits.
    async fn wait_ready(&mut self) {
        let client = http_client();
        let url = format!("{}/readyz", self.url());
        let deadline = Instant::now() + PATIENCE;
        loop {
            let child = self.child.as_mut().expect("the instance runs");
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "the instance on port {} exited at start-up: {status}",
                    self.port
                );
            }
            if matches!(http(&client, "GET", &url, None).await, Ok((200, _))) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the instance on port {} did not answer within {PATIENCE:?}",
                self.port
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn kill(&mut self) {
        let mut child = self.child.take().expect("the instance runs");
        child.kill().await.expect("kill the instance");
    }
}

/// Instances over one Redis and one database, and an API client for setting the scene.
struct Shop {
    instances: Vec<Instance>,
    redis: dlock_tests::RedisServer,
    database_url: String,
    client: HttpClient,
    _dir: tempfile::TempDir,
}

impl Shop {
    /// `count` instances over a fresh SQLite file, or over `database_url`.
    async fn start(count: usize, database_url: Option<String>) -> Self {
        let redis = dlock_tests::RedisServer::start();
        let dir = tempfile::tempdir().unwrap();
        let database_url = database_url.unwrap_or_else(|| {
            format!("sqlite://{}?mode=rwc", dir.path().join("shop.db").display())
        });
        let mut instances = Vec::new();
        // One after the other: the first creates the tables.
        for _ in 0..count {
            instances.push(Instance::start(free_port(), &redis.url(), &database_url).await);
        }
        Self {
            instances,
            redis,
            database_url,
            client: http_client(),
            _dir: dir,
        }
    }

    fn url(&self, instance: usize) -> String {
        self.instances[instance].url()
    }

    async fn restart(&mut self, instance: usize) {
        let port = self.instances[instance].port;
        self.instances[instance] =
            Instance::start(port, &self.redis.url(), &self.database_url).await;
    }

    /// `method path` on the first instance, which must answer with success.
    async fn api(&self, method: &str, path: &str, body: Value) -> Value {
        let url = format!("{}{path}", self.url(0));
        let body = (method != "GET").then_some(&body);
        let (status, answer) = http(&self.client, method, &url, body)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            (200..300).contains(&status),
            "{method} {path}: {status} {answer}"
        );
        answer
    }

    async fn voucher(&self, title: &str, price_cents: i64, stock: i64, window: (i64, i64)) -> i64 {
        let now = flash_sale::now_ms();
        let created = self
            .api(
                "POST",
                "/api/vouchers",
                json!({
                    "title": title, "price_cents": price_cents,
                    "stock": stock, "starts_at_ms": now + window.0, "ends_at_ms": now + window.1,
                }),
            )
            .await;
        created["id"]
            .as_i64()
            .unwrap_or_else(|| panic!("a voucher id in {created}"))
    }

    async fn sku(&self, name: &str, price_cents: i64, stock: i64) -> i64 {
        let created = self
            .api(
                "POST",
                "/api/skus",
                json!({"name": name, "price_cents": price_cents, "stock": stock}),
            )
            .await;
        created["id"]
            .as_i64()
            .unwrap_or_else(|| panic!("a SKU id in {created}"))
    }

    /// Signs in as `name` (not through the page): the session cookie.
    async fn login(&self, name: &str) -> String {
        let (_, cookie) = flash_sale::loadgen::login(&self.url(0), name)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        cookie
    }

    /// `method path` as the shopper of the session `cookie`, which must answer with success.
    async fn api_as(&self, cookie: &str, method: &str, path: &str, body: Value) -> Value {
        let url = format!("{}{path}", self.url(0));
        let request = hyper::Request::builder()
            .method(method)
            .uri(&url)
            .header("content-type", "application/json")
            .header("cookie", cookie)
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap();
        let response = tokio::time::timeout(PATIENCE, self.client.request(request))
            .await
            .unwrap_or_else(|_| panic!("{method} {path}: no answer within {PATIENCE:?}"))
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        assert!(
            status.is_success(),
            "{method} {path}: {status} {}",
            String::from_utf8_lossy(&bytes)
        );
        serde_json::from_slice(&bytes).unwrap_or(Value::Null)
    }

    async fn buy(&self, user: &str, voucher: i64) {
        self.api_as(
            user,
            "POST",
            &format!("/api/vouchers/{voucher}/orders"),
            Value::Null,
        )
        .await;
    }

    async fn cart_checkout(&self, user: &str, sku: i64, qty: i64) {
        self.api_as(
            user,
            "POST",
            "/api/cart/items",
            json!({"sku_id": sku, "qty": qty}),
        )
        .await;
        self.api_as(user, "POST", "/api/cart/checkout", Value::Null)
            .await;
    }
}

// ---------------------------------------------------------------------------------------------
// The browser: chromedriver, one session, its windows.

/// A browser session driven over WebDriver; cheap to clone.
#[derive(Clone)]
struct Page {
    client: HttpClient,
    base: String,
    session: String,
    /// Where screenshots go, or `None` not to take them.
    shots: Option<PathBuf>,
}

impl Page {
    /// A WebDriver command; its `value`, or the WebDriver error as a message.
    async fn try_call(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, String> {
        let url = format!("{}/session/{}{path}", self.base, self.session);
        let body = body.unwrap_or_else(|| json!({}));
        let body = (method == "POST").then_some(&body);
        let (status, answer) = http(&self.client, method, &url, body).await?;
        let value = answer["value"].clone();
        if status == 200 {
            Ok(value)
        } else {
            Err(format!("{method} {path}: {status} {value}"))
        }
    }

    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        self.try_call(method, path, body)
            .await
            .unwrap_or_else(|e| panic!("webdriver: {e}"))
    }

    async fn goto(&self, url: &str) {
        self.call("POST", "/url", Some(json!({"url": url}))).await;
    }

    /// Signs in on `base`'s operator sign-in page with the operator's token, and waits for the
    /// operator's view it leads to.
    async fn operator_view(&self, base: &str) {
        self.goto(&format!("{base}/operator/login")).await;
        self.type_into("#token", OPERATOR).await;
        self.click("#go").await;
        self.wait_text("#stats-state", |_| true).await;
    }

    async fn refresh(&self) {
        self.call("POST", "/refresh", None).await;
    }

    async fn find_all(&self, css: &str) -> Vec<String> {
        let found = self
            .try_call(
                "POST",
                "/elements",
                Some(json!({"using": "css selector", "value": css})),
            )
            .await
            .unwrap_or_default();
        found
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|e| e[ELEMENT].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    }

    async fn find(&self, css: &str) -> String {
        eventually(&format!("`{css}` on the page"), || async {
            self.find_all(css).await.into_iter().next()
        })
        .await
    }

    /// What a script returns, run in the page with `args`.
    async fn script(&self, script: &str, args: Value) -> Value {
        self.call(
            "POST",
            "/execute/sync",
            Some(json!({"script": script, "args": args})),
        )
        .await
    }

    /// The text of the first element matching `css`, as the page shows it (`None` if absent).
    async fn text(&self, css: &str) -> Option<String> {
        let text = self
            .script(
                "const e = document.querySelector(arguments[0]); return e ? e.innerText : null;",
                json!([css]),
            )
            .await;
        text.as_str().map(str::to_owned)
    }

    /// Waits until the first element matching `css` shows text that `ok` accepts; that text.
    async fn wait_text(&self, css: &str, ok: impl Fn(&str) -> bool) -> String {
        let mut last = None;
        let found = tokio::time::timeout(PATIENCE, async {
            loop {
                let text = self.text(css).await;
                if let Some(t) = text.as_deref().filter(|t| ok(t)) {
                    return t.to_owned();
                }
                last = text;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await;
        found.unwrap_or_else(|_| panic!("`{css}` never showed the expected text; last: {last:?}"))
    }

    async fn wait_text_contains(&self, css: &str, needle: &str) -> String {
        self.wait_text(css, |t| t.contains(needle)).await
    }

    /// The card (voucher or product) whose title is `title`, as a CSS selector.
    async fn card(&self, title: &str) -> String {
        eventually(&format!("the card of {title:?}"), || async {
            let selector = self
                .script(
                    "for (const c of document.querySelectorAll('.card')) {
                       if (c.querySelector('.title').textContent === arguments[0])
                         return (c.classList.contains('voucher') ? '#vouchers' : '#skus')
                           + ' > [data-id=\"' + c.dataset.id + '\"]';
                     }
                     return null;",
                    json!([title]),
                )
                .await;
            selector.as_str().map(str::to_owned)
        })
        .await
    }

    /// Runs WebDriver commands on the first element matching `css`, looking it up again when
    /// the page replaced it in between (a push may redraw a part of the page at any time).
    async fn on_element(&self, css: &str, commands: &[(&str, &str, Option<Value>)]) -> Value {
        let deadline = Instant::now() + PATIENCE;
        'retry: loop {
            let element = self.find(css).await;
            let mut last = Value::Null;
            for (method, command, body) in commands {
                let path = format!("/element/{element}/{command}");
                match self.try_call(method, &path, body.clone()).await {
                    Ok(value) => last = value,
                    Err(e) if e.contains("stale element") && Instant::now() < deadline => {
                        continue 'retry;
                    }
                    Err(e) => panic!("webdriver: {e}"),
                }
            }
            return last;
        }
    }

    async fn click(&self, css: &str) {
        self.on_element(css, &[("POST", "click", None)]).await;
    }

    async fn enabled(&self, css: &str) -> bool {
        let enabled = self.on_element(css, &[("GET", "enabled", None)]).await;
        enabled.as_bool().unwrap_or(false)
    }

    async fn wait_enabled(&self, css: &str, enabled: bool) {
        eventually(&format!("`{css}` enabled: {enabled}"), || async {
            (self.enabled(css).await == enabled).then_some(())
        })
        .await;
    }

    async fn type_into(&self, css: &str, text: &str) {
        let commands = [
            ("POST", "clear", None),
            ("POST", "value", Some(json!({"text": text}))),
        ];
        self.on_element(css, &commands).await;
    }

    async fn new_window(&self) -> String {
        let window = self
            .call("POST", "/window/new", Some(json!({"type": "window"})))
            .await;
        window["handle"]
            .as_str()
            .expect("a window handle")
            .to_owned()
    }

    async fn window(&self) -> String {
        let handle = self.call("GET", "/window", None).await;
        handle.as_str().expect("a window handle").to_owned()
    }

    /// Makes `handle` the current window, its viewport [`WINDOW`] large.
    async fn switch_to(&self, handle: &str) {
        self.call("POST", "/window", Some(json!({"handle": handle})))
            .await;
        let (width, height) = WINDOW;
        let inner = self
            .script("return [window.innerWidth, window.innerHeight];", json!([]))
            .await;
        let rect = self.call("GET", "/window/rect", None).await;
        let grow = |outer: &Value, inner: &Value, want: u32| {
            let chrome = outer.as_i64().unwrap_or(0) - inner.as_i64().unwrap_or(0);
            i64::from(want) + chrome.max(0)
        };
        let (w, h) = (
            grow(&rect["width"], &inner[0], width),
            grow(&rect["height"], &inner[1], height),
        );
        if (w, h)
            != (
                rect["width"].as_i64().unwrap_or(0),
                rect["height"].as_i64().unwrap_or(0),
            )
        {
            self.call(
                "POST",
                "/window/rect",
                Some(json!({"width": w, "height": h})),
            )
            .await;
        }
    }

    /// A PNG of the window in `docs/name`, when this run takes screenshots.
    async fn screenshot(&self, name: &str) {
        let Some(dir) = &self.shots else { return };
        // The top of the page, without the focus ring of the last click: what is shown was
        // already checked, this only makes the pictures alike.
        self.script(
            "document.activeElement && document.activeElement.blur(); window.scrollTo(0, 0);",
            json!([]),
        )
        .await;
        let png = self.call("GET", "/screenshot", None).await;
        let png = base64_decode(png.as_str().expect("a base64 screenshot"));
        assert!(png.starts_with(b"\x89PNG"), "the screenshot is a PNG");
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join(name), png).unwrap();
    }

    /// Whether a payload ran in the page: it would set `window.__xss` or change the title.
    async fn assert_no_script_ran(&self) {
        let ran = self
            .script(
                "return {xss: window.__xss === undefined ? null : String(window.__xss),
                         title: document.title};",
                json!([]),
            )
            .await;
        assert_eq!(ran["xss"], Value::Null, "a payload ran: {ran}");
        assert!(
            ran["title"]
                .as_str()
                .is_some_and(|t| t.starts_with("Flash sale")),
            "a payload changed the title: {ran}"
        );
    }
}

fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c}"),
        }
    };
    let digits: Vec<u8> = text
        .bytes()
        .filter(|c| !c.is_ascii_whitespace() && *c != b'=')
        .collect();
    let mut out = Vec::with_capacity(digits.len() * 3 / 4);
    for chunk in digits.chunks(4) {
        let mut n = 0u32;
        for (i, c) in chunk.iter().enumerate() {
            n |= value(*c) << (18 - 6 * i);
        }
        let bytes = n.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    out
}

/// `docs/` with `UPDATE_SCREENSHOTS=1`, else a directory under `target/tmp`.
fn screenshot_dir() -> PathBuf {
    if std::env::var_os("UPDATE_SCREENSHOTS").is_some_and(|v| v == "1") {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("docs")
    } else {
        Path::new(env!("CARGO_TARGET_TMPDIR")).join("flash-sale-screenshots")
    }
}

/// Starts chromedriver and one headless Chromium session, runs `steps` on it in a task of their
/// own, and closes the browser whether they pass or fail.
async fn with_browser<F, Fut>(shots: bool, steps: F)
where
    F: FnOnce(Page) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let chromium = require("chromium");
    let chromedriver = require("chromedriver");
    let port = free_port();
    let logs = tempfile::tempdir().unwrap();
    let driver_log = logs.path().join("chromedriver.log");
    let mut driver_process = tokio::process::Command::new(&chromedriver)
        .arg(format!("--port={port}"))
        .arg(format!("--log-path={}", driver_log.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start chromedriver");
    let client = http_client();
    let base = format!("http://127.0.0.1:{port}");
    eventually("chromedriver", || async {
        let (_, status) = http(&client, "GET", &format!("{base}/status"), None)
            .await
            .ok()?;
        status["value"]["ready"].as_bool().filter(|r| *r)
    })
    .await;
    // Chromium now and then exits while starting up on a loaded machine ("session not
    // created: Chrome instance exited"); that says nothing about the shop, so a start that
    // fails is tried again with a fresh profile, twice, before the test fails with the log.
    let mut profile = tempfile::tempdir().unwrap();
    let mut attempt = 1;
    let session = loop {
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--disable-background-networking", "--disable-component-update",
                    "--disable-sync", "--no-first-run", "--disable-quic", "--lang=en-US",
                    "--hide-scrollbars", "--force-device-scale-factor=1",
                    format!("--window-size={},{}", WINDOW.0, WINDOW.1),
                    format!("--user-data-dir={}", profile.path().display()),
                ]
            }
        }}});
        let (_, session) = http(
            &client,
            "POST",
            &format!("{base}/session"),
            Some(&capabilities),
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        if let Some(id) = session["value"]["sessionId"].as_str() {
            break id.to_owned();
        }
        if attempt == 3 {
            let log = std::fs::read_to_string(&driver_log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            panic!(
                "no browser session after {attempt} starts: {session}\n--- chromedriver log ---\n{}",
                tail.join("\n")
            );
        }
        eprintln!("browser start {attempt} failed, starting again: {session}");
        attempt += 1;
        profile = tempfile::tempdir().unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let page = Page {
        client: client.clone(),
        base: base.clone(),
        session: session.clone(),
        shots: shots.then(screenshot_dir),
    };
    let outcome = tokio::spawn(steps(page)).await;
    let _ = http(
        &client,
        "DELETE",
        &format!("{base}/session/{session}"),
        None,
    )
    .await;
    let _ = driver_process.kill().await;
    if let Err(failed) = outcome {
        std::panic::resume_unwind(failed.into_panic());
    }
}

// ---------------------------------------------------------------------------------------------
// The shopper.

const MINUTE: i64 = 60_000;
const HOUR: i64 = 60 * MINUTE;
/// The operator view's invariants: each 0 in a sound shop.
const INVARIANTS: [&str; 6] = [
    "duplicate_orders",
    "oversold_vouchers",
    "units_oversold",
    "units_lost",
    "units_double_sold",
    "negative_stock_rows",
];

/// Sign in, buy while another window watches, cart, checkout, sold out, the operator view.
async fn shopping(shop: Shop, page: Page) {
    let concert = "Spring concert, front row";
    let sneakers = "Midnight sneaker drop";
    let winter = "Winter sale voucher";
    let chef = "Chef's table for two";
    let beans = "Coffee beans, 1 kg";
    let mug = "Ceramic mug";
    let tea = "Tea sampler";
    let concert_id = shop.voucher(concert, 4900, 2, (-MINUTE, 2 * HOUR)).await;
    shop.voucher(sneakers, 12000, 5, (10 * MINUTE, 3 * HOUR))
        .await;
    shop.voucher(winter, 1500, 10, (-2 * HOUR, -HOUR)).await;
    let chef_id = shop.voucher(chef, 9900, 1, (-MINUTE, 26 * HOUR)).await;
    shop.sku(beans, 1800, 5).await;
    let mug_id = shop.sku(mug, 1200, 1).await;
    shop.sku(tea, 2200, 0).await;

    // Signed out: the catalog with prices and countdowns; Buy says why it can't.
    page.switch_to(&page.window().await).await;
    page.goto(&shop.url(0)).await;
    page.wait_text("#live", |t| t == "live").await;
    let card = page.card(concert).await;
    assert_eq!(
        page.text(&format!("{card} .price")).await.unwrap(),
        "€49.00"
    );
    assert_eq!(
        page.text(&format!("{card} .stock")).await.unwrap(),
        "Only 2 left"
    );
    page.wait_text(&format!("{card} .when"), |t| {
        t.starts_with("ends in 1:59:") || t == "ends in 2:00:00"
    })
    .await;
    page.wait_text(&format!("{card} .reason"), |t| t == "Sign in to buy.")
        .await;
    assert!(!page.enabled(&format!("{card} button.buy")).await);
    let soon = page.card(sneakers).await;
    page.wait_text(&format!("{soon} .when"), |t| {
        t.starts_with("starts in 9:") || t == "starts in 10:00"
    })
    .await;
    page.wait_text_contains(&format!("{soon} .reason"), "Not on sale yet")
        .await;
    let ended = page.card(winter).await;
    page.wait_text(&format!("{ended} .when"), |t| t == "sale ended")
        .await;
    page.wait_text(&format!("{ended} .reason"), |t| t == "The sale has ended.")
        .await;
    let chef_card = page.card(chef).await;
    assert_eq!(
        page.text(&format!("{chef_card} .price")).await.unwrap(),
        "€99.00"
    );
    page.wait_text(&format!("{chef_card} .when"), |t| {
        t.starts_with("ends in 1 day 1:5")
    })
    .await;
    let tea_card = page.card(tea).await;
    page.wait_text(&format!("{tea_card} .stock"), |t| t == "Sold out")
        .await;
    page.wait_text(&format!("{tea_card} .reason"), |t| t == "Out of stock.")
        .await;
    page.card(beans).await;
    page.wait_text("#cart-note", |t| t == "Sign in to fill a cart.")
        .await;
    page.screenshot("01-signed-out.png").await;

    // Sign in; the name is remembered across a reload.
    page.type_into("#name", "Alice").await;
    page.click("#signin button[type=submit]").await;
    page.wait_text("#who", |t| t == "Alice").await;
    page.refresh().await;
    page.wait_text("#who", |t| t == "Alice").await;
    page.wait_text("#live", |t| t == "live").await;
    page.wait_enabled(&format!("{card} button.buy"), true).await;
    page.wait_text(&format!("{card} .reason"), str::is_empty)
        .await;
    page.wait_text(&format!("{soon} .reason"), |t| {
        t.starts_with("Not on sale yet")
    })
    .await;
    assert!(!page.enabled(&format!("{soon} button.buy")).await);
    assert!(!page.enabled(&format!("{ended} button.buy")).await);
    page.wait_text("#cart-note", |t| t == "Your cart is empty.")
        .await;
    page.wait_text("#orders-note", |t| t == "No orders yet.")
        .await;
    page.screenshot("02-signed-in.png").await;

    // A second window, on the other instance, watches; it is marked so that a reload would show.
    let alice = page.window().await;
    let watcher = page.new_window().await;
    page.switch_to(&watcher).await;
    page.goto(&shop.url(1)).await;
    page.wait_text("#live", |t| t == "live").await;
    let watched = page.card(concert).await;
    page.wait_text(&format!("{watched} .stock"), |t| t == "Only 2 left")
        .await;
    page.script("window.__notReloaded = true;", json!([])).await;

    // Alice buys.
    page.switch_to(&alice).await;
    page.click(&format!("{card} button.buy")).await;
    page.wait_text("#message", |t| t == format!("You bought {concert}."))
        .await;
    page.wait_text(&format!("{card} .stock"), |t| t == "Only 1 left")
        .await;
    page.wait_text(&format!("{card} .reason"), |t| t == "You have this one.")
        .await;
    assert!(!page.enabled(&format!("{card} button.buy")).await);
    let order = page
        .wait_text("#orders li.voucher-order", |t| t.contains(concert))
        .await;
    assert!(order.contains("€49.00"), "{order}");
    page.screenshot("03-bought.png").await;

    // The watcher saw it, pushed: no reload, and the page never fetched the catalog itself.
    page.switch_to(&watcher).await;
    page.wait_text(&format!("{watched} .stock"), |t| t == "Only 1 left")
        .await;
    let pushed = page
        .script(
            "return {
               notReloaded: window.__notReloaded === true,
               fetched: performance.getEntriesByType('resource')
                 .filter((e) => /\\/api\\/(vouchers|skus)/.test(e.name)).map((e) => e.name),
             };",
            json!([]),
        )
        .await;
    assert_eq!(pushed["notReloaded"], true, "{pushed}");
    assert_eq!(pushed["fetched"], json!([]), "{pushed}");
    page.screenshot("04-pushed-to-another-window.png").await;
    page.switch_to(&alice).await;

    // The cart: add, add, remove, empty.
    let beans_card = page.card(beans).await;
    let mug_card = page.card(mug).await;
    page.type_into(&format!("{beans_card} input.qty"), "2")
        .await;
    page.click(&format!("{beans_card} button.add")).await;
    page.wait_text("#cart", |t| t.contains(&format!("2 × {beans}")))
        .await;
    page.wait_text(&format!("{beans_card} .reason"), |t| t == "2 in your cart.")
        .await;
    page.wait_enabled(&format!("{mug_card} button.add"), true)
        .await;
    page.click(&format!("{mug_card} button.add")).await;
    page.wait_text("#cart", |t| t.contains(&format!("1 × {mug}")))
        .await;
    page.wait_text("#cart-total", |t| t == "€48.00").await;
    page.screenshot("05-cart.png").await;
    page.wait_enabled("#cart li:last-child button.remove", true)
        .await;
    page.click("#cart li:last-child button.remove").await;
    page.wait_text("#cart", |t| !t.contains(mug)).await;
    page.wait_text("#cart-total", |t| t == "€36.00").await;
    page.wait_enabled("#empty", true).await;
    page.click("#empty").await;
    page.wait_text("#cart-note", |t| t == "Your cart is empty.")
        .await;
    assert!(page.find_all("#cart li").await.is_empty());

    // Beans and the last mug in the cart; Bob takes the mug first: checkout is refused, in words.
    page.wait_enabled(&format!("{beans_card} button.add"), true)
        .await;
    page.type_into(&format!("{beans_card} input.qty"), "2")
        .await;
    page.click(&format!("{beans_card} button.add")).await;
    page.wait_text("#cart", |t| t.contains(beans)).await;
    page.wait_enabled(&format!("{mug_card} button.add"), true)
        .await;
    page.click(&format!("{mug_card} button.add")).await;
    page.wait_text("#cart", |t| t.contains(mug)).await;
    let bob = shop.login("Bob").await;
    shop.cart_checkout(&bob, mug_id, 1).await;
    page.wait_text(&format!("{mug_card} .stock"), |t| t == "Sold out")
        .await;
    page.wait_text("#cart li:last-child .short", |t| {
        t == "Sold out: remove it to check out."
    })
    .await;
    page.wait_enabled("#checkout", true).await;
    page.click("#checkout").await;
    let refused = page
        .wait_text("#message", |t| !t.starts_with("Added"))
        .await;
    assert!(
        page.script(
            "return document.getElementById('message').className;",
            json!([])
        )
        .await
            == "error",
        "{refused}"
    );
    assert!(
        !refused.contains('{') && !refused.contains("problem"),
        "{refused}"
    );
    page.screenshot("06-checkout-refused.png").await;

    // Without the mug it goes through.
    page.wait_enabled("#cart li:last-child button.remove", true)
        .await;
    page.click("#cart li:last-child button.remove").await;
    page.wait_text("#cart", |t| !t.contains(mug)).await;
    page.wait_enabled("#checkout", true).await;
    page.click("#checkout").await;
    page.wait_text("#message", |t| {
        t.starts_with("Thank you! Order #") && t.ends_with("€36.00.")
    })
    .await;
    page.wait_text("#cart-note", |t| t == "Your cart is empty.")
        .await;
    let order = page
        .wait_text("#orders li.cart-order", |t| t.contains(beans))
        .await;
    assert!(
        order.contains(&format!("2 × {beans}")) && order.contains("€36.00"),
        "{order}"
    );
    page.wait_text(&format!("{beans_card} .stock"), |t| t == "Only 3 left")
        .await;
    page.screenshot("07-checkout-done.png").await;

    // Sold out, pushed: Bob takes the last concert ticket, Carol the chef's table.
    shop.buy(&bob, concert_id).await;
    let carol = shop.login("Carol").await;
    shop.buy(&carol, chef_id).await;
    page.wait_text(&format!("{card} .stock"), |t| t == "Sold out")
        .await;
    page.wait_text(&format!("{chef_card} .stock"), |t| t == "Sold out")
        .await;
    page.wait_text(&format!("{chef_card} .reason"), |t| t == "Sold out.")
        .await;
    assert!(!page.enabled(&format!("{chef_card} button.buy")).await);
    page.screenshot("08-sold-out.png").await;

    // Signing out forgets the user, across a reload too.
    page.click("#signout").await;
    page.wait_text("#orders-note", |t| t == "Sign in to see your orders.")
        .await;
    page.refresh().await;
    page.wait_text("#live", |t| t == "live").await;
    assert!(page.find_all("#orders li").await.is_empty());
    page.wait_text(&format!("{} .reason", page.card(beans).await), |t| {
        t == "Sign in to buy."
    })
    .await;

    // The operator view: the whole shop's numbers, invariants held, locks on.
    page.operator_view(&shop.url(1)).await;
    page.wait_text("#stats-state", |t| t == "live").await;
    page.wait_text("#t-locks .value", |t| t == "on").await;
    for invariant in INVARIANTS {
        page.wait_text(&format!("#t-{invariant} .value"), |t| t == "0")
            .await;
        page.wait_text(&format!("#t-{invariant} .verdict"), |t| t == "OK: none")
            .await;
    }
    // Alice's, Bob's and Carol's voucher orders, whichever instance took them.
    page.wait_text("#t-voucher_orders .value", |t| t == "3")
        .await;
    page.wait_text("#vouchers", |t| t.contains(concert)).await;
    // The operator's view is pictured under load, with its plots ([`operator`]).
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shopper_buys_and_checks_out_while_another_window_sees_the_stock_drop() {
    let shop = Shop::start(2, None).await;
    with_browser(true, |page| shopping(shop, page)).await;
}

/// The same steps with the shop on PostgreSQL (no screenshots: they would be the same).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shopper_buys_and_checks_out_on_postgres() {
    let pg = dlock_tests::PostgresServer::start();
    let shop = Shop::start(2, Some(pg.url())).await;
    with_browser(false, |page| shopping(shop, page)).await;
    drop(pg);
}

// ---------------------------------------------------------------------------------------------
// Stored XSS: titles and names are text.

const XSS_TITLE: &str = "<img src=x onerror=\"window.__xss=1;document.title='owned'\">";
const XSS_SKU: &str = "<script>window.__xss=2</script><b>bold</b>";
const XSS_USER: &str = "<svg onload=\"window.__xss=3\"></svg>";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn html_in_titles_and_names_shows_as_text_and_never_runs() {
    let shop = Shop::start(1, None).await;
    with_browser(true, |page| async move {
        // A page already open when the payloads arrive (they are pushed to it) ...
        page.switch_to(&page.window().await).await;
        page.goto(&shop.url(0)).await;
        page.type_into("#name", XSS_USER).await;
        page.click("#signin button[type=submit]").await;
        page.wait_text("#who", |t| t == XSS_USER).await;
        shop.voucher(XSS_TITLE, 100, 5, (-MINUTE, HOUR)).await;
        shop.sku(XSS_SKU, 250, 5).await;
        let title = page.card(XSS_TITLE).await;
        let name = page.card(XSS_SKU).await;
        page.wait_text(&format!("{title} .title"), |t| t == XSS_TITLE)
            .await;
        page.wait_text(&format!("{name} .title"), |t| t == XSS_SKU)
            .await;

        // ... and into the cart and the orders.
        page.wait_enabled(&format!("{title} button.buy"), true)
            .await;
        page.click(&format!("{title} button.buy")).await;
        page.wait_text("#orders", |t| t.contains(XSS_TITLE)).await;
        page.click(&format!("{name} button.add")).await;
        page.wait_text("#cart", |t| t.contains(XSS_SKU)).await;
        page.wait_text("#message", |t| t.contains(XSS_SKU)).await;
        page.assert_no_script_ran().await;

        // A page loaded after, and the operator view.
        page.refresh().await;
        page.wait_text("#who", |t| t == XSS_USER).await;
        page.wait_text("#orders", |t| t.contains(XSS_TITLE)).await;
        page.wait_text("#cart", |t| t.contains(XSS_SKU)).await;
        page.wait_text(&format!("{title} .title"), |t| t == XSS_TITLE)
            .await;
        let parsed = page
            .script(
                "return document.querySelectorAll(
                   'main img, main script, main svg, main b, aside img, aside script, aside svg, '
                   + 'aside b, #who *').length;",
                json!([]),
            )
            .await;
        assert_eq!(parsed, 0, "a title or a name was parsed as HTML");
        page.assert_no_script_ran().await;
        page.screenshot("10-xss-shown-as-text.png").await;

        page.operator_view(&shop.url(0)).await;
        page.wait_text("#vouchers", |t| t.contains(XSS_TITLE)).await;
        page.wait_text("#skus", |t| t.contains(XSS_SKU)).await;
        let parsed = page
            .script(
                "return document.querySelectorAll(
                   '#vouchers img, #vouchers script, #vouchers svg, #vouchers b, '
                   + '#skus img, #skus script, #skus svg, #skus b').length;",
                json!([]),
            )
            .await;
        assert_eq!(
            parsed, 0,
            "a title or a name was parsed as HTML on the operator view"
        );
        page.assert_no_script_ran().await;
    })
    .await;
}

/// A user remembered by the browser that the shop doesn't know (its database was reset) is
/// signed out with a word, instead of "reconnecting…" forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remembered_user_the_shop_does_not_know_is_signed_out() {
    let shop = Shop::start(1, None).await;
    with_browser(false, |page| async move {
        shop.sku("Coffee beans, 1 kg", 1800, 5).await;
        page.switch_to(&page.window().await).await;
        page.goto(&shop.url(0)).await;
        page.wait_text("#live", |t| t == "live").await;
        page.script(
            "localStorage.setItem('flash-sale.user', JSON.stringify({id: 987654321, name: 'Ghost'}));",
            json!([]),
        )
        .await;
        page.refresh().await;
        page.wait_text("#message", |t| {
            t == "Your sign-in as Ghost has ended. Please sign in again."
        })
        .await;
        page.wait_text("#live", |t| t == "live").await;
        let signed_out = page
            .script(
                "return [document.getElementById('signin').hidden,
                         localStorage.getItem('flash-sale.user')];",
                json!([]),
            )
            .await;
        assert_eq!(signed_out, json!([false, null]));
        page.type_into("#name", "Ghost").await;
        page.click("#signin button[type=submit]").await;
        page.wait_text("#who", |t| t == "Ghost").await;
        page.wait_text("#cart-note", |t| t == "Your cart is empty.").await;
        page.wait_text("#live", |t| t == "live").await;
    })
    .await;
}

/// Signing in by name starts a session the page's scripts can't read; another shopper's cart,
/// orders and stream stay out of reach from the page; signing out ends the session, and a
/// reload finds the page signed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_starts_at_sign_in_keeps_to_its_shopper_and_ends_at_sign_out() {
    let shop = Shop::start(1, None).await;
    with_browser(false, |page| async move {
        let mug = shop.sku("Mug", 900, 5).await;
        let bob = shop.login("Bob").await;
        shop.api_as(
            &bob,
            "POST",
            "/api/cart/items",
            json!({"sku_id": mug, "qty": 3}),
        )
        .await;
        let bob_id = shop.api_as(&bob, "GET", "/api/me", Value::Null).await["id"].clone();

        page.switch_to(&page.window().await).await;
        page.goto(&shop.url(0)).await;
        page.type_into("#name", "Alice").await;
        page.click("#signin button[type=submit]").await;
        page.wait_text("#who", |t| t == "Alice").await;
        page.wait_text("#cart-note", |t| t == "Your cart is empty.")
            .await;
        let cookies = page.script("return document.cookie;", json!([])).await;
        assert_eq!(cookies, "", "the session cookie is visible to scripts");

        // From Alice's page, Bob's data is not to be had, by any path.
        let statuses = page
            .script(
                "const bob = arguments[0];
                 const status = (url) => fetch(url).then((r) => r.status);
                 return Promise.all([
                   status(`/api/events?user=${bob}`),
                   status(`/api/carts/${bob}`),
                   status(`/api/users/${bob}/orders`),
                   fetch('/api/cart').then((r) => r.json()).then((c) => c.items.length),
                 ]);",
                json!([bob_id]),
            )
            .await;
        assert_eq!(statuses, json!([403, 404, 404, 0]));

        // A reload keeps the session; signing out ends it.
        page.refresh().await;
        page.wait_text("#who", |t| t == "Alice").await;
        page.click("#signout").await;
        page.wait_text("#message", |t| t == "You are signed out.")
            .await;
        let status = page
            .script(
                "return fetch('/api/cart').then((r) => r.status);",
                json!([]),
            )
            .await;
        assert_eq!(status, 401);
        page.refresh().await;
        page.wait_text("#live", |t| t == "live").await;
        let signed_in = page
            .script(
                "return document.getElementById('signin').hidden;",
                json!([]),
            )
            .await;
        assert_eq!(signed_in, false, "signed out after a reload");
        // Bob's cart was never touched.
        let cart = shop.api_as(&bob, "GET", "/api/cart", Value::Null).await;
        assert_eq!(cart["items"][0]["qty"], 3, "{cart}");
    })
    .await;
}

/// The operator's view is the operator's: a browser without the token is sent to the sign-in
/// page, a wrong token is refused there, the right one opens the view, and signing out closes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_signs_in_with_the_token_and_out_again() {
    let shop = Shop::start(1, None).await;
    with_browser(false, |page| async move {
        let url = shop.url(0);
        page.switch_to(&page.window().await).await;
        page.goto(&format!("{url}/operator")).await;
        page.wait_text("h1", |t| t == "Operator sign-in").await;
        page.type_into("#token", "not-the-operator-token").await;
        page.click("#go").await;
        page.wait_text("#message", |t| t.contains("not right"))
            .await;
        // The numbers stay closed to this browser.
        let status = page
            .script(
                "return fetch('/api/stats').then((r) => r.status);",
                json!([]),
            )
            .await;
        assert_eq!(status, 401);

        page.type_into("#token", OPERATOR).await;
        page.click("#go").await;
        page.wait_text("#stats-state", |t| t == "live").await;
        page.wait_text("#t-locks .value", |t| t == "on").await;
        // The cookie is out of the page's reach.
        let cookies = page.script("return document.cookie;", json!([])).await;
        assert_eq!(cookies, "", "the operator's cookie is visible to scripts");

        page.click("#signout").await;
        page.wait_text("h1", |t| t == "Operator sign-in").await;
        page.goto(&format!("{url}/operator")).await;
        page.wait_text("h1", |t| t == "Operator sign-in").await;
    })
    .await;
}

/// No page builds HTML out of strings: every value goes in as text.
#[test]
fn no_page_builds_html_from_strings() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("static");
    let mut pages = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let source = std::fs::read_to_string(&path).unwrap();
        pages += 1;
        for sink in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "srcdoc",
            "createContextualFragment",
            "DOMParser",
        ] {
            assert!(!source.contains(sink), "{} uses {sink}", path.display());
        }
    }
    assert!(
        pages >= 2,
        "the shop and the operator view, in {}",
        dir.display()
    );
}

// ---------------------------------------------------------------------------------------------
// A dead instance: "reconnecting…" and "unknown", never stale claims.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_instance_shows_reconnecting_and_unknown_then_recovers() {
    let shop = Shop::start(2, None).await;
    with_browser(true, |page| async move {
        let mut shop = shop;
        let concert = "Spring concert, front row";
        let voucher = shop.voucher(concert, 4900, 5, (-MINUTE, 2 * HOUR)).await;
        shop.sku("Coffee beans, 1 kg", 1800, 5).await;

        // A shopper and the operator, both on the second instance.
        let url = shop.url(1);
        let shopper = page.window().await;
        page.switch_to(&shopper).await;
        page.goto(&url).await;
        page.type_into("#name", "Alice").await;
        page.click("#signin button[type=submit]").await;
        page.wait_text("#who", |t| t == "Alice").await;
        page.wait_text("#live", |t| t == "live").await;
        let card = page.card(concert).await;
        page.wait_text(&format!("{card} .stock"), |t| t == "5 left")
            .await;
        let operator = page.new_window().await;
        page.switch_to(&operator).await;
        page.operator_view(&url).await;
        page.wait_text("#t-locks .value", |t| t == "on").await;
        page.wait_text("#catalog-state", |t| t == "(live)").await;

        // The instance dies.
        shop.instances[1].kill().await;

        // The shopper is told the numbers may be old, and is not shown them as current.
        page.switch_to(&shopper).await;
        page.wait_text("#live", |t| t == "reconnecting…").await;
        page.wait_text("#stale", |t| t.starts_with("Reconnecting to the shop"))
            .await;
        let stale = page
            .script(
                "return document.getElementById('catalog').classList.contains('stale');",
                json!([]),
            )
            .await;
        assert_eq!(stale, true);
        page.screenshot("11-shop-reconnecting.png").await;

        // The operator sees "unknown" everywhere, never "locks off" or zeros.
        page.switch_to(&operator).await;
        page.wait_text("#t-locks .value", |t| t == "unknown").await;
        page.wait_text("#stats-state", |t| t == "reconnecting…")
            .await;
        page.wait_text("#unavailable", |t| t.starts_with("Stats unavailable"))
            .await;
        page.wait_text("#plots-state", |t| t.starts_with("Plots paused"))
            .await;
        page.wait_text("#catalog-state", |t| t.contains("reconnecting"))
            .await;
        let counters = [
            "requests",
            "locked",
            "conflicts",
            "voucher_orders",
            "units_sold",
        ];
        for tile in INVARIANTS.iter().chain(&counters) {
            assert_eq!(
                page.text(&format!("#t-{tile} .value")).await.as_deref(),
                Some("unknown"),
                "{tile}"
            );
        }
        page.screenshot("12-stats-unavailable.png").await;

        // The shop goes on elsewhere; once the instance is back, both pages catch up by themselves.
        let bob = shop.login("Bob").await;
        shop.buy(&bob, voucher).await;
        shop.restart(1).await;
        page.wait_text("#t-locks .value", |t| t == "on").await;
        page.wait_text("#stats-state", |t| t == "live").await;
        page.wait_text("#t-voucher_orders .value", |t| t == "1")
            .await;
        page.wait_text("#plots-state", |t| t.contains("a point a second"))
            .await;
        page.wait_text("#catalog-state", |t| t == "(live)").await;
        page.wait_text("#vouchers", |t| t.contains('4')).await;
        let hidden = page
            .script(
                "return document.getElementById('unavailable').hidden;",
                json!([]),
            )
            .await;
        assert_eq!(hidden, true);
        page.switch_to(&shopper).await;
        page.wait_text("#live", |t| t == "live").await;
        page.wait_text(&format!("{card} .stock"), |t| t == "4 left")
            .await;
        let hidden = page
            .script("return document.getElementById('stale').hidden;", json!([]))
            .await;
        assert_eq!(hidden, true);
    })
    .await;
}
