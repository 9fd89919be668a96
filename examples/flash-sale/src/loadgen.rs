//! The load generator: many buyers against one or several instances, then an audit of the
//! database.
//!
//! Each buyer logs in (its requests then carry its session cookie), fires several voucher
//! orders at the same moment, spread over the instances (the double-click, the retry, the
//! second tab: what the per-user lock is for),
//! then puts one SKU in its cart and checks out (buyers compete for the SKUs' stock: what the
//! SKU locks are for). Every [`LoadConfig::edit_every`]th buyer also edits its cart while its
//! checkout runs — adds a second SKU and takes it out again, from another instance — which is
//! what the cart lock is for: the checkout buys what its locks cover or answers 409 "cart
//! changed", and no unit leaves the stock without an order.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use serde::Serialize;
use tokio::sync::Semaphore;

use crate::auth::OperatorToken;
use crate::{NewSku, NewVoucher, Sku, Stats, User, Voucher, now_ms};

/// How hard to push.
#[derive(Debug, Clone)]
pub struct LoadConfig {
    /// Base URLs of the instances (`http://127.0.0.1:PORT`).
    pub targets: Vec<String>,
    /// Buyers.
    pub users: u64,
    /// Voucher stock.
    pub stock: i64,
    /// Concurrent voucher orders each buyer fires.
    pub requests_per_user: u32,
    /// Buyers in flight at once.
    pub concurrency: usize,
    /// SKUs for the cart checkouts (0: no checkouts).
    pub skus: u32,
    /// Stock of each SKU.
    pub sku_stock: i64,
    /// Every this many buyers, one edits its cart while its checkout runs (0: none).
    pub edit_every: u64,
    /// The operator's token, to put the voucher and the SKUs on sale and read the numbers
    /// (`SHOP_OPERATOR_TOKEN` for the `loadgen` binary).
    pub operator: Option<OperatorToken>,
}

impl Default for LoadConfig {
    fn default() -> Self {
        Self {
            targets: Vec::new(),
            users: 2_000,
            stock: 100,
            requests_per_user: 3,
            concurrency: 200,
            skus: 5,
            sku_stock: 20,
            edit_every: 3,
            operator: None,
        }
    }
}

/// What a run saw.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    /// Requests sent (logins aside).
    pub requests: u64,
    /// Of those, purchase requests: voucher orders and checkouts.
    pub purchases: u64,
    /// Of those, checkouts that had a cart edit running beside them.
    pub edited_checkouts: u64,
    /// 2xx answers.
    pub ok: u64,
    /// 409 answers.
    pub conflicts: u64,
    /// Other answers and transport errors.
    pub errors: u64,
    /// The first few of those, for the reader.
    pub error_samples: Vec<String>,
    /// Median latency, ms.
    pub p50_ms: f64,
    /// 99th percentile latency, ms.
    pub p99_ms: f64,
    /// Wall time, s.
    pub seconds: f64,
    /// The audit and the counters of every instance, from the database.
    pub stats: Stats,
}

impl Report {
    /// The invariants hold: no duplicate orders, no oversell, no negative stock, and every unit
    /// that left the stock is in exactly one order.
    pub fn clean(&self) -> bool {
        self.stats.duplicate_orders == 0
            && self.stats.oversold_vouchers == 0
            && self.stats.units_oversold == 0
            && self.stats.units_lost == 0
            && self.stats.units_double_sold == 0
            && self.stats.negative_stock_rows == 0
            && self.stats.voucher_orders <= self.stats.voucher_initial_stock
    }
}

type HttpClient = Client<HttpConnector, Full<Bytes>>;

fn client() -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    Client::builder(hyper_util::rt::TokioExecutor::new())
        .pool_max_idle_per_host(256)
        .build(connector)
}

/// One answer: status and body, or what went wrong on the way.
type Answer = Result<(u16, Bytes), String>;

