//! The fault injector: a plan drawn from the seed (pauses, deletes, restarts, cuts, time jumps)
//! and the task that carries it out while the workers run, recording each fault (its kind, the
//! name it hits) with the span it may have acted in.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_core::MemoryStore;
use dlock_core::redis::{self, AsyncCommands as _};
use rand::rngs::StdRng;
use rand::{RngExt as _, SeedableRng as _};
use tokio::sync::watch;
use tokio::time::Instant;

use super::actors::{Actor, MULTIPLEXED, RedisSetup};
use super::history::{History, locked};
use crate::{Proxy, RedisServer};

/// What kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// `CLIENT PAUSE <ms> WRITE`.
    Pause,
    /// `DEL` of a lock key (or `MemoryStore::delete`).
    Del,
    /// The server killed, down for a while, and restarted (its data gone).
    Restart,
    /// The proxy cut every connection and refused new ones for a while.
    Cut,
    /// Virtual time jumped forward (memory backend).
    Jump,
    /// A foreign value written over a lock key (`SET ... PX`), until it expires.
    Clobber,
    /// The proxy forwarded nothing for a while (its lockers' commands went unanswered).
    Stall,
    /// The proxy held back the server's answers for a while, while its lockers' commands still
    /// reached the server: they ran at once, and their answers came late — a reply that was
    /// true when the server gave it may be stale when it arrives.
    ReplyStall,
    /// A [`ReplyStall`](Self::ReplyStall) that ended with the proxy closing its connections:
    /// the answers held back never arrived. A command that ran was not answered, and a client
    /// that sends it again finds what the first run left.
    ReplyCut,
    /// A coordinated failover (`CLUSTER FAILOVER`): the replica caught up before it took over.
    /// It ends when the replica says it is the master.
    Failover,
    /// What follows a [`Failover`](Self::Failover) until every node agrees on it: the old master
    /// may still take itself for the master and hold writes back, so it excuses a late or failed
    /// command. It excuses no lost wake-up: a release the new master ran was published there,
    /// and a subscription in the right place hears it.
    Promoted,
    /// `SENTINEL FAILOVER` with writes counted once the master has them: the old master stays
    /// writable for a while, and what is written there is lost.
    Switch,
    /// A master killed, its replica promoted, the old one restarted as a replica; writes the
    /// replica had not received are lost.
    MasterKilled,
    /// As [`Switch`](Self::Switch) or [`MasterKilled`](Self::MasterKilled), for lockers whose
    /// writes count only once a replica acknowledged them: nothing that counted is lost.
    AckedFailover,
    /// A replica paused (`SIGSTOP`) for a while: it lags.
    ReplicaPaused,
    /// A master paused (`SIGSTOP`) for less than the cluster's node timeout: nobody fails it
    /// over, and it loses nothing, but it answers nothing meanwhile — its names can't be taken,
    /// given back or renewed, and their waiters hear nothing. The other masters' names must go
    /// on as if nothing happened.
    MasterHung,
    /// One client cut off from the servers for a while (the others not): nothing is lost, so
    /// it excuses nothing.
    Partition,
    /// One client cut off from one node of a cluster for a while: it reaches only what that
    /// client holds in that node's slots.
    NodeCut,
    /// A slot resharded to another master with its keys, staying open (keys on both sides)
    /// for a while: nothing is lost, and it reaches only the names of that slot.
    Migration,
    /// A master without a replica that acknowledges yet (after a `SENTINEL FAILOVER`, until the
    /// old master follows; on a cluster, while a replica syncs after a failover, a kill or a
    /// pause): writes counted once a replica has them fail meanwhile. Nothing is lost.
    /// Recorded in acknowledged runs only.
    Resync,
    /// One sentinel of three paused (`SIGSTOP`): it hears and says nothing. It loses nothing by
    /// itself (the failover it spans is recorded on its own).
    SentinelMute,
    /// The machine's wall clock stepped (forward or back), seen by the lag monitor, not injected:
    /// Redis expires keys by that clock, so a step forward ends every lease at once. It reaches
    /// every name, and excuses what a destroyed hold excuses.
    ClockStep,
    /// The whole cluster refusing commands (`CLUSTERDOWN`) while a master was failing, as
    /// Redis does by default until its replica takes over: nothing is lost, but no hold on any
    /// master can be renewed meanwhile.
    ClusterDown,
    /// A replica paused on a cluster, as it reaches the clients: one that reads the slot map
    /// meanwhile may ask the paused node and wait on it, and the cluster client (redis-rs) does
    /// that under a lock that holds up every command of the client, to every node, until the
    /// node answers or times out. So it may delay any name's commands — not the watchdog's
    /// renewals, which go to each master on a connection of their own. It loses nothing.
    SlotMapStall,
    /// PostgreSQL sessions ended under their holds: killed (`pg_terminate_backend`), or dropped
    /// by their locker when a query went unanswered (the server paused, the connection cut or
    /// stalled), the server ending them when it sees that. Their locks are free at once, while
    /// their guards believe them until the next renewal.
    SessionEnded,
}

