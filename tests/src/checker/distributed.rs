//! The checker on Redis's own distributed deployments: a cluster of three masters and three
//! replicas, and a master, a replica and three sentinels, with failover faults — coordinated
//! failovers, masters killed and restarted, replicas paused, one client partitioned, external
//! `DEL`s.
//!
//! Three lockers follow the deployment (`LockerBuilder::cluster`, `LockerBuilder::sentinel`); a
//! fourth reaches it through proxies that a partition fault stalls or cuts while the others go
//! on: on the cluster, a cluster connection whose node addresses map to one proxy per node; with
//! Sentinel, a plain locker on a floating address (a proxy moved to the new master after each
//! failover, as a virtual IP would be).
//!
//! Each deployment runs in two modes. With writes counted once the master has them (the
//! default), a killed master or a `SENTINEL FAILOVER` may lose grants: those faults are
//! destructive, they excuse the overlaps they cause, and [`Figures::overlaps`] counts every
//! overlap, excused or not — the honest price of the mode. With replica acknowledgement
//! ([`dlock_core::ReplicaAck`]) the same faults lose nothing that counted: they excuse nothing,
//! and any overlap is a violation.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_core::redis::{self, AsyncCommands as _};
use dlock_core::{Locker, LockerBuilder, ReplicaAck};
use tokio::time::Instant;

use super::actors::Actor;
use super::faults::FaultKind;
use super::faults::FaultSpec;
use super::history::{History, Share, locked};
use super::invariants::{Invariant, Violation};
use super::leftovers::{is_fair_line, locker_leftovers};
use super::run::{self, Params, Report, ctx, drive, finish, settle, watchdog_probe};
use super::{Config, FaultFamily};
use crate::{Proxy, RedisCluster, RedisSentinel, unique_name};

/// How many replicas acknowledge, and for how long a write waits for them, in acknowledged runs.
const ACK: ReplicaAck = ReplicaAck::new(1, Duration::from_millis(250));

/// Lockers that follow the deployment themselves; one more is the partitioned client.
const FOLLOWERS: usize = 3;

/// The command timeout of a distributed run: above a cluster's ~1 s of `CLUSTERDOWN` during a
/// failover is not needed (that is what waits are for), but above the acknowledgement wait.
const COMMAND_TIMEOUT: Duration = Duration::from_millis(800);

/// Which deployment a run's faults act on.
#[derive(Debug, Clone)]
enum Deployment {
    Cluster(Arc<Mutex<RedisCluster>>),
    Sentinel(Arc<Mutex<RedisSentinel>>),
}

/// What the distributed injector acts on.
#[derive(Debug)]
pub(crate) struct DistributedTargets {
    deployment: Deployment,
    /// Every name's keys, its lock's first (one slot: a `DEL` takes them all).
    keys: Vec<Vec<String>>,
    acked: bool,
    /// The proxies between the partitioned client and the servers.
    partition: Vec<Proxy>,
}

/// Runs a blocking harness call on the blocking pool.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f)
        .await
        .expect("a harness call")
}

