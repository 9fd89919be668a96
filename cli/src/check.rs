//! `dlock check`: the randomized checker run against the user's own Redis for a given time.
//!
//! Many lockers (over a URL, a bb8 pool, a deadpool pool, a multiplexed connection, a connection
//! manager, a second runtime, a loopback proxy, a tiny command timeout) run random sessions on a
//! few names of the check's own, under a fresh prefix; then the history is checked for overlaps,
//! lies, leaks, losses and slow calls, and the check's keys are deleted.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use dlock_checker::{Config, FaultFamily, Invariant, Remote, RemoteError, Report, Spread};
use serde_json::{Value, json};

use crate::Failure;
use crate::progress::{Ticker, seconds};

/// What to run.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    /// The server.
    pub(crate) url: String,
    /// The applications' key prefix (the check's keys go under it, with a suffix of their own).
    pub(crate) prefix: String,
    /// How long the sessions go on.
    pub(crate) duration: Duration,
    /// Inject the faults that touch only the check's own keys and connections.
    pub(crate) faults: bool,
    /// The seed the sessions and faults are drawn from.
    pub(crate) seed: u64,
    /// Show a live status line.
    pub(crate) progress: bool,
}

/// Which of the things a check reports an invariant belongs to.
pub(crate) fn category(invariant: Invariant) -> &'static str {
    match invariant {
        Invariant::MutualExclusion
        | Invariant::Reentry
        | Invariant::BeliefWithinLease
        | Invariant::AtLeast
        | Invariant::FairOrder
        | Invariant::PermitBound
        | Invariant::ReadWrite
        | Invariant::FencingOrder => "overlaps",
        Invariant::ReleaseTruth | Invariant::RunTruth | Invariant::RefusalTruth => {
            "untruthful outcomes"
        }
        Invariant::LeftBehind => "leaks",
        Invariant::WatchdogKeeps => "losses",
        Invariant::Bounded
        | Invariant::Panic
        | Invariant::WakeUp
        | Invariant::Progress
        | Invariant::Follows
        | Invariant::MasterBudget => "slow or failed calls",
    }
}

/// The check's outcome: its report, and whether Ctrl-C cut it short.
pub(crate) struct Checked {
    pub(crate) report: Report,
    pub(crate) interrupted: bool,
    /// How long the sessions went on: the duration asked for, or less after Ctrl-C.
    pub(crate) ran: Duration,
}

/// Runs the check on a runtime of its own (the checker wants several threads) and waits for
/// it, showing progress; Ctrl-C winds it down early (it still checks and cleans up).
pub(crate) async fn check(options: Options) -> Result<Checked, Failure> {
    let config = Config {
        seed: options.seed,
        ops: usize::MAX,
        family: if options.faults {
            FaultFamily::Remote
        } else {
            FaultFamily::Quiet
        },
        duration: Some(options.duration),
        mixed_layouts: false,
    };
    let remote = Remote {
        url: options.url.clone(),
        prefix: options.prefix.clone(),
        halt: Arc::new(AtomicBool::new(false)),
        sessions: Arc::new(AtomicU64::new(0)),
    };
    let started = tokio::time::Instant::now();
    let ticker = Ticker::start(options.progress, {
        let (sessions, halt, total) = (
            remote.sessions.clone(),
            remote.halt.clone(),
            options.duration,
        );
        move || {
            let elapsed = started.elapsed();
            let done = sessions.load(Ordering::Relaxed);
            if elapsed < total && !halt.load(Ordering::Relaxed) {
                format!(
                    "checking  {} / {}  {done} sessions  (Ctrl-C stops early)",
                    seconds(elapsed),
                    seconds(total)
                )
            } else {
                format!(
                    "checking  {done} sessions done; letting the leases run out, then checking \
                     the history  {}",
                    seconds(elapsed)
                )
            }
        }
    });
    let run = std::thread::Builder::new()
        .name("dlock-check".to_owned())
        .spawn({
            let remote = remote.clone();
            move || {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| RemoteError::Unreachable(format!("no runtime: {e}")))?;
                runtime.block_on(dlock_checker::run_remote(config, &remote))
            }
        })
        .map_err(|e| Failure::new(1, format!("cannot start the check: {e}")))?;
    let mut joined = tokio::task::spawn_blocking(move || run.join());
    let mut interrupted = false;
    let mut ran = options.duration;
    let joined = loop {
        tokio::select! {
            joined = &mut joined => break joined,
            _ = tokio::signal::ctrl_c(), if !interrupted => {
                interrupted = true;
                ran = ran.min(started.elapsed());
                remote.halt.store(true, Ordering::Relaxed);
            }
        }
    };
    drop(ticker);
    let report = match joined {
        Ok(Ok(Ok(report))) => report,
        Ok(Ok(Err(RemoteError::Url(message) | RemoteError::Config(message)))) => {
            return Err(Failure::new(2, message));
        }
        Ok(Ok(Err(RemoteError::Unreachable(message)))) => return Err(Failure::new(1, message)),
        Ok(Err(panic)) => {
            let message = (panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "(no message)".to_owned());
            return Err(Failure::new(
                1,
                format!("the check could not finish (did Redis go away?): {message}"),
            ));
        }
        Err(e) => return Err(Failure::new(1, format!("the check could not finish: {e}"))),
    };
    Ok(Checked {
        report,
        interrupted,
        ran,
    })
}

