//! [`RedisCluster`]: a real Redis Cluster on loopback — three masters, three replicas — with the
//! faults a scale-out lock must survive: a node killed, restarted, paused; a replica failing over
//! (coordinated, forced, or by takeover); a slot migrating to another master.
//!
//! Each node is a [`RedisServer`] (so the panic hook prints its log, and drop kills it) started
//! with `--cluster-enabled yes`, its `nodes.conf` in its own temporary directory (a restarted
//! node comes back as the same node), a short `cluster-node-timeout`, no persistence. The nodes
//! are joined with `redis-cli --cluster create ... --cluster-replicas 1`: the binary named by
//! `DLOCK_REDIS_CLI`, else the `-cli` next to a `DLOCK_REDIS_SERVER` named `<x>-server` (Valkey's
//! `valkey-cli`), else `redis-cli`. Needs Redis 7.0 or later (`--cluster-port`), or Valkey.
//!
//! Every wait polls with a deadline and panics with what it last saw; nothing sleeps for Redis.
//! The methods block: from async code that must keep running meanwhile, call them through
//! `tokio::task::spawn_blocking`, as the checker does with [`RedisServer::restart`].
//!
//! Data is not durable: with no persistence and asynchronous replication, a write the master
//! acknowledged and had not yet sent to its replica is gone once that replica takes over after
//! the master died (`WAIT 1` before the fault makes it survive). A coordinated
//! [`failover`](RedisCluster::failover) loses nothing.

use std::collections::BTreeSet;
use std::io::{Read as _, Seek as _};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::admin::{Admin, field, poll, replica_in_sync};
use crate::{REDIS_SERVER_ENV, RedisServer, free_port};

mod migrate;
mod topology;

pub use migrate::SlotMigration;
use topology::Topology;
pub use topology::{ClusterNode, SLOTS, key_slot};

/// The environment variable naming the `redis-cli` binary that creates the cluster.
pub const REDIS_CLI_ENV: &str = "DLOCK_REDIS_CLI";

/// The `cluster-node-timeout` of [`RedisCluster::start`]: a master that answers nothing for this
/// long is failing, and its replica is promoted a second or two later. Short, so tests are fast;
/// not so short that a loaded machine's hiccup fails a master over.
pub const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(1500);

/// The masters of every cluster the harness starts.
const MASTERS: usize = 3;

/// How long the cluster may take to form, or to be ok again after a fault.
const OK_WITHIN: Duration = Duration::from_secs(30);

/// How long `redis-cli --cluster create` may take (it waits, without end, for the nodes to agree).
const CREATE_WITHIN: Duration = Duration::from_secs(30);

/// A Redis Cluster of `redis-server` processes (three masters, each with one replica unless
/// started [without](RedisCluster::start_without_replicas)) on free loopback ports, killed on drop.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    /// Replicas per master when the cluster was created.
    replicas: usize,
    /// Ports of the nodes paused with [`RedisCluster::pause`].
    paused: BTreeSet<u16>,
    admin: Admin,
}

impl RedisCluster {
    /// Starts six nodes, joins them into three masters with one replica each, and waits until
    /// every node says `cluster_state:ok`, every slot is served and every replica is in sync.
    pub fn start() -> Self {
        Self::start_with_node_timeout(DEFAULT_NODE_TIMEOUT)
    }

    /// [`start`](Self::start), for a program rather than a test: a `redis-server` or
    /// `redis-cli` that can't be run is an error naming the install command, not a panic.
    pub fn try_start() -> Result<Self, String> {
        Self::try_start_with_node_timeout(DEFAULT_NODE_TIMEOUT)
    }

    /// [`try_start`](Self::try_start) with another `cluster-node-timeout`.
    pub fn try_start_with_node_timeout(node_timeout: Duration) -> Result<Self, String> {
        let server = crate::redis_server_binary();
        if !runs(&server) {
            return Err(format!(
                "`{server}` was not found: install it with `apt-get install redis-server`, \
                 or point {REDIS_SERVER_ENV} at a redis-server binary"
            ));
        }
        let cli = redis_cli();
        if !runs(&cli) {
            return Err(format!(
                "`{cli}` was not found (a cluster is created with it): install it with \
                 `apt-get install redis-tools`, or point {REDIS_CLI_ENV} at a redis-cli binary"
            ));
        }
        Ok(Self::start_with_node_timeout(node_timeout))
    }

    /// [`start`](Self::start) with another `cluster-node-timeout`.
    pub fn start_with_node_timeout(node_timeout: Duration) -> Self {
        Self::start_shaped(node_timeout, 1)
    }

