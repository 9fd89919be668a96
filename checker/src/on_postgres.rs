//! One run against a real PostgreSQL (a private cluster made with `initdb`): lockers whose locks
//! are session advisory locks, and the faults that end sessions under them.
//!
//! The run's names are plain locks (PostgreSQL offers no fair lock: the fair name is a plain
//! one here), a semaphore (its count its handles', never set at run time) and a read-write
//! lock, taken every way the plan takes them: waiting, `try_lock`, re-entry, side by side, in
//! a local line, in a `lock_all`, several permits at once, extended, run, dropped half-way. Two
//! lockers reach the server directly, one through a proxy. The faults:
//!
//! - a session killed (`pg_terminate_backend`): the one that holds a given name (a lock, a
//!   permit slot, a read or a write), or every session of the lockers at once (the listeners'
//!   too);
//! - the server paused (`SIGSTOP` to every process of it), or the proxied locker's connections
//!   stalled, for up to a third of the command timeout: nothing is lost unless a query was slow
//!   already and goes unanswered past its timeout (its locker then drops the connection, and
//!   the server ends that session);
//! - the server restarted as a crash would (its sequence survives; every session ends);
//! - the proxied locker's connections cut (the server ends each session at once).
//!
//! A session's locks are free the moment it ends, while their guards believe them until the
//! next renewal says otherwise: a fault that ended sessions is recorded as
//! [`FaultKind::SessionEnded`] (or [`FaultKind::Restart`]) over the names those sessions held,
//! read from `pg_locks` (in the statement that kills the session; before a pause or a stall,
//! for the sessions gone after it). That excuses an overlap on those names and counts it, as a
//! Redis `DEL` does. Nothing else may cost a hold. A release wakes its waiters in time (the
//! wake-up bound of `wakeups.rs`: a claim to the next turn left behind would break it). At the
//! end, once every guard is gone and every lease ran out, no advisory lock may be left in
//! `pg_locks`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_core::{Lease, Locker};
use tokio::time::Instant;

use super::actors::Actor;
use super::faults::{FaultKind, FaultSpec, Reach, Targets};
use super::history::locked;
use super::invariants::{Invariant, Violation};
use super::leftovers::locker_leftovers;
use super::run::{Report, ctx, drive, finish, params, settle, watchdog_probe};
use super::{Config, FaultFamily};
use crate::{PostgresServer, Proxy, unique_name};

/// The locker whose connections go through the proxy (the last one).
const PROXIED: u8 = 2;

/// How long an admin query may take.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(5);

/// What the PostgreSQL injector acts on.
#[derive(Debug)]
pub(crate) struct PgTargets {
    server: Arc<Mutex<PostgresServer>>,
    proxy: Arc<Proxy>,
    url: String,
    /// What maps `pg_locks` back to the run's names.
    keys: NameKeys,
    /// The longest a pause or a stall lasts: a third of the command timeout, so that a query
    /// goes unanswered past its timeout (and its session ends) only if it was slow already.
    short: Duration,
}

/// Each advisory lock held, by session: `(pid, key)`.
const HELD: &str = "SELECT pid::bigint, (classid::bigint << 32) | objid::bigint FROM pg_locks \
                    WHERE locktype = 'advisory' AND objsubid = 1 AND granted";

/// The lockers' sessions (the listeners' among them).
const SESSIONS: &str = "SELECT pid::bigint FROM pg_stat_activity WHERE application_name = 'dlock'";

/// Ends a session that holds an advisory key `k` with `k & $2 = $1` (`$2`: all bits, or a
/// permit slot block's), if one does, and lists the keys it held, in one statement: it can take
/// no other lock in between.
const TERMINATE_HOLDER: &str = "WITH victim AS (\
        SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 AND granted \
        AND ((classid::bigint << 32) | objid::bigint) & $2 = $1 LIMIT 1), \
    held AS (\
        SELECT (l.classid::bigint << 32) | l.objid::bigint AS key FROM pg_locks l, victim v \
        WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted AND l.pid = v.pid), \
    ended AS (SELECT pg_terminate_backend(pid) AS ok FROM victim) \
    SELECT key FROM held, ended WHERE ended.ok";

/// Ends every session of the lockers.
const TERMINATE_ALL: &str = "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                             WHERE application_name = 'dlock'";

