//! The checker on Redis's own distributed deployments — a cluster of three masters and three
//! replicas, and a master, a replica and three sentinels — under the faults they exist to
//! survive: on the cluster, coordinated failovers, masters killed (and back as replicas),
//! replicas paused, slots resharded with their keys, one client cut from every node or from
//! one; with Sentinel, failovers (some with a sentinel mute across them), the master killed,
//! the replica paused, one client cut; external `DEL`s on both. What each fault does, and which
//! names and lockers it reaches, is in [`targets`].
//!
//! Three lockers follow the deployment (`LockerBuilder::cluster`, `LockerBuilder::sentinel`,
//! each sentinel locker with the sentinels in another order); a fourth reaches it through
//! proxies that a partition fault stalls or cuts while the others go on: on the cluster, a
//! cluster connection whose node addresses map to one proxy per node; with Sentinel, a plain
//! locker on a floating address (a proxy moved to the new master after each failover, as a
//! virtual IP would be). Beside the workers' sessions, steady pairs hold names on every master
//! (see [`super::steady`]), and the run checks that a release wakes its waiter in time (see
//! [`super::wakeups`]). On the cluster, in the mode where writes count once the master has
//! them, each following locker also holds a crowd of names with the watchdog throughout
//! ([`CROWD`]), as a service does: their renewals reach every master, the dying one too.
//!
//! Each deployment runs in two modes. With writes counted once the master has them (the
//! default), a killed master or a `SENTINEL FAILOVER` may lose grants: those faults are
//! destructive, they excuse the overlaps they cause — a failover only those granted until the
//! lockers could have followed it — and [`Figures::overlaps`] counts every overlap, excused or
//! not: the honest price of the mode. With replica acknowledgement
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
use super::history::{History, Share, locked};
use super::invariants::{Invariant, Violation};
use super::leftovers::{is_fair_line, locker_leftovers};
use super::refusals::Probe;
use super::run::{self, Params, Report, ctx_with_steady, drive, finish, settle, watchdog_probe};
use super::{Config, FaultFamily};
use crate::{Proxy, RedisCluster, RedisSentinel, unique_name};

mod targets;

pub(crate) use targets::DistributedTargets;
use targets::{Deployment, blocking};

/// How long a write waits for a replica to acknowledge it, in acknowledged runs: as long as
/// the default acknowledgement of a `Locker` on a cluster or Sentinel waits with
/// [`COMMAND_TIMEOUT`] (a quarter of it).
const ACK_TIMEOUT_MS: u64 = 200;

/// How many replicas acknowledge, and for how long a write waits for them, in acknowledged runs.
const ACK: ReplicaAck = ReplicaAck::new(1, Duration::from_millis(ACK_TIMEOUT_MS));

/// Lockers that follow the deployment themselves; one more is the partitioned client.
const FOLLOWERS: usize = 3;

/// The partitioned client's locker: the one after the followers.
const PARTITIONED: u8 = 3;

/// How many names each following locker holds with the watchdog for the whole cluster run
/// without acknowledgement, as a service holds many at once: their renewals keep every master
/// busy, the dying one too (a cluster connection that carried them wedged after a master's
/// death, and the follow probe finds that only with a crowd). One mode suffices: the wedge is
/// the connection's, whatever the writes wait for; the acknowledged runs are slower per write
/// and are left without it.
const CROWD: usize = 80;

/// How soon after the sentinels agree on a new master every locker must have moved to it.
pub(super) const FOLLOW_WITHIN: Duration = Duration::from_secs(2);

/// The command timeout of a distributed run: above a cluster's ~1 s of `CLUSTERDOWN` during a
/// failover is not needed (that is what waits are for), but above the acknowledgement wait.
const COMMAND_TIMEOUT: Duration = Duration::from_millis(800);

/// How many lines of the violations' histories are printed before the server logs.
const HISTORY_FIRST_LINES: usize = 60;

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

