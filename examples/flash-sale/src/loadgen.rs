//! The load generator: many buyers against one or several instances, then an audit.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use serde::Serialize;
use tokio::sync::Semaphore;

use crate::{NewSku, NewVoucher, Stats, now_ms};

/// How hard to push.
#[derive(Debug, Clone)]
pub struct LoadConfig {
    /// Base URLs of the instances (`http://127.0.0.1:PORT`).
    pub targets: Vec<String>,
    /// Buyers.
    pub users: u64,
    /// Voucher stock.
    pub stock: i64,
    /// Concurrent voucher requests each buyer fires.
    pub requests_per_user: u32,
    /// Buyers in flight at once.
    pub concurrency: usize,
    /// SKUs for the cart checkouts, and the stock of each.
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
    /// Median latency, ms.
    pub p50_ms: f64,
    /// 99th percentile latency, ms.
    pub p99_ms: f64,
    /// Wall time, s.
    pub seconds: f64,
    /// The audit, from the database.
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
    let response = tokio::time::timeout(Duration::from_secs(30), client.request(request))
        .await
        .map_err(|_| "timed out".to_owned())?
        .map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, body))
}

fn client() -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    Client::builder(hyper_util::rt::TokioExecutor::new())
        .pool_max_idle_per_host(256)
        .build(connector)
}

/// Sets up a voucher and SKUs on the first target, fires the buyers, and audits.
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
    let (status, body) = send(
        &client,
        "POST",
        &format!("{first}/api/vouchers"),
        serde_json::to_string(&voucher).ok(),
    )
    .await?;
    if status != 201 {
        return Err(format!("creating the voucher: {status} {body:?}"));
    }
    let voucher_id = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v["id"].as_i64())
        .ok_or("voucher id")?;
    let mut skus = Vec::new();
    for i in 0..config.skus {
        let sku = NewSku {
            name: format!("SKU {i}"),
            stock: config.sku_stock,
        };
        let (status, body) = send(
            &client,
            "POST",
            &format!("{first}/api/skus"),
            serde_json::to_string(&sku).ok(),
        )
        .await?;
        if status != 201 {
            return Err(format!("creating a sku: {status}"));
        }
        skus.push(serde_json::from_slice::<i64>(&body).map_err(|e| e.to_string())?);
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
            let mut results = Vec::new();
            // Several requests of one buyer at the same moment, spread over the instances:
            // the double-click the per-user lock is for.
            let mut burst = Vec::new();
            for r in 0..requests {
                let target = &targets[(user as usize + r as usize) % targets.len()];
                let url = format!("{target}/api/vouchers/{voucher_id}/orders");
                let client = client.clone();
                let body = format!("{{\"user_id\":{user}}}");
                burst.push(async move {
                    let t = Instant::now();
                    (send(&client, "POST", &url, Some(body)).await, t.elapsed())
                });
            }
            for (result, elapsed) in futures_util::future::join_all(burst).await {
                results.push((result.map(|(s, _)| s), elapsed));
            }
            if !skus.is_empty() {
                let target = &targets[user as usize % targets.len()];
                let sku = skus[user as usize % skus.len()];
                let added = send(
                    &client,
                    "POST",
                    &format!("{target}/api/carts/{user}/items"),
                    Some(format!("{{\"sku_id\":{sku},\"qty\":1}}")),
                )
                .await;
                if matches!(added, Ok((204, _))) {
                    let t = Instant::now();
                    let result = send(
                        &client,
                        "POST",
                        &format!("{target}/api/carts/{user}/checkout"),
                        None,
                    )
                    .await;
                    results.push((result.map(|(s, _)| s), t.elapsed()));
                } else {
                    results.push((added.map(|(s, _)| s), Duration::ZERO));
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
                Ok(status) if (200..300).contains(&status) => report.ok += 1,
                Ok(409) => report.conflicts += 1,
                _ => report.errors += 1,
            }
            latencies.push(elapsed);
        }
    }
    report.seconds = started.elapsed().as_secs_f64();
    latencies.sort();
    let pick = |p: f64| {
        latencies
            .get(((latencies.len().max(1) - 1) as f64 * p) as usize)
            .map_or(0.0, |d| d.as_secs_f64() * 1e3)
    };
    report.p50_ms = pick(0.5);
    report.p99_ms = pick(0.99);
    let (status, body) = send(&client, "GET", &format!("{first}/api/stats"), None).await?;
    if status != 200 {
        return Err(format!("reading the stats: {status}"));
    }
    report.stats = serde_json::from_slice(&body).map_err(|e| e.to_string())?;
    Ok(report)
}

/// One cell of the table, from a report.
type Cell = fn(&Report) -> String;

/// A side-by-side table of runs.
pub fn table(runs: &[(&str, &Report)]) -> String {
    let mut out = String::new();
    let header: Vec<String> = runs.iter().map(|(name, _)| format!("{name:>14}")).collect();
    out.push_str(&format!("{:<32}{}\n", "", header.join("")));
    let rows: [(&str, Cell); 13] = [
        ("requests", |r| r.requests.to_string()),
        ("2xx", |r| r.ok.to_string()),
        ("409", |r| r.conflicts.to_string()),
        ("other errors", |r| r.errors.to_string()),
        ("p50 latency (ms)", |r| format!("{:.1}", r.p50_ms)),
        ("p99 latency (ms)", |r| format!("{:.1}", r.p99_ms)),
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
        ("SKU units sold", |r| r.stats.sku_units_sold.to_string()),
        ("SKU units oversold", |r| {
            r.stats.sku_units_oversold.to_string()
        }),
        ("rows with negative stock", |r| {
            r.stats.negative_stock_rows.to_string()
        }),
        ("invariants hold", |r| {
            if r.clean() { "yes" } else { "NO" }.to_owned()
        }),
    ];
    for (label, value) in rows {
        let cells: Vec<String> = runs
            .iter()
            .map(|(_, r)| format!("{:>14}", value(r)))
            .collect();
        out.push_str(&format!("{label:<32}{}\n", cells.join("")));
    }
    out
}