/// Who a request is from: nobody in particular, the operator, or a signed-in buyer.
#[derive(Clone, Copy)]
enum As<'a> {
    Anyone,
    Operator(Option<&'a OperatorToken>),
    /// The buyer's session cookie (`shop_session=…`).
    Buyer(&'a str),
}

async fn send(client: &HttpClient, method: &str, url: &str, body: Option<String>) -> Answer {
    send_as(client, As::Anyone, method, url, body).await
}

/// [`send`], as `who`.
async fn send_as(
    client: &HttpClient,
    who: As<'_>,
    method: &str,
    url: &str,
    body: Option<String>,
) -> Answer {
    let mut request = hyper::Request::builder()
        .method(method)
        .uri(url)
        .header("content-type", "application/json");
    match who {
        As::Anyone | As::Operator(None) => {}
        As::Operator(Some(token)) => {
            request = request.header("authorization", format!("Bearer {}", token.expose()));
        }
        As::Buyer(cookie) => request = request.header("cookie", cookie),
    }
    let request = request
        .body(Full::new(Bytes::from(body.unwrap_or_default())))
        .map_err(|e| e.to_string())?;
    let exchange = async {
        let response = client.request(request).await.map_err(|e| e.to_string())?;
        let status = response.status().as_u16();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok((status, body))
    };
    tokio::time::timeout(Duration::from_secs(30), exchange)
        .await
        .map_err(|_| format!("{method} {url}: no answer within 30 s"))?
}

async fn post_json<T: Serialize, R: serde::de::DeserializeOwned>(
    client: &HttpClient,
    operator: Option<&OperatorToken>,
    url: &str,
    value: &T,
    expect: u16,
) -> Result<R, String> {
    let body = serde_json::to_string(value).map_err(|e| e.to_string())?;
    let (status, bytes) = send_as(client, As::Operator(operator), "POST", url, Some(body)).await?;
    if status != expect {
        return Err(format!(
            "POST {url}: {status} {}",
            String::from_utf8_lossy(&bytes)
        ));
    }
    serde_json::from_slice(&bytes).map_err(|e| format!("POST {url}: {e}"))
}

/// Puts a voucher on sale through the API of `target`, as the operator.
pub async fn create_voucher(
    target: &str,
    operator: Option<&OperatorToken>,
    voucher: &NewVoucher,
) -> Result<Voucher, String> {
    post_json(
        &client(),
        operator,
        &format!("{target}/api/vouchers"),
        voucher,
        201,
    )
    .await
}

/// Logs in as `name` through the API of `target`: the user, and the session's cookie
/// (`shop_session=…`) to send with the user's requests.
pub async fn login(target: &str, name: &str) -> Result<(User, String), String> {
    let url = format!("{target}/api/login");
    let body = serde_json::json!({ "name": name }).to_string();
    let request = hyper::Request::post(&url)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| e.to_string())?;
    let response = tokio::time::timeout(Duration::from_secs(30), client().request(request))
        .await
        .map_err(|_| format!("POST {url}: no answer within 30 s"))?
        .map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let cookie = response
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .filter_map(|v| v.split(';').next())
        .find(|pair| pair.starts_with(crate::auth::SESSION_COOKIE))
        .map(str::to_owned);
    let bytes = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    if status != 200 {
        return Err(format!(
            "POST {url}: {status} {}",
            String::from_utf8_lossy(&bytes)
        ));
    }
    let user = serde_json::from_slice(&bytes).map_err(|e| format!("POST {url}: {e}"))?;
    let cookie = cookie.ok_or_else(|| format!("POST {url}: no session cookie"))?;
    Ok((user, cookie))
}

/// Whether `target` answers `/healthz`.
pub async fn healthy(target: &str) -> bool {
    matches!(
        send(&client(), "GET", &format!("{target}/healthz"), None).await,
        Ok((200, _))
    )
}

/// Reads `/api/stats` of `target`, as the operator.
pub async fn stats(target: &str, operator: Option<&OperatorToken>) -> Result<Stats, String> {
    let url = format!("{target}/api/stats");
    let (status, body) = send_as(&client(), As::Operator(operator), "GET", &url, None).await?;
    if status != 200 {
        return Err(format!(
            "reading the stats of {target}: {status} {}",
            String::from_utf8_lossy(&body)
        ));
    }
    serde_json::from_slice(&body).map_err(|e| e.to_string())
}

/// What one buyer sent: each answer, how long it took, and whether it was a purchase.
struct Sent {
    answer: Answer,
    took: Duration,
    purchase: bool,
}

async fn timed(
    client: &HttpClient,
    cookie: &str,
    method: &str,
    url: String,
    body: Option<String>,
) -> Sent {
    let t = Instant::now();
    let answer = send_as(client, As::Buyer(cookie), method, &url, body).await;
    Sent {
        answer,
        took: t.elapsed(),
        purchase: false,
    }
}

/// One buyer's requests.
struct Buyer {
    client: HttpClient,
    targets: Arc<Vec<String>>,
    skus: Arc<Vec<i64>>,
    voucher: i64,
    requests: u32,
    index: usize,
    edits: bool,
    run: String,
}

