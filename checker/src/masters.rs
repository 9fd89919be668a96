//! The checker on a [`MasterSet`]: three independent `redis-server`s and three clients, each a
//! majority set over lockers of its own (the third client reaches every master through a
//! proxy), under the faults a set of independent masters exists to survive:
//!
//! - a master hung (`SIGSTOP`: its connections stay open, nothing is answered), then resumed;
//! - a master killed, and restarted empty only once every lease it could hold has run out (the
//!   Redlock rule for masters without persistence: a restart must wait out the longest lease);
//! - the third client's connections to one master stalled (nothing forwarded) or cut;
//! - one master hung while another answers only in short spells between long stalls (as one
//!   that swaps does): rounds wait out the hung one's budget, and the other stops answering at
//!   any moment of a round — between its grant and the give-back of a round that got too few,
//!   too.
//!
//! None of these may cost anything that counted, so nothing is excused. What the run checks:
//!
//! - (a) mutual exclusion: no two guards of one name believe at once. A guard believes from
//!   the moment its acquisition returned until its release is sent, or until the validity it
//!   last read (`valid_until`, while `is_lost` was false) ends, whichever comes first;
//! - (e) a hung master costs a round one master budget: every acquisition returns within its
//!   wait, one budget for its last round and one for giving back what that round got (plus
//!   scheduling slack), and every grant keeps at least 90 % of its lease (less the same slack)
//!   — a round, or a give-back, that waits for a hung master's command timeout breaks these.
//!   The scheduler's own lateness while the call ran (as [`super::lag`] saw it) is added to
//!   both allowances: it says nothing about the budget;
//! - (d) nothing left behind: once every lease has run out, no lock key remains on a master;
//! - (e) no panics.
//!
//! Sessions and faults come from the seed ([`super::SEED_ENV`] replays one); timing does not.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use dlock_core::redis::{self, AsyncCommands as _};
use dlock_core::{LockError, Locker, MasterGuard, MasterSet};
use rand::rngs::StdRng;
use rand::{RngExt as _, SeedableRng as _};
use tokio::time::Instant;

use super::history::ms;
use super::invariants::{Invariant, Violation};
use super::lag::LagLog;
use super::{Config, FaultFamily};
use crate::{Proxy, RedisServer, unique_name};

/// Masters in the set; a majority is two.
const MASTERS: usize = 3;
/// Clients (majority sets), each with a locker per master; the last one through proxies.
const CLIENTS: usize = 3;
/// Workers per client.
const WORKERS: usize = 3;
/// Hot names, contended by every worker.
const NAMES: usize = 3;
/// The longest lease a session asks for.
const LONGEST_LEASE: Duration = Duration::from_millis(4_000);
/// Each locker's command timeout: longer than any master budget, as in a real deployment, so
/// that a round bounded by it (and not by the budget) shows.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);
/// A master's budget for one attempt: a sixteenth of the lease (the library's default).
const BUDGET_DIVISOR: u32 = 16;
/// Room for the scheduler of a busy machine, on every time bound.
const SLACK: Duration = Duration::from_millis(300);
/// The least share of its lease a grant keeps at the moment it is returned (less [`SLACK`]).
const KEPT_SHARE: f64 = 0.9;

/// What a master-set run reports besides its violations.
#[derive(Debug, Clone, Default)]
pub struct MastersFigures {
    /// Guards handed out.
    pub guards: usize,
    /// Acquisitions refused because the name was busy.
    pub refused: usize,
    /// Acquisitions that failed for another reason (too few masters answered in time).
    pub failed: usize,
    /// Grants whose acquisition ran while a master was hung or stalled.
    pub granted_while_hung: usize,
    /// The least share of its lease a grant kept when returned.
    pub least_kept: f64,
    /// The longest an acquisition took past its wait.
    pub longest_overrun: Duration,
    /// Faults injected, by kind.
    pub faults: BTreeMap<&'static str, u32>,
}

