//! W7: fairness across processes. Three processes contend for one name, two tasks each, holding
//! it [`HOLD`] at a time; one process reaches Redis (or PostgreSQL, for dlock on it) through a
//! proxy that holds what it sends for [`DELAY`]. Fair means every process gets at least half its share of the acquisitions,
//! the 99th percentile wait stays within ten holds (a task waits five others' holds in strict
//! turns), and no wait runs into [`BOUND`].
//!
//! The processes are this binary again (`dlock-bench --w7-contender …`): each connects, says
//! `ready`, starts on a line from its stdin so that all three start together, and prints one
//! `result` line: acquisitions, timeouts, errors, the median hold and every wait in µs.

use std::collections::BTreeMap;
use std::io::{BufRead as _, BufReader, Write as _};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_tests::Proxy;

use super::*;
use crate::modes::Mode;
use crate::peers::Client;
use crate::{Row, Server, Settings};

/// How long a holder keeps the lock (as W3).
const HOLD: Duration = Duration::from_millis(5);
/// What the proxy adds to the slower process's commands. On tokio's millisecond timer that
/// comes to about 2 ms more per round trip (the run measures it: `added_rtt_us`).
const DELAY: Duration = Duration::from_millis(1);
/// Tasks per process.
const TASKS: usize = 2;
/// A wait this long is a timeout.
const BOUND: Duration = Duration::from_secs(3);
/// The argument that makes this binary a W7 contender.
pub(crate) const CONTENDER: &str = "--w7-contender";

/// One process's figures.
#[derive(Debug, Default)]
struct Outcome {
    acquisitions: u64,
    timeouts: u64,
    errors: u64,
    hold_us: f64,
    waits: Vec<Duration>,
}

pub(crate) async fn w7(settings: &Settings, server: &Server) -> Vec<Row> {
    let direct = server_addr(&settings.url);
    let proxy = Arc::new(Proxy::start_delayed(direct, DELAY).await);
    let added_rtt_us = ping_us(&proxy.url()).await - ping_us(&settings.url).await;
    // PostgreSQL's slower process goes through a proxy of its own, with the same delay.
    let postgres = &server.endpoints.postgres;
    let pg_proxy = match postgres_addr(postgres) {
        Some(addr)
            if w7_libs(settings)
                .iter()
                .any(|l| l.mode() == Some(Mode::Postgres)) =>
        {
            Some(Proxy::start_delayed(addr, DELAY).await)
        }
        _ => None,
    };
    let mut acc: BTreeMap<&'static str, Acc> = BTreeMap::new();
    for round in rounds(settings) {
        for lib in w7_libs(settings) {
            let length = round_length(settings, round);
            let name = format!("w7:{}:{}", lib.label(), round.map_or(-1, |r| r as i64));
            let urls = match (&pg_proxy, lib.mode()) {
                (Some(pg_proxy), Some(Mode::Postgres)) => [
                    postgres.clone(),
                    postgres.clone(),
                    dlock_tests::PostgresServer::url_at(pg_proxy.port()),
                ],
                _ => [settings.url.clone(), settings.url.clone(), proxy.url()],
            };
            let label = lib.label();
            let meter = Meter::start(server, lib);
            let outcomes =
                tokio::task::spawn_blocking(move || contend(label, &urls, &name, length))
                    .await
                    .expect("w7 round");
            let a = acc.entry(lib.label()).or_default();
            let outcomes = match outcomes {
                Ok(outcomes) => outcomes,
                Err(e) => {
                    eprintln!("W7 {}: {e}", lib.label());
                    a.errors += 1;
                    continue;
                }
            };
            a.errors += outcomes.iter().map(|o| o.errors).sum::<u64>();
            let Some(_) = round else { continue };
            let total: u64 = outcomes.iter().map(|o| o.acquisitions).sum();
            let fair = total as f64 / outcomes.len() as f64;
            let share = |o: &Outcome| {
                if fair > 0.0 {
                    o.acquisitions as f64 / fair
                } else {
                    0.0
                }
            };
            let min_share = outcomes.iter().map(share).fold(f64::INFINITY, f64::min);
            let mut waits: Vec<Duration> = outcomes
                .iter()
                .flat_map(|o| o.waits.iter().copied())
                .collect();
            let mut holds: Vec<f64> = outcomes.iter().map(|o| o.hold_us).collect();
            // Commands and Redis's work only: the client CPU is the contenders', not this
            // process's.
            let spent = meter.per_op(server, total);
            a.cmds.push(spent.commands_per_op);
            a.redis_work(&spent);
            a.ops.push(total as f64 / length.as_secs_f64());
            a.p50.push(percentile_us(&mut waits, 0.5));
            a.p99.push(percentile_us(&mut waits, 0.99));
            let extra = &mut a.extra;
            extra.entry("min_share").or_default().push(min_share);
            extra
                .entry("slow_share")
                .or_default()
                .push(outcomes.last().map_or(0.0, share));
            extra
                .entry("timeouts")
                .or_default()
                .push(outcomes.iter().map(|o| o.timeouts).sum::<u64>() as f64);
            extra.entry("hold_us").or_default().push(median(&mut holds));
            extra.entry("added_rtt_us").or_default().push(added_rtt_us);
        }
    }
    rows("W7", &w7_libs(settings), acc)
}

