//! W4–W6: the HTTP layer, the watchdog's cost, and waiters at scale.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dlock_core::Locker;

use super::*;
use crate::{Row, Server, Settings};

/// W4: an axum route behind `LockLayer` (a distinct key per request) against the bare route,
/// driven one request at a time over loopback by an in-process hyper client. Returns the rows
/// and the added p50 latency (the median over rounds of locked p50 − bare p50).
pub(super) async fn w4(settings: &Settings) -> (Vec<Row>, f64) {
    use axum::Router;
    use axum::extract::Path;
    use axum::routing::get;
    use http_body_util::BodyExt as _;

    let locker = Locker::connect(&settings.url).await.expect("connect");
    let bare = Router::new().route("/r/{id}", get(|| async { "ok" }));
    let locked = Router::new()
        .route("/r/{id}", get(|| async { "ok" }))
        .route_layer(
            dlock_tower::LockLayer::new(locker)
                .key(|Path(id): Path<u64>| async move { format!("w4:{id}") }),
        );
    let mut bases = Vec::new();
    for app in [bare, locked] {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        bases.push(format!("http://{addr}"));
    }
    let client: hyper_util::client::legacy::Client<_, http_body_util::Empty<bytes::Bytes>> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build_http();
    let labels = ["axum bare", "axum+LockLayer"];
    let mut acc: [Acc; 2] = Default::default();
    let mut added = Vec::new();
    let mut id = 0u64;
    for round in rounds(settings) {
        let length = round_length(settings, round);
        let mut p50 = [0.0; 2];
        for (which, base) in bases.iter().enumerate() {
            let mut samples = Vec::new();
            let mut errors = 0;
            let started = Instant::now();
            let end = started + length;
            while Instant::now() < end {
                id += 1;
                let uri = format!("{base}/r/{id}").parse().expect("uri");
                let t = Instant::now();
                match client.get(uri).await {
                    Ok(response) if response.status().is_success() => {
                        let _ = response.into_body().collect().await;
                        samples.push(t.elapsed());
                    }
                    Ok(response) => {
                        if errors == 0 {
                            eprintln!("W4 {}: status {}", labels[which], response.status());
                        }
                        errors += 1;
                    }
                    Err(e) => {
                        if errors == 0 {
                            eprintln!("W4 {}: {e}", labels[which]);
                        }
                        errors += 1;
                    }
                }
            }
            let a = &mut acc[which];
            a.errors += errors;
            let Some(_) = round else { continue };
            a.ops
                .push(samples.len() as f64 / started.elapsed().as_secs_f64());
            p50[which] = percentile_us(&mut samples, 0.5);
            a.p50.push(p50[which]);
            a.p99.push(percentile_us(&mut samples, 0.99));
        }
        if round.is_some() {
            added.push(p50[1] - p50[0]);
        }
    }
    let [bare, locked] = acc;
    let mut locked = locked.row("W4", labels[1]);
    let added = median(&mut added);
    locked.extra.insert("added_p50_us", added);
    (vec![bare.row("W4", labels[0]), locked], added)
}

fn rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

/// W5: many locks held in watchdog mode with a 3 s lease. Lost: holds the client saw lost, plus
/// locks missing from Redis at the end.
pub(super) async fn w5(settings: &Settings, server: &Server) -> Row {
    let (count, hold) = if settings.quick {
        (500, Duration::from_millis(2_500))
    } else {
        (10_000, Duration::from_secs(30))
    };
    let lease = Duration::from_secs(3);
    let locker = Locker::builder()
        .url(settings.url.clone())
        .default_lease(dlock_core::Lease::watchdog(lease))
        .build()
        .await
        .expect("connect");
    let mut errors = 0;
    let mut guards = Vec::with_capacity(count);
    let mut pending = Vec::new();
    for i in 0..count {
        let locker = locker.clone();
        pending.push(tokio::spawn(
            async move { locker.lock(format!("w5:{i}")).await },
        ));
        if pending.len() == 256 || i + 1 == count {
            for task in pending.drain(..) {
                match task.await.expect("w5 task") {
                    Ok(guard) => guards.push(guard),
                    Err(e) => {
                        if errors == 0 {
                            eprintln!("W5: {e}");
                        }
                        errors += 1;
                    }
                }
            }
        }
    }
    let trips_before = locker.stats().renewal_round_trips;
    let before = server.info("all");
    tokio::time::sleep(hold).await;
    let trips = locker.stats().renewal_round_trips - trips_before;
    let after = server.info("all");
    let scripts = |info: &str| dlock_tests::script_calls(&crate::parse_commandstats(info));
    let script_calls = scripts(&after) - scripts(&before);
    let cpu_used = redis_cpu(&after) - redis_cpu(&before);
    let lost_client = guards.iter().filter(|g| g.is_lost()).count();
    // Every lock is still in Redis, with a lease that was renewed.
    let mut con = redis::Client::open(settings.url.as_str())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let mut pipe = redis::pipe();
    for guard in &guards {
        pipe.cmd("PTTL")
            .arg(locker.key_of(guard.name().clone()).expect("key"));
    }
    let pttls: Vec<i64> = pipe.query_async(&mut con).await.expect("PTTL");
    let missing = pttls.iter().filter(|p| **p <= 0).count();
    let min_pttl_ms = pttls.iter().copied().min().unwrap_or(0);
    for guard in guards {
        if !guard.release().await.is_released() {
            errors += 1;
        }
    }
    let ticks = (hold.as_secs_f64() / (lease.as_secs_f64() / 3.0))
        .floor()
        .max(1.0);
    let lost = (lost_client + missing) as f64;
    let mut extra = BTreeMap::new();
    extra.insert("locks", count as f64);
    extra.insert("seconds", hold.as_secs_f64());
    extra.insert("ticks", ticks);
    extra.insert("round_trips", trips as f64);
    extra.insert(
        "round_trips_per_tick_per_100",
        trips as f64 / ticks / (count as f64 / 100.0),
    );
    extra.insert("script_calls", script_calls as f64);
    extra.insert("one_per_lock_would_be", ticks * count as f64);
    extra.insert("redis_cpu_s", cpu_used);
    extra.insert("lost", lost);
    extra.insert("min_pttl_ms", min_pttl_ms as f64);
    Row {
        workload: "W5",
        lib: "dlock".to_owned(),
        errors,
        violations: lost as u64,
        extra,
        ..Row::default()
    }
}