impl FaultKind {
    /// Whether it destroys holds (and so excuses an overlap).
    pub fn destructive(self) -> bool {
        matches!(
            self,
            Self::Del
                | Self::Restart
                | Self::Clobber
                | Self::Switch
                | Self::MasterKilled
                | Self::SessionEnded
                | Self::ClockStep
        )
    }
}

/// What one fault reaches: some names (or all), through every locker or one.
///
/// A fault on one node of a cluster reaches the names whose slots that node serves, and a
/// partition reaches one client: a hold outside its reach lost while it acted is a fault of
/// dlock's, not of the deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reach {
    /// One bit per name (bit `n`: name `n`).
    names: u64,
    /// The one locker it reaches (`None`: every locker).
    locker: Option<u8>,
}

impl Reach {
    /// Every name, through every locker.
    pub const ALL: Self = Self {
        names: u64::MAX,
        locker: None,
    };

    /// One name, through every locker.
    pub fn name(name: u8) -> Self {
        Self::names([name])
    }

    /// These names, through every locker.
    pub fn names(names: impl IntoIterator<Item = u8>) -> Self {
        let names =
            (names.into_iter()).fold(0, |bits, n| bits | 1u64.checked_shl(n.into()).unwrap_or(0));
        Self {
            names,
            locker: None,
        }
    }

    /// The same names, through `locker` alone.
    pub fn through(self, locker: u8) -> Self {
        Self {
            locker: Some(locker),
            ..self
        }
    }

    /// Whether it reaches `name` (through some locker).
    pub fn hits(&self, name: u8) -> bool {
        1u64.checked_shl(name.into())
            .is_some_and(|bit| self.names & bit != 0)
    }

    /// Whether it reaches what `locker` holds of `name`.
    pub fn hits_hold(&self, name: u8, locker: u8) -> bool {
        self.hits(name) && self.locker.is_none_or(|l| l == locker)
    }

    /// The names it reaches, as `[0, 2]`, or `all names`; and the locker, if one.
    pub fn describe(&self, names: &[String]) -> String {
        let what = if self.names == u64::MAX {
            "all names".to_owned()
        } else {
            let hit: Vec<&str> = (names.iter().enumerate())
                .filter(|(i, _)| u8::try_from(*i).is_ok_and(|n| self.hits(n)))
                .map(|(_, n)| n.as_str())
                .collect();
            hit.join(", ")
        };
        match self.locker {
            Some(l) => format!("{what} through locker {l}"),
            None => what,
        }
    }
}

/// One fault, over the span it may have acted in.
#[derive(Debug, Clone, Copy)]
pub struct FaultRec {
    /// What.
    pub kind: FaultKind,
    /// What it reaches.
    pub reach: Reach,
    /// From when.
    pub from: Instant,
    /// Until when.
    pub to: Instant,
}

impl FaultRec {
    /// Whether it hits `name`.
    pub fn hits(&self, name: u8) -> bool {
        self.reach.hits(name)
    }
}