/// Prints every server's log, for a run that found violations: what the sentinels or the
/// cluster did around them. The logs' times are the wall clock (UTC here); the run's `+ms`
/// times count from `origin`, whose wall-clock time comes first.
async fn print_logs(deployment: &Deployment, origin: Instant) {
    let wall = std::time::SystemTime::now() - origin.elapsed();
    let ms = (wall.duration_since(std::time::UNIX_EPOCH))
        .map_or(0, |d| d.as_millis() % (24 * 3600 * 1000));
    eprintln!(
        "server logs; the run's +0 ms is {:02}:{:02}:{:02}.{:03} UTC",
        ms / 3_600_000,
        ms / 60_000 % 60,
        ms / 1000 % 60,
        ms % 1000
    );
    let deployment = deployment.clone();
    let logs = blocking(move || match &deployment {
        Deployment::Sentinel(s) => locked(s).logs(),
        Deployment::Cluster(c) => {
            let c = locked(c);
            (c.ports().into_iter())
                .map(|port| (format!("node {port}"), c.node(port).log()))
                .collect()
        }
    })
    .await;
    for (label, log) in logs {
        eprintln!("--- {label} ---\n{log}");
    }
}

/// [`CROWD`] names per following locker, held with the watchdog until the run ends: load, not
/// checked (the steady pairs are).
async fn hold_crowd(followers: &[Locker], p: Params) -> Vec<dlock_core::LockGuard> {
    let mut crowd = Vec::with_capacity(followers.len() * CROWD);
    for (i, locker) in followers.iter().enumerate() {
        for j in 0..CROWD {
            let name = format!("crowd{i}-{j}");
            let request = locker.lock(name.as_str()).watchdog_lease(p.watchdog_lease);
            let guard = request.wait(Duration::from_secs(2)).await;
            crowd.push(guard.expect("a crowd name, free before any fault"));
        }
    }
    crowd
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
    /// The port behind each proxy.
    ports: Vec<u16>,
    polls: bool,
}

/// A locker's builder; in an `acked` run, its writes wait for a replica — by default on a
/// `scale_out` source (a cluster, Sentinel), as asked on another — and in other runs they don't.
/// The `nth` locker's builder (see `actors::clock_apart` for what `nth` sets).
fn builder(prefix: &str, p: Params, acked: bool, scale_out: bool, nth: usize) -> LockerBuilder {
    let b = Locker::builder()
        .clock_apart(crate::actors::clock_apart(nth))
        .prefix(prefix)
        .default_lease(dlock_core::Lease::watchdog(p.watchdog_lease))
        .dead_waiter_timeout(p.dead_waiter_timeout)
        .fence_ttl(p.fence_ttl)
        .command_timeout(COMMAND_TIMEOUT)
        .connect_timeout(Duration::from_secs(1));
    match (acked, scale_out) {
        (true, true) => b,
        (true, false) => b.replica_ack(ACK),
        (false, _) => b.replica_ack(dlock_core::ReplicaAck::none()),
    }
}

/// The names the refusal probes try, and the builders of their own two `Locker`s (see
/// `refusals`).
type Probed = (Vec<String>, [LockerBuilder; 2]);