impl fmt::Display for MastersFigures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} guards ({} while a master hung), {} refused busy, {} failed; least lease kept \
             {:.3}, longest past the wait {:?}; faults {:?}",
            self.guards,
            self.granted_while_hung,
            self.refused,
            self.failed,
            self.least_kept,
            self.longest_overrun,
            self.faults
        )
    }
}

/// The outcome of a master-set run.
#[derive(Debug)]
pub struct MastersReport {
    /// What was run.
    pub config: Config,
    /// Every violation found.
    pub violations: Vec<Violation>,
    /// The figures.
    pub figures: MastersFigures,
}

impl MastersReport {
    /// Panics with the seed and every violation, if any.
    pub fn assert_clean(&self) {
        let found: Vec<String> = (self.violations.iter())
            .map(|v| format!("{}: {}", v.invariant, v.summary))
            .collect();
        assert!(
            found.is_empty(),
            "{} violations:\n{}\nfigures: {}\nreplay: {}={}",
            found.len(),
            found.join("\n"),
            self.figures,
            super::SEED_ENV,
            self.config.seed,
        );
    }
}

/// One acquisition, as its worker saw it.
#[derive(Debug, Clone)]
struct Attempt {
    client: usize,
    name: usize,
    wait: Duration,
    lease: Duration,
    call: Instant,
    returned: Instant,
    outcome: Outcome,
}

#[derive(Debug, Clone)]
enum Outcome {
    /// Granted: the validity when returned, and the end of the guard's belief.
    Granted {
        valid_until: Instant,
        belief_end: Instant,
    },
    Busy,
    Failed(String),
}

/// A fault as it ran.
#[derive(Debug, Clone, Copy)]
struct FaultRun {
    kind: &'static str,
    /// Whether a master (or one client's way to it) stopped answering without closing.
    hangs: bool,
    from: Instant,
    to: Instant,
}