/// The categories, in the order they are reported.
const CATEGORIES: [&str; 5] = [
    "overlaps",
    "untruthful outcomes",
    "leaks",
    "losses",
    "slow or failed calls",
];

fn count(report: &Report, category: &str) -> usize {
    (report.violations.iter())
        .filter(|v| self::category(v.invariant) == category)
        .count()
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn spread_json(s: &Spread) -> Value {
    json!({
        "count": s.count,
        "p50_ms": millis(s.p50),
        "p99_ms": millis(s.p99),
        "max_ms": millis(s.max),
    })
}

/// What `dlock check` prints.
pub(crate) fn render(checked: &Checked, options: &Options, json: bool) -> String {
    let r = &checked.report;
    let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let s = &r.stats;
    if json {
        let mut by_category = serde_json::Map::new();
        for c in CATEGORIES {
            by_category.insert(c.replace(' ', "_"), json!(count(r, c)));
        }
        let violations: Vec<Value> = (r.violations.iter())
            .map(|v| {
                json!({
                    "invariant": format!("{:?}", v.invariant),
                    "category": category(v.invariant),
                    "summary": v.summary,
                })
            })
            .collect();
        let value = json!({
            "ok": r.violations.is_empty(),
            "interrupted": checked.interrupted,
            "seed": r.config.seed,
            "faults_requested": options.faults,
            "duration_ms": millis(options.duration),
            "ran_ms": millis(checked.ran),
            "wall_ms": millis(r.wall),
            "sessions": get(&s.sessions),
            "calls": get(&s.calls),
            "granted": get(&s.acquired),
            "busy": get(&s.busy),
            "backend_errors": get(&s.backend_errors),
            "dropped_futures": get(&s.dropped_futures),
            "runs_cancelled": get(&s.runs_cancelled),
            "faults": r.faults,
            "losses": r.latency.losses,
            "latency": {
                "try_lock": spread_json(&r.latency.try_lock),
                "granted_wait": spread_json(&r.latency.granted_wait),
                "release": spread_json(&r.latency.release),
            },
            "violations_by_category": by_category,
            "violations": violations,
        });
        return value.to_string();
    }
    let mut out = String::new();
    let faults = if r.faults.is_empty() {
        if options.faults {
            "none landed".to_owned()
        } else {
            "none (no --faults)".to_owned()
        }
    } else {
        (r.faults.iter())
            .map(|(k, n)| format!("{k} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    out.push_str(&format!(
        "ran {}{}: {} sessions, {} calls, {} locks granted, {} busy, {} backend errors, {} \
         futures dropped half-way, {} guarded runs cancelled\n",
        seconds(checked.ran),
        if checked.interrupted {
            " (stopped early by Ctrl-C)"
        } else {
            ""
        },
        get(&s.sessions),
        get(&s.calls),
        get(&s.acquired),
        get(&s.busy),
        get(&s.backend_errors),
        get(&s.dropped_futures),
        get(&s.runs_cancelled),
    ));
    out.push_str(&format!("{:<22}{faults}\n", "faults:"));
    for c in CATEGORIES {
        let n = count(r, c);
        let verdict = if n == 0 {
            "none".to_owned()
        } else {
            format!("{n} VIOLATION(S)")
        };
        let line = if c == "losses" {
            // Losses under faults are expected; the violations are the unexplained ones.
            format!(
                "{} holds learnt of a loss (fixed leases outlived on purpose, a locker with a \
                 1-5 ms command timeout, faults); unexplained: {verdict}",
                r.latency.losses
            )
        } else {
            verdict
        };
        out.push_str(&format!("{:<22}{line}\n", format!("{c}:")));
    }
    out.push_str(&format!("{:<22}{}\n", "try_lock:", r.latency.try_lock));
    out.push_str(&format!(
        "{:<22}{} (granted, waiting included)\n",
        "waits:", r.latency.granted_wait
    ));
    out.push_str(&format!("{:<22}{}\n", "releases:", r.latency.release));
    if r.violations.is_empty() {
        out.push_str("verdict:              OK, no violation");
    } else {
        out.push_str(&format!(
            "verdict:              FAILED, {} violation(s); the first of each kind:\n{}",
            r.violations.len(),
            r.details().trim_end()
        ));
    }
    out.push_str(&format!(
        "\nseed {} (--seed {} draws the same sessions and faults again)",
        r.config.seed, r.config.seed
    ));
    out
}
