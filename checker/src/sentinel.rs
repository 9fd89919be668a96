//! [`RedisSentinel`]: a master, one replica and three sentinels on loopback, with the faults a
//! lock that follows a failover must survive: the master killed, a `SENTINEL FAILOVER`, a node
//! paused (a paused replica is a lagging one: `WAIT` gets no acknowledgement from it).
//!
//! The two data nodes and the sentinels are [`RedisServer`]s (the panic hook prints their logs,
//! drop kills them). Both data nodes start as plain masters with no persistence; the second is
//! made a replica of the first with `REPLICAOF`, so a restarted data node is always an empty
//! master until the sentinels reconfigure it. Each sentinel runs `redis-server <conf> --sentinel`
//! with a configuration file of its own (which it rewrites) in a temporary directory.
//!
//! Timings worth knowing (Redis 7.0 and Valkey 8 behave alike here):
//! - a killed master is replaced about [`DOWN_AFTER`] + 1 s later;
//! - a `SENTINEL FAILOVER` promotes the replica in about a second, but the sentinels tell the old
//!   master to follow the new one only about 10 s later; until then it is a second, writable
//!   master (clients that stay connected to it keep writing there);
//! - likewise a restarted data node is an empty, writable master for about 10 s.
//!
//! Every wait polls with a deadline and panics with what it last saw. The methods block: from
//! async code that must keep running meanwhile, call them through `tokio::task::spawn_blocking`.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;
use std::time::Duration;

use crate::RedisServer;
use crate::admin::{Admin, field, poll, replica_in_sync, try_poll};

/// The name the sentinels monitor the master under.
pub const MASTER_NAME: &str = "dlock";

/// `down-after-milliseconds`: a master that answers nothing for this long is down for a
/// sentinel, and once two agree, failed over.
pub const DOWN_AFTER: Duration = Duration::from_millis(1500);

/// `failover-timeout`: how long a failover may stall before it is given up (and, twice this, how
/// long before the same sentinel tries again).
pub const FAILOVER_TIMEOUT: Duration = Duration::from_secs(5);

/// How many sentinels, and how many must agree that the master is down.
const SENTINELS: usize = 3;
const QUORUM: usize = 2;

/// How long the set-up may take to be ready, at start or after a fault.
const READY_WITHIN: Duration = Duration::from_secs(30);

/// How long a promotion may take after `SENTINEL FAILOVER` or a killed master: a sentinel that
/// led a failover of this master tries again only after twice the failover timeout, then the
/// master must be seen down and a leader elected — and the machine may be busy.
pub const PROMOTION_WITHIN: Duration = Duration::from_secs(30);

/// A master, its replica and three sentinels, each a `redis-server` process on a free loopback
/// port, killed on drop.
#[derive(Debug)]
pub struct RedisSentinel {
    /// The two data nodes; the first started as the master.
    data: Vec<RedisServer>,
    sentinels: Vec<RedisServer>,
    /// Ports of the data nodes paused with [`RedisSentinel::pause`], and of the sentinels paused
    /// with [`RedisSentinel::pause_sentinel`].
    paused: BTreeSet<u16>,
    admin: Admin,
    /// The sentinels' configuration files; after the servers, so it goes once they are dead.
    _configs: tempfile::TempDir,
}

impl RedisSentinel {
    /// Starts a master and its replica, waits until the replica is in sync, starts three
    /// sentinels monitoring the master as [`MASTER_NAME`] with a quorum of two, and waits until
    /// every sentinel knows the master, the replica and the two other sentinels.
    pub fn start() -> Self {
        let data_args = ["--repl-diskless-sync-delay", "0"];
        let data: Vec<RedisServer> = (0..2)
            .map(|_| RedisServer::start_with_args(&data_args))
            .collect();
        let admin = Admin::default();
        let master = data[0].port();
        let mut cmd = redis::cmd("REPLICAOF");
        cmd.arg("127.0.0.1").arg(master);
        let () = (admin.query(data[1].port(), &cmd)).expect("REPLICAOF");
        // A sentinel lists the replicas from the master's INFO: the first INFO, sent at once,
        // lists this one only if it is attached by then (the next comes 10 s later).
        poll("the replica is in sync", READY_WITHIN, || {
            replica_in_sync(&admin, data[1].port(), master)
        });
        let configs = tempfile::tempdir().expect("a directory for the sentinels' configuration");
        let sentinels = (0..SENTINELS)
            .map(|i| {
                let path = configs.path().join(format!("sentinel-{i}.conf"));
                std::fs::write(&path, sentinel_config(master)).expect("write a sentinel config");
                RedisServer::start_with_config(&path, &["--sentinel"])
            })
            .collect();
        let set_up = Self {
            data,
            sentinels,
            paused: BTreeSet::new(),
            admin,
            _configs: configs,
        };
        set_up.wait_ready();
        set_up
    }

