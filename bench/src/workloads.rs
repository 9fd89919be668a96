//! The seven workloads and the PING floor.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::peers::{Client, Lib};
use crate::{Row, Server, Settings, Verdict};

mod contention;
pub(crate) mod fairness;
mod scale;

use contention::{w1, w2, w3};
use fairness::w7;
use scale::{w4, w5, w6};

/// The workload ids, in run order.
pub(crate) const IDS: [&str; 7] = ["W1", "W2", "W3", "W4", "W5", "W6", "W7"];

/// Commands a client sends (a script counts once; what it runs inside does not). Commands that
/// scripts run too are left out: the `PEXPIRE` inside raw-hash-acquire's transaction is not
/// counted, its `MULTI`, `HSETNX` and `EXEC` are.
const CLIENT_COMMANDS: &[&str] = &[
    "fcall",
    "evalsha",
    "multi",
    "exec",
    "hsetnx",
    "eval",
    "set",
    "subscribe",
    "unsubscribe",
    "ssubscribe",
    "sunsubscribe",
    "wait",
    "ping",
    "script|load",
    "script",
    "function|load",
];

/// What a library's servers and this process spent over an interval: client commands, CPU
/// seconds. A mode on several servers counts them all (a cluster's replicas included).
struct Meter {
    lib: Lib,
    commands: u64,
    /// Client commands per data node, in the order `Server::infos` lists them.
    per_node: Vec<u64>,
    work: RedisWork,
    redis_cpu: f64,
    /// Server CPU seconds per data node, in the same order.
    cpu_per_node: Vec<f64>,
    client_cpu: f64,
    allocations: u64,
}

/// Per-op costs measured by a [`Meter`].
struct Spent {
    commands_per_op: f64,
    /// Commands Redis ran per op, scripts' inner ones included.
    redis_commands_per_op: f64,
    /// µs Redis spent running the clients' commands per op (`INFO commandstats`; a script's
    /// time includes its inner commands'), without the event loop and the network.
    redis_command_us_per_op: f64,
    redis_cpu_us_per_op: f64,
    /// The masters' part of `redis_cpu_us_per_op`, on a mode of several servers.
    master_cpu_us_per_op: Option<f64>,
    client_cpu_us_per_op: f64,
    /// Allocations this process made per op (the workload's own bookkeeping included, which
    /// is the same for every library).
    allocs_per_op: f64,
    /// With several masters: the least and the most client commands one master got, each as a
    /// share of the mean over the masters.
    master_spread: Option<(f64, f64)>,
}

impl Meter {
    fn start(server: &Server, lib: Lib) -> Meter {
        let infos = server.infos(lib, "all");
        Meter {
            lib,
            commands: infos.iter().map(|i| client_commands(i)).sum(),
            per_node: infos.iter().map(|i| client_commands(i)).collect(),
            work: infos.iter().map(|i| redis_work(i)).sum(),
            redis_cpu: infos.iter().map(|i| redis_cpu(i)).sum(),
            cpu_per_node: infos.iter().map(|i| redis_cpu(i)).collect(),
            client_cpu: client_cpu_s(),
            allocations: crate::allocations(),
        }
    }