/// The advisory key of `lock_key` (see dlock-core's `backend/postgres/keys.rs`).
fn advisory_key(lock_key: &str) -> i64 {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(lock_key.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(first)
}

/// The bits a semaphore's permit slots share (see dlock-core's `backend/postgres/shared.rs`).
const SLOT_BLOCK: i64 = !0xFFFF;

/// The advisory keys of the run's names, as dlock-core computes them.
#[derive(Debug)]
struct NameKeys {
    /// Each name's key its holders hold: `(key, mask)` — a lock's or a read-write lock's
    /// writer's key (every bit counts), or the first of a semaphore's slots (its block counts).
    victims: Vec<(i64, i64)>,
    /// Every key of a name but its permit slots: a lock's, a writer's, a waiting writer's gate.
    exact: std::collections::HashMap<i64, u8>,
    /// The semaphore's slots' block.
    slots: (i64, u8),
}

impl NameKeys {
    /// The keys of the names whose first keys are `lock_keys` (a lock's, the semaphore's
    /// permits', the read-write lock's writer's); `semaphore` and `rw` are the indices of the
    /// semaphore's and the read-write lock's.
    fn new(lock_keys: &[String], semaphore: u8, rw: u8) -> Self {
        let mut victims = Vec::new();
        let mut exact = std::collections::HashMap::new();
        let mut slots = (0, semaphore);
        for (i, key) in lock_keys.iter().enumerate() {
            let i = u8::try_from(i).expect("a few names");
            if i == semaphore {
                let first = advisory_key(key) & SLOT_BLOCK;
                slots = (first, i);
                victims.push((first, SLOT_BLOCK));
            } else if i == rw {
                let write = advisory_key(key);
                exact.insert(write, i);
                exact.insert(advisory_key(&format!("{key}:waiting")), i);
                victims.push((write, -1));
            } else {
                let lock = advisory_key(key);
                exact.insert(lock, i);
                victims.push((lock, -1));
            }
        }
        Self {
            victims,
            exact,
            slots,
        }
    }

    /// The name advisory key `key` belongs to, if any.
    fn name_of(&self, key: i64) -> Option<u8> {
        (self.exact.get(&key).copied())
            .or_else(|| (key & SLOT_BLOCK == self.slots.0).then_some(self.slots.1))
    }
}

impl PgTargets {
    /// An admin session of its own for each query: the server may have restarted since.
    async fn admin(&self) -> Option<sqlx::PgConnection> {
        use sqlx::Connection as _;
        let connect = sqlx::PgConnection::connect(&self.url);
        tokio::time::timeout(ADMIN_TIMEOUT, connect)
            .await
            .ok()?
            .ok()
    }

    /// Runs `query` (with `args` bound) on an admin session: its rows, `None` if it failed.
    async fn rows<T>(&self, query: &'static str, args: &[i64]) -> Option<Vec<T>>
    where
        T: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> + Send + Unpin,
    {
        let mut admin = self.admin().await?;
        let mut q = sqlx::query_as::<_, T>(query);
        for arg in args {
            q = q.bind(*arg);
        }
        tokio::time::timeout(ADMIN_TIMEOUT, q.fetch_all(&mut admin))
            .await
            .ok()?
            .ok()
    }

    /// The run's names among advisory `keys`.
    fn names_of(&self, keys: impl IntoIterator<Item = i64>) -> Reach {
        let names: std::collections::BTreeSet<u8> = keys
            .into_iter()
            .filter_map(|k| self.keys.name_of(k))
            .collect();
        Reach::names(names)
    }

    /// Runs `fault` (a pause or a stall meant to end no session), then sees whether it ended
    /// sessions all the same: those of the lockers' that were there before and are gone after.
    /// Their holds before it are what it may have destroyed.
    async fn measured(&self, fault: impl std::future::Future<Output = ()>) -> Option<Reach> {
        let held: Vec<(i64, i64)> = self.rows(HELD, &[]).await.unwrap_or_default();
        let before: Vec<(i64,)> = self.rows(SESSIONS, &[]).await.unwrap_or_default();
        fault.await;
        let after: Vec<(i64,)> = self.rows(SESSIONS, &[]).await?;
        let ended: Vec<i64> = (before.into_iter())
            .filter(|b| !after.contains(b))
            .map(|(pid,)| pid)
            .collect();
        if ended.is_empty() {
            return None;
        }
        Some(
            self.names_of(
                (held.into_iter())
                    .filter(|(pid, _)| ended.contains(pid))
                    .map(|(_, k)| k),
            ),
        )
    }

    /// Carries out one fault: what it was and what it reached (nothing: it did nothing).
    pub(crate) async fn apply(&self, fault: FaultSpec) -> Vec<(FaultKind, Reach)> {
        match fault {
            FaultSpec::Del(n) if n % 5 == 0 => {
                let ended = self.rows::<(i64,)>(TERMINATE_ALL, &[]).await;
                (ended.is_some_and(|e| e.first().is_some_and(|(n,)| *n > 0)))
                    .then_some((FaultKind::SessionEnded, Reach::ALL))
                    .into_iter()
                    .collect()
            }
            FaultSpec::Del(n) => {
                let victims = &self.keys.victims;
                let (key, mask) = victims[usize::from(n) % victims.len()];
                let held =
                    (self.rows::<(i64,)>(TERMINATE_HOLDER, &[key, mask]).await).unwrap_or_default();
                if held.is_empty() {
                    return Vec::new();
                }
                vec![(
                    FaultKind::SessionEnded,
                    self.names_of(held.into_iter().map(|(k,)| k)),
                )]
            }
            FaultSpec::Pause(d) | FaultSpec::FlushThenPause(d) => {
                let server = self.server.clone();
                let d = d.min(self.short);
                let pause = blocking(move || {
                    let server = locked(&server);
                    server.pause();
                    std::thread::sleep(d);
                    server.resume();
                });
                let ended = self.measured(pause).await;
                std::iter::once((FaultKind::Stall, Reach::ALL))
                    .chain(ended.map(|r| (FaultKind::SessionEnded, r)))
                    .collect()
            }
            FaultSpec::Restart { down } => {
                let server = self.server.clone();
                blocking(move || {
                    let server = locked(&server);
                    std::thread::sleep(down);
                    server.restart();
                })
                .await;
                vec![(FaultKind::Restart, Reach::ALL)]
            }
            FaultSpec::Cut(d) => {
                self.proxy.cut();
                tokio::time::sleep(d).await;
                self.proxy.restore();
                vec![(FaultKind::SessionEnded, Reach::ALL.through(PROXIED))]
            }
            FaultSpec::Stall(d) | FaultSpec::StallReplies { span: d, .. } => {
                let d = d.min(self.short);
                let stall = async {
                    self.proxy.stall();
                    tokio::time::sleep(d).await;
                    self.proxy.unstall();
                };
                let ended = self.measured(stall).await;
                std::iter::once((FaultKind::Stall, Reach::ALL.through(PROXIED)))
                    .chain(ended.map(|r| (FaultKind::SessionEnded, r)))
                    .collect()
            }
            other => unreachable!("fault {other:?} planned for PostgreSQL"),
        }
    }

    /// Undoes what a fault may have left on.
    pub(crate) fn settle(&self) {
        self.proxy.restore();
        self.proxy.unstall();
        locked(&self.server).resume();
    }
}

async fn blocking(f: impl FnOnce() + Send + 'static) {
    tokio::task::spawn_blocking(f)
        .await
        .expect("a blocking fault task");
}

/// One run against a PostgreSQL server started here, on a multi-threaded runtime.
pub async fn run_postgres(config: Config) -> Report {
    assert_eq!(
        config.family,
        FaultFamily::Postgres,
        "a PostgreSQL run takes the PostgreSQL faults"
    );
    let wall = std::time::Instant::now();
    let p = params(config.seed);
    let server = PostgresServer::start();
    let proxy = Arc::new(Proxy::start(server.addr()).await);
    let prefix = format!("chk-{}-{}:", config.seed, unique_name("pg"));
    let url = server.url();
    let urls = [
        url.clone(),
        url.clone(),
        PostgresServer::url_at(proxy.port()),
    ];
    let mut actors = Vec::new();
    for (i, at) in urls.iter().enumerate() {
        let l = Locker::builder()
            .postgres_url(at.clone())
            .prefix(prefix.clone())
            .default_lease(Lease::watchdog(p.watchdog_lease))
            .command_timeout(p.command_timeout)
            .connect_timeout(p.command_timeout.max(Duration::from_millis(500)))
            .build()
            .await
            .expect("a locker on PostgreSQL");
        let label = if i == usize::from(PROXIED) {
            "proxied".to_owned()
        } else {
            format!("locker-{i}")
        };
        actors.push(Actor::new(&label, p.command_timeout, p.watchdog_lease, l));
    }
    let ctx = ctx(actors, p, None);
    let targets = Targets::Postgres(PgTargets {
        server: Arc::new(Mutex::new(server)),
        proxy,
        url,
        keys: NameKeys::new(&ctx.keys, p.semaphore_name(), p.rw_name()),
        short: p.command_timeout / 3,
    });
    let faults = drive(&ctx, &targets, config, p).await;
    let Targets::Postgres(t) = &targets else {
        unreachable!("PostgreSQL targets")
    };
    let mut leftovers = advisory_leftovers(t, settle(p)).await;
    locker_leftovers(&ctx.actors, &mut leftovers);
    // (e) Every locker here waits by `LISTEN`: a release wakes a waiter in time, and no claim
    // to the next turn keeps the name from everyone.
    let faults_seen = ctx.history.faults();
    let waits = (&[][..], Duration::ZERO);
    super::wakeups::check(&ctx.history, &faults_seen, waits, &mut leftovers);
    watchdog_probe(&ctx.actors, None, &mut leftovers).await;
    let report = finish(config, wall, &ctx, faults, leftovers);
    eprintln!("{}", report.summary());
    report
}

/// (d) once every guard is gone: after every lease ran out (and the backend unlocked what it
/// keeps for a lease), no session holds an advisory lock.
async fn advisory_leftovers(t: &PgTargets, settle: Duration) -> Vec<Violation> {
    let deadline = Instant::now() + settle;
    let query = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted";
    loop {
        let held = match t.admin().await {
            Some(mut admin) => sqlx::query_scalar::<_, i64>(query)
                .fetch_one(&mut admin)
                .await
                .ok(),
            None => None,
        };
        if held == Some(0) {
            return Vec::new();
        }
        if Instant::now() >= deadline {
            return vec![Violation {
                invariant: Invariant::LeftBehind,
                summary: format!(
                    "{} advisory lock(s) still held {} after the last session ended",
                    held.map_or_else(|| "unknown (no answer)".to_owned(), |n| n.to_string()),
                    super::history::ms(settle)
                ),
                window: None,
                hint: "a release, a lease's end or a lost session left a lock taken",
            }];
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