    /// The name the sentinels know the master by ([`MASTER_NAME`]).
    pub fn master_name(&self) -> &str {
        MASTER_NAME
    }

    /// `redis://127.0.0.1:PORT/` for each sentinel: what redis-rs's `Sentinel` and
    /// `SentinelClient` take, with [`master_name`](Self::master_name). (redis-rs has no
    /// `redis+sentinel://` URL; that scheme belongs to Python and Ruby clients.)
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(RedisServer::url).collect()
    }

    /// The sentinel processes.
    pub fn sentinels(&self) -> &[RedisServer] {
        &self.sentinels
    }

    /// A redis-rs client for whatever node the sentinels say is the master.
    pub fn client(&self) -> redis::sentinel::SentinelClient {
        redis::sentinel::SentinelClient::build(
            self.sentinel_urls(),
            // A `String`: redis-rs takes one without its `tls-rustls` feature, anything
            // string-like with it.
            String::from(MASTER_NAME),
            None,
            redis::sentinel::SentinelServerType::Master,
        )
        .expect("a sentinel client")
    }

    /// Every process's log so far, each with a label (`sentinel <port>`, `data <port>`): what
    /// a failed run prints to show what the sentinels did.
    pub fn logs(&self) -> Vec<(String, String)> {
        let data = (self.data.iter()).map(|n| (format!("data {}", n.port()), n.log()));
        let sentinels =
            (self.sentinels.iter()).map(|n| (format!("sentinel {}", n.port()), n.log()));
        data.chain(sentinels).collect()
    }

    /// The ports of the two data nodes, in start order.
    pub fn data_ports(&self) -> Vec<u16> {
        self.data.iter().map(RedisServer::port).collect()
    }

    /// The data node on `port`: its log, `INFO`, a plain connection, its pid.
    pub fn data_node(&self, port: u16) -> &RedisServer {
        self.data
            .iter()
            .find(|n| n.port() == port)
            .unwrap_or_else(|| panic!("no data node on port {port}"))
    }

    fn data_node_mut(&mut self, port: u16) -> &mut RedisServer {
        self.data
            .iter_mut()
            .find(|n| n.port() == port)
            .unwrap_or_else(|| panic!("no data node on port {port}"))
    }

    /// The master's port, as every running sentinel reports it (`SENTINEL
    /// GET-MASTER-ADDR-BY-NAME`); while they disagree, this waits.
    pub fn master_port(&self) -> u16 {
        poll("the sentinels agree on the master", READY_WITHIN, || {
            self.agreed_master()
        })
    }

    /// The data node the sentinels report as the master.
    pub fn master(&self) -> &RedisServer {
        self.data_node(self.master_port())
    }

    /// The data node that is not the master.
    pub fn replica(&self) -> &RedisServer {
        let master = self.master_port();
        self.data
            .iter()
            .find(|n| n.port() != master)
            .expect("two data nodes")
    }

    /// Kills the master (`SIGKILL`) and returns its port; the sentinels promote the replica
    /// about [`DOWN_AFTER`] + 1 s later: [`wait_promotion`](Self::wait_promotion) waits for it.
    pub fn kill_master(&mut self) -> u16 {
        let master = self.master_port();
        self.kill(master);
        master
    }

    /// Waits, up to `within`, until every running sentinel reports a master other than the one
    /// on port `from`, and that node says it is master; returns its port.
    pub fn wait_promotion(&self, from: u16, within: Duration) -> u16 {
        poll(
            format!("the sentinels promote a new master in place of {from}"),
            within,
            || self.promoted(from),
        )
    }

    /// The new master's port once every sentinel reports a master other than `from` and that
    /// node says it is master; what is seen so far otherwise.
    fn promoted(&self, from: u16) -> Result<u16, String> {
        let master = self.agreed_master()?;
        if master == from {
            return Err(format!("the sentinels still report {from}"));
        }
        let info = (self.admin)
            .info(master, "replication")
            .map_err(|e| format!("INFO replication on {master}: {e}"))?;
        match field(&info, "role") {
            Some("master") => Ok(master),
            role => Err(format!("{master}, reported master, has role {role:?}")),
        }
    }

    /// `SENTINEL FAILOVER` (once the set-up is [ready](Self::wait_ready)): the replica is
    /// promoted without the master failing. Returns the new master's port once every sentinel
    /// reports it and it says it is master. The old master follows it only ~10 s later (see the
    /// [module docs](self)); [`wait_ready`](Self::wait_ready) waits for that.
    ///
    /// A requested failover can be aborted: another sentinel, not yet told of the new epoch,
    /// may turn the promoted replica back into a replica (`+convert-to-slave`), and the leader
    /// gives up after the failover timeout (`-failover-abort-slave-timeout`). It is requested
    /// again then, from the next sentinel, up to three times.
    pub fn failover(&self) -> u16 {
        let mut last = String::new();
        for attempt in 0..3 {
            self.wait_ready();
            let old = self.master_port();
            let asked: Vec<u16> = self.answering_sentinels().map(RedisServer::port).collect();
            let sentinel = asked[attempt % asked.len()];
            poll("a sentinel starts a failover", PROMOTION_WITHIN, || {
                let mut cmd = redis::cmd("SENTINEL");
                cmd.arg("FAILOVER").arg(MASTER_NAME);
                match self.admin.query::<()>(sentinel, &cmd) {
                    Ok(()) => Ok(()),
                    // A failover already under way (one this call started and whose answer was
                    // lost, or the sentinels' own) is waited for, not followed by a second one.
                    Err(e) if e.code() == Some("INPROG") => Ok(()),
                    // -NOGOODSLAVE while the sentinel's view of the replica settles.
                    Err(e) => Err(format!("SENTINEL FAILOVER: {e}")),
                }
            });
            // An aborted failover is given up after the failover timeout.
            match try_poll(FAILOVER_TIMEOUT * 2 + DOWN_AFTER, || self.promoted(old)) {
                Ok(master) => return master,
                Err(state) => {
                    eprintln!(
                        "requested failover {} of 3 did not promote the replica: {state}",
                        attempt + 1
                    );
                    last = state;
                }
            }
        }
        panic!("three requested failovers did not promote the replica; last seen: {last}")
    }

    /// Pauses sentinel `index` (`SIGSTOP`): a mute sentinel, which keeps its connections and
    /// answers nothing. The others go on without it; the waits skip it.
    pub fn pause_sentinel(&mut self, index: usize) {
        let sentinel = &self.sentinels[index];
        sentinel.pause();
        self.paused.insert(sentinel.port());
    }

    /// Resumes sentinel `index` (`SIGCONT`).
    pub fn resume_sentinel(&mut self, index: usize) {
        let sentinel = &self.sentinels[index];
        sentinel.resume();
        self.paused.remove(&sentinel.port());
    }

    /// The sentinels that run and are not paused.
    fn answering_sentinels(&self) -> impl Iterator<Item = &RedisServer> {
        (self.sentinels.iter()).filter(|s| s.pid().is_some() && !self.paused.contains(&s.port()))
    }

    /// Kills a data node (`SIGKILL`).
    pub fn kill(&mut self, port: u16) {
        self.data_node_mut(port).kill();
        self.paused.remove(&port);
    }

    /// Starts a killed (or running) data node again on its port: an empty master, until the
    /// sentinels make it a replica of the current master (~10 s; [`wait_ready`](Self::wait_ready)).
    pub fn restart(&mut self, port: u16) {
        self.data_node_mut(port).restart();
        self.paused.remove(&port);
    }

    /// Pauses a data node (`SIGSTOP`). A paused replica lags: it applies nothing, acknowledges
    /// nothing (`WAIT` times out), and after [`DOWN_AFTER`] the sentinels count it down.
    pub fn pause(&mut self, port: u16) {
        self.data_node(port).pause();
        self.paused.insert(port);
    }

    /// Resumes a paused data node (`SIGCONT`).
    pub fn resume(&mut self, port: u16) {
        self.data_node(port).resume();
        self.paused.remove(&port);
    }

    /// Pauses the replica and returns its port.
    pub fn pause_replica(&mut self) -> u16 {
        let replica = self.replica().port();
        self.pause(replica);
        replica
    }

    /// Resumes the replica paused with [`pause_replica`](Self::pause_replica).
    pub fn resume_replica(&mut self) {
        let master = self.master_port();
        let replica = self
            .data
            .iter()
            .find(|n| n.port() != master)
            .map(RedisServer::port);
        self.resume(replica.expect("two data nodes"));
    }

    /// Waits (up to 30 s) until every answering sentinel lists the replica as in sync with the
    /// master (`master-link-status ok`). A sentinel reads a replica's state every 10 s, so this
    /// can lag [`wait_ready`](Self::wait_ready) (which asks the replica itself) by as much; a
    /// `Locker`'s writes wait only for replicas the sentinels list in sync.
    pub fn wait_replica_listed_in_sync(&self) {
        poll(
            "the sentinels list the replica in sync",
            READY_WITHIN,
            || {
                let replica = self.replica().port().to_string();
                for sentinel in self.answering_sentinels().map(RedisServer::port) {
                    let listed = self.listed_replica(sentinel, &replica)?;
                    if listed.get("master-link-status").map(String::as_str) != Some("ok") {
                        return Err(format!(
                            "sentinel {sentinel} lists the replica as {listed:?}"
                        ));
                    }
                }
                Ok(())
            },
        );
    }

    /// Whether every answering sentinel holds the data node on `port` down (`s_down`).
    pub fn replica_down_everywhere(&self, port: u16) -> bool {
        let port = port.to_string();
        (self.answering_sentinels().map(RedisServer::port)).all(|sentinel| {
            self.listed_replica(sentinel, &port).is_ok_and(|r| {
                (r.get("flags")).is_some_and(|f| f.split(',').any(|f| f == "s_down"))
            })
        })
    }

    /// What `sentinel` says of the replica on `port` (`SENTINEL REPLICAS`).
    fn listed_replica(&self, sentinel: u16, port: &str) -> Result<HashMap<String, String>, String> {
        let mut cmd = redis::cmd("SENTINEL");
        cmd.arg("REPLICAS").arg(MASTER_NAME);
        let replicas: Vec<Vec<String>> = (self.admin.query(sentinel, &cmd))
            .map_err(|e| format!("SENTINEL REPLICAS on {sentinel}: {e}"))?;
        (replicas.into_iter())
            .map(|r| pairs(Ok(r)))
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .find(|r| r.get("port").map(String::as_str) == Some(port))
            .ok_or_else(|| format!("sentinel {sentinel} lists no replica on {port}"))
    }

    fn is_up(&self, port: u16) -> bool {
        !self.paused.contains(&port) && self.data_node(port).pid().is_some()
    }

    /// Waits (up to 30 s) until every sentinel agrees on the master and sees it up, the master
    /// says it is master, the other data node, if it runs, says it is the master's replica and in
    /// sync, every sentinel lists it as a replica that is up, and every sentinel knows the two
    /// others.
    pub fn wait_ready(&self) {
        poll("the sentinel set-up is ready", READY_WITHIN, || {
            self.health()
        });
    }

    fn health(&self) -> Result<(), String> {
        let master = self.agreed_master()?;
        if !self.is_up(master) {
            return Err(format!("the master {master} is down"));
        }
        let info = (self.admin)
            .info(master, "replication")
            .map_err(|e| format!("INFO replication on {master}: {e}"))?;
        if field(&info, "role") != Some("master") {
            return Err(format!("{master}, reported master, is a replica"));
        }
        let replica = (self.data_ports().into_iter()).find(|p| *p != master && self.is_up(*p));
        if let Some(replica) = replica {
            replica_in_sync(&self.admin, replica, master)?;
        }
        for sentinel in self.answering_sentinels().map(RedisServer::port) {
            let mut cmd = redis::cmd("SENTINEL");
            cmd.arg("MASTER").arg(MASTER_NAME);
            let state = pairs(self.admin.query(sentinel, &cmd))?;
            let others = (SENTINELS - 1).to_string();
            if state.get("flags").map(String::as_str) != Some("master")
                || state.get("num-other-sentinels") != Some(&others)
            {
                return Err(format!("sentinel {sentinel} sees the master as {state:?}"));
            }
            let Some(replica) = replica else { continue };
            let mut cmd = redis::cmd("SENTINEL");
            cmd.arg("REPLICAS").arg(MASTER_NAME);
            let replicas: Vec<Vec<String>> = (self.admin.query(sentinel, &cmd))
                .map_err(|e| format!("SENTINEL REPLICAS on {sentinel}: {e}"))?;
            let known = (replicas.into_iter())
                .map(|r| pairs(Ok(r)))
                .collect::<Result<Vec<_>, _>>()?
                .into_iter()
                .find(|r| r.get("port") == Some(&replica.to_string()));
            // Only the flags: the rest of a sentinel's view of a replica comes from its INFO,
            // refreshed every 10 s; whether the replica is in sync was asked of the replica.
            let flags = known.as_ref().and_then(|r| r.get("flags"));
            let healthy = matches!(flags.map(String::as_str), Some("slave" | "replica"));
            if !healthy {
                return Err(format!(
                    "sentinel {sentinel} sees replica {replica} as {known:?}"
                ));
            }
        }
        Ok(())
    }

    /// The master every running sentinel that is not paused reports, or what they report.
    fn agreed_master(&self) -> Result<u16, String> {
        let mut seen = BTreeSet::new();
        for sentinel in self.answering_sentinels() {
            let mut cmd = redis::cmd("SENTINEL");
            cmd.arg("GET-MASTER-ADDR-BY-NAME").arg(MASTER_NAME);
            let addr: (String, u16) = (self.admin.query(sentinel.port(), &cmd))
                .map_err(|e| format!("GET-MASTER-ADDR-BY-NAME on {}: {e}", sentinel.port()))?;
            seen.insert(addr.1);
        }
        match seen.len() {
            1 => Ok(seen.pop_first().expect("one")),
            0 => Err("no sentinel is running".to_owned()),
            _ => Err(format!("the sentinels disagree: {seen:?}")),
        }
    }
}

