//! The run driver: sets the backend and the lockers up, runs the workers and the fault injector,
//! lets every lease run out, checks what is left behind (d) and every other invariant, and
//! reports.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_core::MemoryStore;
use dlock_core::redis;
use rand::rngs::StdRng;
use rand::{RngExt as _, SeedableRng as _};
use tokio::sync::watch;
use tokio::time::Instant;

use super::actors::{self, Actor, RedisSetup};
use super::fair::FairFigures;
use super::faults::{FaultPlan, MemoryTargets, RedisTargets, Targets, inject};
use super::history::{History, Special, ms};
use super::invariants::{self, Invariant, Violation};
use super::latency::Latencies;
use super::leftovers::{fair_line_leftovers, locker_leftovers, redis_leftovers};
use super::ops::{Ctx, Stats, run_worker};
use super::plan::{self, MAX_PLANNED_LEASE, Shape};
use super::shares::ShareFigures;
use super::{Config, FaultFamily};
use crate::{Proxy, RedisServer, unique_name};

/// How many violations of each invariant are printed with their history.
const PRINTED_PER_INVARIANT: usize = 3;

/// How many sessions a worker of a timed run draws at a time.
const TIMED_BATCH: usize = 64;

/// Added to the longest lease and a watchdog tick before the final look at the backend.
const SETTLE_MARGIN: Duration = Duration::from_millis(500);

/// The run's shape, drawn from the seed.
#[derive(Debug, Clone, Copy)]
pub(super) struct Params {
    pub(super) workers: u16,
    pub(super) names: u8,
    pub(super) watchdog_lease: Duration,
    pub(super) command_timeout: Duration,
    pub(super) tiny_timeout: Duration,
    pub(super) fence_ttl: Option<Duration>,
    /// How long a fair lock's waiter keeps its place without an attempt: short, so that dead
    /// waiters are dropped, and the line's keys expire, within the run.
    pub(super) dead_waiter_timeout: Duration,
    /// The permit count every handle on the semaphore is made with.
    pub(super) permits: u32,
    /// Whether the read-write lock's handles prefer writers.
    pub(super) prefer_writers: bool,
}

impl Params {
    /// The name taken with `fair_lock`: the last of the lock names.
    pub(super) fn fair_name(&self) -> u8 {
        self.names - 1
    }

    /// The semaphore's name, after the lock names.
    pub(super) fn semaphore_name(&self) -> u8 {
        self.names
    }

    /// The read-write lock's name, after the semaphore's.
    pub(super) fn rw_name(&self) -> u8 {
        self.names + 1
    }

    /// How many names in all.
    pub(super) fn all_names(&self) -> u8 {
        self.names + 2
    }

    /// The names that are not plain locks.
    pub(super) fn special(&self) -> Special {
        Special {
            fair: Some(self.fair_name()),
            semaphore: Some((self.semaphore_name(), self.permits)),
            rw: Some((self.rw_name(), self.prefer_writers)),
        }
    }
}

pub(super) fn params(seed: u64) -> Params {
    let mut rng = StdRng::seed_from_u64(seed);
    let ms = |rng: &mut StdRng, lo: u64, hi: u64| Duration::from_millis(rng.random_range(lo..=hi));
    Params {
        workers: rng.random_range(16..=32),
        names: rng.random_range(3..=5),
        watchdog_lease: ms(&mut rng, 300, 1_000),
        command_timeout: ms(&mut rng, 150, 500),
        tiny_timeout: ms(&mut rng, 1, 5),
        // Half the runs let fencing counters expire quickly, so they are re-created mid-run.
        fence_ttl: if rng.random_bool(0.5) {
            Some(ms(&mut rng, 200, 2_000))
        } else {
            Some(dlock_core::DEFAULT_FENCE_TTL)
        },
        dead_waiter_timeout: ms(&mut rng, 300, 600),
        permits: rng.random_range(2..=3),
        // Mostly the default; now and then readers may pass a waiting writer.
        prefer_writers: rng.random_bool(0.8),
    }
}