/// The libraries W7 runs: those on the one server (the proxy stands in front of it), and
/// dlock on PostgreSQL (a proxy in front of that server).
fn w7_libs(settings: &Settings) -> Vec<crate::peers::Lib> {
    let libs = libs(settings).into_iter();
    libs.filter(|lib| matches!(lib.mode(), None | Some(Mode::Postgres)))
        .collect()
}

/// The address in a `postgres://user@host:port/db` URL (`None`: no PostgreSQL in this run).
fn postgres_addr(url: &str) -> Option<std::net::SocketAddr> {
    let rest = url.strip_prefix("postgres://")?;
    let host_port = rest.split('/').next()?.rsplit('@').next()?;
    let (host, port) = host_port.rsplit_once(':')?;
    let host = if host == "localhost" {
        "127.0.0.1"
    } else {
        host
    };
    format!("{host}:{port}").parse().ok()
}

/// The address in a `redis://host:port/` URL.
fn server_addr(url: &str) -> std::net::SocketAddr {
    let client = redis::Client::open(url).expect("url");
    match client.get_connection_info().addr() {
        redis::ConnectionAddr::Tcp(host, port) => {
            let host = if host == "localhost" {
                "127.0.0.1"
            } else {
                host.as_str()
            };
            format!("{host}:{port}")
                .parse()
                .expect("W7 runs against a server on an IP address")
        }
        other => panic!("W7 runs against a TCP server, not {other:?}"),
    }
}

/// The median `PING` round trip through `url`.
async fn ping_us(url: &str) -> f64 {
    let mut con = redis::Client::open(url)
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let mut samples = pings(&mut con, 200).await;
    percentile_us(&mut samples, 0.5)
}

/// Runs one round: a contender process per URL, started together.
fn contend(
    lib: &str,
    urls: &[String],
    name: &str,
    length: Duration,
) -> Result<Vec<Outcome>, String> {
    let exe = std::env::current_exe().map_err(|e| format!("this binary: {e}"))?;
    let mut children: Vec<Child> = Vec::new();
    for url in urls {
        let child = Command::new(&exe)
            .args([CONTENDER, lib, url, name])
            .arg(length.as_millis().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("spawn a contender: {e}"))?;
        children.push(child);
    }
    let mut readers = Vec::new();
    for child in &mut children {
        let stdout = child.stdout.take().ok_or("a contender's stdout")?;
        let mut reader = BufReader::new(stdout);
        let mut line = String::new();
        reader
            .read_line(&mut line)
            .map_err(|e| format!("a contender: {e}"))?;
        if line.trim() != "ready" {
            return Err(format!("a contender did not start: {line:?}"));
        }
        readers.push(reader);
    }
    for child in &mut children {
        let stdin = child.stdin.as_mut().ok_or("a contender's stdin")?;
        writeln!(stdin, "go").map_err(|e| format!("start a contender: {e}"))?;
    }
    let mut outcomes = Vec::new();
    for (child, mut reader) in children.iter_mut().zip(readers) {
        let mut line = String::new();
        reader
            .read_line(&mut line)
            .map_err(|e| format!("a contender: {e}"))?;
        let status = child.wait().map_err(|e| format!("a contender: {e}"))?;
        if !status.success() {
            return Err(format!("a contender failed ({status})"));
        }
        outcomes.push(parse(&line).ok_or_else(|| format!("a contender said {line:?}"))?);
    }
    Ok(outcomes)
}