impl Buyer {
    fn target(&self, offset: usize) -> &str {
        &self.targets[(self.index + offset) % self.targets.len()]
    }

    async fn go(self) -> Result<Vec<Sent>, String> {
        let (_, cookie) = login(
            self.target(0),
            &format!("buyer-{}-{}", self.run, self.index),
        )
        .await?;
        let cookie = cookie.as_str();
        let mut sent = Vec::new();
        // Several requests of one buyer at the same moment, spread over the instances: the
        // session is known to every instance.
        let client = &self.client;
        let burst = (0..self.requests as usize).map(|r| {
            let url = format!("{}/api/vouchers/{}/orders", self.target(r), self.voucher);
            async move {
                Sent {
                    purchase: true,
                    ..timed(client, cookie, "POST", url, None).await
                }
            }
        });
        sent.extend(futures_util::future::join_all(burst).await);
        if self.skus.is_empty() {
            return Ok(sent);
        }
        let sku = self.skus[self.index % self.skus.len()];
        let items = format!("{}/api/cart/items", self.target(0));
        let added = timed(
            client,
            cookie,
            "POST",
            items.clone(),
            Some(format!("{{\"sku_id\":{sku},\"qty\":1}}")),
        )
        .await;
        let added_ok = matches!(added.answer, Ok((200, _)));
        sent.push(added);
        if !added_ok {
            return Ok(sent);
        }
        let checkout = async {
            let url = format!("{}/api/cart/checkout", self.target(0));
            Sent {
                purchase: true,
                ..timed(client, cookie, "POST", url, None).await
            }
        };
        if !self.edits {
            sent.push(checkout.await);
            return Ok(sent);
        }
        // A second tab, on another instance: adds another SKU and takes it out again while the
        // checkout runs.
        let other = self.skus[(self.index + 1) % self.skus.len()];
        let elsewhere = format!("{}/api/cart/items", self.target(1));
        let edit = async {
            let add = timed(
                client,
                cookie,
                "POST",
                elsewhere.clone(),
                Some(format!("{{\"sku_id\":{other},\"qty\":1}}")),
            )
            .await;
            let remove = timed(
                client,
                cookie,
                "DELETE",
                format!("{elsewhere}/{other}"),
                None,
            )
            .await;
            [add, remove]
        };
        let (checkout, edits) = tokio::join!(checkout, edit);
        sent.push(checkout);
        sent.extend(edits);
        Ok(sent)
    }
}

/// Sets up a voucher and SKUs on the first target, fires the buyers at every target, and
/// audits.
pub async fn run(config: &LoadConfig) -> Result<Report, String> {
    let first = config.targets.first().ok_or("no target")?.clone();
    let client = client();
    let voucher = NewVoucher {
        title: "Flash voucher".to_owned(),
        price_cents: 999,
        stock: config.stock,
        starts_at_ms: now_ms() - 1_000,
        ends_at_ms: now_ms() + 3_600_000,
    };
    let operator = config.operator.as_ref();
    let voucher = create_voucher(&first, operator, &voucher).await?.id;
    let mut skus = Vec::new();
    for i in 0..config.skus {
        let sku = NewSku {
            name: format!("SKU {i}"),
            price_cents: 500 + i64::from(i) * 100,
            stock: config.sku_stock,
        };
        let url = format!("{first}/api/skus");
        let sku: Sku = post_json(&client, operator, &url, &sku, 201).await?;
        skus.push(sku.id);
    }
    let (targets, skus) = (Arc::new(config.targets.clone()), Arc::new(skus));
    let run = crate::counters::random_id();

    let started = Instant::now();
    let permits = Arc::new(Semaphore::new(config.concurrency.max(1)));
    let mut buyers = Vec::new();
    for index in 0..config.users {
        let permit = permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| e.to_string())?;
        let buyer = Buyer {
            client: client.clone(),
            targets: targets.clone(),
            skus: skus.clone(),
            voucher,
            requests: config.requests_per_user,
            index: usize::try_from(index).unwrap_or(0),
            edits: config.edit_every > 0 && index % config.edit_every == 0,
            run: run.clone(),
        };
        buyers.push(tokio::spawn(async move {
            let _permit = permit;
            buyer.go().await
        }));
    }
    let mut report = Report::default();
    let mut latencies = Vec::new();
    for buyer in buyers {
        let sent = buyer.await.map_err(|e| e.to_string())??;
        if sent.len() > config.requests_per_user as usize + 2 {
            report.edited_checkouts += 1;
        }
        for Sent {
            answer,
            took,
            purchase,
        } in sent
        {
            report.requests += 1;
            report.purchases += u64::from(purchase);
            match answer {
                Ok((status, _)) if (200..300).contains(&status) => report.ok += 1,
                Ok((409, _)) => report.conflicts += 1,
                other => {
                    report.errors += 1;
                    if report.error_samples.len() < 5 {
                        report.error_samples.push(match other {
                            Ok((status, body)) => {
                                format!("{status} {}", String::from_utf8_lossy(&body))
                            }
                            Err(err) => err,
                        });
                    }
                }
            }
            latencies.push(took);
        }
    }
    report.seconds = started.elapsed().as_secs_f64();
    latencies.sort();
    let pick = |p: f64| {
        let last = latencies.len().saturating_sub(1);
        let at = (last as f64 * p).round() as usize;
        latencies.get(at).map_or(0.0, |d| d.as_secs_f64() * 1e3)
    };
    report.p50_ms = pick(0.5);
    report.p99_ms = pick(0.99);
    // The audit and the counters are the database's: every instance answers alike.
    report.stats = settled_stats(&first, operator).await?;
    Ok(report)
}