/// Which faults a run injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultFamily {
    /// `CLIENT PAUSE .. WRITE`, external `DEL`s, and foreign values written over lock keys.
    PauseAndDel,
    /// Server kills and restarts, and external `DEL`s.
    Restart,
    /// The proxy cutting connections or stalling them (a server that stops answering), and
    /// external `DEL`s.
    ProxyCut,
    /// All of the above.
    Mixed,
    /// Memory backend: `MemoryStore::delete` and virtual-time jumps past the leases.
    Memory,
    /// A Redis Cluster: coordinated failovers, masters killed (and restarted as replicas),
    /// replicas paused, one client partitioned from every node, external `DEL`s.
    Cluster,
    /// Redis Sentinel: `SENTINEL FAILOVER`, the master killed (and restarted), the replica
    /// paused, one client partitioned from the master, external `DEL`s.
    Sentinel,
    /// A server the run does not own (`dlock check --faults`): only what touches the run's own
    /// keys and connections — the proxy cutting or stalling its connections, `DEL`s of its lock
    /// keys and foreign values written over them. Never a pause or a restart.
    Remote,
    /// No faults at all (`dlock check` without `--faults`).
    Quiet,
    /// PostgreSQL: sessions killed (`pg_terminate_backend`), the server paused (`SIGSTOP`) and
    /// restarted, one client's connections cut or stalled (see `run_postgres`).
    Postgres,
    /// Independent masters under a `MasterSet`: a master hung or killed (restarted empty once
    /// its leases ran out), one client stalled or cut from one master. The run deals these
    /// itself (see `run_masters`).
    Masters,
}

/// One planned fault.
#[derive(Debug, Clone, Copy)]
pub(crate) enum FaultSpec {
    Pause(Duration),
    /// The server's scripts and functions gone (`SCRIPT FLUSH`, `FUNCTION FLUSH`), then a
    /// pause: every locker's next script is refused (`NOSCRIPT`, "Function not found") and sent
    /// again once loaded, so commands held up by the pause reach the server later still, one at
    /// a time.
    FlushThenPause(Duration),
    Del(u8),
    Restart {
        down: Duration,
    },
    Cut(Duration),
    Jump(Duration),
    /// A foreign value written over a lock key, expiring after the duration.
    Clobber(u8, Duration),
    /// The proxy forwarding nothing (connections stay open) for a while.
    Stall(Duration),
    /// The proxy holding back the server's answers alone for a while; with `then_cut`, its
    /// connections then closed with the answers still held back (new ones accepted at once),
    /// so a command that ran is never answered on the connection it came by.
    StallReplies {
        span: Duration,
        then_cut: bool,
    },
    /// A failover of the master of a name's slot (of the master, with Sentinel).
    Failover(u8),
    /// The master of a name's slot killed, down at least this long, then restarted.
    KillMaster(u8, Duration),
    /// The master of a name's slot killed and kept down until its replica has taken over and
    /// every locker that follows the cluster was seen to reach it, then restarted.
    KillMasterForGood(u8),
    /// The replica of a name's master paused for a while.
    PauseReplica(u8, Duration),
    /// The master of a name's slot paused for a while, shorter than the node timeout.
    HangMaster(u8, Duration),
    /// One client cut off from every node for a while: its connections stall (a partition that
    /// drops packets) or, if `cut`, are closed and refused.
    Partition {
        span: Duration,
        cut: bool,
    },
    /// One client cut off from the master of a name's slot alone (as [`Partition`](Self::Partition)).
    CutNode {
        name: u8,
        span: Duration,
        cut: bool,
    },
    /// A name's slot resharded to another master, left open (its lock key moved, its other keys
    /// not yet) for a while.
    Migrate(u8, Duration),
    /// One sentinel paused (`SIGSTOP`) for a while, across a `SENTINEL FAILOVER`.
    MuteSentinel {
        index: u8,
        span: Duration,
    },
}

/// A restart costs a new process and every connection: at most one per this much planned time.
const MIN_RESTART_INTERVAL: Duration = Duration::from_secs(4);

