//! W1–W3: the lock itself, uncontended, contended, and handed from one task to another.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::*;
use crate::peers::Client;
use crate::{Row, Server, Settings};

/// W1: 32 tasks, each acquiring and releasing its own name.
pub(super) async fn w1(settings: &Settings, server: &Server) -> Vec<Row> {
    let clients = clients(settings, server).await;
    let mut acc: BTreeMap<&'static str, Acc> = BTreeMap::new();
    for round in rounds(settings) {
        for (lib, client) in &clients {
            let length = round_length(settings, round);
            let errors = Arc::new(Errors::default());
            let meter = Meter::start(server, *lib);
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
    rows("W1", &libs(settings), acc)
}

/// W2: 16 tasks contend for one name and do a non-atomic read-modify-write of a shared counter
/// inside. Violations: two holders at once (a flag), a lost increment (the final count), and for
/// dlock a fencing token that did not increase.
pub(super) async fn w2(settings: &Settings, server: &Server) -> Vec<Row> {
    let clients = clients(settings, server).await;
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
            let meter = Meter::start(server, *lib);
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
                        let waited = asked.elapsed();
                        // Asked for before the write, as a fenced writer would: for dlock, a
                        // round trip that mints the token. No token, no write.
                        let fence = match held.fence().await {
                            Ok(fence) => fence,
                            Err(e) => {
                                errors.record("W2", lib, &e);
                                let _ = client.release(held).await;
                                continue;
                            }
                        };
                        waits.push(waited);
                        if holder.swap(true, Ordering::SeqCst) {
                            violations.fetch_add(1, Ordering::SeqCst);
                        }
                        if let Some(fence) = fence
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
    rows("W2", &libs(settings), acc)
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
pub(super) async fn w3(settings: &Settings, server: &Server) -> Vec<Row> {
    let mut pairs = Vec::new();
    for lib in libs(settings) {
        pairs.push((
            lib,
            Client::new(lib, &server.endpoints).await,
            Client::new(lib, &server.endpoints).await,
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
            let meter = Meter::start(server, *lib);
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
            a.redis_work(&spent);
        }
    }
    let mut rows = Vec::new();
    if let Some(a) = acc.remove("PING-idle") {
        rows.push(a.row("W3", "PING-idle"));
    }
    rows.extend(super::rows("W3", &libs(settings), acc));
    rows
}
