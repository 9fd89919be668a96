//! A randomized, seeded, replayable history checker for dlock-core, and the real Redis servers
//! it runs against.
//!
//! `dlock check` (the `dlock` command line, crate `dlock-cli`) runs it against a server of the
//! user's own with [`run_remote`]; dlock's own tests run it on the memory backend
//! ([`run_memory`]), on one server ([`run_redis`]), on a Redis Cluster ([`run_cluster`]), on a
//! Sentinel set-up ([`run_sentinel`]), on independent masters ([`run_masters`]) and on
//! PostgreSQL ([`run_postgres`]), with faults.
//!
//! A run starts several lockers on one backend, has many worker tasks run randomly generated
//! sessions over a few hot names (acquire with random waits and leases, `try_lock`, re-entry in a
//! `scope`, two acquisitions of one name side by side in one task, each in a nested scope of its
//! own as `#[distributed_lock]` calls run, `lock_all`, `extend`, `run`, release, drop, and futures
//! dropped half-way) while a
//! fault task injects random faults, records everything on one monotonic clock, and then checks
//! the history: (a) mutual exclusion and, on the run's one fair name (taken with `fair_lock`,
//! never in a `lock_all`), fair order, on its semaphore (permits, `set_permits`) the permit
//! bound, on its read-write lock (reads, writes, reads inside a writer's or a reader's scope)
//! no writer beside a reader, (b) fencing order (writers included), (c) truthful release outcomes, (d)
//! nothing left behind (fair lines included), (e) bounded calls and no panics. See
//! [`invariants`] for the details.
//!
//! [`run_remote`] runs it against a server it does not own (`dlock check`): for a given time
//! ([`Config::duration`]), on keys of its own that it deletes at the end, with no fault
//! ([`FaultFamily::Quiet`]) or only faults that touch its own keys and connections
//! ([`FaultFamily::Remote`]); the [`Report`] adds latencies and losses ([`Latencies`]).
//!
//! # Seeds and replay
//!
//! `DLOCK_CHECKER_SEED=<n>` replays a seed: the sessions every worker runs and the sequence of
//! faults are generated from it up front, so they are the same on every run of that seed. What is
//! *not* replayed is timing: against a real Redis (and a real scheduler) the interleaving of the
//! workers, the moments faults land and what each call returns differ from run to run, so a seed
//! that found a violation finds it again only with some probability. Against the memory backend
//! on a paused clock a seed replays exactly: the same history, event for event, on every run
//! ([`Report::digest`]; ARCHITECTURE.md, "A seed replays", says what makes it so).
//! Without the variable a random seed is drawn and printed. `DLOCK_CHECKER_OPS=<n>` sets the
//! number of sessions (operations) per run, for a long soak.
//!
//! # The servers
//!
//! The runs start real processes, as the tests do:
//!
//! - [`RedisServer`] spawns `redis-server` (the binary named by `DLOCK_REDIS_SERVER`, default
//!   `redis-server`) with `--save ""` and a log file in a temporary directory, polls until it
//!   answers, and kills it on drop. It can be killed, restarted on the same port, paused
//!   (`SIGSTOP`) and resumed. While a server lives, every panic message is followed by the tail
//!   of its log.
//! - [`Proxy`] forwards a loopback port to a server and can cut, stall or retarget every
//!   connection through it.
//! - [`RedisCluster`] ([`cluster`]) is a Redis Cluster of three masters and three replicas,
//!   [`RedisSentinel`] ([`sentinel`]) a master, a replica and three sentinels: real processes,
//!   with failovers, kills, pauses and slot migrations on demand.
//! - [`hold`] reads a lock's key as Redis holds it, with dlock-core's own codec.
//!
//! A missing `redis-server` binary is a loud failure naming the command that installs it.

mod admin;
pub mod cluster;
pub mod hold;
pub mod layouts;
mod postgres;
mod proxy;
pub mod sentinel;
mod server;

pub use cluster::RedisCluster;
pub use postgres::PostgresServer;
pub use proxy::Proxy;
pub use sentinel::RedisSentinel;
pub use server::{
    REDIS_SERVER_ENV, RedisServer, free_port, redis_server_binary, require_redis_server,
    script_calls, unique_name,
};

mod actors;
mod bounded;
mod distributed;
pub mod fair;
mod faults;
mod grants;
mod history;
pub mod invariants;
mod lag;
pub mod latency;
mod leftovers;
mod masters;
mod on_postgres;
mod ops;
mod plan;
mod refusals;
mod remote;
mod render;
mod run;
mod sample;
pub mod shares;
mod steady;
mod tracked;
mod wakeups;
mod watchdog;

pub use distributed::{Figures, run_cluster, run_sentinel};
pub use fair::FairFigures;
pub use faults::FaultFamily;
pub use history::{History, HistoryDigest};
pub use invariants::{Invariant, Violation};
pub use latency::{Latencies, Spread};
pub use masters::{MastersFigures, MastersReport, run_masters};
pub use on_postgres::run_postgres;
pub use ops::SLACK;
pub use remote::{Remote, RemoteError, run_remote};
pub use run::{Report, run_memory, run_redis};
pub use shares::ShareFigures;

/// The environment variable that replays a seed.
pub const SEED_ENV: &str = "DLOCK_CHECKER_SEED";
/// The environment variable that sets the number of operations per run.
pub const OPS_ENV: &str = "DLOCK_CHECKER_OPS";
/// The environment variable that sets the length of a timed run, in seconds.
pub const SECS_ENV: &str = "DLOCK_CHECKER_SECS";

/// What to run.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// The seed everything is generated from.
    pub seed: u64,
    /// How many sessions (operations) the workers run in all.
    pub ops: usize,
    /// Which faults.
    pub family: FaultFamily,
    /// Run for this long instead: the workers start sessions until it has passed (`ops` is
    /// then ignored; sessions are drawn from the seed in batches as they are needed).
    pub duration: Option<std::time::Duration>,
    /// Every other locker of a memory or single-server run runs layout 1's frozen scripts
    /// ([`layouts::layout_1`]) beside this version's: a fleet in the middle of a rolling
    /// deploy. The invariants are the same.
    pub mixed_layouts: bool,
}

impl Config {
    /// The seed from [`SEED_ENV`] (or a random one), the count from [`OPS_ENV`] (or
    /// `default_ops`); prints the seed and how to replay it.
    pub fn from_env(family: FaultFamily, default_ops: usize) -> Self {
        let seed = match std::env::var(SEED_ENV) {
            Ok(s) => s
                .trim()
                .parse()
                .unwrap_or_else(|_| panic!("{SEED_ENV}={s:?} is not a u64")),
            Err(_) => rand::random(),
        };
        let ops = match std::env::var(OPS_ENV) {
            Ok(s) => s
                .trim()
                .parse()
                .unwrap_or_else(|_| panic!("{OPS_ENV}={s:?} is not a count")),
            Err(_) => default_ops,
        };
        eprintln!("checker {family:?}: seed {seed} ({SEED_ENV}={seed} replays it)");
        Self {
            seed,
            ops,
            family,
            duration: None,
            mixed_layouts: false,
        }
    }
}