/// The endless, seeded sequence of faults (gap before each, fault).
#[derive(Debug)]
pub(crate) struct FaultPlan {
    rng: StdRng,
    family: FaultFamily,
    names: u8,
    longest_lease: Duration,
    since_restart: Duration,
    /// Distributed families draw kinds from a shuffled deck holding each kind they inject, so
    /// that a run of a few decks' length sees several faults of every kind.
    deck: Vec<usize>,
    /// The steady names (see [`super::steady`]), which a fault aimed at one name's master or
    /// slot targets three times in four: they have one waiter per release and holds that live
    /// through the fault, where a lost wake-up or a failed release shows.
    steady: std::ops::Range<u8>,
}

/// The kinds (by their pick number in [`FaultPlan::next_fault`]) of a deck: a cluster's, a
/// sentinel set-up's, and a PostgreSQL server's.
const CLUSTER_DECK: [usize; 10] = [1, 7, 8, 9, 10, 11, 13, 11, 14, 15];
const SENTINEL_DECK: [usize; 6] = [1, 7, 8, 9, 10, 12];
/// PostgreSQL's: a pause, two session kills, a restart, a cut, a stall.
const POSTGRES_DECK: [usize; 6] = [0, 1, 1, 2, 3, 6];

fn between(rng: &mut StdRng, lo_ms: u64, hi_ms: u64) -> Duration {
    Duration::from_micros(rng.random_range(lo_ms * 1_000..=hi_ms * 1_000))
}

impl FaultPlan {
    pub(crate) fn new(seed: u64, family: FaultFamily, names: u8, longest_lease: Duration) -> Self {
        Self {
            rng: StdRng::seed_from_u64(seed ^ 0x00fa_0175),
            family,
            names,
            longest_lease,
            since_restart: Duration::ZERO,
            deck: Vec::new(),
            steady: 0..0,
        }
    }

    /// Aims most faults at one name's master or slot at the `steady` names.
    pub(crate) fn targeting_steady(mut self, steady: std::ops::Range<u8>) -> Self {
        self.steady = steady;
        self
    }

    /// The name a fault aimed at one name's master or slot targets.
    fn target(&mut self) -> u8 {
        if !self.steady.is_empty() && self.rng.random_bool(0.75) {
            self.rng.random_range(self.steady.clone())
        } else {
            self.rng.random_range(0..self.names)
        }
    }

    /// The next kind from the deck, shuffling a new one when it is empty.
    fn deal(&mut self, kinds: &[usize]) -> usize {
        if self.deck.is_empty() {
            self.deck = kinds.to_vec();
            rand::seq::SliceRandom::shuffle(self.deck.as_mut_slice(), &mut self.rng);
        }
        self.deck.pop().unwrap_or(1)
    }

    /// A gap and a kind (its pick number), drawn by the family's weights.
    fn draw(&mut self) -> (Duration, usize) {
        let rng = &mut self.rng;
        let (gap, weights): (Duration, [u32; 8]) = match self.family {
            // pause, del, restart, cut, jump, clobber, stall
            FaultFamily::PauseAndDel => (between(rng, 30, 300), [45, 40, 0, 0, 0, 15, 0, 0]),
            FaultFamily::Restart => (between(rng, 200, 800), [0, 60, 40, 0, 0, 0, 0, 0]),
            FaultFamily::ProxyCut => (between(rng, 50, 300), [0, 20, 0, 30, 0, 0, 50, 0]),
            FaultFamily::Mixed => (between(rng, 50, 300), [20, 25, 10, 20, 0, 15, 10, 0]),
            FaultFamily::Memory => (between(rng, 20, 500), [0, 60, 0, 0, 40, 0, 0, 0]),
            FaultFamily::Remote => (between(rng, 100, 500), [0, 30, 0, 30, 0, 15, 25, 0]),
            FaultFamily::Cluster | FaultFamily::Sentinel | FaultFamily::Postgres => {
                unreachable!("distributed and PostgreSQL faults are dealt from a deck")
            }
            FaultFamily::Quiet => unreachable!("a quiet run plans no fault"),
            FaultFamily::Masters => unreachable!("a master-set run deals its own faults"),
        };
        self.since_restart += gap;
        let mut roll = rng.random_range(0..weights.iter().sum::<u32>());
        let mut pick = 0;
        while roll >= weights[pick] {
            roll -= weights[pick];
            pick += 1;
        }
        // A restart costs a new process and every connection.
        if pick == 2 && self.since_restart < MIN_RESTART_INTERVAL {
            pick = 1;
        }
        (gap, pick)
    }

