//! What the commands print: text for people, JSON for scripts.

use std::time::Duration;

use dlock_core::{Holder, LockInfo};
use serde_json::{Value, json};

/// One word for the name's state.
fn state(info: &LockInfo) -> &'static str {
    if !info.holders.is_empty() {
        "held"
    } else if info.kept {
        "kept"
    } else if info.foreign {
        "foreign"
    } else {
        "free"
    }
}

fn holder(h: &Holder) -> String {
    match &h.label {
        Some(label) => format!("{} ({label})", h.token_prefix),
        None => h.token_prefix.clone(),
    }
}

fn holders(info: &LockInfo) -> String {
    info.holders
        .iter()
        .map(holder)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The name's other kinds, for one line: `writer 0123abcd (api), readers 2, permits 3 of 5`
/// (empty: none holds it).
fn other_kinds(info: &LockInfo) -> String {
    let mut parts = Vec::new();
    if let Some(writer) = &info.writer {
        parts.push(format!("writer {}", holder(writer)));
    }
    if info.readers > 0 {
        parts.push(format!("readers {}", info.readers));
    }
    if info.permits_taken > 0 {
        let of = info
            .permit_limit
            .map_or_else(String::new, |n| format!(" of {n}"));
        parts.push(format!("permits {}{of}", info.permits_taken));
    }
    parts.join(", ")
}

fn ttl(d: Option<Duration>) -> String {
    d.map_or_else(|| "-".to_owned(), |d| format!("{:.3}s", d.as_secs_f64()))
}

fn to_json(info: &LockInfo) -> Value {
    json!({
        "name": info.name,
        "state": state(info),
        "holders": info.holders.iter().map(|h| json!({
            "token_prefix": h.token_prefix,
            "label": h.label,
        })).collect::<Vec<_>>(),
        "ttl_ms": info.ttl.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        "fencing_token": info.fencing_token.map(|t| t.get()),
        "last_fencing_token": info.last_fencing_token.map(|t| t.get()),
        "waiting_lockers": info.waiting_lockers,
        "queued_waiters": info.queued_waiters,
        "writer": info.writer.as_ref().map(|h| json!({
            "token_prefix": h.token_prefix,
            "label": h.label,
        })),
        "writer_ttl_ms": info.writer_ttl.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        "readers": info.readers,
        "permits_taken": info.permits_taken,
        "permit_limit": info.permit_limit,
    })
}

/// `dlock list`.
pub(crate) fn list(infos: &[LockInfo], json: bool) -> String {
    if json {
        return Value::Array(infos.iter().map(to_json).collect()).to_string();
    }
    if infos.is_empty() {
        return "no locks".to_owned();
    }
    let width = infos.iter().map(|i| i.name.len()).max().unwrap_or(0);
    let lines = infos.iter().map(|i| {
        let who = match state(i) {
            "held" => format!("held by {}", holders(i)),
            other => other.to_owned(),
        };
        let others = match other_kinds(i) {
            others if others.is_empty() => others,
            others => format!("  {others}"),
        };
        format!(
            "{:width$}  {who}  ttl {}  waiting {}{others}",
            i.name,
            ttl(i.ttl),
            i.waiting_lockers
        )
    });
    lines.collect::<Vec<_>>().join("\n")
}

/// `dlock list` on PostgreSQL: each advisory lock held, with its session.
pub(crate) fn advisory_locks(locks: &[dlock_core::AdvisoryLock], json: bool) -> String {
    let age = |l: &dlock_core::AdvisoryLock| l.session_age.map(|d| d.as_secs_f64());
    if json {
        let rows = locks.iter().map(|l| {
            serde_json::json!({
                "key": l.key,
                "mode": if l.shared { "shared" } else { "exclusive" },
                "pid": l.pid,
                "application": l.application,
                "client": l.client,
                "session_age_s": age(l),
            })
        });
        return Value::Array(rows.collect()).to_string();
    }
    if locks.is_empty() {
        return "no advisory locks".to_owned();
    }
    let mut lines = vec![format!(
        "{:>20}  {:9}  {:>7}  {:12}  {:15}  session age",
        "advisory key", "mode", "pid", "application", "client"
    )];
    lines.extend(locks.iter().map(|l| {
        format!(
            "{:>20}  {:9}  {:>7}  {:12}  {:15}  {}",
            l.key,
            if l.shared { "shared" } else { "exclusive" },
            l.pid,
            l.application,
            l.client.as_deref().unwrap_or("-"),
            l.session_age
                .map_or("-".to_owned(), |d| format!("{:.1}s", d.as_secs_f64())),
        )
    }));
    lines.join("\n")
}

/// `dlock show`.
pub(crate) fn show(info: &LockInfo, json: bool) -> String {
    if json {
        return to_json(info).to_string();
    }
    let token = |t: Option<dlock_core::FencingToken>| t.map_or("-".to_owned(), |t| t.to_string());
    let state = match state(info) {
        "kept" => "kept after a release (at-least period)",
        "foreign" => "a value that is not a lock",
        other => other,
    };
    let who = if info.holders.is_empty() {
        "-".to_owned()
    } else {
        holders(info)
    };
    [
        format!("name             {}", info.name),
        format!("state            {state}"),
        format!("holder           {who}"),
        format!("ttl              {}", ttl(info.ttl)),
        format!("fencing token    {}", token(info.fencing_token)),
        format!("last token       {}", token(info.last_fencing_token)),
        format!("waiting lockers  {}", info.waiting_lockers),
        format!("in line (fair)   {}", info.queued_waiters),
        format!(
            "writer           {}",
            info.writer.as_ref().map_or_else(|| "-".to_owned(), holder)
        ),
        format!("writer ttl       {}", ttl(info.writer_ttl)),
        format!("readers          {}", info.readers),
        format!("permits taken    {}", info.permits_taken),
        format!(
            "permit limit     {}",
            info.permit_limit
                .map_or_else(|| "-".to_owned(), |n| n.to_string())
        ),
    ]
    .join("\n")
}

/// `dlock release --force`.
pub(crate) fn released(name: &str, removed: bool, json: bool) -> String {
    if json {
        return json!({ "name": name, "released": removed }).to_string();
    }
    if removed {
        format!("released {name}")
    } else {
        format!("{name} was not held")
    }
}

/// One line of `dlock watch`.
pub(crate) fn watch_line(info: &LockInfo, json: bool) -> String {
    if json {
        return to_json(info).to_string();
    }
    match state(info) {
        "held" => format!(
            "{}: held by {} (token {}), ttl {}, waiting {}",
            info.name,
            holders(info),
            info.fencing_token.map_or("-".to_owned(), |t| t.to_string()),
            ttl(info.ttl),
            info.waiting_lockers
        ),
        other => match other_kinds(info) {
            others if others.is_empty() => {
                format!("{}: {other}, waiting {}", info.name, info.waiting_lockers)
            }
            others => format!(
                "{}: {other}, waiting {}; {others}",
                info.name, info.waiting_lockers
            ),
        },
    }
}

/// What `dlock watch` compares between reads: everything but the TTL.
pub(crate) fn watch_key(info: &LockInfo) -> String {
    format!(
        "{} {} {:?} {} {}",
        state(info),
        holders(info),
        info.fencing_token,
        info.waiting_lockers,
        other_kinds(info)
    )
}

/// `1.234` (milliseconds, for a table).
fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1000.0)
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