    /// Three masters and no replica: a cluster that shards but can't fail over.
    pub fn start_without_replicas() -> Self {
        Self::start_shaped(DEFAULT_NODE_TIMEOUT, 0)
    }

    /// Three masters with `replicas` replicas each.
    fn start_shaped(node_timeout: Duration, replicas: usize) -> Self {
        let cli = redis_cli();
        require_cli(&cli);
        let timeout = node_timeout.as_millis().to_string();
        let nodes = (0..MASTERS * (1 + replicas))
            .map(|_| {
                RedisServer::start_with_port_args(None, |port| {
                    [
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-node-timeout",
                        &timeout,
                        // The bus port defaults to port + 10000: past 65535 for a port
                        // above 55535, which the ephemeral range holds.
                        "--cluster-port",
                        &bus_port(port).to_string(),
                        // A replica syncs at once, not after the default 5 s wait for others.
                        "--repl-diskless-sync-delay",
                        "0",
                    ]
                    .map(str::to_owned)
                    .to_vec()
                })
            })
            .collect();
        let cluster = Self {
            nodes,
            replicas,
            paused: BTreeSet::new(),
            admin: Admin::default(),
        };
        cluster.create(&cli);
        cluster.wait_ok_within("the new cluster is ok", OK_WITHIN);
        cluster
    }