    /// The next gap and fault.
    pub(crate) fn next_fault(&mut self) -> (Duration, FaultSpec) {
        let pick = match self.family {
            // A distributed fault lasts seconds (the injector waits each out before the next):
            // every kind in turn, in a shuffled order.
            FaultFamily::Cluster => (between(&mut self.rng, 200, 800), self.deal(&CLUSTER_DECK)),
            FaultFamily::Sentinel => (between(&mut self.rng, 200, 800), self.deal(&SENTINEL_DECK)),
            // Every kind in turn too, so a short run sees each (a restart among them).
            FaultFamily::Postgres => (between(&mut self.rng, 100, 600), self.deal(&POSTGRES_DECK)),
            _ => self.draw(),
        };
        let (gap, pick) = pick;
        // Only the distributed families aim faults at one name's master or slot (and draw it).
        let target = match self.family {
            FaultFamily::Cluster | FaultFamily::Sentinel => self.target(),
            _ => 0,
        };
        let rng = &mut self.rng;
        let fault = match pick {
            // Past most command timeouts: what was sent meanwhile goes unanswered, and is
            // sent again (after its script is loaded) when the pause ends.
            0 if rng.random_bool(0.3) => FaultSpec::FlushThenPause(between(rng, 300, 900)),
            0 => FaultSpec::Pause(between(rng, 10, 400)),
            1 => FaultSpec::Del(rng.random_range(0..self.names)),
            2 => {
                self.since_restart = Duration::ZERO;
                FaultSpec::Restart {
                    down: between(rng, 0, 200),
                }
            }
            3 => FaultSpec::Cut(between(rng, 20, 400)),
            // Long enough to outlast a lease: the other holds must be renewed meanwhile.
            // Or the answers alone: what the lockers learn comes late, and may be stale. Most
            // of those end with their connections closed, the answers never sent: short then,
            // so the commands held up are still waited for (within a command timeout).
            6 if rng.random_bool(0.6) => {
                let then_cut = rng.random_bool(0.7);
                let span = if then_cut {
                    between(rng, 10, 150)
                } else {
                    between(rng, 50, 1_000)
                };
                FaultSpec::StallReplies { span, then_cut }
            }
            6 => FaultSpec::Stall(between(rng, 50, 1_000)),
            5 => FaultSpec::Clobber(rng.random_range(0..self.names), between(rng, 200, 1500)),
            7 => FaultSpec::Failover(target),
            8 => FaultSpec::KillMaster(target, between(rng, 0, 300)),
            // Often past an acknowledgement timeout or several (grants go unacknowledged, and
            // are rolled back), well under the node timeout and the sentinels' down-after.
            9 => FaultSpec::PauseReplica(target, between(rng, 50, 800)),
            // Up to about three leases: the partitioned holder must let go by its own clock
            // while the others take over.
            10 => FaultSpec::Partition {
                span: between(rng, 100, 3_000),
                cut: rng.random_bool(0.3),
            },
            // Open past a lease or two, as a large slot stays while its keys move.
            11 => FaultSpec::Migrate(target, between(rng, 200, 2_500)),
            // Mute past the failover: a sentinel that comes back tells its subscribers what
            // they missed.
            12 => FaultSpec::MuteSentinel {
                index: rng.random_range(0..3),
                span: between(rng, 4_000, 12_000),
            },
            14 => FaultSpec::KillMasterForGood(target),
            // Under the node timeout (1.5 s) by more than a loaded machine's hiccup: the
            // master comes back as the master.
            15 => FaultSpec::HangMaster(target, between(rng, 100, 900)),
            13 => FaultSpec::CutNode {
                name: target,
                span: between(rng, 100, 3_000),
                cut: rng.random_bool(0.3),
            },
            _ => FaultSpec::Jump(self.longest_lease.mul_f64(rng.random_range(1.0..3.0))),
        };
        (gap, fault)
    }
}