/// What a run did and found.
#[derive(Debug)]
pub struct Report {
    /// What was run.
    pub config: Config,
    /// Wall-clock time of the whole run, set-up and checks included.
    pub wall: std::time::Duration,
    /// Counters.
    pub stats: Stats,
    /// Guards handed out.
    pub guards: usize,
    /// The history's fingerprint: a memory run on a paused clock replays its seed exactly.
    pub digest: super::history::HistoryDigest,
    /// What the fair-order check looked at.
    pub fair: FairFigures,
    /// What the permit and reader-writer checks looked at.
    pub shares: ShareFigures,
    /// What the calls took, and how many holds were lost.
    pub latency: Latencies,
    /// Faults injected, by kind.
    pub faults: BTreeMap<String, u64>,
    /// Every violation found.
    pub violations: Vec<Violation>,
    summary: String,
    rendered: String,
}

impl Report {
    /// One paragraph: what ran, how fast, what it found.
    pub fn summary(&self) -> &str {
        &self.summary
    }

    /// The violations with their minimal histories (a few per invariant), for people.
    pub fn details(&self) -> &str {
        &self.rendered
    }

    /// Panics with the seed, the violated invariants and their minimal histories, if any.
    pub fn assert_clean(&self) {
        let length = match self.config.duration {
            Some(d) => format!("{}={}", super::SECS_ENV, d.as_secs()),
            None => format!("{}={}", super::OPS_ENV, self.config.ops),
        };
        assert!(
            self.violations.is_empty(),
            "{}\n{}\nreplay: {}={} {length}",
            self.summary,
            self.rendered,
            super::SEED_ENV,
            self.config.seed,
        );
    }
}

fn summarize(
    config: Config,
    wall: std::time::Duration,
    ctx: &Ctx,
    faults: &BTreeMap<String, u64>,
    violations: &[Violation],
    (fair, shares): (FairFigures, ShareFigures),
) -> String {
    let s = &ctx.stats;
    let get = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    let secs = wall.as_secs_f64();
    let mut counts: BTreeMap<Invariant, usize> = BTreeMap::new();
    for v in violations {
        *counts.entry(v.invariant).or_default() += 1;
    }
    let mut out = format!(
        "checker {:?} seed {}: {} sessions, {} calls, {} guards, {} busy, {} backend errors, \
         {} dropped futures, {} runs cancelled, {} grants in releases, {} hand-overs inside a \
         locker; faults {:?}; {:.1} s \
         wall, {:.0} sessions/s, {:.0} calls/s; {fair}; {shares}; lockers: {}",
        config.family,
        config.seed,
        get(&s.sessions),
        get(&s.calls),
        get(&s.acquired),
        get(&s.busy),
        get(&s.backend_errors),
        get(&s.dropped_futures),
        get(&s.runs_cancelled),
        get(&s.grants),
        get(&s.handed_over),
        faults,
        secs,
        get(&s.sessions) as f64 / secs,
        get(&s.calls) as f64 / secs,
        ctx.history.lockers.join(", "),
    );
    if counts.is_empty() {
        out.push_str("; no violations");
    } else {
        let _ = write!(out, "; VIOLATIONS: {counts:?}");
    }
    out
}

