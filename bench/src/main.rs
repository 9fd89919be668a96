//! The benchmark harness: dlock against the raw protocol and rslock, side by side in one run,
//! with rows for dlock's other exclusive primitives (fair lock, writer, one-permit semaphore)
//! and its scale-out modes (cluster, Sentinel, replica acknowledgement, a majority of masters),
//! so what each guarantee costs reads off the same table.
//!
//! ```text
//! cargo run --release -p dlock-bench            # the full run (a few minutes)
//! cargo run --release -p dlock-bench -- --quick # a smoke run: every workload, no timing verdicts
//! cargo run --release -p dlock-bench -- --only W2,W3 --libs dlock,raw --duration 20 --rounds 10
//! ```
//!
//! Every workload gets a warm-up round per library, then libraries alternate in short rounds
//! (A B C D A B C D …) and every figure is the median over rounds, so a machine that drifts
//! doesn't favour one side. One table goes to stdout, then one JSON line per (library,
//! workload). The run exits non-zero if a workload fails to run, reports an error or a
//! mutual-exclusion violation, or (W6) leaves a waiter without the lock; it never judges timings.

mod modes;
mod peers;
mod workloads;

/// Counts allocations, for the allocations-per-op columns.
#[global_allocator]
static ALLOCATOR: &stats_alloc::StatsAlloc<std::alloc::System> = &stats_alloc::INSTRUMENTED_SYSTEM;

/// Allocations (and reallocations) this process has made so far.
pub(crate) fn allocations() -> u64 {
    let stats = ALLOCATOR.stats();
    u64::try_from(stats.allocations + stats.reallocations).unwrap_or(u64::MAX)
}

use std::collections::BTreeMap;
use std::time::Duration;

use dlock_tests::RedisServer;

/// Run settings.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) quick: bool,
    /// One measured round of one library.
    pub(crate) round: Duration,
    pub(crate) rounds: usize,
    /// The unmeasured round each library runs first.
    pub(crate) warmup: Duration,
    pub(crate) json_only: bool,
    pub(crate) only: Option<Vec<String>>,
    pub(crate) libs: Option<Vec<String>>,
    pub(crate) url: String,
}

/// One (library, workload) result.
#[derive(Debug, Clone, Default)]
pub(crate) struct Row {
    pub(crate) workload: &'static str,
    pub(crate) lib: String,
    pub(crate) ops_per_sec: Option<f64>,
    pub(crate) p50_us: Option<f64>,
    pub(crate) p99_us: Option<f64>,
    pub(crate) commands_per_op: Option<f64>,
    pub(crate) errors: u64,
    pub(crate) violations: u64,
    pub(crate) extra: BTreeMap<&'static str, f64>,
}

/// A target check.
#[derive(Debug, Clone)]
pub(crate) struct Verdict {
    pub(crate) workload: &'static str,
    pub(crate) target: String,
    pub(crate) measured: String,
    pub(crate) met: bool,
}

/// The server the workloads talk to, the scale-out modes' deployments, and their counters.
pub(crate) struct Server {
    pub(crate) url: String,
    local: Option<RedisServer>,
    modes: modes::Deployments,
    /// Where every library's clients connect.
    pub(crate) endpoints: modes::Endpoints,
}

impl Server {
    /// `INFO <section>` of every data node `lib` runs on.
    pub(crate) fn infos(&self, lib: peers::Lib, section: &str) -> Vec<String> {
        match lib.mode() {
            Some(mode) => self.modes.infos(mode, section),
            None => vec![self.info(section)],
        }
    }

    pub(crate) fn info(&self, section: &str) -> String {
        match &self.local {
            Some(server) => server.info(section),
            None => info(&self.url, section),
        }
    }

    /// A field of `INFO <section>` as a number.
    pub(crate) fn info_field(&self, section: &str, field: &str) -> f64 {
        self.info(section)
            .lines()
            .find_map(|l| l.strip_prefix(field).and_then(|r| r.strip_prefix(':')))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    }
}

fn info(url: &str, section: &str) -> String {
    let client = redis::Client::open(url).expect("url");
    let mut con = client
        .get_connection_with_timeout(Duration::from_secs(2))
        .expect("INFO connection");
    redis::cmd("INFO")
        .arg(section)
        .query(&mut con)
        .expect("INFO")
}

fn parse_commandstats(info: &str) -> BTreeMap<String, u64> {
    commandstats(info)
        .into_iter()
        .map(|(name, stat)| (name, stat.calls))
        .collect()
}

/// One command's line of `INFO commandstats`: how many times it ran and the µs it took. A
/// script's inner commands count in their own lines (and their time in the script's too).
#[derive(Debug, Clone, Copy, Default)]
struct CommandStat {
    calls: u64,
    usec: u64,
}