/// What the Redis injector acts on.
#[derive(Debug)]
pub(crate) struct RedisTargets {
    /// The server, when the run started it (`None`: someone else's, never paused or restarted).
    pub(crate) server: Option<Arc<Mutex<RedisServer>>>,
    pub(crate) proxy: Arc<Proxy>,
    pub(crate) admin: redis::aio::ConnectionManager,
    /// Every name's keys, its lock's (written over by a clobber) first; a `DEL` takes them all.
    pub(crate) keys: Vec<Vec<String>>,
    pub(crate) setup: RedisSetup,
    pub(crate) actors: Arc<Vec<Actor>>,
}

/// What the memory injector acts on.
#[derive(Debug)]
pub(crate) struct MemoryTargets {
    pub(crate) store: MemoryStore,
    /// Every name's keys (see [`RedisTargets::keys`]).
    pub(crate) keys: Vec<Vec<String>>,
}

/// What a run injects faults into.
#[derive(Debug)]
pub(crate) enum Targets {
    Redis(RedisTargets),
    Memory(MemoryTargets),
    /// A cluster or a sentinel set-up (see `distributed`).
    Distributed(super::distributed::DistributedTargets),
    /// A PostgreSQL server (see `on_postgres`).
    Postgres(super::on_postgres::PgTargets),
}

/// How long an admin command may take.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(2);

async fn admin_cmd(admin: &redis::aio::ConnectionManager, cmd: &redis::Cmd) -> bool {
    let mut con = admin.clone();
    matches!(
        tokio::time::timeout(ADMIN_TIMEOUT, cmd.query_async::<redis::Value>(&mut con)).await,
        Ok(Ok(_))
    )
}

