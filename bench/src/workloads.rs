//! The six workloads and the PING floor.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dlock_core::Locker;

use crate::peers::{Client, Lib};
use crate::{Row, Server, Settings, Verdict};

/// The workload ids, in run order.
pub(crate) const IDS: [&str; 6] = ["W1", "W2", "W3", "W4", "W5", "W6"];

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

/// What the server and this process spent over an interval: client commands, CPU seconds.
struct Meter {
    commands: u64,
    redis_cpu: f64,
    client_cpu: f64,
}

/// Per-op costs measured by a [`Meter`].
struct Spent {
    commands_per_op: f64,
    redis_cpu_us_per_op: f64,
    client_cpu_us_per_op: f64,
}

impl Meter {
    fn start(server: &Server) -> Meter {
        let info = server.info("all");
        Meter {
            commands: client_commands(&info),
            redis_cpu: redis_cpu(&info),
            client_cpu: client_cpu_s(),
        }
    }

    fn per_op(&self, server: &Server, ops: u64) -> Spent {
        let client_cpu = client_cpu_s();
        let info = server.info("all");
        let ops = ops.max(1) as f64;
        Spent {
            commands_per_op: client_commands(&info).saturating_sub(self.commands) as f64 / ops,
            redis_cpu_us_per_op: (redis_cpu(&info) - self.redis_cpu) * 1e6 / ops,
            client_cpu_us_per_op: (client_cpu - self.client_cpu) * 1e6 / ops,
        }
    }
}

fn client_commands(info: &str) -> u64 {
    let stats = crate::parse_commandstats(info);
    CLIENT_COMMANDS.iter().filter_map(|c| stats.get(*c)).sum()
}

fn info_field(info: &str, field: &str) -> f64 {
    info.lines()
        .find_map(|l| l.strip_prefix(field).and_then(|r| r.strip_prefix(':')))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Seconds of CPU the server has used (main thread and all).
fn redis_cpu(info: &str) -> f64 {
    info_field(info, "used_cpu_sys") + info_field(info, "used_cpu_user")
}

/// Seconds of CPU this process has used (user + system, every thread), from `/proc/self/stat`.
fn client_cpu_s() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return f64::NAN;
    };
    // Fields after the command name, which is in parentheses and may hold spaces.
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) else {
        return f64::NAN;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name and state.
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok());
    match (ticks(11), ticks(12)) {
        // The kernel's USER_HZ, 100 on every Linux this runs on.
        (Some(u), Some(s)) => (u + s) / 100.0,
        _ => f64::NAN,
    }
}

fn median(values: &mut [f64]) -> f64 {
    let mut finite: Vec<f64> = values.iter().copied().filter(|v| !v.is_nan()).collect();
    if finite.is_empty() {
        return f64::NAN;
    }
    finite.sort_by(f64::total_cmp);
    finite[finite.len() / 2]
}

fn percentile_us(samples: &mut [Duration], p: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    samples.sort_unstable();
    let index = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[index].as_secs_f64() * 1e6
}

fn wanted(settings: &Settings, id: &str) -> bool {
    settings
        .only
        .as_ref()
        .is_none_or(|only| only.iter().any(|o| o == id))
}

/// Errors seen by a library in a workload: counted, and the first few printed to stderr.
#[derive(Default)]
struct Errors {
    count: AtomicU64,
}

impl Errors {
    fn record(&self, workload: &str, lib: &str, error: &str) {
        if self.count.fetch_add(1, Ordering::Relaxed) < 3 {
            eprintln!("{workload} {lib}: {error}");
        }
    }

    fn get(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }
}

/// The rounds of a workload: `None` for the warm-up round (not measured), then the measured
/// ones.
fn rounds(settings: &Settings) -> impl Iterator<Item = Option<usize>> {
    std::iter::once(None).chain((0..settings.rounds).map(Some))
}

fn round_length(settings: &Settings, round: Option<usize>) -> Duration {
    match round {
        None => settings.warmup,
        Some(_) => settings.round,
    }
}

/// Medians over rounds of one library's figures.
#[derive(Default)]
struct Acc {
    ops: Vec<f64>,
    p50: Vec<f64>,
    p99: Vec<f64>,
    cmds: Vec<f64>,
    redis_cpu: Vec<f64>,
    client_cpu: Vec<f64>,
    extra: BTreeMap<&'static str, Vec<f64>>,
    errors: u64,
    violations: u64,
}