async fn run(
    config: Config,
    deployment: Deployment,
    lockers: Vec<Locker>,
    partitioned: Partitioned,
    (prefix, steady, probed): (String, Vec<String>, Option<Probed>),
    acked: bool,
    p: Params,
) -> (Report, Figures) {
    let wall = std::time::Instant::now();
    let followers = lockers[..FOLLOWERS].to_vec();
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
    // Each steady name taken in turn by two of the following lockers.
    let pairs: Vec<(u8, u8)> = (0..steady.len())
        .map(|i| {
            let a = u8::try_from(i % FOLLOWERS).expect("a few lockers");
            (a, (a + 1) % PARTITIONED)
        })
        .collect();
    // The probes' names come after the steady ones, with no pair: only their probe uses them.
    let (probed, probe_locker) = probed.unzip();
    let probed = probed.unwrap_or_default();
    let named: Vec<String> = steady.iter().chain(&probed).cloned().collect();
    let ctx = ctx_with_steady(actors, p, None, &named, pairs);
    let probes: Vec<_> = (probed.iter())
        .map(|name| {
            let index = (ctx.history.names.iter()).position(|n| n == name);
            let index = index.and_then(|i| u8::try_from(i).ok());
            Probe::new(name.clone(), index.expect("a probe's name"), 0)
        })
        .collect();
    let probing = probe_locker.map(|b| super::refusals::spawn(ctx.clone(), probes.clone(), b));
    let crowd = match deployment {
        Deployment::Cluster(_) if !acked => hold_crowd(&followers, p).await,
        _ => Vec::new(),
    };
    let targets = DistributedTargets {
        deployment,
        keys: ctx.name_keys.clone(),
        acked,
        partition: partitioned.proxies,
        partition_ports: partitioned.ports,
        followers,
        unfollowed: Mutex::default(),
    };
    let targets = super::faults::Targets::Distributed(targets);
    let faults = drive(&ctx, &targets, config, p).await;
    if let Some(probing) = probing
        && let Err(err) = probing.await
    {
        ctx.history.panic(format!("a probe died: {err}"));
    }
    let super::faults::Targets::Distributed(targets) = &targets else {
        unreachable!("a distributed run");
    };
    for guard in crowd {
        let _ = guard.release().await;
    }
    let mut found = leftovers(targets, &prefix, p).await;
    found.append(&mut locked(&targets.unfollowed));
    let polling: Vec<u8> = (0..ctx.actors.len())
        .filter(|&i| ctx.actors[i].polls)
        .filter_map(|i| u8::try_from(i).ok())
        .collect();
    let faults_seen = ctx.history.faults();
    // With replica acknowledgement a grant waits for a replica too (up to its timeout).
    let acknowledged = if acked {
        Duration::from_millis(ACK_TIMEOUT_MS)
    } else {
        Duration::ZERO
    };
    let waits = (polling.as_slice(), acknowledged);
    super::wakeups::check(&ctx.history, &faults_seen, waits, &mut found);
    super::wakeups::migrating_releases(&ctx.history, &faults_seen, &mut found);
    let stopped = ctx
        .steady_stopped
        .get()
        .copied()
        .unwrap_or_else(Instant::now);
    let span = (ctx.history.origin, stopped);
    super::steady::check(&ctx.history, &faults_seen, &ctx.steady, span, &mut found);
    super::refusals::check(&probes, &faults_seen, ctx.history.origin, &mut found);
    locker_leftovers(&ctx.actors, &mut found);
    watchdog_probe(&ctx.actors, None, &mut found).await;
    let figures = figures(&ctx.history, Instant::now());
    let report = finish(config, wall, &ctx, faults, found);
    if !report.violations.is_empty() {
        // The violations in a line each first: the server logs after them are long, and an
        // output cut short keeps its beginning and its end (where the panic's backtrace is).
        eprintln!(
            "{} violations (in full, with their histories, after the server logs):",
            report.violations.len()
        );
        for v in &report.violations {
            let lines: Vec<&str> = v.summary.lines().take(3).map(str::trim).collect();
            let short: String = lines.join(" / ").chars().take(600).collect();
            eprintln!("  {}: {short}", v.invariant);
        }
        // The first histories too, cut short: an output that keeps only its beginning shows
        // what led to the violation, not only that it happened.
        let details: Vec<&str> = report.details().lines().take(HISTORY_FIRST_LINES).collect();
        eprintln!("{}", details.join("\n"));
        print_logs(&targets.deployment, ctx.history.origin).await;
    }
    eprintln!("{}", report.summary());
    eprintln!(
        "checker {:?}{}: {figures}",
        config.family,
        if acked { " (replica-acknowledged)" } else { "" }
    );
    if !probes.is_empty() {
        eprintln!(
            "checker refusal probes: {}",
            super::refusals::tally(&probes)
        );
    }
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
    // Writes wait only for replicas the cluster lists, and it lists them a few seconds after
    // it forms.
    let cluster = if acked {
        blocking(move || {
            cluster.wait_replicas_listed();
            cluster
        })
        .await
    } else {
        cluster
    };
    let prefix = format!("chk-{}-{}:", config.seed, unique_name("cluster"));
    let node_urls = cluster.seed_urls();
    let mut lockers = Vec::new();
    for i in 0..FOLLOWERS {
        let l = builder(&prefix, p, acked, true, i)
            .cluster(cluster.seed_urls())
            .build()
            .await
            .expect("a cluster locker");
        lockers.push(l);
    }
    let mut partition = Vec::new();
    let mut map = std::collections::HashMap::new();
    let ports = cluster.ports();
    for &port in &ports {
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
    // Over an application's cluster connection, the replicas are listed through it: its
    // writes wait for one by default too.
    let l = builder(&prefix, p, acked, true, FOLLOWERS)
        .cluster_connection(conn)
        .wake_by_polling()
        .build()
        .await;
    lockers.push(l.expect("a locker over the proxied cluster connection"));
    let deployment = Deployment::Cluster(Arc::new(Mutex::new(cluster)));
    let partitioned = Partitioned {
        proxies: partition,
        ports,
        polls: true,
    };
    let node_of = |name: &str| {
        let key = lockers[0].key_of(name).expect("a valid name");
        cluster_of(&deployment, &key)
    };
    let steady = names_on_nodes("steady", node_of, 2);
    // The probes' own two lockers, configured as locker 0 is (see `refusals`).
    let probed = acked.then(|| {
        let probe_locker = || builder(&prefix, p, acked, true, 0).cluster(node_urls.clone());
        (
            names_on_nodes("refusal", node_of, 1),
            [probe_locker(), probe_locker()],
        )
    });
    run(
        config,
        deployment,
        lockers,
        partitioned,
        (prefix, steady, probed),
        acked,
        p,
    )
    .await
}

/// The port of the master serving `key` on the run's cluster.
fn cluster_of(deployment: &Deployment, key: &str) -> u16 {
    match deployment {
        Deployment::Cluster(c) => locked(c).node_for_key(key).port,
        Deployment::Sentinel(_) => 0,
    }
}

/// `per_node` names on each node `node_of` tells of (`{stem}0`, `{stem}1`, …: the first that
/// land on each), in the order found.
fn names_on_nodes(stem: &str, node_of: impl Fn(&str) -> u16, per_node: usize) -> Vec<String> {
    let mut found: Vec<(u16, String)> = Vec::new();
    let mut nodes = std::collections::BTreeMap::<u16, usize>::new();
    for i in 0..10_000 {
        let name = format!("{stem}{i}");
        let node = node_of(&name);
        let count = nodes.entry(node).or_insert(0);
        if *count < per_node {
            *count += 1;
            found.push((node, name));
        }
        if nodes.len() == 3 && nodes.values().all(|&c| c >= per_node) {
            break;
        }
    }
    found.into_iter().map(|(_, n)| n).collect()
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
    // Writes wait only for a replica the sentinels list in sync.
    let set = if acked {
        blocking(move || {
            set.wait_replica_listed_in_sync();
            set
        })
        .await
    } else {
        set
    };
    let prefix = format!("chk-{}-{}:", config.seed, unique_name("sentinel"));
    let (sentinel_urls, master_name) = (set.sentinel_urls(), set.master_name().to_owned());
    let mut lockers = Vec::new();
    for i in 0..FOLLOWERS {
        // Each with the sentinels in another order, as instances configured apart would be: a
        // mute sentinel is the first one some locker asks.
        let mut urls = set.sentinel_urls();
        let first = i % urls.len();
        urls.rotate_left(first);
        let l = builder(&prefix, p, acked, true, i)
            .sentinel(urls, set.master_name())
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
    let l = (builder(&prefix, p, acked, false, FOLLOWERS)
        .url(floating.url())
        .build())
    .await;
    lockers.push(l.expect("a locker on the floating address"));
    let deployment = Deployment::Sentinel(Arc::new(Mutex::new(set)));
    let partitioned = Partitioned {
        proxies: vec![floating],
        ports: Vec::new(),
        polls: false,
    };
    let steady = (0..3).map(|i| format!("steady{i}")).collect();
    // The probes' own two lockers, configured as locker 0 is (see `refusals`).
    let probed = acked.then(|| {
        let probe_locker =
            || builder(&prefix, p, acked, true, 0).sentinel(sentinel_urls.clone(), &master_name);
        (
            vec!["refusal0".to_owned()],
            [probe_locker(), probe_locker()],
        )
    });
    run(
        config,
        deployment,
        lockers,
        partitioned,
        (prefix, steady, probed),
        acked,
        p,
    )
    .await
}