impl DistributedTargets {
    /// Carries out one fault; returns what to record.
    pub(crate) async fn apply(&self, fault: FaultSpec) -> (FaultKind, Option<u8>, bool) {
        let lost_kind = |kind| {
            if self.acked {
                FaultKind::AckedFailover
            } else {
                kind
            }
        };
        match (&self.deployment, fault) {
            (_, FaultSpec::Del(n)) => {
                let ok = self.del(self.keys[usize::from(n)].clone()).await;
                (FaultKind::Del, Some(n), ok)
            }
            (_, FaultSpec::Partition { span, cut }) => {
                for proxy in &self.partition {
                    if cut { proxy.cut() } else { proxy.stall() }
                }
                tokio::time::sleep(span).await;
                self.heal();
                (FaultKind::Partition, None, true)
            }
            (Deployment::Cluster(c), FaultSpec::Failover(n)) => {
                let (c, key) = (c.clone(), self.keys[usize::from(n)][0].clone());
                blocking(move || {
                    let cluster = locked(&c);
                    let replica = cluster.replica_of(&cluster.node_for_key(&key));
                    cluster.failover(replica.port);
                })
                .await;
                (FaultKind::Failover, None, true)
            }
            (Deployment::Cluster(c), FaultSpec::KillMaster(n, down)) => {
                let (c, key) = (c.clone(), self.keys[usize::from(n)][0].clone());
                blocking(move || {
                    let mut cluster = locked(&c);
                    let master = cluster.node_for_key(&key).port;
                    cluster.kill(master);
                    cluster.wait_ok();
                    std::thread::sleep(down);
                    cluster.restart(master);
                    cluster.wait_ok();
                })
                .await;
                (lost_kind(FaultKind::MasterKilled), None, true)
            }
            (Deployment::Cluster(c), FaultSpec::PauseReplica(n, pause)) => {
                let (c, key) = (c.clone(), self.keys[usize::from(n)][0].clone());
                blocking(move || {
                    let mut cluster = locked(&c);
                    let replica = cluster.replica_of(&cluster.node_for_key(&key)).port;
                    cluster.pause(replica);
                    std::thread::sleep(pause);
                    cluster.resume(replica);
                })
                .await;
                (FaultKind::ReplicaPaused, None, true)
            }
            (Deployment::Sentinel(s), FaultSpec::Failover(_)) => {
                let s = s.clone();
                let moved = s.clone();
                blocking(move || locked(&moved).failover()).await;
                self.follow_master(&s).await;
                // Until the old master follows the new one (~10 s), the new one has no replica:
                // acknowledged writes fail. That is part of the fault.
                blocking(move || locked(&s).wait_ready()).await;
                (lost_kind(FaultKind::Switch), None, true)
            }
            (Deployment::Sentinel(s), FaultSpec::KillMaster(_, down)) => {
                let s = s.clone();
                let moved = s.clone();
                let old = blocking(move || {
                    let mut set = locked(&moved);
                    let old = set.kill_master();
                    set.wait_promotion(old, crate::sentinel::PROMOTION_WITHIN);
                    old
                })
                .await;
                self.follow_master(&s).await;
                blocking(move || {
                    let mut set = locked(&s);
                    std::thread::sleep(down);
                    // Back empty; the sentinels make it a replica of the new master.
                    set.restart(old);
                    set.wait_ready();
                })
                .await;
                (lost_kind(FaultKind::MasterKilled), None, true)
            }
            (Deployment::Sentinel(s), FaultSpec::PauseReplica(_, pause)) => {
                let s = s.clone();
                blocking(move || {
                    let mut set = locked(&s);
                    set.pause_replica();
                    std::thread::sleep(pause);
                    set.resume_replica();
                })
                .await;
                (FaultKind::ReplicaPaused, None, true)
            }
            (_, other) => unreachable!("fault {other:?} planned for a distributed run"),
        }
    }

    /// Ends a partition.
    pub(crate) fn heal(&self) {
        for proxy in &self.partition {
            proxy.restore();
            proxy.unstall();
        }
    }

    /// Moves the floating address to the master the sentinels promoted.
    async fn follow_master(&self, set: &Arc<Mutex<RedisSentinel>>) {
        let set = set.clone();
        let port = blocking(move || locked(&set).master_port()).await;
        for proxy in &self.partition {
            proxy.retarget(std::net::SocketAddr::from(([127, 0, 0, 1], port)));
        }
    }

    /// `DEL` of keys that share a slot, on the node that has them now.
    async fn del(&self, keys: Vec<String>) -> bool {
        let port = match &self.deployment {
            Deployment::Cluster(c) => {
                let (c, key) = (c.clone(), keys[0].clone());
                blocking(move || locked(&c).node_for_key(&key).port).await
            }
            Deployment::Sentinel(s) => {
                let s = s.clone();
                blocking(move || locked(&s).master_port()).await
            }
        };
        let url = format!("redis://127.0.0.1:{port}/");
        let Ok(client) = redis::Client::open(url) else {
            return false;
        };
        let done = tokio::time::timeout(Duration::from_secs(2), async {
            let mut con = client.get_multiplexed_async_connection().await?;
            con.del::<_, i64>(&keys).await
        })
        .await;
        matches!(done, Ok(Ok(_)))
    }