/// Runs the workers and the fault injector to the end; returns the faults injected.
pub(super) async fn drive(
    ctx: &Arc<Ctx>,
    targets: &Targets,
    config: Config,
    p: Params,
) -> BTreeMap<String, u64> {
    // PostgreSQL offers no fair lock, and a semaphore's count there is its handle's.
    let redis = !matches!(targets, Targets::Postgres(_));
    let shape = Shape {
        lockers: u8::try_from(ctx.actors.len()).expect("a few lockers"),
        names: p.names,
        fair: redis.then(|| p.fair_name()),
        semaphore: Some(p.semaphore_name()),
        rw: Some(p.rw_name()),
        set_permits: redis,
        long_waits: (!redis).then(|| p.fair_name()),
    };
    let (stop_tx, stop_rx) = watch::channel(false);
    // Faults may target the steady names too: their holds live through the faults.
    let targets_names = u8::try_from(ctx.history.names.len()).expect("a few names");
    let steady_names =
        (ctx.steady.iter().map(|t| t.name).min()).map_or(0..0, |first| first..targets_names);
    let plan = FaultPlan::new(config.seed, config.family, targets_names, MAX_PLANNED_LEASE)
        .targeting_steady(steady_names);
    let lag_stop = stop_rx.clone();
    let lags = async move {
        // Virtual time has no scheduler lag, and a sleeper would keep it moving.
        if !matches!(targets, Targets::Memory(_)) {
            ctx.history.lags.monitor(lag_stop).await;
        }
    };
    let faults = inject(targets, plan, ctx.history.clone(), stop_rx);
    let work = async {
        let workers = usize::from(p.workers);
        let mut handles = Vec::new();
        for w in 0..p.workers {
            let ctx = ctx.clone();
            let lease = p.watchdog_lease;
            let Some(duration) = config.duration else {
                let count =
                    config.ops / workers + usize::from(usize::from(w) < config.ops % workers);
                let sessions = plan::sessions(config.seed, w, count, shape, lease);
                handles.push(tokio::spawn(run_worker(ctx, w, sessions)));
                continue;
            };
            handles.push(tokio::spawn(async move {
                // Batches of sessions, each drawn from its own seed, until the time is up.
                let end = Instant::now() + duration;
                for batch in 0u64.. {
                    if Instant::now() >= end || ctx.halt.load(Ordering::Relaxed) {
                        break;
                    }
                    let seed = config.seed ^ batch.wrapping_mul(0x2545_f491_4f6c_dd1d);
                    let sessions = plan::sessions(seed, w, TIMED_BATCH, shape, lease);
                    run_worker(ctx.clone(), w, sessions).await;
                }
            }));
        }
        if let Some(duration) = config.duration {
            // A session started just before the end stops the next one from starting.
            let ctx = ctx.clone();
            tokio::spawn(async move {
                tokio::time::sleep(duration).await;
                ctx.halt.store(true, Ordering::Relaxed);
            });
        }
        let steady: Vec<_> = (ctx.steady.iter())
            .map(|&task| tokio::spawn(super::steady::run(ctx.clone(), task, config.seed)))
            .collect();
        for (w, h) in handles.into_iter().enumerate() {
            if let Err(err) = h.await {
                ctx.history.panic(format!("worker {w} died: {err}"));
            }
        }
        ctx.halt.store(true, Ordering::Relaxed);
        let _ = ctx.steady_stopped.set(Instant::now());
        for h in steady {
            if let Err(err) = h.await {
                ctx.history.panic(format!("a steady task died: {err}"));
            }
        }
        let _ = stop_tx.send(true);
    };
    let (counts, (), ()) = tokio::join!(faults, work, lags);
    for step in ctx.history.lags.clock_steps() {
        ctx.history.fault(step);
    }
    reset_permits(ctx, p).await;
    let settle = if ctx.steady.is_empty() {
        settle(p)
    } else {
        settle(p).max(super::steady::STEADY_LEASE + SETTLE_MARGIN)
    };
    tokio::time::sleep(settle).await;
    counts
}