/// A sentinel's flat `[name, value, name, value, ...]` answer as a map.
fn pairs(answer: redis::RedisResult<Vec<String>>) -> Result<HashMap<String, String>, String> {
    let flat = answer.map_err(|e| e.to_string())?;
    let mut map = HashMap::new();
    for pair in flat.chunks(2) {
        if let [name, value] = pair {
            map.insert(name.clone(), value.clone());
        }
    }
    Ok(map)
}

/// A sentinel's configuration, monitoring the master on `master`.
fn sentinel_config(master: u16) -> String {
    let mut config = String::new();
    let name = MASTER_NAME;
    let down_after = DOWN_AFTER.as_millis();
    let failover_timeout = FAILOVER_TIMEOUT.as_millis();
    writeln!(config, "sentinel resolve-hostnames no").expect("write to a string");
    writeln!(
        config,
        "sentinel monitor {name} 127.0.0.1 {master} {QUORUM}"
    )
    .expect("write");
    writeln!(
        config,
        "sentinel down-after-milliseconds {name} {down_after}"
    )
    .expect("write");
    writeln!(
        config,
        "sentinel failover-timeout {name} {failover_timeout}"
    )
    .expect("write");
    writeln!(config, "sentinel parallel-syncs {name} 1").expect("write");
    config
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_monitors_the_master_with_a_quorum_of_two() {
        let config = sentinel_config(7000);
        assert!(
            config.contains("sentinel monitor dlock 127.0.0.1 7000 2\n"),
            "{config}"
        );
        assert!(
            config.contains("down-after-milliseconds dlock 1500\n"),
            "{config}"
        );
        assert!(config.contains("failover-timeout dlock 5000\n"), "{config}");
    }

    #[test]
    fn flat_answers_become_maps() {
        let flat = ["name", "dlock", "flags", "master"]
            .map(str::to_owned)
            .to_vec();
        let map = pairs(Ok(flat)).unwrap();
        assert_eq!(map["flags"], "master");
        assert_eq!(map.len(), 2);
    }
}