type Shared<T> = Arc<Mutex<T>>;

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A checker run on three independent masters with majority sets (see the module's docs).
pub async fn run_masters(config: Config) -> MastersReport {
    assert_eq!(config.family, FaultFamily::Masters, "a master-set run");
    let duration = config.duration.unwrap_or(Duration::from_secs(40));
    let servers: Vec<RedisServer> =
        tokio::task::spawn_blocking(|| (0..MASTERS).map(|_| RedisServer::start()).collect())
            .await
            .expect("start the masters");
    let addrs: Vec<SocketAddr> = servers.iter().map(RedisServer::addr).collect();
    let mut proxies = Vec::new();
    for &addr in &addrs {
        proxies.push(Proxy::start(addr).await);
    }
    let prefix = format!("chk-{}-{}:", config.seed, unique_name("masters"));
    let mut sets = Vec::new();
    for client in 0..CLIENTS {
        let mut lockers = Vec::new();
        for (i, server) in servers.iter().enumerate() {
            let url = if client + 1 == CLIENTS {
                proxies[i].url()
            } else {
                server.url()
            };
            let locker = Locker::builder()
                .url(url)
                .prefix(&prefix)
                .command_timeout(COMMAND_TIMEOUT)
                .connect_timeout(Duration::from_millis(500))
                .build()
                .await
                .expect("a locker on one master");
            lockers.push(locker);
        }
        sets.push(MasterSet::majority(lockers).expect("three lockers"));
    }
    let servers = Arc::new(Mutex::new(servers));
    let attempts: Shared<Vec<Attempt>> = Arc::default();
    let faults: Shared<Vec<FaultRun>> = Arc::default();
    let origin = Instant::now();
    let end = origin + duration;
    let lags = Arc::new(LagLog::default());
    let (stop_lags, stop) = tokio::sync::watch::channel(false);
    let monitor = tokio::spawn({
        let lags = lags.clone();
        async move { lags.monitor(stop).await }
    });
    let mut tasks = Vec::new();
    for (client, set) in sets.iter().enumerate() {
        for w in 0..WORKERS {
            let seed = config.seed ^ ((client * WORKERS + w) as u64 + 1).wrapping_mul(0x9e37_79b9);
            let (set, attempts) = (set.clone(), attempts.clone());
            tasks.push(tokio::spawn(worker(client, set, seed, end, attempts)));
        }
    }
    let injector = tokio::spawn(inject(
        config.seed,
        end,
        servers.clone(),
        Arc::new(proxies),
        faults.clone(),
    ));
    let mut violations = Vec::new();
    for task in tasks {
        if let Err(err) = task.await {
            violations.push(panic_violation(&err.to_string()));
        }
    }
    if let Err(err) = injector.await {
        violations.push(panic_violation(&err.to_string()));
    }
    let _ = stop_lags.send(true);
    let _ = monitor.await;
    // Every lease (and every background release) has run out: nothing may remain.
    tokio::time::sleep(LONGEST_LEASE + Duration::from_millis(500)).await;
    let attempts = std::mem::take(&mut *locked(&attempts));
    let faults = std::mem::take(&mut *locked(&faults));
    let steps = lags.clock_steps();
    exclusion(&attempts, origin, &steps, &mut violations);
    let figures = budgets(&attempts, &faults, &lags, &mut violations);
    leftovers(&addrs, &prefix, &mut violations).await;
    drop(servers);
    eprintln!(
        "checker Masters: seed {}, {:?}, {} violations; {figures}",
        config.seed,
        duration,
        violations.len()
    );
    MastersReport {
        config,
        violations,
        figures,
    }
}

fn panic_violation(what: &str) -> Violation {
    Violation {
        invariant: Invariant::Panic,
        summary: format!("a task panicked: {what}"),
        window: None,
        hint: "",
    }
}

/// One worker: sessions on random names until `end` — acquire with a random wait (none, for a
/// `try_lock`) and lease, hold for a while (now and then past the lease), release or drop.
async fn worker(
    client: usize,
    set: MasterSet,
    seed: u64,
    end: Instant,
    attempts: Shared<Vec<Attempt>>,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    while Instant::now() < end {
        let name = rng.random_range(0..NAMES);
        let lease =
            Duration::from_millis(rng.random_range(1_500..=LONGEST_LEASE.as_millis() as u64));
        let wait = if rng.random_bool(0.3) {
            Duration::ZERO
        } else {
            Duration::from_millis(rng.random_range(50..=1_500))
        };
        let hold = if rng.random_bool(0.05) {
            lease + Duration::from_millis(200)
        } else {
            Duration::from_millis(rng.random_range(0..=150))
        };
        let drop_it = rng.random_bool(0.2);
        let request = set.lock(format!("n{name}")).lease(lease);
        let call = Instant::now();
        let result = if wait.is_zero() {
            request.try_lock().await
        } else {
            request.wait(wait).await.map(Some)
        };
        let returned = Instant::now();
        let outcome = match result {
            Ok(Some(guard)) => {
                let valid_until = guard.valid_until();
                let belief_end = hold_for(&guard, hold).await;
                if drop_it {
                    drop(guard);
                } else {
                    // Judged by the beliefs and the server's record, not by what it says here.
                    let _ = guard.release().await;
                }
                Outcome::Granted {
                    valid_until,
                    belief_end,
                }
            }
            Ok(None) => Outcome::Busy,
            Err(LockError::Masters(err)) if err.is_busy() => Outcome::Busy,
            Err(err) => Outcome::Failed(err.to_string()),
        };
        let busy = !matches!(outcome, Outcome::Granted { .. });
        locked(&attempts).push(Attempt {
            client,
            name,
            wait,
            lease,
            call,
            returned,
            outcome,
        });
        if busy {
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..=30))).await;
        }
    }
}

