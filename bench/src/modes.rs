//! The scale-out modes' deployments, started by the harness beside the plain server: a cluster
//! of three masters with a replica each, a master and its replica watched by three sentinels, a
//! master whose grants wait for its replica's acknowledgement, three independent masters
//! locked by majority, and a PostgreSQL server (the other backend). Each runs the plain lock,
//! so each row shows what the mode itself costs.

use std::time::{Duration, Instant};

use dlock_tests::{PostgresServer, RedisCluster, RedisSentinel, RedisServer};

/// A scale-out mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// `LockerBuilder::cluster`: a 3-master cluster, woken through sharded pub/sub; by default,
    /// every write waits for the master's replica.
    Cluster,
    /// The same cluster with `replica_ack(ReplicaAck::none())`: writes count once the master has them.
    ClusterUnacked,
    /// `LockerBuilder::sentinel`: the master found through three sentinels; by default, every
    /// write waits for the replica.
    Sentinel,
    /// The same sentinels with `replica_ack(ReplicaAck::none())`.
    SentinelUnacked,
    /// `LockerBuilder::replica_ack(ReplicaAck::new(1, 1 s))`: a grant counts once one replica
    /// has it.
    Ack,
    /// `MasterSet::majority` over three independent masters (Redlock).
    Majority,
    /// `LockerBuilder::postgres_url`: session advisory locks on a PostgreSQL server of its own,
    /// woken by `NOTIFY`. No Redis: its Redis columns are empty.
    Postgres,
}

/// A cluster node that answers nothing for this long is failed over. Far longer than the
/// tests' default: a benchmark keeps both cores busy, and a failover would spoil a round.
const CLUSTER_NODE_TIMEOUT: Duration = Duration::from_secs(15);

/// How long the acknowledging replica may take to be in sync.
const SYNC_WITHIN: Duration = Duration::from_secs(30);

/// Where a mode's clients connect. Plain strings, so a client can be built from them anywhere.
#[derive(Debug, Clone, Default)]
pub(crate) struct Endpoints {
    /// The plain server.
    pub(crate) url: String,
    pub(crate) cluster_seeds: Vec<String>,
    pub(crate) sentinels: Vec<String>,
    pub(crate) sentinel_master: String,
    /// The master whose replica acknowledges.
    pub(crate) ack_master: String,
    pub(crate) masters: Vec<String>,
    pub(crate) postgres: String,
}

impl Endpoints {
    /// The plain server only.
    pub(crate) fn single(url: &str) -> Endpoints {
        Endpoints {
            url: url.to_owned(),
            ..Endpoints::default()
        }
    }
}

/// The servers of the modes a run compares, each started only when one of its rows is wanted.
#[derive(Default)]
pub(crate) struct Deployments {
    cluster: Option<RedisCluster>,
    sentinel: Option<RedisSentinel>,
    /// The acknowledging pair: master, replica.
    ack: Option<(RedisServer, RedisServer)>,
    masters: Vec<RedisServer>,
    postgres: Option<PostgresServer>,
}

impl Deployments {
    /// Starts the deployments of `modes`, saying what it starts unless `quiet`.
    pub(crate) fn start(modes: &[Mode], quiet: bool) -> Deployments {
        let mut deployments = Deployments::default();
        for mode in modes {
            let started = Instant::now();
            match mode {
                // Both ways of writing run on the same servers.
                Mode::Cluster | Mode::ClusterUnacked if deployments.cluster.is_some() => continue,
                Mode::Sentinel | Mode::SentinelUnacked if deployments.sentinel.is_some() => {
                    continue;
                }
                Mode::Cluster | Mode::ClusterUnacked => {
                    deployments.cluster = Some(
                        RedisCluster::try_start_with_node_timeout(CLUSTER_NODE_TIMEOUT)
                            .unwrap_or_else(|e| fail(&e)),
                    )
                }
                Mode::Sentinel | Mode::SentinelUnacked => {
                    deployments.sentinel = Some(RedisSentinel::start())
                }
                Mode::Ack => deployments.ack = Some(acknowledging_pair()),
                Mode::Majority => {
                    deployments.masters = (0..3).map(|_| RedisServer::start()).collect()
                }
                Mode::Postgres => deployments.postgres = Some(PostgresServer::start()),
            }
            if !quiet {
                eprintln!(
                    "started the {mode:?} deployment in {:.1} s",
                    started.elapsed().as_secs_f64()
                );
            }
        }
        deployments
    }

    /// Where each mode's clients connect, beside the plain server at `url`.
    pub(crate) fn endpoints(&self, url: &str) -> Endpoints {
        let mut endpoints = Endpoints::single(url);
        if let Some(cluster) = &self.cluster {
            endpoints.cluster_seeds = cluster.seed_urls();
        }
        if let Some(sentinel) = &self.sentinel {
            endpoints.sentinels = sentinel.sentinel_urls();
            endpoints.sentinel_master = sentinel.master_name().to_owned();
        }
        if let Some((master, _)) = &self.ack {
            endpoints.ack_master = master.url();
        }
        endpoints.masters = self.masters.iter().map(RedisServer::url).collect();
        if let Some(postgres) = &self.postgres {
            endpoints.postgres = postgres.url();
        }
        endpoints
    }

    /// `INFO <section>` of every data node `mode` runs on (its sentinels are not counted).
    pub(crate) fn infos(&self, mode: Mode, section: &str) -> Vec<String> {
        let nodes: Vec<&RedisServer> = match mode {
            Mode::Cluster | Mode::ClusterUnacked => (self.cluster.iter())
                .flat_map(|c| c.ports().into_iter().map(|p| c.node(p)))
                .collect(),
            Mode::Sentinel | Mode::SentinelUnacked => (self.sentinel.iter())
                .flat_map(|s| s.data_ports().into_iter().map(|p| s.data_node(p)))
                .collect(),
            Mode::Ack => self.ack.iter().flat_map(|(m, r)| [m, r]).collect(),
            Mode::Majority => self.masters.iter().collect(),
            Mode::Postgres => Vec::new(),
        };
        nodes.into_iter().map(|n| n.info(section)).collect()
    }
}

fn fail(error: &str) -> ! {
    eprintln!("dlock-bench: {error}");
    std::process::exit(2);
}

/// A master and a replica of it, in sync.
fn acknowledging_pair() -> (RedisServer, RedisServer) {
    let master = RedisServer::start_with_args(&["--repl-diskless-sync-delay", "0"]);
    let replica = RedisServer::start();
    let mut con = replica
        .client()
        .get_connection_with_timeout(Duration::from_secs(2))
        .unwrap_or_else(|e| fail(&format!("connect to the replica: {e}")));
    let () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(master.port())
        .query(&mut con)
        .unwrap_or_else(|e| fail(&format!("REPLICAOF: {e}")));
    let deadline = Instant::now() + SYNC_WITHIN;
    while !replica
        .info("replication")
        .contains("master_link_status:up")
    {
        if Instant::now() > deadline {
            fail("the acknowledging replica did not get in sync");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    (master, replica)
}