fn commandstats(info: &str) -> BTreeMap<String, CommandStat> {
    info.lines()
        .filter_map(|l| l.strip_prefix("cmdstat_"))
        .filter_map(|l| l.split_once(':'))
        .map(|(name, fields)| {
            let field = |key: &str| {
                fields
                    .split(',')
                    .find_map(|f| f.strip_prefix(key))
                    .and_then(|c| c.parse().ok())
                    .unwrap_or(0)
            };
            let stat = CommandStat {
                calls: field("calls="),
                usec: field("usec="),
            };
            (name.to_owned(), stat)
        })
        .collect()
}

const USAGE: &str = "\
dlock-bench [--quick] [--only W1,W2,...] [--libs dlock,raw,...] [--duration SECONDS]
            [--rounds N] [--json-only]

  --quick       a smoke run: every workload for a second or so, smaller W5/W6
  --only        run these workloads (W1..W7)
  --libs        compare only these: dlock, raw, rslock, rslock-2ms; dlock's other
                exclusive primitives dlock-fair, dlock-write (a read-write lock's writer),
                dlock-permit (a semaphore of one permit); and the plain lock in its
                scale-out modes, each on servers of its own: dlock-cluster (3 masters with
                a replica each; a replica acknowledges every write, the default there),
                dlock-cluster-unacked (the same without), dlock-sentinel and
                dlock-sentinel-unacked (likewise), dlock-ack (one server whose replica
                acknowledges every write), dlock-majority (3 independent masters). W1-W3
                run each of them.
                Only when named: raw-scripted-acquire (raw with its SET NX PX inside a
                script), raw-marked-release (raw whose release also records the released
                owner and publishes, as dlock's does), raw-recorded-release (records, does
                not publish) and raw-hash-acquire (the lock a hash taken by MULTI HSETNX +
                PEXPIRE NX, released as raw-marked-release), to see what each step costs;
                dlock-evalsha (dlock's plain lock as a user that may not use Redis
                functions, so its scripts go by EVALSHA: what functions save)
  --duration    measured seconds per library and workload (default 10; quick 0.6)
  --rounds      rounds that time is cut into, libraries alternating (default 5; quick 2)
  --json-only   print only the JSON lines

Starts its own redis-server on a free loopback port unless DLOCK_URL is set; the
scale-out modes always run on servers it starts (with DLOCK_URL, only when named).";

fn parse_args() -> Settings {
    let mut quick = false;
    let mut json_only = false;
    let mut only = None;
    let mut libs = None;
    let mut duration: Option<f64> = None;
    let mut rounds: Option<usize> = None;
    let mut args = std::env::args().skip(1);
    let bad = |what: &str| -> ! {
        eprintln!("{what}\n\n{USAGE}");
        std::process::exit(2);
    };
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => quick = true,
            "--json-only" => json_only = true,
            "--only" => {
                only = Some(
                    args.next()
                        .unwrap_or_else(|| bad("--only needs a list"))
                        .split(',')
                        .map(|s| s.trim().to_uppercase())
                        .collect::<Vec<_>>(),
                )
            }
            "--libs" => {
                libs = Some(
                    args.next()
                        .unwrap_or_else(|| bad("--libs needs a list"))
                        .split(',')
                        .map(|s| s.trim().to_owned())
                        .collect::<Vec<_>>(),
                )
            }
            "--duration" => {
                duration = Some(
                    args.next()
                        .and_then(|v| v.parse().ok())
                        .filter(|d: &f64| *d > 0.0)
                        .unwrap_or_else(|| bad("--duration needs a number of seconds")),
                )
            }
            "--rounds" => {
                rounds = Some(
                    args.next()
                        .and_then(|v| v.parse().ok())
                        .filter(|r: &usize| *r > 0)
                        .unwrap_or_else(|| bad("--rounds needs a positive number")),
                )
            }
            "--help" | "-h" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => bad(&format!("unknown argument `{other}`")),
        }
    }
    let known: Vec<&str> = peers::Lib::ALL.iter().map(|l| l.label()).collect();
    if let Some(unknown) = libs.iter().flatten().find(|l| !known.contains(&l.as_str())) {
        bad(&format!("unknown library `{unknown}`"));
    }
    // Against the user's own server, the modes (which need servers of their own) run only
    // when asked for.
    if libs.is_none() && std::env::var_os("DLOCK_URL").is_some() {
        let single = (peers::Lib::ALL.iter()).filter(|l| l.mode().is_none() && l.by_default());
        libs = Some(single.map(|l| l.label().to_owned()).collect());
    }
    if let Some(unknown) = only
        .iter()
        .flatten()
        .find(|w| !workloads::IDS.contains(&w.as_str()))
    {
        bad(&format!("unknown workload `{unknown}`"));
    }
    let duration = duration.unwrap_or(if quick { 0.6 } else { 10.0 });
    let rounds = rounds.unwrap_or(if quick { 2 } else { 5 });
    Settings {
        quick,
        round: Duration::from_secs_f64(duration / rounds as f64),
        rounds,
        warmup: Duration::from_millis(if quick { 100 } else { 1_000 }),
        json_only,
        only,
        libs,
        url: String::new(),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(workloads::fairness::CONTENDER) {
        workloads::fairness::contender(&args[2..]);
    }
    let mut settings = parse_args();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let local = match std::env::var("DLOCK_URL") {
        Ok(_) => None,
        Err(_) => Some(RedisServer::start()),
    };
    let url = std::env::var("DLOCK_URL")
        .unwrap_or_else(|_| local.as_ref().map(RedisServer::url).unwrap_or_default());
    settings.url = url.clone();
    let modes: Vec<modes::Mode> = (workloads::libs(&settings).into_iter())
        .filter_map(peers::Lib::mode)
        .collect();
    let runs_modes = ["W1", "W2", "W3"]
        .iter()
        .any(|w| workloads::wanted(&settings, w));
    let modes = if runs_modes { modes } else { Vec::new() };
    let deployments = modes::Deployments::start(&modes, settings.json_only);
    let endpoints = deployments.endpoints(&url);
    let server = Server {
        url,
        local,
        modes: deployments,
        endpoints,
    };
    let (rows, verdicts) = runtime.block_on(workloads::run_all(&settings, &server));
    drop(runtime);
    drop(server);
    if !settings.json_only {
        print_table(&rows, &verdicts, settings.quick);
    }
    print_json(&rows);
    let violations: u64 = rows.iter().map(|r| r.violations).sum();
    let errors: u64 = rows.iter().map(|r| r.errors).sum();
    let unserved = rows
        .iter()
        .any(|r| r.extra.get("acquired_all").is_some_and(|a| *a != 1.0));
    if violations > 0 || errors > 0 || unserved {
        eprintln!(
            "FAILED: {violations} mutual-exclusion violations or lost locks, {errors} errors{}",
            if unserved {
                ", a W6 waiter never acquired"
            } else {
                ""
            }
        );
        std::process::exit(1);
    }
}