/// The shop's numbers once every instance has written what it counted: each adds its counts
/// to the database once per [`crate::events::POLL_INTERVAL`], so the numbers are read again,
/// more than one interval apart, until two reads agree (at most about five seconds).
async fn settled_stats(target: &str, operator: Option<&OperatorToken>) -> Result<Stats, String> {
    let apart = crate::events::POLL_INTERVAL + Duration::from_millis(100);
    let mut last = stats(target, operator).await?;
    for _ in 0..12 {
        tokio::time::sleep(apart).await;
        let now = stats(target, operator).await?;
        if now == last {
            return Ok(now);
        }
        last = now;
    }
    Ok(last)
}

/// One cell of the table, from a report.
type Cell = fn(&Report) -> String;

/// A side-by-side table of runs.
pub fn table(runs: &[(&str, &Report)]) -> String {
    let rows: [(&str, Cell); 19] = [
        ("requests", |r| r.requests.to_string()),
        ("2xx", |r| r.ok.to_string()),
        ("409", |r| r.conflicts.to_string()),
        ("other errors", |r| r.errors.to_string()),
        ("requests per second", |r| {
            format!("{:.0}", r.requests as f64 / r.seconds.max(1e-9))
        }),
        ("p50 latency (ms)", |r| format!("{:.1}", r.p50_ms)),
        ("p99 latency (ms)", |r| format!("{:.1}", r.p99_ms)),
        ("requests that waited for a lock", |r| {
            r.stats.lock_waits.to_string()
        }),
        ("checkouts with a cart edit beside", |r| {
            r.edited_checkouts.to_string()
        }),
        ("voucher orders / stock", |r| {
            format!(
                "{} / {}",
                r.stats.voucher_orders, r.stats.voucher_initial_stock
            )
        }),
        ("users with duplicate orders", |r| {
            r.stats.duplicate_orders.to_string()
        }),
        ("oversold vouchers", |r| {
            r.stats.oversold_vouchers.to_string()
        }),
        ("SKU units sold / stock", |r| {
            format!("{} / {}", r.stats.units_sold, r.stats.sku_initial_stock)
        }),
        ("SKU units oversold", |r| r.stats.units_oversold.to_string()),
        ("units lost (stock − orders)", |r| {
            r.stats.units_lost.to_string()
        }),
        ("units sold twice (lost updates)", |r| {
            r.stats.units_double_sold.to_string()
        }),
        ("rows with negative stock", |r| {
            r.stats.negative_stock_rows.to_string()
        }),
        ("stale writes refused (fencing)", |r| {
            r.stats.stale_refused.to_string()
        }),
        ("invariants hold", |r| {
            if r.clean() { "yes" } else { "NO" }.to_owned()
        }),
    ];
    let label_width = rows
        .iter()
        .map(|(l, _)| l.chars().count())
        .max()
        .unwrap_or(0)
        + 2;
    let mut out = String::new();
    out.push_str(&" ".repeat(label_width));
    for (name, _) in runs {
        out.push_str(&format!("{name:>16}"));
    }
    out.push('\n');
    for (label, value) in rows {
        out.push_str(label);
        out.push_str(&" ".repeat(label_width - label.chars().count()));
        for (_, report) in runs {
            out.push_str(&format!("{:>16}", value(report)));
        }
        out.push('\n');
    }
    out
}