/// Holds `guard` for `hold` (or until it is lost), reading its validity every few
/// milliseconds as a careful user would; returns the end of its belief: when its release is
/// about to be sent, or the validity it last read while not lost, whichever is first.
async fn hold_for(guard: &MasterGuard, hold: Duration) -> Instant {
    let until = Instant::now() + hold;
    let mut promised = guard.valid_until();
    loop {
        let now = Instant::now();
        if now >= until || now >= promised || guard.is_lost() {
            return now.min(promised);
        }
        tokio::time::sleep((until - now).min(Duration::from_millis(10))).await;
        if !guard.is_lost() {
            promised = promised.max(guard.valid_until());
        }
    }
}

/// The seeded faults, one at a time, each waited out, until `end`.
async fn inject(
    seed: u64,
    end: Instant,
    servers: Shared<Vec<RedisServer>>,
    proxies: Arc<Vec<Proxy>>,
    faults: Shared<Vec<FaultRun>>,
) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x006d_a57e);
    let mut deck: Vec<u8> = Vec::new();
    loop {
        let gap = Duration::from_millis(rng.random_range(300..=1_200));
        tokio::time::sleep(gap).await;
        if Instant::now() + Duration::from_secs(3) >= end {
            return;
        }
        if deck.is_empty() {
            deck = vec![0, 0, 1, 2, 3, 4, 4];
            rand::seq::SliceRandom::shuffle(deck.as_mut_slice(), &mut rng);
        }
        let kind = deck.pop().unwrap_or(0);
        let master = rng.random_range(0..MASTERS);
        let span = Duration::from_millis(rng.random_range(300..=2_500));
        let from = Instant::now();
        let (name, hangs) = match kind {
            0 => {
                locked(&servers)[master].pause();
                tokio::time::sleep(span).await;
                locked(&servers)[master].resume();
                ("master hung", true)
            }
            1 => {
                let gone = servers.clone();
                tokio::task::spawn_blocking(move || locked(&gone)[master].kill())
                    .await
                    .expect("kill a master");
                // Empty after a restart: only once whatever it held has run out.
                tokio::time::sleep(span.max(LONGEST_LEASE + Duration::from_millis(200))).await;
                let back = servers.clone();
                tokio::task::spawn_blocking(move || locked(&back)[master].restart())
                    .await
                    .expect("restart a master");
                ("master killed", false)
            }
            2 => {
                proxies[master].stall();
                tokio::time::sleep(span).await;
                proxies[master].unstall();
                ("client stalled from a master", true)
            }
            3 => {
                proxies[master].cut();
                tokio::time::sleep(span).await;
                proxies[master].restore();
                ("client cut from a master", false)
            }
            _ => {
                let spells = (master + rng.random_range(1..MASTERS)) % MASTERS;
                locked(&servers)[master].pause();
                let until = Instant::now() + span * 2;
                while Instant::now() < until {
                    locked(&servers)[spells].pause();
                    tokio::time::sleep(Duration::from_millis(rng.random_range(700..=1_500))).await;
                    locked(&servers)[spells].resume();
                    tokio::time::sleep(Duration::from_millis(rng.random_range(5..=40))).await;
                }
                locked(&servers)[master].resume();
                ("a master hung, another answering in spells", true)
            }
        };
        locked(&faults).push(FaultRun {
            kind: name,
            hangs,
            from,
            to: Instant::now(),
        });
    }
}

/// (a) No two guards of one name believe at once (unless the machine's wall clock stepped
/// between their grants: Redis expires keys by it).
fn exclusion(
    attempts: &[Attempt],
    origin: Instant,
    steps: &[super::faults::FaultRec],
    out: &mut Vec<Violation>,
) {
    for name in 0..NAMES {
        let mut holds: Vec<(Instant, Instant, usize)> = (attempts.iter())
            .filter(|a| a.name == name)
            .filter_map(|a| match a.outcome {
                Outcome::Granted { belief_end, .. } => Some((a.returned, belief_end, a.client)),
                _ => None,
            })
            .filter(|h| h.0 < h.1)
            .collect();
        holds.sort_by_key(|h| h.0);
        for (i, a) in holds.iter().enumerate() {
            for b in holds[i + 1..].iter().take_while(|b| b.0 < a.1) {
                // The machine's wall clock stepped meanwhile: every master expired A's key.
                if steps.iter().any(|s| s.to >= a.0 && s.from <= b.0) {
                    continue;
                }
                out.push(Violation {
                    invariant: Invariant::MutualExclusion,
                    summary: format!(
                        "name n{name}: client {} believed it from {} to {}, client {} from {} \
                         to {}",
                        a.2,
                        ms(a.0 - origin),
                        ms(a.1 - origin),
                        b.2,
                        ms(b.0 - origin),
                        ms(b.1 - origin)
                    ),
                    window: None,
                    hint: "",
                });
            }
        }
    }
}