fn latencies_json(l: &crate::bench::Latencies) -> Value {
    json!({
        "p50": micros(l.p50),
        "p90": micros(l.p90),
        "p99": micros(l.p99),
        "max": micros(l.max),
    })
}

/// `dlock bench`: a table per run, or one JSON object (latencies in microseconds).
pub(crate) fn bench(report: &crate::bench::Report, json: bool) -> String {
    if json {
        let runs = report.runs.iter().map(|run| {
            json!({
                "run": run.label,
                "tasks": run.tasks,
                "names": run.names,
                "cycles": run.cycles,
                "elapsed_ms": u64::try_from(run.elapsed.as_millis()).unwrap_or(u64::MAX),
                "cycles_per_sec": (run.rate() * 10.0).round() / 10.0,
                "acquire_us": latencies_json(&run.acquire),
                "cycle_us": latencies_json(&run.cycle),
            })
        });
        return json!({
            "keys": report.keys,
            "duration_ms": u64::try_from(report.duration.as_millis()).unwrap_or(u64::MAX),
            "runs": runs.collect::<Vec<_>>(),
            "interrupted": report.interrupted,
            "keys_removed": report.keys_removed,
        })
        .to_string();
    }
    let quartet = |l: &crate::bench::Latencies| {
        format!(
            "{} / {} / {} / {}",
            ms(l.p50),
            ms(l.p90),
            ms(l.p99),
            ms(l.max)
        )
    };
    let rows: Vec<[String; 7]> = (report.runs.iter())
        .map(|run| {
            [
                run.label.to_owned(),
                run.tasks.to_string(),
                run.names.to_string(),
                run.cycles.to_string(),
                format!("{:.1}", run.rate()),
                quartet(&run.acquire),
                quartet(&run.cycle),
            ]
        })
        .collect();
    let header = [
        "run",
        "tasks",
        "names",
        "cycles",
        "cycles/s",
        "acquire ms p50 / p90 / p99 / max",
        "cycle ms p50 / p90 / p99 / max",
    ];
    let width = |i: usize| {
        (rows.iter().map(|r| r[i].len()))
            .chain([header[i].len()])
            .max()
            .unwrap_or(0)
    };
    let line = |cells: [&str; 7]| {
        let mut out = format!("{:<w$}", cells[0], w = width(0));
        for (i, cell) in cells.iter().enumerate().skip(1).take(4) {
            out.push_str(&format!("  {cell:>w$}", w = width(i)));
        }
        for (i, cell) in cells.iter().enumerate().skip(5) {
            out.push_str(&format!("  {cell:<w$}", w = width(i)));
        }
        out.trim_end().to_owned()
    };
    let mut out = vec![line(header)];
    for row in &rows {
        out.push(line(row.each_ref().map(String::as_str)));
    }
    if report.interrupted {
        out.push("interrupted: the runs stopped early".to_owned());
    }
    out.push(format!(
        "deleted {} keys under {}",
        report.keys_removed, report.keys
    ));
    out.join("\n")
}