    /// The ports of the data nodes that serve writes now.
    async fn masters(&self) -> Vec<u16> {
        match &self.deployment {
            Deployment::Cluster(c) => {
                let c = c.clone();
                blocking(move || {
                    let cluster = locked(&c);
                    cluster.wait_ok();
                    cluster.masters().into_iter().map(|m| m.port).collect()
                })
                .await
            }
            Deployment::Sentinel(s) => {
                let s = s.clone();
                blocking(move || vec![locked(&s).master_port()]).await
            }
        }
    }
}

/// The figures a distributed run reports besides its violations.
#[derive(Debug, Clone, Default)]
pub struct Figures {
    /// Guards handed out.
    pub guards: usize,
    /// Pairs of holds of one name, with different tokens, whose beliefs overlapped, other than
    /// those an external `DEL` of the name explains (a `DEL` frees a lock by design) — whether a
    /// failover excuses them or not.
    pub overlaps: usize,
    /// Guards that saw their lock lost while they lived.
    pub lost: usize,
    /// Failovers and kills, and for each the time from its start to the next grant of any name.
    pub recoveries: Vec<(FaultKind, Duration)>,
}

impl fmt::Display for Figures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut times: Vec<Duration> = self.recoveries.iter().map(|r| r.1).collect();
        times.sort();
        let median = times.get(times.len() / 2).copied().unwrap_or_default();
        let max = times.last().copied().unwrap_or_default();
        write!(
            f,
            "{} guards, {} overlaps, {} lost; {} failovers/kills, recovered (next grant) in \
             median {median:?}, max {max:?}",
            self.guards,
            self.overlaps,
            self.lost,
            times.len()
        )
    }
}

/// Counts every overlap of two holds with different tokens, and the losses and recoveries.
fn figures(history: &History, finish: Instant) -> Figures {
    let guards = history.guards();
    let faults = history.faults();
    let deleted = |name: u8, from: Instant, to: Instant| {
        (faults.iter())
            .any(|f| f.kind == FaultKind::Del && f.hits(name) && f.to >= from && f.from <= to)
    };
    let mut overlaps = 0;
    let names = u8::try_from(history.names.len()).unwrap_or(u8::MAX);
    for name in 0..names {
        // (start of belief, end of belief, token, acquisition called, exclusive). Permits share
        // their name by design (their bound is checked on its own), and so do readers: a pair
        // overlaps when one of the two excludes the other.
        let mut holds: Vec<(Instant, Instant, u64, Instant, bool)> = (guards.iter())
            .filter(|g| g.name == name && !g.reentrant && g.share != Share::Permit)
            .map(|g| {
                let exclusive = g.share != Share::Read;
                (g.start, g.belief_end(finish), g.token(), g.call, exclusive)
            })
            .filter(|h| h.0 < h.1)
            .collect();
        holds.sort_by_key(|h| h.0);
        for (i, a) in holds.iter().enumerate() {
            // `a` was granted first: a `DEL` between the earlier call and `b`'s grant explains it.
            overlaps += (holds[i + 1..].iter())
                .take_while(|b| b.0 < a.1)
                .filter(|b| (a.4 || b.4) && b.2 != a.2)
                .filter(|b| !deleted(name, a.3.min(b.3), b.0))
                .count();
        }
    }
    let lost = guards.iter().filter(|g| g.lost_at.get().is_some()).count();
    let mut starts: Vec<Instant> = guards.iter().map(|g| g.start).collect();
    starts.sort();
    let recoveries = (history.faults().iter())
        .filter(|f| {
            matches!(
                f.kind,
                FaultKind::Failover
                    | FaultKind::Switch
                    | FaultKind::MasterKilled
                    | FaultKind::AckedFailover
            )
        })
        .filter_map(|f| {
            let next = starts.iter().find(|s| **s >= f.from)?;
            Some((f.kind, *next - f.from))
        })
        .collect();
    Figures {
        guards: guards.len(),
        overlaps,
        lost,
        recoveries,
    }
}