fn fmt_opt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.digits$}"))
}

fn print_table(rows: &[Row], verdicts: &[Verdict], quick: bool) {
    println!(
        "\n{:<4} {:<15} {:>10} {:>10} {:>10} {:>9} {:>6} {:>5}  extra",
        "id", "library", "ops/s", "p50 µs", "p99 µs", "cmds/op", "errs", "viol"
    );
    for row in rows {
        let extra: Vec<String> = row
            .extra
            .iter()
            .map(|(k, v)| format!("{k}={v:.2}"))
            .collect();
        println!(
            "{:<4} {:<15} {:>10} {:>10} {:>10} {:>9} {:>6} {:>5}  {}",
            row.workload,
            row.lib,
            fmt_opt(row.ops_per_sec, 0),
            fmt_opt(row.p50_us, 1),
            fmt_opt(row.p99_us, 1),
            fmt_opt(row.commands_per_op, 2),
            row.errors,
            row.violations,
            extra.join(" ")
        );
    }
    println!(
        "\ntargets{}:",
        if quick {
            " (quick run: timings not judged)"
        } else {
            ""
        }
    );
    for v in verdicts {
        let mark = if quick {
            "·"
        } else if v.met {
            "met"
        } else {
            "MISSED"
        };
        println!(
            "  {:<4} {:<6} {} — measured {}",
            v.workload, mark, v.target, v.measured
        );
    }
    println!();
}

fn print_json(rows: &[Row]) {
    for row in rows {
        let mut json = format!(
            "{{\"workload\":\"{}\",\"library\":\"{}\",\"ops_per_sec\":{},\"p50_us\":{},\"p99_us\":{},\"commands_per_op\":{},\"errors\":{},\"violations\":{}",
            row.workload,
            row.lib,
            json_num(row.ops_per_sec),
            json_num(row.p50_us),
            json_num(row.p99_us),
            json_num(row.commands_per_op),
            row.errors,
            row.violations
        );
        for (k, v) in &row.extra {
            json.push_str(&format!(",\"{k}\":{}", json_num(Some(*v))));
        }
        json.push('}');
        println!("{json}");
    }
}

fn json_num(v: Option<f64>) -> String {
    match v {
        Some(v) if v.is_finite() => format!("{v:.3}"),
        _ => "null".to_owned(),
    }
}
