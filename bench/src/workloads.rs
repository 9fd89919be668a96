//! The six workloads and the PING floor.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dlock_core::Locker;
use tokio::sync::Mutex;

use crate::peers::{Client, Lib};
use crate::{Row, Server, Settings, Verdict};

/// Commands a client sends (a script counts once; what it runs inside does not).
const CLIENT_COMMANDS: &[&str] = &[
    "evalsha",
    "eval",
    "set",
    "subscribe",
    "unsubscribe",
    "ping",
    "script|load",
    "script",
];

fn client_commands(server: &Server) -> u64 {
    let stats = server.commandstats();
    CLIENT_COMMANDS.iter().filter_map(|c| stats.get(*c)).sum()
}

fn median(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn percentile_us(samples: &mut [Duration], p: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    samples.sort();
    let index = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[index].as_secs_f64() * 1e6
}

fn wanted(settings: &Settings, id: &str) -> bool {
    settings
        .only
        .as_ref()
        .is_none_or(|only| only.iter().any(|o| o == id))
}

pub(crate) async fn run_all(settings: &Settings, server: &Server) -> (Vec<Row>, Vec<Verdict>) {
    let mut rows = Vec::new();
    let mut verdicts = Vec::new();
    let ping = ping_p50_us(&settings.url).await;
    rows.push(Row {
        workload: "PING",
        lib: "redis".to_owned(),
        p50_us: Some(ping),
        ..Row::default()
    });
    if wanted(settings, "W1") {
        let w1 = w1(settings, server).await;
        let ops = |lib: &str| {
            w1.iter()
                .find(|r| r.lib == lib)
                .and_then(|r| r.ops_per_sec)
                .unwrap_or(f64::NAN)
        };
        let (d, raw, rs) = (ops("dlock"), ops("raw"), ops("rslock"));
        verdicts.push(Verdict {
            workload: "W1",
            target: "cycles/s ≥ 0.8 × raw and > rslock".to_owned(),
            measured: format!("{:.2} × raw, {:.2} × rslock", d / raw, d / rs),
            met: d >= 0.8 * raw && d > rs,
        });
        rows.extend(w1);
    }
    if wanted(settings, "W2") {
        let w2 = w2(settings, server).await;
        let get = |lib: &str| {
            w2.iter()
                .find(|r| r.lib == lib)
                .cloned()
                .unwrap_or_default()
        };
        let (d, raw) = (get("dlock"), get("raw"));
        let fairness = d.extra.get("fairness").copied().unwrap_or(0.0);
        let ops_ratio = d.ops_per_sec.unwrap_or(0.0) / raw.ops_per_sec.unwrap_or(f64::NAN);
        let p99_ratio = d.p99_us.unwrap_or(f64::NAN) / raw.p99_us.unwrap_or(f64::NAN);
        verdicts.push(Verdict {
            workload: "W2",
            target: "acq/s ≥ raw, 0 violations, fairness ≥ 0.5, p99 wait ≤ 0.25 × raw".to_owned(),
            measured: format!(
                "{ops_ratio:.2} × raw, {} violations, fairness {fairness:.2}, p99 {p99_ratio:.2} × raw",
                d.violations
            ),
            met: ops_ratio >= 1.0 && d.violations == 0 && fairness >= 0.5 && p99_ratio <= 0.25,
        });
        rows.extend(w2);
    }
    if wanted(settings, "W3") {
        let w3 = w3(settings, server).await;
        if let Some(d) = w3.iter().find(|r| r.lib == "dlock") {
            let p50 = d.p50_us.unwrap_or(f64::NAN);
            let cmds = d.commands_per_op.unwrap_or(f64::NAN);
            verdicts.push(Verdict {
                workload: "W3",
                target: "handoff p50 ≤ 350 µs and ≤ 4 × PING; ≤ 8 commands per handoff".to_owned(),
                measured: format!(
                    "p50 {p50:.0} µs = {:.2} × PING ({ping:.0} µs), {cmds:.1} commands",
                    p50 / ping
                ),
                met: p50 <= 350.0 && p50 <= 4.0 * ping && cmds <= 8.0,
            });
        }
        rows.extend(w3);
    }
    if wanted(settings, "W4") {
        let w4 = w4(settings).await;
        let p50 = |lib: &str| {
            w4.iter()
                .find(|r| r.lib == lib)
                .and_then(|r| r.p50_us)
                .unwrap_or(f64::NAN)
        };
        let added = p50("axum+LockLayer") - p50("axum bare");
        verdicts.push(Verdict {
            workload: "W4",
            target: "added p50 ≤ 3 × PING".to_owned(),
            measured: format!("+{added:.0} µs = {:.2} × PING", added / ping),
            met: added <= 3.0 * ping,
        });
        rows.extend(w4);
    }
    if wanted(settings, "W5") {
        let w5 = w5(settings, server).await;
        let per100 = w5
            .extra
            .get("round_trips_per_tick_per_100")
            .copied()
            .unwrap_or(f64::NAN);
        let lost = w5.extra.get("lost").copied().unwrap_or(f64::NAN);
        verdicts.push(Verdict {
            workload: "W5",
            target: "≤ 1 renewal round trip per tick per 100 locks, 0 lost".to_owned(),
            measured: format!("{per100:.3} per tick per 100 locks, {lost} lost"),
            met: per100 <= 1.0 && lost == 0.0,
        });
        rows.push(w5);
    }
    if wanted(settings, "W6") {
        let w6 = w6(settings, server).await;
        let conns = w6.extra.get("connections").copied().unwrap_or(f64::NAN);
        let rss = w6.extra.get("rss_growth_mb").copied().unwrap_or(f64::NAN);
        let all = w6.extra.get("acquired_all").copied().unwrap_or(0.0);
        verdicts.push(Verdict {
            workload: "W6",
            target: "every waiter acquires; ≤ 3 connections; RSS growth ≤ 64 MB".to_owned(),
            measured: format!(
                "all acquired: {}, {conns} connections, +{rss:.1} MB",
                all == 1.0
            ),
            met: all == 1.0 && conns <= 3.0 && rss <= 64.0,
        });
        rows.push(w6);
    }
    (rows, verdicts)
}

async fn ping_p50_us(url: &str) -> f64 {
    let mut con = redis::Client::open(url)
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let mut samples = Vec::with_capacity(2_000);
    for _ in 0..2_000 {
        let t = Instant::now();
        let _: String = redis::cmd("PING")
            .query_async(&mut con)
            .await
            .expect("PING");
        samples.push(t.elapsed());
    }
    percentile_us(&mut samples, 0.5)
}

fn libs(settings: &Settings) -> Vec<Lib> {
    Lib::ALL
        .into_iter()
        .filter(|lib| {
            settings
                .libs
                .as_ref()
                .is_none_or(|libs| libs.iter().any(|l| l == lib.label()))
        })
        .collect()
}

async fn clients(settings: &Settings) -> Vec<(Lib, Client)> {
    let url = settings.url.as_str();
    let mut out = Vec::new();
    for lib in libs(settings) {
        out.push((lib, Client::new(lib, url).await));
    }
    out
}

/// W1: 32 tasks, each acquiring and releasing its own name.
async fn w1(settings: &Settings, server: &Server) -> Vec<Row> {
    let clients = clients(settings).await;
    let mut per_lib: BTreeMap<&'static str, (Vec<f64>, Vec<f64>)> = BTreeMap::new();
    for round in 0..settings.rounds {
        for (lib, client) in &clients {
            let before = client_commands(server);
            let end = Instant::now() + settings.round;
            let mut tasks = Vec::new();
            for t in 0..32 {
                let client = client.clone();
                let name = format!("w1:{round}:{t}");
                tasks.push(tokio::spawn(async move {
                    let mut n = 0u64;
                    while Instant::now() < end {
                        let held = client.acquire(&name).await;
                        client.release(held).await;
                        n += 1;
                    }
                    n
                }));
            }
            let mut ops = 0;
            for task in tasks {
                ops += task.await.expect("w1 task");
            }
            let cmds = client_commands(server) - before;
            let entry = per_lib.entry(lib.label()).or_default();
            entry.0.push(ops as f64 / settings.round.as_secs_f64());
            entry.1.push(cmds as f64 / ops.max(1) as f64);
        }
    }
    libs(settings)
        .iter()
        .map(|lib| {
            let (mut ops, mut cmds) = per_lib.remove(lib.label()).unwrap_or_default();
            Row {
                workload: "W1",
                lib: lib.label().to_owned(),
                ops_per_sec: Some(median(&mut ops)),
                commands_per_op: Some(median(&mut cmds)),
                ..Row::default()
            }
        })
        .collect()
}

/// W2: 16 tasks contend for one name and increment a shared counter inside.
async fn w2(settings: &Settings, server: &Server) -> Vec<Row> {
    let clients = clients(settings).await;
    #[derive(Default)]
    struct Acc {
        ops: Vec<f64>,
        p50: Vec<f64>,
        p99: Vec<f64>,
        fairness: Vec<f64>,
        cmds: Vec<f64>,
        violations: u64,
    }
    let mut acc: BTreeMap<&'static str, Acc> = BTreeMap::new();
    for round in 0..settings.rounds {
        for (lib, client) in &clients {
            let name = format!("w2:{round}");
            let holder = Arc::new(AtomicBool::new(false));
            let violations = Arc::new(AtomicU64::new(0));
            let counter = Arc::new(AtomicU64::new(0));
            let before = client_commands(server);
            let end = Instant::now() + settings.round;
            let mut tasks = Vec::new();
            for _ in 0..16 {
                let (client, name) = (client.clone(), name.clone());
                let (holder, violations, counter) =
                    (holder.clone(), violations.clone(), counter.clone());
                tasks.push(tokio::spawn(async move {
                    let mut waits = Vec::new();
                    while Instant::now() < end {
                        let asked = Instant::now();
                        let held = client.acquire(&name).await;
                        waits.push(asked.elapsed());
                        if holder.swap(true, Ordering::SeqCst) {
                            violations.fetch_add(1, Ordering::SeqCst);
                        }
                        // A non-atomic read-modify-write.
                        let value = counter.load(Ordering::SeqCst);
                        tokio::task::yield_now().await;
                        counter.store(value + 1, Ordering::SeqCst);
                        holder.store(false, Ordering::SeqCst);
                        client.release(held).await;
                    }
                    waits
                }));
            }
            let mut all_waits = Vec::new();
            let mut counts = Vec::new();
            for task in tasks {
                let waits = task.await.expect("w2 task");
                counts.push(waits.len() as f64);
                all_waits.extend(waits);
            }
            let total = all_waits.len() as u64;
            let elapsed = settings.round.as_secs_f64();
            let a = acc.entry(lib.label()).or_default();
            if counter.load(Ordering::SeqCst) != total {
                a.violations += 1;
            }
            a.violations += violations.load(Ordering::SeqCst);
            a.ops.push(total as f64 / elapsed);
            a.p50.push(percentile_us(&mut all_waits, 0.5));
            a.p99.push(percentile_us(&mut all_waits, 0.99));
            let max = counts.iter().copied().fold(0.0, f64::max);
            let min = counts.iter().copied().fold(f64::INFINITY, f64::min);
            a.fairness.push(if max > 0.0 { min / max } else { 0.0 });
            a.cmds
                .push((client_commands(server) - before) as f64 / total.max(1) as f64);
        }
    }
    libs(settings)
        .iter()
        .map(|lib| {
            let mut a = acc.remove(lib.label()).unwrap_or_default();
            let mut extra = BTreeMap::new();
            extra.insert("fairness", median(&mut a.fairness));
            Row {
                workload: "W2",
                lib: lib.label().to_owned(),
                ops_per_sec: Some(median(&mut a.ops)),
                p50_us: Some(median(&mut a.p50)),
                p99_us: Some(median(&mut a.p99)),
                commands_per_op: Some(median(&mut a.cmds)),
                violations: a.violations,
                extra,
                ..Row::default()
            }
        })
        .collect()
}

/// W3: two clients (as two processes) ping-pong one name, holding 5 ms each time; the latency
/// from the start of one's release to the other's acquisition.
async fn w3(settings: &Settings, server: &Server) -> Vec<Row> {
    let mut pairs = Vec::new();
    for lib in libs(settings) {
        pairs.push((
            lib,
            Client::new(lib, &settings.url).await,
            Client::new(lib, &settings.url).await,
        ));
    }
    let mut acc: BTreeMap<&'static str, (Vec<Duration>, u64, u64)> = BTreeMap::new();
    for round in 0..settings.rounds {
        for (lib, a, b) in &pairs {
            let name = format!("w3:{round}");
            let last_release: Arc<Mutex<Option<(usize, Instant)>>> = Arc::default();
            let before = client_commands(server);
            let end = Instant::now() + settings.round;
            let mut tasks = Vec::new();
            for (side, client) in [a.clone(), b.clone()].into_iter().enumerate() {
                let (name, last_release) = (name.clone(), last_release.clone());
                tasks.push(tokio::spawn(async move {
                    let mut samples = Vec::new();
                    let mut cycles = 0u64;
                    while Instant::now() < end {
                        let held = client.acquire(&name).await;
                        let acquired = Instant::now();
                        let last = last_release.lock().await.take();
                        if let Some((_, released)) = last.filter(|(other, _)| *other != side) {
                            samples.push(acquired - released);
                        }
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        *last_release.lock().await = Some((side, Instant::now()));
                        client.release(held).await;
                        cycles += 1;
                        // Other work before wanting the lock again, so the waiter gets it.
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    (samples, cycles)
                }));
            }
            let entry = acc.entry(lib.label()).or_default();
            for task in tasks {
                let (samples, cycles) = task.await.expect("w3 task");
                entry.0.extend(samples);
                entry.1 += cycles;
            }
            entry.2 += client_commands(server) - before;
        }
    }
    libs(settings)
        .iter()
        .map(|lib| {
            let (mut samples, cycles, cmds) = acc.remove(lib.label()).unwrap_or_default();
            let mut extra = BTreeMap::new();
            extra.insert("handoffs", samples.len() as f64);
            Row {
                workload: "W3",
                lib: lib.label().to_owned(),
                p50_us: Some(percentile_us(&mut samples, 0.5)),
                p99_us: Some(percentile_us(&mut samples, 0.99)),
                commands_per_op: Some(cmds as f64 / cycles.max(1) as f64),
                extra,
                ..Row::default()
            }
        })
        .collect()
}

/// W4: an axum route behind `LockLayer` (a distinct key per request) against the bare route,
/// driven one request at a time over loopback.
async fn w4(settings: &Settings) -> Vec<Row> {
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
    let per_round = if settings.quick { 100 } else { 1_000 };
    let mut samples = [Vec::new(), Vec::new()];
    let mut id = 0u64;
    for _ in 0..settings.rounds {
        for (which, base) in bases.iter().enumerate() {
            for _ in 0..per_round {
                id += 1;
                let uri = format!("{base}/r/{id}").parse().expect("uri");
                let t = Instant::now();
                let response = client.get(uri).await.expect("request");
                assert!(response.status().is_success(), "{}", response.status());
                let _ = response.into_body().collect().await;
                samples[which].push(t.elapsed());
            }
        }
    }
    ["axum bare", "axum+LockLayer"]
        .into_iter()
        .zip(samples.iter_mut())
        .map(|(lib, samples)| Row {
            workload: "W4",
            lib: lib.to_owned(),
            p50_us: Some(percentile_us(samples, 0.5)),
            p99_us: Some(percentile_us(samples, 0.99)),
            ..Row::default()
        })
        .collect()
}

fn rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

/// W5: many locks held in watchdog mode with a 3 s lease.
async fn w5(settings: &Settings, server: &Server) -> Row {
    let (count, hold) = if settings.quick {
        (300, Duration::from_millis(2_500))
    } else {
        (10_000, Duration::from_secs(30))
    };
    let lease = Duration::from_secs(3);
    let locker = Locker::builder()
        .url(settings.url.clone())
        .watchdog_lease(lease)
        .build()
        .await
        .expect("connect");
    let mut guards = Vec::with_capacity(count);
    let mut pending = Vec::new();
    for i in 0..count {
        let locker = locker.clone();
        pending.push(tokio::spawn(async move {
            locker.lock(format!("w5:{i}")).await.expect("w5 acquire")
        }));
        if pending.len() == 256 {
            for task in pending.drain(..) {
                guards.push(task.await.expect("w5 task"));
            }
        }
    }
    for task in pending {
        guards.push(task.await.expect("w5 task"));
    }
    let trips_before = locker.renewal_round_trips();
    let cpu =
        |s: &Server| s.info_field("cpu", "used_cpu_sys") + s.info_field("cpu", "used_cpu_user");
    let cpu_before = cpu(server);
    let evalsha_before = server.commandstats().get("evalsha").copied().unwrap_or(0);
    tokio::time::sleep(hold).await;
    let trips = locker.renewal_round_trips() - trips_before;
    let evalsha = server.commandstats().get("evalsha").copied().unwrap_or(0) - evalsha_before;
    let cpu_used = cpu(server) - cpu_before;
    let lost = guards.iter().filter(|g| g.is_lost()).count();
    for guard in guards {
        let _ = guard.release().await;
    }
    let ticks = (hold.as_secs_f64() / (lease.as_secs_f64() / 3.0))
        .floor()
        .max(1.0);
    let mut extra = BTreeMap::new();
    extra.insert("locks", count as f64);
    extra.insert("ticks", ticks);
    extra.insert("round_trips", trips as f64);
    extra.insert(
        "round_trips_per_tick_per_100",
        trips as f64 / ticks / (count as f64 / 100.0),
    );
    extra.insert("script_calls", evalsha as f64);
    extra.insert("per_lock_round_trips_would_be", ticks * count as f64);
    extra.insert("redis_cpu_s", cpu_used);
    extra.insert("lost", lost as f64);
    Row {
        workload: "W5",
        lib: "dlock".to_owned(),
        violations: lost as u64,
        extra,
        ..Row::default()
    }
}

/// W6: many tasks waiting on many names, released one by one.
async fn w6(settings: &Settings, server: &Server) -> Row {
    let (tasks, names) = if settings.quick {
        (400, 40)
    } else {
        (10_000, 1_000)
    };
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
    let clients_before = server.info_field("clients", "connected_clients");
    let rss_before = rss_mb();
    let waiter = Locker::connect(&settings.url).await.expect("connect");
    let acquired = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut handles = Vec::with_capacity(tasks);
    for t in 0..tasks {
        let (waiter, acquired) = (waiter.clone(), acquired.clone());
        handles.push(tokio::spawn(async move {
            let guard = waiter
                .lock(format!("w6:{}", t % names))
                .wait(Duration::from_secs(300))
                .await
                .expect("w6 waiter acquires");
            acquired.fetch_add(1, Ordering::SeqCst);
            let _ = guard.release().await;
        }));
    }
    // Every name waited in Redis (one head waiter per name) before the releases start.
    let settle = Instant::now() + Duration::from_secs(30);
    while waiter.watched_names() < names && Instant::now() < settle {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let clients_waiting = server.info_field("clients", "connected_clients");
    let mut rss_peak = rss_mb();
    for guard in held {
        let _ = guard.release().await;
        rss_peak = rss_peak.max(rss_mb());
    }
    let mut errors = 0;
    for handle in handles {
        if tokio::time::timeout(Duration::from_secs(60), handle)
            .await
            .is_err()
        {
            errors += 1;
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
    extra.insert("connections", clients_waiting - clients_before);
    extra.insert("rss_growth_mb", rss_peak - rss_before);
    extra.insert("seconds", elapsed.as_secs_f64());
    Row {
        workload: "W6",
        lib: "dlock".to_owned(),
        ops_per_sec: Some(got as f64 / elapsed.as_secs_f64()),
        errors,
        extra,
        ..Row::default()
    }
}