impl Acc {
    fn spent(&mut self, spent: &Spent) {
        self.cmds.push(spent.commands_per_op);
        self.redis_cpu.push(spent.redis_cpu_us_per_op);
        self.client_cpu.push(spent.client_cpu_us_per_op);
    }

    fn row(mut self, workload: &'static str, lib: &str) -> Row {
        let some = |v: &mut Vec<f64>| (!v.is_empty()).then(|| median(v));
        let mut extra: BTreeMap<&'static str, f64> = self
            .extra
            .iter_mut()
            .map(|(k, v)| (*k, median(v)))
            .collect();
        if let Some(v) = some(&mut self.redis_cpu) {
            extra.insert("redis_cpu_us_per_op", v);
        }
        if let Some(v) = some(&mut self.client_cpu) {
            extra.insert("client_cpu_us_per_op", v);
        }
        Row {
            workload,
            lib: lib.to_owned(),
            ops_per_sec: some(&mut self.ops),
            p50_us: some(&mut self.p50),
            p99_us: some(&mut self.p99),
            commands_per_op: some(&mut self.cmds),
            errors: self.errors,
            violations: self.violations,
            extra,
        }
    }
}

pub(crate) async fn run_all(settings: &Settings, server: &Server) -> (Vec<Row>, Vec<Verdict>) {
    let mut rows = Vec::new();
    let mut verdicts = Vec::new();
    let ping = ping_row(settings).await;
    let ping_us = ping.p50_us.unwrap_or(f64::NAN);
    rows.push(ping);
    let find = |rows: &[Row], lib: &str| rows.iter().find(|r| r.lib == lib).cloned();
    if wanted(settings, "W1") {
        let w1 = w1(settings, server).await;
        let ops = |lib: &str| find(&w1, lib).and_then(|r| r.ops_per_sec);
        if let (Some(d), Some(raw), Some(rs)) = (ops("dlock"), ops("raw"), ops("rslock")) {
            verdicts.push(Verdict {
                workload: "W1",
                target: "cycles/s ≥ 0.8 × raw and > rslock".to_owned(),
                measured: format!("{:.2} × raw, {:.2} × rslock", d / raw, d / rs),
                met: d >= 0.8 * raw && d > rs,
            });
        }
        rows.extend(w1);
    }
    if wanted(settings, "W2") {
        let w2 = w2(settings, server).await;
        if let (Some(d), Some(raw)) = (find(&w2, "dlock"), find(&w2, "raw")) {
            let fairness = d.extra.get("fairness").copied().unwrap_or(0.0);
            let ops_ratio = d.ops_per_sec.unwrap_or(0.0) / raw.ops_per_sec.unwrap_or(f64::NAN);
            let p99_ratio = d.p99_us.unwrap_or(f64::NAN) / raw.p99_us.unwrap_or(f64::NAN);
            verdicts.push(Verdict {
                workload: "W2",
                target: "acq/s ≥ raw, 0 violations, fairness ≥ 0.5, p99 wait ≤ 0.25 × raw"
                    .to_owned(),
                measured: format!(
                    "{ops_ratio:.2} × raw, {} violations, fairness {fairness:.2}, p99 {p99_ratio:.2} × raw",
                    d.violations
                ),
                met: ops_ratio >= 1.0
                    && d.violations == 0
                    && fairness >= 0.5
                    && p99_ratio <= 0.25,
            });
        }
        rows.extend(w2);
    }
    if wanted(settings, "W3") {
        let w3 = w3(settings, server).await;
        if let Some(d) = find(&w3, "dlock") {
            let p50 = d.p50_us.unwrap_or(f64::NAN);
            let cmds = d.commands_per_op.unwrap_or(f64::NAN);
            let idle = find(&w3, "PING-idle")
                .and_then(|r| r.p50_us)
                .unwrap_or(f64::NAN);
            verdicts.push(Verdict {
                workload: "W3",
                target: "handoff p50 ≤ 350 µs and ≤ 4 × PING; ≤ 8 commands per handoff"
                    .to_owned(),
                measured: format!(
                    "p50 {p50:.0} µs = {:.2} × PING-idle ({idle:.0} µs), {:.2} × PING-busy ({ping_us:.0} µs); {cmds:.1} commands",
                    p50 / idle,
                    p50 / ping_us
                ),
                met: p50 <= 350.0 && p50 <= 4.0 * idle && cmds <= 8.0,
            });
        }
        rows.extend(w3);
    }
    if wanted(settings, "W4") {
        let (w4, added) = w4(settings).await;
        verdicts.push(Verdict {
            workload: "W4",
            target: "added p50 ≤ 3 × PING".to_owned(),
            measured: format!("+{added:.0} µs = {:.2} × PING-busy", added / ping_us),
            met: added <= 3.0 * ping_us,
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
        let cpu = w5.extra.get("redis_cpu_s").copied().unwrap_or(f64::NAN);
        verdicts.push(Verdict {
            workload: "W5",
            target: "≤ 1 renewal round trip per tick per 100 locks, 0 lost".to_owned(),
            measured: format!(
                "{per100:.3} per tick per 100 locks, {lost} lost, {cpu:.2} s of Redis CPU"
            ),
            met: per100 <= 1.0 && lost == 0.0,
        });
        rows.push(w5);
    }
    if wanted(settings, "W6") {
        let w6 = w6(settings, server).await;
        let conns = w6
            .extra
            .get("connections_peak")
            .copied()
            .unwrap_or(f64::NAN);
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

/// The `PING` round trip on a busy connection: back-to-back, the runtime's threads awake.
async fn ping_row(settings: &Settings) -> Row {
    let mut con = redis::Client::open(settings.url.as_str())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let count = if settings.quick { 500 } else { 5_000 };
    let mut p50 = Vec::new();
    let mut p99 = Vec::new();
    for _ in 0..5 {
        let mut samples = Vec::with_capacity(count);
        for _ in 0..count {
            let t = Instant::now();
            let _: String = redis::cmd("PING")
                .query_async(&mut con)
                .await
                .expect("PING");
            samples.push(t.elapsed());
        }
        p50.push(percentile_us(&mut samples, 0.5));
        p99.push(percentile_us(&mut samples, 0.99));
    }
    Row {
        workload: "PING",
        lib: "PING-busy".to_owned(),
        p50_us: Some(median(&mut p50)),
        p99_us: Some(median(&mut p99)),
        ..Row::default()
    }
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
    let mut acc: BTreeMap<&'static str, Acc> = BTreeMap::new();
    for round in rounds(settings) {
        for (lib, client) in &clients {
            let length = round_length(settings, round);
            let errors = Arc::new(Errors::default());
            let meter = Meter::start(server);
            let started = Instant::now();
            let end = started + length;
            let mut tasks = Vec::new();
            for t in 0..32 {
                let (client, errors, lib) = (client.clone(), errors.clone(), lib.label());
                let name = format!("w1:{t}");
                tasks.push(tokio::spawn(async move {
                    let mut cycles = Vec::with_capacity(1 << 12);
                    while Instant::now() < end {
                        let t = Instant::now();
                        let held = match client.acquire(&name).await {
                            Ok(held) => held,
                            Err(e) => {
                                errors.record("W1", lib, &e);
                                tokio::time::sleep(Duration::from_millis(1)).await;
                                continue;
                            }
                        };
                        if let Err(e) = client.release(held).await {
                            errors.record("W1", lib, &e);
                        }
                        cycles.push(t.elapsed());
                    }
                    cycles
                }));
            }
            let mut samples = Vec::new();
            for task in tasks {
                samples.extend(task.await.expect("w1 task"));
            }
            let elapsed = started.elapsed().as_secs_f64();
            let spent = meter.per_op(server, samples.len() as u64);
            let a = acc.entry(lib.label()).or_default();
            // Errors count in the warm-up round too.
            a.errors += errors.get();
            let Some(_) = round else { continue };
            a.ops.push(samples.len() as f64 / elapsed);
            a.p50.push(percentile_us(&mut samples, 0.5));
            a.p99.push(percentile_us(&mut samples, 0.99));
            a.spent(&spent);
        }
    }
    libs(settings)
        .iter()
        .map(|lib| {
            acc.remove(lib.label())
                .unwrap_or_default()
                .row("W1", lib.label())
        })
        .collect()
}

/// W2: 16 tasks contend for one name and do a non-atomic read-modify-write of a shared counter
/// inside. Violations: two holders at once (a flag), a lost increment (the final count), and for
/// dlock a fencing token that did not increase.
async fn w2(settings: &Settings, server: &Server) -> Vec<Row> {
    let clients = clients(settings).await;
    let mut acc: BTreeMap<&'static str, Acc> = BTreeMap::new();
    for round in rounds(settings) {
        for (lib, client) in &clients {
            let length = round_length(settings, round);
            let name = format!("w2:{}", round.map_or(-1, |r| r as i64));
            let holder = Arc::new(AtomicBool::new(false));
            let violations = Arc::new(AtomicU64::new(0));
            let counter = Arc::new(AtomicU64::new(0));
            let last_fence = Arc::new(AtomicU64::new(0));
            let errors = Arc::new(Errors::default());
            let meter = Meter::start(server);
            let started = Instant::now();
            let end = started + length;
            let mut tasks = Vec::new();
            for _ in 0..16 {
                let (client, name, lib) = (client.clone(), name.clone(), lib.label());
                let (holder, violations, counter, last_fence, errors) = (
                    holder.clone(),
                    violations.clone(),
                    counter.clone(),
                    last_fence.clone(),
                    errors.clone(),
                );
                tasks.push(tokio::spawn(async move {
                    let mut waits = Vec::new();
                    while Instant::now() < end {
                        let asked = Instant::now();
                        let held = match client.acquire(&name).await {
                            Ok(held) => held,
                            Err(e) => {
                                errors.record("W2", lib, &e);
                                continue;
                            }
                        };
                        waits.push(asked.elapsed());
                        if holder.swap(true, Ordering::SeqCst) {
                            violations.fetch_add(1, Ordering::SeqCst);
                        }
                        if let Some(fence) = held.fence()
                            && last_fence.swap(fence, Ordering::SeqCst) >= fence
                        {
                            violations.fetch_add(1, Ordering::SeqCst);
                        }
                        // A non-atomic read-modify-write.
                        let value = counter.load(Ordering::SeqCst);
                        tokio::task::yield_now().await;
                        counter.store(value + 1, Ordering::SeqCst);
                        holder.store(false, Ordering::SeqCst);
                        if let Err(e) = client.release(held).await {
                            errors.record("W2", lib, &e);
                        }
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
            let elapsed = started.elapsed().as_secs_f64();
            let total = all_waits.len() as u64;
            let spent = meter.per_op(server, total);
            let mut found = violations.load(Ordering::SeqCst);
            if counter.load(Ordering::SeqCst) != total {
                found += 1;
            }
            let a = acc.entry(lib.label()).or_default();
            // Violations and errors count in the warm-up round too.
            a.violations += found;
            a.errors += errors.get();
            let Some(_) = round else { continue };
            a.ops.push(total as f64 / elapsed);
            a.p50.push(percentile_us(&mut all_waits, 0.5));
            a.p99.push(percentile_us(&mut all_waits, 0.99));
            let max = counts.iter().copied().fold(0.0, f64::max);
            let min = counts.iter().copied().fold(f64::INFINITY, f64::min);
            a.extra
                .entry("fairness")
                .or_default()
                .push(if max > 0.0 { min / max } else { 0.0 });
            a.spent(&spent);
        }
    }
    libs(settings)
        .iter()
        .map(|lib| {
            acc.remove(lib.label())
                .unwrap_or_default()
                .row("W2", lib.label())
        })
        .collect()
}

/// How long a W3 holder keeps the lock.
const W3_HOLD: Duration = Duration::from_millis(5);

/// W3: two clients (two `Locker`s, as two processes would be) ping-pong one name, holding it
/// 5 ms each time; the latency from the start of one's release to the other's acquisition.
/// Strict turns: after releasing, a side asks again only once the other side has taken the lock,
/// so every cycle is a hand-over and its latency is the waiter's wake-up.
///
/// In the same rotation, `PING-idle` measures the PING round trip in the same conditions: one
/// `PING` after each 5 ms sleep, the runtime's threads parked as W3's are.
async fn w3(settings: &Settings, server: &Server) -> Vec<Row> {
    let mut pairs = Vec::new();
    for lib in libs(settings) {
        pairs.push((
            lib,
            Client::new(lib, &settings.url).await,
            Client::new(lib, &settings.url).await,
        ));
    }
    let mut ping = redis::Client::open(settings.url.as_str())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let mut acc: BTreeMap<&'static str, Acc> = BTreeMap::new();
    for round in rounds(settings) {
        let length = round_length(settings, round);
        {
            let end = Instant::now() + length;
            let mut samples = Vec::new();
            while Instant::now() < end {
                tokio::time::sleep(W3_HOLD).await;
                let t = Instant::now();
                let _: String = redis::cmd("PING")
                    .query_async(&mut ping)
                    .await
                    .expect("PING");
                samples.push(t.elapsed());
            }
            if round.is_some() {
                let a = acc.entry("PING-idle").or_default();
                a.p50.push(percentile_us(&mut samples, 0.5));
                a.p99.push(percentile_us(&mut samples, 0.99));
            }
        }
        for (lib, a, b) in &pairs {
            let name = format!("w3:{}", round.map_or(-1, |r| r as i64));
            let last_release: Arc<Mutex<Option<(usize, Instant)>>> = Arc::default();
            let holder = Arc::new(AtomicBool::new(false));
            let violations = Arc::new(AtomicU64::new(0));
            let errors = Arc::new(Errors::default());
            // The side that acquired last.
            let (turn, _) = tokio::sync::watch::channel(usize::MAX);
            let meter = Meter::start(server);
            let end = Instant::now() + length;
            let mut tasks = Vec::new();
            for (side, client) in [a.clone(), b.clone()].into_iter().enumerate() {
                let (name, last_release, lib) = (name.clone(), last_release.clone(), lib.label());
                let (holder, violations, errors) =
                    (holder.clone(), violations.clone(), errors.clone());
                let (turn, mut turns) = (turn.clone(), turn.subscribe());
                tasks.push(tokio::spawn(async move {
                    let mut samples = Vec::new();
                    let mut cycles = 0u64;
                    while Instant::now() < end {
                        let held = match client.acquire(&name).await {
                            Ok(held) => held,
                            Err(e) => {
                                errors.record("W3", lib, &e);
                                continue;
                            }
                        };
                        let acquired = Instant::now();
                        if holder.swap(true, Ordering::SeqCst) {
                            violations.fetch_add(1, Ordering::SeqCst);
                        }
                        let last = last_release
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .take();
                        if let Some((_, released)) = last.filter(|(other, _)| *other != side) {
                            samples.push(acquired - released);
                        }
                        turn.send_replace(side);
                        tokio::time::sleep(W3_HOLD).await;
                        holder.store(false, Ordering::SeqCst);
                        *last_release.lock().unwrap_or_else(|e| e.into_inner()) =
                            Some((side, Instant::now()));
                        if let Err(e) = client.release(held).await {
                            errors.record("W3", lib, &e);
                        }
                        cycles += 1;
                        // The other side's turn: ask again once it has the lock.
                        let other_took = turns.wait_for(|last| *last != side);
                        let _ = tokio::time::timeout_at(end.into(), other_took).await;
                    }
                    (samples, cycles)
                }));
            }
            let mut samples = Vec::new();
            let mut cycles = 0;
            for task in tasks {
                let (s, c) = task.await.expect("w3 task");
                samples.extend(s);
                cycles += c;
            }
            // Commands per cycle only: CPU per cycle here is mostly the 5 ms sleeps' wake-ups.
            let spent = meter.per_op(server, cycles);
            let a = acc.entry(lib.label()).or_default();
            a.violations += violations.load(Ordering::SeqCst);
            a.errors += errors.get();
            let Some(_) = round else { continue };
            a.extra
                .entry("handoffs")
                .or_default()
                .push(samples.len() as f64);
            a.p50.push(percentile_us(&mut samples, 0.5));
            a.p99.push(percentile_us(&mut samples, 0.99));
            a.cmds.push(spent.commands_per_op);
        }
    }
    let mut rows = Vec::new();
    if let Some(a) = acc.remove("PING-idle") {
        rows.push(a.row("W3", "PING-idle"));
    }
    for lib in libs(settings) {
        rows.push(
            acc.remove(lib.label())
                .unwrap_or_default()
                .row("W3", lib.label()),
        );
    }
    rows
}

/// W4: an axum route behind `LockLayer` (a distinct key per request) against the bare route,
/// driven one request at a time over loopback by an in-process hyper client. Returns the rows
/// and the added p50 latency (the median over rounds of locked p50 − bare p50).
async fn w4(settings: &Settings) -> (Vec<Row>, f64) {
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
async fn w5(settings: &Settings, server: &Server) -> Row {
    let (count, hold) = if settings.quick {
        (500, Duration::from_millis(2_500))
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
    let trips_before = locker.renewal_round_trips();
    let before = server.info("all");
    tokio::time::sleep(hold).await;
    let trips = locker.renewal_round_trips() - trips_before;
    let after = server.info("all");
    let evalsha = |info: &str| {
        crate::parse_commandstats(info)
            .get("evalsha")
            .copied()
            .unwrap_or(0)
    };
    let script_calls = evalsha(&after) - evalsha(&before);
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
async fn w6(settings: &Settings, server: &Server) -> Row {
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
    while waiter.watched_names() < names && Instant::now() < settle {
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