/// Takes back a count the sessions set on the semaphore, so that its key is not left behind; a
/// connection a fault broke comes back within a few tries.
async fn reset_permits(ctx: &Ctx, p: Params) {
    let name = ctx.history.names[usize::from(p.semaphore_name())].as_str();
    for _ in 0..20 {
        let semaphore = ctx.actors[0].locker().semaphore(name, p.permits);
        if semaphore.reset_permits().await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// How long the run waits, once every guard is gone, before it looks at what is left: every
/// lease and one more watchdog tick run out, and so does every fair waiter's place in line (the
/// line's keys expire no later than a dead-waiter timeout after the last waiter's last attempt).
pub(super) fn settle(p: Params) -> Duration {
    let longest = MAX_PLANNED_LEASE.max(p.watchdog_lease);
    (longest + p.watchdog_lease / 3).max(p.dead_waiter_timeout) + SETTLE_MARGIN
}

/// How long the final liveness probe holds its watchdog lock, in leases.
const PROBE_LEASES: u32 = 3;

/// (f) at the end: every locker (but an unreliable one) keeps a watchdog lock alive across a few
/// leases on a quiet backend. A locker whose watchdog task died (e.g. with the runtime it was
/// started on) loses it.
///
/// With an admin connection, each locker also holds a second lock whose key gets a foreign value
/// written over it: that hold is lost, and the first must be renewed regardless.
pub(super) async fn watchdog_probe(
    actors: &[Actor],
    admin: Option<&redis::aio::ConnectionManager>,
    out: &mut Vec<Violation>,
) {
    let lease = Duration::from_millis(300);
    let probes = actors
        .iter()
        .enumerate()
        .filter(|(_, a)| !a.tiny)
        .map(|(i, actor)| async move {
            let l = actor.locker();
            let name = format!("probe-{i}");
            // A connection broken by a fault comes back on the next command or two.
            let mut guard = None;
            for _ in 0..10 {
                match l.lock(name.as_str()).watchdog_lease(lease).await {
                    Ok(g) => {
                        guard = Some(g);
                        break;
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
            let Some(guard) = guard else {
                return Some(format!(
                    "locker {} could not take a free lock at the end",
                    actor.label
                ));
            };
            // A wait on the held name goes through the subscriber, which must be up (restarted
            // on this runtime if the one it started on is gone) within a reconnect or two.
            let waited = l.lock(name.as_str()).wait(Duration::from_millis(50)).await;
            let subscribed = async {
                if actor.polls {
                    return true;
                }
                for _ in 0..100 {
                    if l.stats().subscriber_connected {
                        return true;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                false
            };
            if waited.is_ok() || !subscribed.await {
                return Some(format!(
                    "locker {}: a wait on a held lock {}, subscriber connected: {}",
                    actor.label,
                    if waited.is_ok() {
                        "got it"
                    } else {
                        "timed out"
                    },
                    l.stats().subscriber_connected
                ));
            }
            let mut clobbered = None;
            if let Some(admin) = admin {
                let other = format!("probe-{i}-clobbered");
                if let Ok(g) = l.lock(other.as_str()).watchdog_lease(lease).await {
                    let mut cmd = redis::cmd("SET");
                    cmd.arg(l.key_of(other.as_str()).expect("a valid name"))
                        .arg("not a lock")
                        .arg("PX")
                        .arg(u64::try_from((lease * 2).as_millis()).unwrap_or(u64::MAX));
                    let mut con = admin.clone();
                    let _: Result<redis::Value, _> = cmd.query_async(&mut con).await;
                    clobbered = Some(g);
                }
            }
            tokio::time::sleep(lease * PROBE_LEASES).await;
            if let Some(g) = clobbered {
                if !g.is_lost() {
                    return Some(format!(
                        "locker {}: a hold whose key was overwritten by a foreign value still \
                         believes it holds the lock",
                        actor.label
                    ));
                }
                drop(g);
            }
            let lost = guard.is_lost();
            let renewals = l.stats().renewal_round_trips;
            let outcome = guard.release().await;
            (lost || !outcome.is_released()).then(|| {
            format!(
                "locker {} let a watchdog lock (lease {}) lapse on a quiet backend: lost {lost} \
                 after {PROBE_LEASES} leases, {renewals} renewal round trips in the whole run, \
                 release said {outcome:?}",
                actor.label,
                ms(lease)
            )
        })
        });
    for failure in futures_util::future::join_all(probes)
        .await
        .into_iter()
        .flatten()
    {
        out.push(Violation {
            invariant: Invariant::WatchdogKeeps,
            summary: failure,
            window: None,
            hint: "",
        });
    }
}

pub(super) fn finish(
    config: Config,
    wall: std::time::Instant,
    ctx: &Ctx,
    faults: BTreeMap<String, u64>,
    mut violations: Vec<Violation>,
) -> Report {
    // Lockers whose commands are meant to time out, and the far one, whose waiters join a
    // fair line later than their calls say: neither is a reference for the fair order or the
    // watchdog check.
    for (i, actor) in ctx.actors.iter().enumerate() {
        for l in actor.generations() {
            let handed = l.stats().handed_over;
            ctx.stats.handed_over.fetch_add(handed, Ordering::Relaxed);
        }
        if actor.ran_frozen_layout() {
            ctx.history
                .ran_frozen_layout(u8::try_from(i).expect("a few lockers"));
        }
    }
    let unreliable: Vec<u8> = (0..ctx.actors.len())
        .filter(|&i| ctx.actors[i].tiny || ctx.actors[i].far)
        .map(|i| u8::try_from(i).expect("a few lockers"))
        .collect();
    violations.extend(invariants::check(&ctx.history, Instant::now(), &unreliable));
    let fair = super::fair::check(&ctx.history, &ctx.history.faults(), &unreliable).0;
    let shares = super::shares::check(&ctx.history, Instant::now()).0;
    let wall = wall.elapsed();
    let summary = summarize(config, wall, ctx, &faults, &violations, (fair, shares));
    let rendered = super::render::render(&ctx.history, &violations, PRINTED_PER_INVARIANT);
    let stats = Stats::default();
    for (to, from) in [
        (&stats.sessions, &ctx.stats.sessions),
        (&stats.calls, &ctx.stats.calls),
        (&stats.acquired, &ctx.stats.acquired),
        (&stats.busy, &ctx.stats.busy),
        (&stats.backend_errors, &ctx.stats.backend_errors),
        (&stats.dropped_futures, &ctx.stats.dropped_futures),
        (&stats.runs_cancelled, &ctx.stats.runs_cancelled),
        (&stats.grants, &ctx.stats.grants),
        (&stats.handed_over, &ctx.stats.handed_over),
    ] {
        to.store(from.load(Ordering::Relaxed), Ordering::Relaxed);
    }
    Report {
        config,
        wall,
        stats,
        guards: ctx.history.guards().len(),
        digest: ctx.history.digest(),
        fair,
        shares,
        latency: Latencies::of(&ctx.history),
        faults,
        violations,
        summary,
        rendered,
    }
}

fn names(p: Params) -> Vec<String> {
    (0..p.all_names())
        .map(|i| match i {
            _ if i == p.fair_name() => format!("fair{i}"),
            _ if i == p.semaphore_name() => format!("sem{i}"),
            _ if i == p.rw_name() => format!("rw{i}"),
            _ => format!("hot{i}"),
        })
        .collect()
}

/// Every key of each name (as `DEL` in a fault removes them), its lock key first: a lock's key,
/// a semaphore's permits, a read-write lock's write lock and its readers.
fn name_keys(first: &dlock_core::Locker, names: &[String], p: Params) -> Vec<Vec<String>> {
    let index = |i: usize| u8::try_from(i).expect("a few names");
    names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let base = first.key_of(n.as_str()).expect("a valid name");
            match index(i) {
                i if i == p.semaphore_name() => vec![format!("{base}:permits")],
                i if i == p.rw_name() => vec![format!("{base}:write"), format!("{base}:read")],
                _ => vec![base],
            }
        })
        .collect()
}

/// The run's context: its lockers, its names (the fair one among them) and its history.
pub(super) fn ctx(
    actors: Vec<Actor>,
    p: Params,
    admin: Option<redis::aio::ConnectionManager>,
) -> Arc<Ctx> {
    ctx_with_steady(actors, p, admin, &[], Vec::new())
}

/// [`ctx`], with steady names after the run's own (see `steady`), each taken in turn by the
/// lockers of its pair.
pub(super) fn ctx_with_steady(
    actors: Vec<Actor>,
    p: Params,
    admin: Option<redis::aio::ConnectionManager>,
    steady_names: &[String],
    pairs: Vec<(u8, u8)>,
) -> Arc<Ctx> {
    let mut names = names(p);
    let first_steady = u8::try_from(names.len()).expect("a few names");
    names.extend(steady_names.iter().cloned());
    let mut steady = Vec::new();
    for (i, &(a, b)) in pairs.iter().enumerate() {
        let name = first_steady + u8::try_from(i).expect("a few steady names");
        for locker in [a, b] {
            let worker = p.workers + u16::try_from(steady.len()).expect("a few steady tasks");
            steady.push(super::steady::Steady {
                worker,
                locker,
                name,
            });
        }
    }
    let labels = actors.iter().map(|a| a.label.clone()).collect();
    let name_keys = name_keys(&actors[0].locker(), &names, p);
    let keys = name_keys.iter().map(|k| k[0].clone()).collect();
    Arc::new(Ctx {
        history: Arc::new(History::new(
            names,
            labels,
            p.special(),
            p.dead_waiter_timeout,
        )),
        actors: Arc::new(actors),
        admin,
        keys,
        name_keys,
        stats: Stats::default(),
        halt: std::sync::atomic::AtomicBool::new(false),
        steady,
        steady_stopped: std::sync::OnceLock::new(),
    })
}

/// One run against a real `redis-server` (started here), on a multi-threaded runtime.
pub async fn run_redis(config: Config) -> Report {
    assert_ne!(
        config.family,
        FaultFamily::Memory,
        "a Redis run needs a Redis fault family"
    );
    let wall = std::time::Instant::now();
    let p = params(config.seed);
    let server = RedisServer::start();
    let proxy = Arc::new(Proxy::start(server.addr()).await);
    // A process farther away: what it sends arrives a quarter of a command timeout late.
    let far = Proxy::start_delayed(server.addr(), p.command_timeout / 4).await;
    let prefix = format!("chk-{}-{}:", config.seed, unique_name("run"));
    let setup = RedisSetup {
        url: server.url(),
        proxy_url: proxy.url(),
        far_url: Some(far.url()),
        prefix: prefix.clone(),
        watchdog_lease: p.watchdog_lease,
        command_timeout: p.command_timeout,
        tiny_timeout: p.tiny_timeout,
        fence_ttl: p.fence_ttl,
        dead_waiter_timeout: p.dead_waiter_timeout,
        mixed_layouts: config.mixed_layouts,
        built: Arc::default(),
    };
    let actors = setup.actors("warm-up").await;
    let admin = redis::aio::ConnectionManager::new(server.client())
        .await
        .expect("an admin connection");
    let server_client = server.client();
    let ctx = ctx(actors, p, Some(admin.clone()));
    let targets = Targets::Redis(RedisTargets {
        server: Some(Arc::new(Mutex::new(server))),
        proxy,
        admin: admin.clone(),
        keys: ctx.name_keys.clone(),
        setup,
        actors: ctx.actors.clone(),
    });
    let (stop_counting, stop) = watch::channel(false);
    let counting = tokio::spawn(super::grants::count(
        server_client,
        format!("{prefix}*:wake"),
        ctx.clone(),
        stop,
    ));
    let faults = drive(&ctx, &targets, config, p).await;
    let _ = stop_counting.send(true);
    let _ = counting.await;
    let mut leftovers = redis_leftovers(&ctx, &admin, &prefix, settle(p)).await;
    watchdog_probe(&ctx.actors, Some(&admin), &mut leftovers).await;
    let report = finish(config, wall, &ctx, faults, leftovers);
    eprintln!("{}", report.summary());
    drop(far);
    report
}

/// What a memory run's store clock reads at its start (2026-09-21): a fixed time, so a seed
/// replays with the same fencing tokens.
const MEMORY_CLOCK_AT: std::time::Duration = std::time::Duration::from_secs(1_790_000_000);

/// One run against lockers over one memory store. Meant for a paused clock
/// (`#[tokio::test(flavor = "current_thread", start_paused = true)]`): sleeps cost nothing. A
/// seed replays exactly: the same history, event for event ([`Report::digest`]).
pub async fn run_memory(config: Config) -> Report {
    assert_eq!(
        config.family,
        FaultFamily::Memory,
        "a memory run takes the memory faults"
    );
    let wall = std::time::Instant::now();
    let p = params(config.seed);
    // A clock of its own, the same on every run: fencing tokens and claims come from it.
    let store = MemoryStore::with_clock_at(MEMORY_CLOCK_AT);
    let prefix = format!("chk-{}:", config.seed);
    let timeouts = (p.watchdog_lease, p.dead_waiter_timeout);
    let actors = actors::memory_actors(&store, &prefix, timeouts, 4, config.mixed_layouts).await;
    let ctx = ctx(actors, p, None);
    let targets = Targets::Memory(MemoryTargets {
        store: store.clone(),
        keys: ctx.name_keys.clone(),
    });
    // The releases that grant the lock, counted as the Redis runs count them: by their
    // wake-up message.
    let counted = Arc::downgrade(&ctx);
    store.on_publish(move |_, message| {
        if message.starts_with('g')
            && let Some(ctx) = counted.upgrade()
        {
            ctx.stats.grants.fetch_add(1, Ordering::Relaxed);
        }
    });
    let faults = drive(&ctx, &targets, config, p).await;
    let mut leftovers = redis_leftovers(&ctx, &store.connection(), &prefix, settle(p)).await;
    fair_line_leftovers(&ctx, p, &mut leftovers).await;
    locker_leftovers(&ctx.actors, &mut leftovers);
    watchdog_probe(&ctx.actors, None, &mut leftovers).await;
    let report = finish(config, wall, &ctx, faults, leftovers);
    eprintln!("{}", report.summary());
    report
}