    /// `redis-cli --cluster create` over every node, with the cluster's replicas per master.
    fn create(&self, cli: &str) {
        let replicas = self.replicas.to_string();
        let mut output = tempfile::tempfile().expect("a file for redis-cli's output");
        let mut cmd = Command::new(cli);
        cmd.args(["--cluster", "create"])
            .args(self.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port())))
            .args(["--cluster-replicas", &replicas, "--cluster-yes"])
            .stdin(Stdio::null())
            .stdout(output.try_clone().expect("clone a file handle"))
            .stderr(output.try_clone().expect("clone a file handle"));
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("run `{cli} --cluster create`: {e}"));
        let started = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait for redis-cli") {
                break Some(status);
            }
            if started.elapsed() >= CREATE_WITHIN {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut text = String::new();
        output.rewind().expect("rewind redis-cli's output");
        output
            .read_to_string(&mut text)
            .expect("read redis-cli's output");
        match status {
            Some(status) if status.success() => {}
            Some(status) => panic!("`{cli} --cluster create` exited with {status}:\n{text}"),
            None => panic!("`{cli} --cluster create` did not finish in {CREATE_WITHIN:?}:\n{text}"),
        }
    }

    /// `redis://127.0.0.1:PORT/` for every node, the seeds a cluster client starts from.
    pub fn seed_urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// A cluster client over [`seed_urls`](Self::seed_urls), with redis-rs's defaults.
    pub fn client(&self) -> redis::cluster::ClusterClient {
        redis::cluster::ClusterClient::new(self.seed_urls()).expect("a cluster client")
    }

    /// A `Locker` on this cluster whose watchdog lease is `lease`.
    pub async fn locker(&self, lease: Duration) -> dlock_core::Locker {
        dlock_core::Locker::builder()
            .cluster(self.seed_urls())
            .default_lease(dlock_core::Lease::watchdog(lease))
            .build()
            .await
            .expect("a locker on the cluster")
    }

    /// The port of every node, in start order (ports never change, whatever the roles).
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(RedisServer::port).collect()
    }

    /// The node process on `port`: its log, `INFO`, a plain connection, its pid.
    ///
    /// Pause, kill and restart it through the cluster, which keeps track of what is up.
    pub fn node(&self, port: u16) -> &RedisServer {
        self.nodes
            .iter()
            .find(|n| n.port() == port)
            .unwrap_or_else(|| panic!("no cluster node on port {port}"))
    }

    fn node_mut(&mut self, port: u16) -> &mut RedisServer {
        self.nodes
            .iter_mut()
            .find(|n| n.port() == port)
            .unwrap_or_else(|| panic!("no cluster node on port {port}"))
    }

    /// Whether the node on `port` runs and is not paused.
    fn is_up(&self, port: u16) -> bool {
        !self.paused.contains(&port) && self.node(port).pid().is_some()
    }

    /// The masters that serve slots, by their first slot, as a running node sees them.
    pub fn masters(&self) -> Vec<ClusterNode> {
        let mut masters: Vec<ClusterNode> = (self.topology().nodes.into_iter())
            .filter(|n| n.is_master() && n.slot_count() > 0)
            .collect();
        masters.sort_by_key(|n| n.slots.iter().map(|r| *r.start()).min());
        masters
    }

    /// The replicas, by port, as a running node sees them.
    pub fn replicas(&self) -> Vec<ClusterNode> {
        let mut replicas: Vec<ClusterNode> = (self.topology().nodes.into_iter())
            .filter(|n| !n.is_master())
            .collect();
        replicas.sort_by_key(|n| n.port);
        replicas
    }

    /// The replica of `master` (panics if it has none).
    pub fn replica_of(&self, master: &ClusterNode) -> ClusterNode {
        (self.topology().nodes.into_iter())
            .find(|n| n.master_id.as_deref() == Some(&master.id))
            .unwrap_or_else(|| panic!("master {} has no replica", master.port))
    }

    /// The master serving `slot`.
    pub fn master_for_slot(&self, slot: u16) -> ClusterNode {
        self.topology()
            .owner(slot)
            .cloned()
            .unwrap_or_else(|| panic!("no master serves slot {slot}"))
    }

    /// The master serving `key`'s slot ([`key_slot`]).
    pub fn node_for_key(&self, key: impl AsRef<[u8]>) -> ClusterNode {
        self.master_for_slot(key_slot(key.as_ref()))
    }

    /// The cluster as the first running node that answers describes it.
    fn topology(&self) -> Topology {
        poll(
            "a running cluster node describes the cluster",
            OK_WITHIN,
            || {
                let mut last = "no node is running".to_owned();
                for port in self.ports().into_iter().filter(|p| self.is_up(*p)) {
                    match self.cluster_nodes(port) {
                        Ok(topology) => return Ok(topology),
                        Err(err) => last = err,
                    }
                }
                Err(last)
            },
        )
    }

    fn cluster_nodes(&self, port: u16) -> Result<Topology, String> {
        let text: String = (self.admin)
            .query(port, redis::cmd("CLUSTER").arg("NODES"))
            .map_err(|e| format!("CLUSTER NODES on {port}: {e}"))?;
        Topology::parse(&text)
    }

    /// Kills the node (`SIGKILL`). Its slots are served again once its replica is promoted,
    /// about two node timeouts later: [`wait_ok`](Self::wait_ok) waits for that.
    pub fn kill(&mut self, port: u16) {
        self.node_mut(port).kill();
        self.paused.remove(&port);
    }

    /// Starts a killed (or running) node again on its port, with its `nodes.conf`: the same node,
    /// with no data. A master that was replaced meanwhile comes back as a replica of its
    /// successor. Call [`wait_ok`](Self::wait_ok) to wait until it is in sync.
    pub fn restart(&mut self, port: u16) {
        self.node_mut(port).restart();
        self.paused.remove(&port);
    }

    /// Pauses the node (`SIGSTOP`): it keeps its connections and answers nothing, not even the
    /// cluster bus, so after the node timeout the others count it failing.
    pub fn pause(&mut self, port: u16) {
        self.node(port).pause();
        self.paused.insert(port);
    }

    /// Resumes a paused node (`SIGCONT`).
    pub fn resume(&mut self, port: u16) {
        self.node(port).resume();
        self.paused.remove(&port);
    }

    /// `CLUSTER FAILOVER` on `replica`: its master stops writes, the replica catches up, takes
    /// over its slots, and the master becomes its replica; nothing acknowledged is lost. Returns
    /// once the replica says it is master and the cluster is ok again. The master must answer
    /// (Redis gives up a coordinated failover after 5 s): for a dead or paused one, use
    /// [`failover_force`](Self::failover_force) or [`takeover`](Self::takeover).
    pub fn failover(&self, replica: u16) {
        self.fail_over(replica, None);
    }

    /// `CLUSTER FAILOVER FORCE`: the replica takes over without its master's agreement (for a
    /// master that is down or paused), still elected by the other masters.
    pub fn failover_force(&self, replica: u16) {
        self.fail_over(replica, Some("FORCE"));
    }

    /// `CLUSTER FAILOVER TAKEOVER`: the replica takes its master's slots on its own, without an
    /// election — a paused master that resumes finds itself demoted.
    pub fn takeover(&self, replica: u16) {
        self.fail_over(replica, Some("TAKEOVER"));
    }

    fn fail_over(&self, replica: u16, option: Option<&str>) {
        self.promote(replica, option);
        self.wait_ok();
    }

    /// `CLUSTER FAILOVER [option]` on `replica`, returning as soon as it says it is a master:
    /// the other nodes may not have heard yet (the old master may still think it serves the
    /// slots, and refuse writes while it waits to hear). [`wait_ok`](Self::wait_ok) waits for
    /// them.
    pub fn promote(&self, replica: u16, option: Option<&str>) {
        let node = self.topology().by_port(replica).cloned();
        assert!(
            node.is_some_and(|n| !n.is_master()),
            "the node on port {replica} is not a replica"
        );
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("FAILOVER").arg(option);
        let () = (self.admin)
            .query(replica, &cmd)
            .unwrap_or_else(|e| panic!("CLUSTER FAILOVER {option:?} on {replica}: {e}"));
        poll(
            format!("replica {replica} is master after CLUSTER FAILOVER {option:?}"),
            OK_WITHIN,
            || match self.admin.info(replica, "replication") {
                Ok(info) if field(&info, "role") == Some("master") => Ok(()),
                Ok(info) => Err(format!("role {:?}", field(&info, "role"))),
                Err(e) => Err(e.to_string()),
            },
        );
    }

    /// Waits (up to 30 s) until every running node agrees on who serves which slot and who
    /// replicates whom, says `cluster_state:ok` with all 16384 slots served, no running node is
    /// flagged failing, every slot's master runs, and every running replica is in sync with its
    /// master. After a master is killed or paused, this is the wait for its replica's promotion.
    pub fn wait_ok(&self) {
        self.wait_ok_within("the cluster is ok", OK_WITHIN);
    }

    /// Waits (up to 30 s) until every running master lists, in `CLUSTER SLOTS`, a replica for
    /// each master that has a running replica. A replica is listed only once the cluster has
    /// heard it synced (a few seconds after a cluster forms or a replica rejoins), and a
    /// `Locker`'s writes wait only for listed replicas.
    pub fn wait_replicas_listed(&self) {
        poll("CLUSTER SLOTS lists the replicas", OK_WITHIN, || {
            let topology = self.topology();
            let replicated: BTreeSet<u16> = (topology.nodes.iter())
                .filter(|n| n.is_master() && n.slot_count() > 0)
                .filter(|m| {
                    (topology.nodes.iter())
                        .any(|r| r.master_id.as_deref() == Some(&m.id) && self.is_up(r.port))
                })
                .map(|m| m.port)
                .collect();
            for port in self.ports().into_iter().filter(|p| self.is_up(*p)) {
                let slots: Vec<redis::Value> = (self.admin)
                    .query(port, redis::cmd("CLUSTER").arg("SLOTS"))
                    .map_err(|e| format!("CLUSTER SLOTS on {port}: {e}"))?;
                for range in &slots {
                    let redis::Value::Array(parts) = range else {
                        return Err(format!("CLUSTER SLOTS on {port}: {range:?}"));
                    };
                    let master = match parts.get(2) {
                        Some(redis::Value::Array(m)) => m.get(1).cloned(),
                        _ => None,
                    };
                    let master: Option<u16> = master.and_then(|m| redis::from_redis_value(m).ok());
                    if master.is_some_and(|m| replicated.contains(&m)) && parts.len() < 4 {
                        return Err(format!("{port} lists no replica for {master:?}"));
                    }
                }
            }
            Ok(())
        });
    }

    /// Whether the cluster is as [`wait_ok`](Self::wait_ok) waits for it to be, now.
    pub fn is_ok(&self) -> bool {
        self.health().is_ok()
    }

    /// Whether some running node refuses commands now (`cluster_state:fail`: by default the
    /// whole cluster does while a master is failing, until its replica takes over).
    pub fn is_down(&self) -> bool {
        (self.ports().into_iter())
            .filter(|p| self.is_up(*p))
            .any(|port| {
                let info: Result<String, _> =
                    (self.admin).query(port, redis::cmd("CLUSTER").arg("INFO"));
                info.is_ok_and(|info| field(&info, "cluster_state") == Some("fail"))
            })
    }

    fn wait_ok_within(&self, what: &str, within: Duration) {
        poll(what, within, || self.health());
    }

    /// The agreed topology, or what is not ok yet.
    fn health(&self) -> Result<Topology, String> {
        let up: Vec<u16> = self
            .ports()
            .into_iter()
            .filter(|p| self.is_up(*p))
            .collect();
        let mut agreed: Option<(u16, Topology)> = None;
        let known = self.nodes.len().to_string();
        for &port in &up {
            let info: String = (self.admin)
                .query(port, redis::cmd("CLUSTER").arg("INFO"))
                .map_err(|e| format!("CLUSTER INFO on {port}: {e}"))?;
            for (name, want) in [
                ("cluster_state", "ok"),
                ("cluster_slots_assigned", "16384"),
                ("cluster_slots_ok", "16384"),
                ("cluster_known_nodes", known.as_str()),
            ] {
                let seen = field(&info, name);
                if seen != Some(want) {
                    return Err(format!("node {port}: {name} is {seen:?}, not {want}"));
                }
            }
            let topology = self.cluster_nodes(port)?;
            if let Some(flagged) = topology
                .nodes
                .iter()
                .find(|n| n.failing && self.is_up(n.port))
            {
                return Err(format!(
                    "node {port} flags running {} failing",
                    flagged.port
                ));
            }
            if let Some(master_id) = topology
                .by_id(&topology.myself)
                .and_then(|n| n.master_id.clone())
            {
                let master = topology
                    .by_id(&master_id)
                    .ok_or_else(|| format!("node {port} replicates unknown {master_id}"))?;
                if !self.is_up(master.port) {
                    return Err(format!("replica {port}'s master {} is down", master.port));
                }
                replica_in_sync(&self.admin, port, master.port)?;
            }
            match &agreed {
                None => agreed = Some((port, topology)),
                Some((first, seen)) if seen.shape() != topology.shape() => {
                    return Err(format!(
                        "nodes {first} and {port} disagree:\n{seen:#?}\n{topology:#?}"
                    ));
                }
                Some(_) => {}
            }
        }
        let (_, topology) = agreed.ok_or("no node is running")?;
        for master in topology.nodes.iter().filter(|n| n.slot_count() > 0) {
            if !self.is_up(master.port) {
                return Err(format!(
                    "master {} is down and still serves slots",
                    master.port
                ));
            }
        }
        Ok(topology)
    }
}