/// W6: many tasks waiting on many names (held by another `Locker`), released one by one.
pub(super) async fn w6(settings: &Settings, server: &Server) -> Row {
    let (tasks, names) = if settings.quick {
        (400, 40)
    } else {
        (10_000, 1_000)
    };
    let clients = |s: &Server| s.info_field("clients", "connected_clients");
    let holder = Locker::connect(&settings.url).await.expect("connect");
    let mut held = Vec::with_capacity(names);
    for n in 0..names {
        held.push(
            holder
                .lock(format!("w6:{n}"))
                .lease(Duration::from_secs(120))
                .await
                .expect("w6 hold"),
        );
    }
    let clients_before = clients(server);
    let rss_before = rss_mb();
    let waiter = Locker::connect(&settings.url).await.expect("connect");
    // What one waiter costs in memory before any allocation of its own: the sizes of the
    // futures it holds (the acquisition is boxed by `IntoFuture`; the release is awaited inline).
    let (acquire_bytes, release_bytes) = {
        use std::future::IntoFuture as _;
        let acquiring = holder.lock("w6:size").into_future();
        let acquire_bytes = std::mem::size_of_val(&*acquiring);
        drop(acquiring);
        let guard = holder.lock("w6:size").await.expect("w6 size probe");
        let releasing = guard.release();
        let release_bytes = std::mem::size_of_val(&releasing);
        let _ = releasing.await;
        (acquire_bytes, release_bytes)
    };
    let acquired = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(Errors::default());
    let started = Instant::now();
    let mut handles = Vec::with_capacity(tasks);
    for t in 0..tasks {
        let (waiter, acquired, errors) = (waiter.clone(), acquired.clone(), errors.clone());
        handles.push(tokio::spawn(async move {
            match waiter
                .lock(format!("w6:{}", t % names))
                .wait(Duration::from_secs(300))
                .await
            {
                Ok(guard) => {
                    acquired.fetch_add(1, Ordering::SeqCst);
                    if !guard.release().await.is_released() {
                        errors.record("W6", "dlock", "a release failed");
                    }
                }
                Err(e) => errors.record("W6", "dlock", &e.to_string()),
            }
        }));
    }
    // Every name waited in Redis (one head waiter per name) before the releases start.
    let settle = Instant::now() + Duration::from_secs(60);
    while waiter.stats().watched_names < names && Instant::now() < settle {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let settled = started.elapsed();
    let mut connections_peak = clients(server) - clients_before;
    let mut rss_peak = rss_mb();
    for (i, guard) in held.into_iter().enumerate() {
        if !guard.release().await.is_released() {
            errors.record("W6", "holder", "a release failed");
        }
        rss_peak = rss_peak.max(rss_mb());
        if i % (names / 20).max(1) == 0 {
            connections_peak = connections_peak.max(clients(server) - clients_before);
        }
    }
    let mut unfinished = 0;
    for handle in handles {
        if tokio::time::timeout(Duration::from_secs(60), handle)
            .await
            .is_err()
        {
            unfinished += 1;
        }
    }
    rss_peak = rss_peak.max(rss_mb());
    let elapsed = started.elapsed();
    let got = acquired.load(Ordering::SeqCst);
    let mut extra = BTreeMap::new();
    extra.insert("waiters", tasks as f64);
    extra.insert("names", names as f64);
    extra.insert("acquired", got as f64);
    extra.insert("acquired_all", f64::from(u8::from(got == tasks as u64)));
    extra.insert("connections_peak", connections_peak);
    extra.insert("rss_growth_mb", rss_peak - rss_before);
    extra.insert("acquire_future_bytes", acquire_bytes as f64);
    extra.insert("release_future_bytes", release_bytes as f64);
    extra.insert("settle_s", settled.as_secs_f64());
    extra.insert("seconds", elapsed.as_secs_f64());
    Row {
        workload: "W6",
        lib: "dlock".to_owned(),
        ops_per_sec: Some(got as f64 / (elapsed - settled).as_secs_f64()),
        errors: errors.get() + unfinished,
        extra,
        ..Row::default()
    }
}