    fn per_op(&self, server: &Server, ops: u64) -> Spent {
        let client_cpu = client_cpu_s();
        let allocations = crate::allocations();
        let infos = server.infos(self.lib, "all");
        let commands: u64 = infos.iter().map(|i| client_commands(i)).sum();
        let cpu: f64 = infos.iter().map(|i| redis_cpu(i)).sum();
        let work: RedisWork = infos.iter().map(|i| redis_work(i)).sum();
        let masters: Vec<f64> = (infos.iter().zip(&self.per_node))
            .filter(|(info, _)| info.lines().any(|l| l.trim() == "role:master"))
            .map(|(info, before)| client_commands(info).saturating_sub(*before) as f64)
            .collect();
        // On a mode of several servers, the masters' share of the CPU (what is left is the
        // replicas applying the masters' writes).
        let master_cpu = (infos.len() > 1).then(|| {
            (infos.iter().zip(&self.cpu_per_node))
                .filter(|(info, _)| info.lines().any(|l| l.trim() == "role:master"))
                .map(|(info, before)| redis_cpu(info) - before)
                .sum::<f64>()
        });
        let mean = masters.iter().sum::<f64>() / masters.len().max(1) as f64;
        let master_spread = (masters.len() > 1 && mean > 0.0).then(|| {
            let least = masters.iter().copied().fold(f64::INFINITY, f64::min);
            let most = masters.iter().copied().fold(0.0, f64::max);
            (least / mean, most / mean)
        });
        let ops = ops.max(1) as f64;
        Spent {
            commands_per_op: commands.saturating_sub(self.commands) as f64 / ops,
            redis_commands_per_op: work.commands.saturating_sub(self.work.commands) as f64 / ops,
            redis_command_us_per_op: work.usec.saturating_sub(self.work.usec) as f64 / ops,
            redis_cpu_us_per_op: (cpu - self.redis_cpu) * 1e6 / ops,
            master_cpu_us_per_op: master_cpu.map(|cpu| cpu * 1e6 / ops),
            client_cpu_us_per_op: (client_cpu - self.client_cpu) * 1e6 / ops,
            allocs_per_op: allocations.saturating_sub(self.allocations) as f64 / ops,
            master_spread,
        }
    }
}

fn client_commands(info: &str) -> u64 {
    // A replica runs what its master sends it, scripts' effects wrapped in MULTI/EXEC: none of
    // it was sent by a client.
    if info.lines().any(|l| l.trim() == "role:slave") {
        return 0;
    }
    let stats = crate::parse_commandstats(info);
    CLIENT_COMMANDS.iter().filter_map(|c| stats.get(*c)).sum()
}

/// What the clients' commands made one server do: every command it ran (scripts' inner ones
/// included, the meter's own `INFO` not), and the µs the clients' commands took.
#[derive(Debug, Clone, Copy, Default)]
struct RedisWork {
    commands: u64,
    usec: u64,
}

impl std::iter::Sum for RedisWork {
    fn sum<I: Iterator<Item = Self>>(iter: I) -> Self {
        iter.fold(Self::default(), |a, b| Self {
            commands: a.commands + b.commands,
            usec: a.usec + b.usec,
        })
    }
}