/// (e) Every acquisition answers within its wait and two master budgets (its last round, which
/// starts before the wait ends, and the give-back of a round that got too few), and every grant
/// keeps most of its lease; the figures.
fn budgets(
    attempts: &[Attempt],
    faults: &[FaultRun],
    lags: &LagLog,
    out: &mut Vec<Violation>,
) -> MastersFigures {
    let mut figures = MastersFigures {
        least_kept: 1.0,
        ..MastersFigures::default()
    };
    for f in faults {
        *figures.faults.entry(f.kind).or_default() += 1;
    }
    for a in attempts {
        let budget = a.lease / BUDGET_DIVISOR;
        let took = a.returned - a.call;
        let slack = SLACK + lags.max_within(a.call, a.returned);
        let overrun = took.saturating_sub(a.wait);
        figures.longest_overrun = figures.longest_overrun.max(overrun);
        if took > a.wait + budget * 2 + slack {
            out.push(Violation {
                invariant: Invariant::MasterBudget,
                summary: format!(
                    "an acquisition with a wait of {:?} and a {:?} lease (a master budget of \
                     {budget:?}) answered after {took:?}: {}",
                    a.wait,
                    a.lease,
                    describe(&a.outcome)
                ),
                window: None,
                hint: "",
            });
        }
        match a.outcome {
            Outcome::Granted { valid_until, .. } => {
                figures.guards += 1;
                let hung = (faults.iter()).any(|f| f.hangs && f.from < a.returned && f.to > a.call);
                figures.granted_while_hung += usize::from(hung);
                let kept = valid_until.saturating_duration_since(a.returned);
                let share = kept.as_secs_f64() / a.lease.as_secs_f64();
                figures.least_kept = figures.least_kept.min(share);
                if kept + slack < a.lease.mul_f64(KEPT_SHARE) {
                    out.push(Violation {
                        invariant: Invariant::MasterBudget,
                        summary: format!(
                            "a grant of a {:?} lease kept only {kept:?} when returned (the \
                             acquisition took {took:?}{})",
                            a.lease,
                            if hung { ", while a master hung" } else { "" }
                        ),
                        window: None,
                        hint: "",
                    });
                }
            }
            Outcome::Busy => figures.refused += 1,
            Outcome::Failed(_) => figures.failed += 1,
        }
    }
    figures
}

fn describe(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Granted { .. } => "granted".into(),
        Outcome::Busy => "busy".into(),
        Outcome::Failed(err) => format!("failed: {err}"),
    }
}

/// (d) No lock key of the run on any master.
async fn leftovers(addrs: &[SocketAddr], prefix: &str, out: &mut Vec<Violation>) {
    for addr in addrs {
        let client = redis::Client::open(format!("redis://{addr}/")).expect("a master's url");
        let mut con =
            (client.get_multiplexed_async_connection().await).expect("a connection to a master");
        let keys: Vec<String> = (con.keys(format!("{prefix}*")).await).expect("KEYS of the run");
        for key in keys.into_iter().filter(|k| !k.ends_with(":fence")) {
            let pttl: i64 = con.pttl(&key).await.unwrap_or(-3);
            out.push(Violation {
                invariant: Invariant::LeftBehind,
                summary: format!(
                    "lock key {key} remains on master {addr} after every lease ran out (PTTL \
                     {pttl} ms)"
                ),
                window: None,
                hint: "",
            });
        }
    }
}