fn parse(line: &str) -> Option<Outcome> {
    let mut fields = line.split_whitespace();
    if fields.next()? != "result" {
        return None;
    }
    let mut next = || fields.next()?.parse::<f64>().ok();
    let (acquisitions, timeouts, errors, hold_us) = (next()?, next()?, next()?, next()?);
    let mut waits = Vec::new();
    while let Some(us) = next() {
        waits.push(Duration::from_secs_f64(us / 1e6));
    }
    Some(Outcome {
        acquisitions: acquisitions as u64,
        timeouts: timeouts as u64,
        errors: errors as u64,
        hold_us,
        waits,
    })
}

/// The contender process: `--w7-contender LIB URL NAME MILLISECONDS`.
pub(crate) fn contender(args: &[String]) -> ! {
    let [lib, url, name, ms] = args else {
        eprintln!("{CONTENDER} LIB URL NAME MILLISECONDS");
        std::process::exit(2);
    };
    let Some(lib) = crate::peers::Lib::ALL
        .into_iter()
        .find(|l| l.label() == lib)
    else {
        eprintln!("unknown library `{lib}`");
        std::process::exit(2);
    };
    let length = Duration::from_millis(ms.parse().unwrap_or(1_000));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let outcome = runtime.block_on(async {
        // One URL: the plain server's, or the PostgreSQL server's for dlock on it.
        let mut at = crate::modes::Endpoints::single(url);
        at.postgres = url.clone();
        let client = Client::new(lib, &at).await;
        println!("ready");
        let mut go = String::new();
        let _ = std::io::stdin().read_line(&mut go);
        let end = Instant::now() + length;
        let mut tasks = Vec::new();
        for _ in 0..TASKS {
            let (client, name) = (client.clone(), name.clone());
            tasks.push(tokio::spawn(async move {
                let mut outcome = Outcome::default();
                let mut holds = Vec::new();
                while Instant::now() < end {
                    let asked = Instant::now();
                    match client.acquire_within(&name, BOUND).await {
                        Ok(held) => {
                            outcome.waits.push(asked.elapsed());
                            outcome.acquisitions += 1;
                            let held_at = Instant::now();
                            tokio::time::sleep(HOLD).await;
                            holds.push(held_at.elapsed());
                            if client.release(held).await.is_err() {
                                outcome.errors += 1;
                            }
                        }
                        Err(_) if asked.elapsed() >= BOUND => outcome.timeouts += 1,
                        Err(e) => {
                            outcome.errors += 1;
                            eprintln!("W7 {}: {e}", lib.label());
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                    }
                }
                outcome.hold_us = percentile_us(&mut holds, 0.5);
                outcome
            }));
        }
        let mut all = Outcome::default();
        let mut holds = Vec::new();
        for task in tasks {
            let o = task.await.expect("a W7 task");
            all.acquisitions += o.acquisitions;
            all.timeouts += o.timeouts;
            all.errors += o.errors;
            holds.push(o.hold_us);
            all.waits.extend(o.waits);
        }
        all.hold_us = median(&mut holds);
        all
    });
    let mut line = format!(
        "result {} {} {} {:.1}",
        outcome.acquisitions, outcome.timeouts, outcome.errors, outcome.hold_us
    );
    for wait in &outcome.waits {
        line.push_str(&format!(" {:.0}", wait.as_secs_f64() * 1e6));
    }
    println!("{line}");
    std::process::exit(0);
}