/// Lock keys and fair line keys (not fencing counters) left on the masters after every lease
/// and every waiter's place in line ran out.
async fn leftovers(targets: &DistributedTargets, prefix: &str, p: Params) -> Vec<Violation> {
    let mut out = Vec::new();
    for port in targets.masters().await {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).expect("a node url");
        let mut con = client
            .get_multiplexed_async_connection()
            .await
            .expect("a connection to a master");
        let keys: Vec<String> = {
            let mut iter = (con.scan_match::<_, String>(format!("{prefix}*")).await)
                .expect("SCAN the run's prefix");
            let mut keys = Vec::new();
            while let Some(key) = futures_util::StreamExt::next(&mut iter).await {
                keys.push(key.expect("a SCAN reply"));
            }
            keys
        };
        for key in keys.into_iter().filter(|k| !k.ends_with(":fence")) {
            let mut con = con.clone();
            let pttl: i64 = con.pttl(&key).await.unwrap_or(-3);
            let summary = if is_fair_line(&key) {
                format!(
                    "fair line key {key} remains on master {port} {} after the last session \
                     ended, past the dead-waiter timeout ({:?}) of its last waiter (PTTL {pttl} \
                     ms)",
                    super::history::ms(settle(p)),
                    p.dead_waiter_timeout
                )
            } else {
                format!(
                    "lock key {key} remains on master {port} after every guard is gone and \
                     every lease ran out (PTTL {pttl} ms)"
                )
            };
            out.push(Violation {
                invariant: Invariant::LeftBehind,
                summary,
                window: None,
                hint: "",
            });
        }
    }
    out
}

/// The last locker of a run: the proxies between it and the servers, and whether it polls.
struct Partitioned {
    proxies: Vec<Proxy>,
    polls: bool,
}

fn builder(prefix: &str, p: Params, acked: bool) -> LockerBuilder {
    let b = Locker::builder()
        .prefix(prefix)
        .watchdog_lease(p.watchdog_lease)
        .dead_waiter_timeout(p.dead_waiter_timeout)
        .fence_ttl(p.fence_ttl)
        .command_timeout(COMMAND_TIMEOUT)
        .connect_timeout(Duration::from_secs(1));
    if acked { b.replica_ack(ACK) } else { b }
}

async fn run(
    config: Config,
    deployment: Deployment,
    lockers: Vec<Locker>,
    partitioned: Partitioned,
    prefix: String,
    acked: bool,
    p: Params,
) -> (Report, Figures) {
    let wall = std::time::Instant::now();
    let actors = (lockers.into_iter().enumerate())
        .map(|(i, l)| {
            if i < FOLLOWERS {
                Actor::new(&format!("locker-{i}"), COMMAND_TIMEOUT, p.watchdog_lease, l)
            } else {
                let mut actor = Actor::new("partitioned", COMMAND_TIMEOUT, p.watchdog_lease, l);
                // Over a cluster connection of its own: no subscriber, its waiters poll.
                actor.polls = partitioned.polls;
                actor
            }
        })
        .collect();
    let ctx = ctx(actors, p, None);
    let targets = DistributedTargets {
        deployment,
        keys: ctx.name_keys.clone(),
        acked,
        partition: partitioned.proxies,
    };
    let targets = super::faults::Targets::Distributed(targets);
    let faults = drive(&ctx, &targets, config, p).await;
    let super::faults::Targets::Distributed(targets) = &targets else {
        unreachable!("a distributed run");
    };
    let mut found = leftovers(targets, &prefix, p).await;
    locker_leftovers(&ctx.actors, &mut found);
    watchdog_probe(&ctx.actors, None, &mut found).await;
    let figures = figures(&ctx.history, Instant::now());
    let report = finish(config, wall, &ctx, faults, found);
    eprintln!("{}", report.summary());
    eprintln!(
        "checker {:?}{}: {figures}",
        config.family,
        if acked { " (replica-acknowledged)" } else { "" }
    );
    (report, figures)
}