/// A free port for a node's cluster bus, other than its client port.
fn bus_port(port: u16) -> u16 {
    loop {
        let bus = free_port();
        if bus != port {
            return bus;
        }
    }
}

/// The `redis-cli` to create clusters with (see the [module docs](self)).
fn redis_cli() -> String {
    cli_for(
        std::env::var(REDIS_CLI_ENV).ok(),
        std::env::var(REDIS_SERVER_ENV).ok(),
    )
}

/// The cli named by `DLOCK_REDIS_CLI`, else the one next to the server `DLOCK_REDIS_SERVER`
/// names, else `redis-cli`.
fn cli_for(cli: Option<String>, server: Option<String>) -> String {
    if let Some(cli) = cli {
        return cli;
    }
    if let Some(server) = server {
        let server = Path::new(&server);
        let prefix = (server.file_name().and_then(|n| n.to_str()))
            .and_then(|name| name.strip_suffix("-server"));
        if let Some(prefix) = prefix {
            // Next to the server (a symlink is not followed: valkey-server links to
            // valkey-check-rdb), or on the PATH for a bare name.
            let cli = server.with_file_name(format!("{prefix}-cli"));
            if runs(&cli.to_string_lossy()) {
                return cli.to_string_lossy().into_owned();
            }
        }
    }
    "redis-cli".to_owned()
}

