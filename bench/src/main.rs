//! The benchmark harness: dlock against the raw protocol and rslock, side by side in one run.
//!
//! ```text
//! cargo run --release -p dlock-bench            # the full run (a few minutes)
//! cargo run --release -p dlock-bench -- --quick # a smoke run: every workload, no timing verdicts
//! cargo run --release -p dlock-bench -- --only W2,W3
//! ```
//!
//! Libraries alternate in short rounds (A B C D A B C D …) and every figure is the median over
//! rounds, so a machine that drifts doesn't favour one side. One table goes to stdout, then one
//! JSON line per (library, workload). `--quick` exits non-zero if a workload fails to run or
//! sees a mutual-exclusion violation; it never judges timings.

mod peers;
mod workloads;

use std::collections::BTreeMap;
use std::time::Duration;

use dlock_tests::RedisServer;

/// Run settings.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) quick: bool,
    pub(crate) round: Duration,
    pub(crate) rounds: usize,
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

/// The server the workloads talk to, and its command counters.
pub(crate) struct Server {
    pub(crate) url: String,
    local: Option<RedisServer>,
}

impl Server {
    pub(crate) fn commandstats(&self) -> BTreeMap<String, u64> {
        match &self.local {
            Some(server) => server.info_commandstats(),
            None => parse_commandstats(&info(&self.url, "commandstats")),
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
    info.lines()
        .filter_map(|l| l.strip_prefix("cmdstat_"))
        .filter_map(|l| l.split_once(':'))
        .map(|(name, fields)| {
            let calls = fields
                .split(',')
                .find_map(|f| f.strip_prefix("calls="))
                .and_then(|c| c.parse().ok())
                .unwrap_or(0);
            (name.to_owned(), calls)
        })
        .collect()
}

fn parse_args() -> Settings {
    let mut quick = false;
    let mut only = None;
    let mut libs = None;
    let mut round = None;
    let mut rounds = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => quick = true,
            "--only" => {
                only = args
                    .next()
                    .map(|v| v.split(',').map(|s| s.trim().to_uppercase()).collect())
            }
            "--libs" => {
                libs = args
                    .next()
                    .map(|v| v.split(',').map(|s| s.trim().to_owned()).collect())
            }
            "--round-ms" => round = args.next().and_then(|v| v.parse().ok()),
            "--rounds" => rounds = args.next().and_then(|v| v.parse().ok()),
            "--help" | "-h" => {
                println!(
                    "dlock-bench [--quick] [--only W1,W2,...] [--libs dlock,raw,...] [--round-ms N] [--rounds N]\n\
                     Starts its own redis-server unless REDIS_URL is set."
                );
                std::process::exit(0);
            }
            other => {
                eprintln!("unknown argument `{other}` (try --help)");
                std::process::exit(2);
            }
        }
    }
    Settings {
        quick,
        round: Duration::from_millis(round.unwrap_or(if quick { 300 } else { 2_000 })),
        rounds: rounds.unwrap_or(if quick { 2 } else { 5 }),
        only,
        libs,
        url: String::new(),
    }
}

fn main() {
    let mut settings = parse_args();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let local = match std::env::var("REDIS_URL") {
        Ok(_) => None,
        Err(_) => Some(RedisServer::start()),
    };
    let url = std::env::var("REDIS_URL")
        .unwrap_or_else(|_| local.as_ref().map(RedisServer::url).unwrap_or_default());
    settings.url = url.clone();
    let server = Server { url, local };
    let (rows, verdicts) = runtime.block_on(workloads::run_all(&settings, &server));
    print_table(&rows, &verdicts, settings.quick);
    let violations: u64 = rows.iter().map(|r| r.violations).sum();
    let errors: u64 = rows.iter().map(|r| r.errors).sum();
    if violations > 0 || errors > 0 {
        eprintln!("FAILED: {violations} mutual-exclusion violations, {errors} errors");
        std::process::exit(1);
    }
}

fn fmt_opt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.digits$}"))
}

fn print_table(rows: &[Row], verdicts: &[Verdict], quick: bool) {
    println!(
        "\n{:<4} {:<12} {:>12} {:>10} {:>10} {:>9} {:>6} {:>5}  extra",
        "id", "library", "ops/s", "p50 µs", "p99 µs", "cmds/op", "errs", "viol"
    );
    for row in rows {
        let extra: Vec<String> = row
            .extra
            .iter()
            .map(|(k, v)| format!("{k}={v:.2}"))
            .collect();
        println!(
            "{:<4} {:<12} {:>12} {:>10} {:>10} {:>9} {:>6} {:>5}  {}",
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