/// A checker run on a real 3+3 Redis Cluster: three lockers on it through
/// `LockerBuilder::cluster`, a fourth through `LockerBuilder::cluster_connection` over one proxy
/// per node (the partitioned client); with replica acknowledgement if `acked`.
pub async fn run_cluster(config: Config, acked: bool) -> (Report, Figures) {
    assert_eq!(
        config.family,
        FaultFamily::Cluster,
        "a cluster run takes the cluster faults"
    );
    let p = run::params(config.seed);
    let cluster = blocking(RedisCluster::start).await;
    let prefix = format!("chk-{}-{}:", config.seed, unique_name("cluster"));
    let mut lockers = Vec::new();
    for _ in 0..FOLLOWERS {
        let l = builder(&prefix, p, acked)
            .cluster(cluster.seed_urls())
            .build()
            .await
            .expect("a cluster locker");
        lockers.push(l);
    }
    let mut partition = Vec::new();
    let mut map = std::collections::HashMap::new();
    for port in cluster.ports() {
        let proxy = Proxy::start(std::net::SocketAddr::from(([127, 0, 0, 1], port))).await;
        map.insert(
            redis::cluster::NodeAddress::new("127.0.0.1", port),
            redis::cluster::NodeAddress::new("127.0.0.1", proxy.port()),
        );
        partition.push(proxy);
    }
    // Seeds through the proxies too: a partition leaves this client no way around it.
    let seeds: Vec<String> = partition.iter().map(Proxy::url).collect();
    let client = redis::cluster::ClusterClient::builder(seeds)
        .node_address_map(map)
        .connection_timeout(Duration::from_secs(1))
        .build()
        .expect("a cluster client with an address map");
    let conn = (client.get_async_connection().await).expect("a cluster connection via proxies");
    let l = builder(&prefix, p, acked)
        .cluster_connection(conn)
        .build()
        .await;
    lockers.push(l.expect("a locker over the proxied cluster connection"));
    let deployment = Deployment::Cluster(Arc::new(Mutex::new(cluster)));
    let partitioned = Partitioned {
        proxies: partition,
        polls: true,
    };
    run(config, deployment, lockers, partitioned, prefix, acked, p).await
}

/// A checker run on a real master, replica and three sentinels: three lockers on it through
/// `LockerBuilder::sentinel`, a fourth on a floating address (the partitioned client); with
/// replica acknowledgement if `acked`.
pub async fn run_sentinel(config: Config, acked: bool) -> (Report, Figures) {
    assert_eq!(
        config.family,
        FaultFamily::Sentinel,
        "a sentinel run takes the sentinel faults"
    );
    let p = run::params(config.seed);
    let set = blocking(RedisSentinel::start).await;
    let prefix = format!("chk-{}-{}:", config.seed, unique_name("sentinel"));
    let mut lockers = Vec::new();
    for _ in 0..FOLLOWERS {
        let l = builder(&prefix, p, acked)
            .sentinel(set.sentinel_urls(), set.master_name())
            .build()
            .await
            .expect("a sentinel locker");
        lockers.push(l);
    }
    let floating = Proxy::start(std::net::SocketAddr::from((
        [127, 0, 0, 1],
        set.master_port(),
    )))
    .await;
    let l = builder(&prefix, p, acked).url(floating.url()).build().await;
    lockers.push(l.expect("a locker on the floating address"));
    let deployment = Deployment::Sentinel(Arc::new(Mutex::new(set)));
    let partitioned = Partitioned {
        proxies: vec![floating],
        polls: false,
    };
    run(config, deployment, lockers, partitioned, prefix, acked, p).await
}