fn runs(binary: &str) -> bool {
    Command::new(binary)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Panics with the install command when `cli` can't be run.
fn require_cli(cli: &str) {
    assert!(
        runs(cli),
        "`{cli}` could not be run: the cluster tests create their cluster with it.\n\
         Install it with `apt-get install redis-tools` (Debian/Ubuntu), \
         or point {REDIS_CLI_ENV} at a redis-cli (or valkey-cli) binary."
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[should_panic(expected = "apt-get install redis-tools")]
    fn a_missing_cli_names_the_install_command() {
        require_cli("/nonexistent/dlock-no-such-redis-cli");
    }

    #[test]
    fn the_cli_is_the_named_one_else_the_one_next_to_the_server() {
        let dir = tempfile::tempdir().unwrap();
        // A link to a binary that answers `--version`: nothing written is executed (a file just
        // written can be "busy" for a process forked meanwhile).
        let cli = dir.path().join("valkey-cli");
        std::os::unix::fs::symlink("/bin/true", &cli).unwrap();
        let server = dir.path().join("valkey-server").display().to_string();
        let named = Some("/opt/my-cli".to_owned());
        assert_eq!(cli_for(named, Some(server.clone())), "/opt/my-cli");
        assert_eq!(cli_for(None, Some(server)), cli.display().to_string());
        let lonely = dir.path().join("keydb-server").display().to_string();
        assert_eq!(cli_for(None, Some(lonely)), "redis-cli");
        assert_eq!(cli_for(None, None), "redis-cli");
    }

    #[test]
    fn bus_ports_are_not_the_client_port() {
        let port = free_port();
        assert_ne!(bus_port(port), port);
    }
}