impl Targets {
    /// Carries out one fault and records it; returns whether it was applied.
    async fn apply(&self, fault: FaultSpec, history: &History) -> bool {
        let from = Instant::now();
        if let Self::Distributed(t) = self {
            // A distributed fault may act in more than one way, over spans of its own.
            let recs = t.apply(fault, from, history).await;
            for &rec in &recs {
                history.fault(rec);
            }
            return !recs.is_empty();
        }
        if let Self::Postgres(t) = self {
            let applied = t.apply(fault).await;
            let to = Instant::now();
            for &(kind, reach) in &applied {
                history.fault(FaultRec {
                    kind,
                    reach,
                    from,
                    to,
                });
            }
            return !applied.is_empty();
        }
        let (kind, reach, applied) = match (self, fault) {
            (Self::Redis(t), FaultSpec::FlushThenPause(d)) => {
                let flushed = admin_cmd(&t.admin, redis::cmd("SCRIPT").arg("FLUSH")).await
                    && admin_cmd(&t.admin, redis::cmd("FUNCTION").arg("FLUSH")).await;
                let mut cmd = redis::cmd("CLIENT");
                cmd.arg("PAUSE").arg(d.as_millis() as u64).arg("WRITE");
                let ok = flushed && admin_cmd(&t.admin, &cmd).await;
                if ok {
                    tokio::time::sleep(d).await;
                }
                (FaultKind::Pause, Reach::ALL, ok)
            }
            (Self::Redis(t), FaultSpec::Pause(d)) => {
                let mut cmd = redis::cmd("CLIENT");
                cmd.arg("PAUSE").arg(d.as_millis() as u64).arg("WRITE");
                let ok = admin_cmd(&t.admin, &cmd).await;
                if ok {
                    // Faults don't overlap: wait the pause out.
                    tokio::time::sleep(d).await;
                }
                (FaultKind::Pause, Reach::ALL, ok)
            }
            (Self::Redis(t), FaultSpec::Del(n)) => {
                let keys = &t.keys[usize::from(n)];
                let mut con = t.admin.clone();
                let done = tokio::time::timeout(ADMIN_TIMEOUT, con.del::<_, i64>(keys)).await;
                (FaultKind::Del, Reach::name(n), matches!(done, Ok(Ok(_))))
            }
            (Self::Redis(t), FaultSpec::Clobber(n, ttl)) => {
                let mut cmd = redis::cmd("SET");
                cmd.arg(&t.keys[usize::from(n)][0])
                    .arg("not a lock")
                    .arg("PX")
                    .arg(ttl.as_millis() as u64);
                let ok = admin_cmd(&t.admin, &cmd).await;
                if ok {
                    // It acts until it expires.
                    tokio::time::sleep(ttl).await;
                }
                (FaultKind::Clobber, Reach::name(n), ok)
            }
            (Self::Redis(t), FaultSpec::Restart { down }) => {
                let server = (t.server.clone()).expect("restarts are planned for owned servers");
                tokio::task::spawn_blocking(move || {
                    let mut server = locked(&server);
                    server.kill();
                    std::thread::sleep(down);
                    server.restart();
                })
                .await
                .expect("the restart task");
                // A multiplexed connection does not come back by itself: its owner reconnects.
                if let Ok(l) = t.setup.multiplexed().await {
                    t.actors[MULTIPLEXED].replace(l);
                }
                (FaultKind::Restart, Reach::ALL, true)
            }
            (Self::Redis(t), FaultSpec::Stall(d)) => {
                t.proxy.stall();
                tokio::time::sleep(d).await;
                t.proxy.unstall();
                (FaultKind::Stall, Reach::ALL, true)
            }
            (Self::Redis(t), FaultSpec::StallReplies { span, then_cut }) => {
                t.proxy.stall_replies();
                tokio::time::sleep(span).await;
                if then_cut {
                    // The answers held back are dropped with their connections (closed before
                    // the answers are let through); a client that sends its command again soon
                    // after reaches the server.
                    t.proxy.cut();
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    t.proxy.restore();
                    t.proxy.unstall_replies();
                    (FaultKind::ReplyCut, Reach::ALL, true)
                } else {
                    t.proxy.unstall_replies();
                    (FaultKind::ReplyStall, Reach::ALL, true)
                }
            }
            (Self::Redis(t), FaultSpec::Cut(d)) => {
                t.proxy.cut();
                tokio::time::sleep(d).await;
                t.proxy.restore();
                (FaultKind::Cut, Reach::ALL, true)
            }
            (Self::Memory(t), FaultSpec::Del(n)) => {
                for key in &t.keys[usize::from(n)] {
                    t.store.delete(key);
                }
                (FaultKind::Del, Reach::name(n), true)
            }
            (Self::Memory(_), FaultSpec::Jump(d)) => {
                tokio::time::advance(d).await;
                (FaultKind::Jump, Reach::ALL, true)
            }
            (_, other) => unreachable!("fault {other:?} planned for the wrong backend"),
        };
        if applied {
            let to = Instant::now();
            history.fault(FaultRec {
                kind,
                reach,
                from,
                to,
            });
        }
        applied
    }

    /// Undoes what a fault may have left on: a pause, a cut, a stall, a partition.
    pub(crate) async fn settle(&self) {
        if let Self::Distributed(t) = self {
            t.heal();
        }
        if let Self::Postgres(t) = self {
            t.settle();
        }
        if let Self::Redis(t) = self {
            t.proxy.restore();
            t.proxy.unstall();
            // Someone else's server may be paused by someone else.
            if t.server.is_some() {
                let mut cmd = redis::cmd("CLIENT");
                cmd.arg("UNPAUSE");
                admin_cmd(&t.admin, &cmd).await;
            }
        }
    }
}

/// Injects faults from `plan` until `stop` turns true; returns how many of each kind.
pub(crate) async fn inject(
    targets: &Targets,
    mut plan: FaultPlan,
    history: Arc<History>,
    mut stop: watch::Receiver<bool>,
) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    if plan.family == FaultFamily::Quiet {
        let _ = stop.wait_for(|s| *s).await;
        return counts;
    }
    loop {
        let (gap, fault) = plan.next_fault();
        tokio::select! {
            biased;
            () = tokio::time::sleep(gap) => {}
            _ = stop.wait_for(|s| *s) => break,
        }
        if *stop.borrow() {
            break;
        }
        if targets.apply(fault, &history).await {
            let kind = format!("{fault:?}");
            let kind = kind.split(['(', ' ']).next().unwrap_or("?").to_owned();
            *counts.entry(kind).or_insert(0) += 1;
        }
    }
    targets.settle().await;
    counts
}