fn redis_work(info: &str) -> RedisWork {
    // A replica's work is counted too: it is the mode's cost. Its commands came from its
    // master (a script's effects wrapped in `MULTI`/`EXEC`, whose time is its commands'); its
    // time is in what it ran.
    let replica = info.lines().any(|l| l.trim() == "role:slave");
    let stats = crate::commandstats(info);
    let commands = (stats.iter())
        .filter(|(name, _)| !name.starts_with("info"))
        .map(|(_, stat)| stat.calls)
        .sum();
    let usec = if replica {
        (stats.iter())
            .filter(|(name, _)| !name.starts_with("info") && name.as_str() != "exec")
            .map(|(_, stat)| stat.usec)
            .sum()
    } else {
        (CLIENT_COMMANDS.iter())
            .filter_map(|c| stats.get(*c))
            .map(|stat| stat.usec)
            .sum()
    };
    RedisWork { commands, usec }
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

pub(crate) fn wanted(settings: &Settings, id: &str) -> bool {
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
    redis_commands: Vec<f64>,
    redis_command_us: Vec<f64>,
    client_cpu: Vec<f64>,
    allocs: Vec<f64>,
    extra: BTreeMap<&'static str, Vec<f64>>,
    errors: u64,
    violations: u64,
}

impl Acc {
    fn spent(&mut self, spent: &Spent) {
        self.cmds.push(spent.commands_per_op);
        self.redis_work(spent);
        self.redis_cpu.push(spent.redis_cpu_us_per_op);
        if let Some(cpu) = spent.master_cpu_us_per_op {
            self.extra
                .entry("master_cpu_us_per_op")
                .or_default()
                .push(cpu);
        }
        self.client_cpu.push(spent.client_cpu_us_per_op);
        self.allocs.push(spent.allocs_per_op);
    }

    /// What Redis did per op (kept for every workload that has Redis do work).
    fn redis_work(&mut self, spent: &Spent) {
        self.redis_commands.push(spent.redis_commands_per_op);
        self.redis_command_us.push(spent.redis_command_us_per_op);
        if let Some((least, most)) = spent.master_spread {
            self.extra.entry("master_least").or_default().push(least);
            self.extra.entry("master_most").or_default().push(most);
        }
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
        if let Some(v) = some(&mut self.redis_commands) {
            extra.insert("redis_cmds_per_op", v);
        }
        if let Some(v) = some(&mut self.redis_command_us) {
            extra.insert("redis_cmd_us_per_op", v);
        }
        if let Some(v) = some(&mut self.client_cpu) {
            extra.insert("client_cpu_us_per_op", v);
        }
        if let Some(v) = some(&mut self.allocs) {
            extra.insert("allocs_per_op", v);
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
    // W6 measures resident growth: it runs first, in a process whose heap the other workloads
    // have not grown yet (memory they freed would be reused and hide the growth).
    let w6 = if wanted(settings, "W6") {
        Some(w6(settings, server).await)
    } else {
        None
    };
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
    if let Some(w6) = w6 {
        let conns = w6
            .extra
            .get("connections_peak")
            .copied()
            .unwrap_or(f64::NAN);
        let rss = w6.extra.get("rss_growth_mb").copied().unwrap_or(f64::NAN);
        let all = w6.extra.get("acquired_all").copied().unwrap_or(0.0);
        verdicts.push(Verdict {
            workload: "W6",
            target: "every waiter acquires; ≤ 3 connections; RSS growth ≤ 32 MB".to_owned(),
            measured: format!(
                "all acquired: {}, {conns} connections, +{rss:.1} MB",
                all == 1.0
            ),
            met: all == 1.0 && conns <= 3.0 && rss <= 32.0,
        });
        rows.push(w6);
    }
    if wanted(settings, "W7") {
        let w7 = w7(settings, server).await;
        if let Some(d) = find(&w7, "dlock") {
            let extra = |k: &str| d.extra.get(k).copied().unwrap_or(f64::NAN);
            let (min_share, timeouts, hold) =
                (extra("min_share"), extra("timeouts"), extra("hold_us"));
            let p99 = d.p99_us.unwrap_or(f64::NAN);
            verdicts.push(Verdict {
                workload: "W7",
                target: "every process ≥ 0.5 × its share, p99 wait ≤ 10 × hold, no timeouts"
                    .to_owned(),
                measured: format!(
                    "least share {min_share:.2} (the slower process {:.2}), p99 {:.1} × hold, \
                     {timeouts} timeouts",
                    extra("slow_share"),
                    p99 / hold
                ),
                met: min_share >= 0.5 && p99 <= 10.0 * hold && timeouts == 0.0,
            });
        }
        rows.extend(w7);
    }
    (rows, verdicts)
}

/// `count` round trips of `PING`, back to back.
async fn pings(con: &mut redis::aio::MultiplexedConnection, count: usize) -> Vec<Duration> {
    let mut samples = Vec::with_capacity(count);
    for _ in 0..count {
        let t = Instant::now();
        let _: String = redis::cmd("PING").query_async(con).await.expect("PING");
        samples.push(t.elapsed());
    }
    samples
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
        let mut samples = pings(&mut con, count).await;
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

/// One row per library of `libs`, in their order, from the figures gathered for each.
fn rows(workload: &'static str, libs: &[Lib], mut acc: BTreeMap<&'static str, Acc>) -> Vec<Row> {
    (libs.iter())
        .map(|lib| {
            let figures = acc.remove(lib.label()).unwrap_or_default();
            figures.row(workload, lib.label())
        })
        .collect()
}

pub(crate) fn libs(settings: &Settings) -> Vec<Lib> {
    Lib::ALL
        .into_iter()
        .filter(|lib| match &settings.libs {
            None => lib.by_default(),
            Some(libs) => libs.iter().any(|l| l == lib.label()),
        })
        .collect()
}

async fn clients(settings: &Settings, server: &Server) -> Vec<(Lib, Client)> {
    let mut out = Vec::new();
    for lib in libs(settings) {
        out.push((lib, Client::new(lib, &server.endpoints).await));
    }
    out
}
