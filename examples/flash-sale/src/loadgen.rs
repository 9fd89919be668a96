//! The load generator: many buyers against one or several instances, then an audit of the
//! database.
//!
//! Each buyer fires several voucher orders at the same moment, spread over the instances (the
//! double-click, the retry, the second tab: what the per-user lock is for), then puts one SKU in
//! its cart and checks out (buyers compete for the SKUs' stock: what the SKU locks are for).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use serde::Serialize;
use tokio::sync::Semaphore;

use crate::{NewSku, NewVoucher, Sku, Stats, Voucher, now_ms};

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
        }
    }
}

/// What a run saw.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    /// Requests sent.
    pub requests: u64,
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
    /// The audit (from the database) and the counters of every instance, summed.
    pub stats: Stats,
}

impl Report {
    /// The invariants hold: no duplicate orders, no oversell, no negative stock.
    pub fn clean(&self) -> bool {
        self.stats.duplicate_orders == 0
            && self.stats.oversold_vouchers == 0
            && self.stats.sku_units_oversold == 0
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

async fn send(
    client: &HttpClient,
    method: &str,
    url: &str,
    body: Option<String>,
) -> Result<(u16, Bytes), String> {
    let request = hyper::Request::builder()
        .method(method)
        .uri(url)
        .header("content-type", "application/json")
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
    url: &str,
    value: &T,
) -> Result<R, String> {
    let body = serde_json::to_string(value).map_err(|e| e.to_string())?;
    let (status, bytes) = send(client, "POST", url, Some(body)).await?;
    if status != 201 {
        return Err(format!(
            "POST {url}: {status} {}",
            String::from_utf8_lossy(&bytes)
        ));
    }
    serde_json::from_slice(&bytes).map_err(|e| format!("POST {url}: {e}"))
}

/// Puts a voucher on sale through the API of `target`.
pub async fn create_voucher(target: &str, voucher: &NewVoucher) -> Result<Voucher, String> {
    post_json(&client(), &format!("{target}/api/vouchers"), voucher).await
}

/// Reads `/api/stats` of `target`.
pub async fn stats(target: &str) -> Result<Stats, String> {
    let (status, body) = send(&client(), "GET", &format!("{target}/api/stats"), None).await?;
    if status != 200 {
        return Err(format!("reading the stats of {target}: {status}"));
    }
    serde_json::from_slice(&body).map_err(|e| e.to_string())
}

/// Sets up a voucher and SKUs on the first target, fires the buyers at every target, and
/// audits.
pub async fn run(config: &LoadConfig) -> Result<Report, String> {
    let first = config.targets.first().ok_or("no target")?.clone();
    let client = client();
    let voucher = NewVoucher {
        title: "Flash voucher".to_owned(),
        price: 999,
        stock: config.stock,
        begin_at: now_ms() - 1_000,
        end_at: now_ms() + 3_600_000,
    };
    let voucher_id = create_voucher(&first, &voucher).await?.id;
    let mut skus = Vec::new();
    for i in 0..config.skus {
        let sku = NewSku {
            name: format!("SKU {i}"),
            stock: config.sku_stock,
        };
        let sku: Sku = post_json(&client, &format!("{first}/api/skus"), &sku).await?;
        skus.push(sku.id);
    }

    let started = Instant::now();
    let permits = Arc::new(Semaphore::new(config.concurrency.max(1)));
    let mut buyers = Vec::new();
    for user in 1..=config.users {
        let permit = permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| e.to_string())?;
        let (client, targets, skus) = (client.clone(), config.targets.clone(), skus.clone());
        let requests = config.requests_per_user;
        buyers.push(tokio::spawn(async move {
            let _permit = permit;
            let user_ix = usize::try_from(user).unwrap_or(0);
            let mut results = Vec::new();
            // Several requests of one buyer at the same moment, spread over the instances.
            let burst = (0..requests).map(|r| {
                let target = &targets[(user_ix + r as usize) % targets.len()];
                let url = format!("{target}/api/vouchers/{voucher_id}/orders");
                let client = client.clone();
                let body = format!("{{\"user_id\":{user}}}");
                async move {
                    let t = Instant::now();
                    let result = send(&client, "POST", &url, Some(body)).await;
                    (result, t.elapsed())
                }
            });
            results.extend(futures_util::future::join_all(burst).await);
            if !skus.is_empty() {
                let target = &targets[user_ix % targets.len()];
                let sku = skus[user_ix % skus.len()];
                let t = Instant::now();
                let added = send(
                    &client,
                    "POST",
                    &format!("{target}/api/carts/{user}/items"),
                    Some(format!("{{\"sku_id\":{sku},\"qty\":1}}")),
                )
                .await;
                if matches!(added, Ok((204, _))) {
                    let t = Instant::now();
                    let url = format!("{target}/api/carts/{user}/checkout");
                    let result = send(&client, "POST", &url, None).await;
                    results.push((result, t.elapsed()));
                } else {
                    results.push((added, t.elapsed()));
                }
            }
            results
        }));
    }
    let mut report = Report::default();
    let mut latencies = Vec::new();
    for buyer in buyers {
        for (result, elapsed) in buyer.await.map_err(|e| e.to_string())? {
            report.requests += 1;
            match result {
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
            latencies.push(elapsed);
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
    // The audit is the database's; the counters are each instance's, summed.
    report.stats = stats(&first).await?;
    for target in &config.targets[1..] {
        let other = stats(target).await?;
        let s = &mut report.stats;
        s.requests += other.requests;
        s.locked += other.locked;
        s.lock_waits += other.lock_waits;
        s.conflicts += other.conflicts;
        s.stale_writes_refused += other.stale_writes_refused;
    }
    Ok(report)
}

/// One cell of the table, from a report.
type Cell = fn(&Report) -> String;

/// A side-by-side table of runs.
pub fn table(runs: &[(&str, &Report)]) -> String {
    let rows: [(&str, Cell); 16] = [
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
            format!("{} / {}", r.stats.sku_units_sold, r.stats.sku_initial_stock)
        }),
        ("SKU units oversold", |r| {
            r.stats.sku_units_oversold.to_string()
        }),
        ("rows with negative stock", |r| {
            r.stats.negative_stock_rows.to_string()
        }),
        ("stale writes refused (fencing)", |r| {
            r.stats.stale_writes_refused.to_string()
        }),
        ("invariants hold", |r| {
            if r.clean() { "yes" } else { "NO" }.to_owned()
        }),
    ];
    let label_width = rows.iter().map(|(l, _)| l.len()).max().unwrap_or(0) + 2;
    let mut out = String::new();
    out.push_str(&format!("{:<label_width$}", ""));
    for (name, _) in runs {
        out.push_str(&format!("{name:>16}"));
    }
    out.push('\n');
    for (label, value) in rows {
        out.push_str(&format!("{label:<label_width$}"));
        for (_, report) in runs {
            out.push_str(&format!("{:>16}", value(report)));
        }
        out.push('\n');
    }
    out
}
