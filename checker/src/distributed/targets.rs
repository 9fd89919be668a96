//! What each distributed fault does to a cluster or a sentinel set-up, and what it records:
//! which names and lockers it reaches, over which span.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_core::redis::{self, AsyncCommands as _};
use tokio::time::Instant;

use dlock_core::Locker;

use super::{COMMAND_TIMEOUT, FOLLOW_WITHIN, PARTITIONED};
use crate::cluster::key_slot;
use crate::faults::{FaultKind, FaultRec, FaultSpec, Reach};
use crate::history::{History, locked};
use crate::invariants::{Invariant, Violation};
use crate::{Proxy, RedisCluster, RedisSentinel};

/// Which deployment a run's faults act on.
#[derive(Debug, Clone)]
pub(super) enum Deployment {
    Cluster(Arc<Mutex<RedisCluster>>),
    Sentinel(Arc<Mutex<RedisSentinel>>),
}

/// What the distributed injector acts on.
#[derive(Debug)]
pub(crate) struct DistributedTargets {
    pub(super) deployment: Deployment,
    /// Every name's keys, its lock's first (one slot: a `DEL` takes them all).
    pub(super) keys: Vec<Vec<String>>,
    pub(super) acked: bool,
    /// The proxies between the partitioned client and the servers.
    pub(super) partition: Vec<Proxy>,
    /// The port behind each of those proxies (on a cluster: the node it stands for).
    pub(super) partition_ports: Vec<u16>,
    /// The lockers that follow the deployment themselves, to see that they reach a promoted
    /// replica in time.
    pub(super) followers: Vec<Locker>,
    /// Lockers seen not to reach a promoted replica in time (see [`Invariant::Follows`]).
    pub(super) unfollowed: Mutex<Vec<Violation>>,
}

/// How often a killed master's cluster is looked at until it is ok again.
const REFUSALS_EVERY: Duration = Duration::from_millis(20);

/// How long after the deployment lists a replica again every locker has read the list: they
/// read it every second.
const RELISTED_WITHIN: Duration = Duration::from_millis(1200);

/// Waits until the cluster is ok again after a master died; returns when some node first and
/// last said it refused commands (`cluster_state:fail`), if one did.
fn watch_refusals(cluster: &RedisCluster) -> Option<(std::time::Instant, std::time::Instant)> {
    let give_up = std::time::Instant::now() + Duration::from_secs(30);
    let mut refused: Option<(std::time::Instant, std::time::Instant)> = None;
    loop {
        let seen = std::time::Instant::now();
        if cluster.is_down() {
            let first = refused.map_or(seen, |r| r.0);
            refused = Some((first, std::time::Instant::now()));
        } else if cluster.is_ok() {
            return refused.map(|(from, to)| (from, to + REFUSALS_EVERY));
        }
        assert!(
            seen < give_up,
            "the cluster is not ok 30 s after a master died"
        );
        std::thread::sleep(REFUSALS_EVERY);
    }
}

/// Kills master `port` and waits until the cluster is ok again; returns the span in which the
/// whole cluster refused commands, if it did: no hold anywhere could be renewed then.
async fn kill_and_watch(c: &Arc<Mutex<RedisCluster>>, port: u16) -> Option<FaultRec> {
    let owned = c.clone();
    let refused = blocking(move || {
        let mut cluster = locked(&owned);
        cluster.kill(port);
        watch_refusals(&cluster)
    })
    .await;
    refused.map(|(from, to)| FaultRec {
        kind: FaultKind::ClusterDown,
        reach: Reach::ALL,
        from: Instant::from_std(from),
        to: Instant::from_std(to),
    })
}

/// After `down`, starts the killed master `port` again (empty; the cluster makes it a replica
/// of the node that took over) and waits until the cluster is ok.
async fn restart_old_master(c: &Arc<Mutex<RedisCluster>>, port: u16, down: Duration) {
    let owned = c.clone();
    blocking(move || {
        std::thread::sleep(down);
        let mut cluster = locked(&owned);
        cluster.restart(port);
        cluster.wait_ok();
    })
    .await;
}

/// Runs a blocking harness call on the blocking pool.
pub(super) async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f)
        .await
        .expect("a harness call")
}

impl DistributedTargets {
    /// Carries out one fault, begun at `from`; returns what to record (nothing: not applied).
    pub(crate) async fn apply(
        &self,
        fault: FaultSpec,
        from: Instant,
        history: &History,
    ) -> Vec<FaultRec> {
        let lost_kind = |kind| {
            if self.acked {
                FaultKind::AckedFailover
            } else {
                kind
            }
        };
        let rec = |kind, reach| FaultRec {
            kind,
            reach,
            from,
            to: Instant::now(),
        };
        match (&self.deployment, fault) {
            (_, FaultSpec::Del(n)) => {
                let ok = self.del(self.keys[usize::from(n)].clone()).await;
                ok.then(|| rec(FaultKind::Del, Reach::name(n)))
                    .into_iter()
                    .collect()
            }
            (_, FaultSpec::Partition { span, cut }) => {
                for proxy in &self.partition {
                    if cut { proxy.cut() } else { proxy.stall() }
                }
                tokio::time::sleep(span).await;
                self.heal();
                vec![rec(FaultKind::Partition, Reach::ALL.through(PARTITIONED))]
            }
            (Deployment::Cluster(c), FaultSpec::CutNode { name, span, cut }) => {
                let port = self.master_of(c, name).await;
                let reach = self.names_on(c, port).await.through(PARTITIONED);
                let proxy = (self.partition.iter().zip(&self.partition_ports))
                    .find(|(_, p)| **p == port)
                    .map(|(proxy, _)| proxy);
                let Some(proxy) = proxy else {
                    // A master that was a replica when the run began has no proxy of its own
                    // in front of it: nothing to cut.
                    return Vec::new();
                };
                if cut {
                    proxy.cut()
                } else {
                    proxy.stall()
                }
                tokio::time::sleep(span).await;
                self.heal();
                vec![rec(FaultKind::NodeCut, reach)]
            }
            (Deployment::Cluster(c), FaultSpec::Migrate(n, open)) => {
                let (c, keys) = (c.clone(), self.keys[usize::from(n)].clone());
                let slot = key_slot(keys[0].as_bytes());
                let reach = Reach::names(
                    (0..self.keys.len())
                        .filter(|&i| key_slot(self.keys[i][0].as_bytes()) == slot)
                        .filter_map(|i| u8::try_from(i).ok()),
                );
                blocking(move || {
                    let cluster = locked(&c);
                    let source = cluster.master_for_slot(slot);
                    let Some(target) = (cluster.masters().into_iter()).find(|m| m.id != source.id)
                    else {
                        return;
                    };
                    let migration = cluster.begin_migration(slot, target.port);
                    // The lock key moves first, the others later: for a while the name's keys
                    // are on both sides, as a large slot's are while it moves batch by batch.
                    std::thread::sleep(open / 2);
                    cluster.migrate_keys(&migration, &keys[..1]);
                    std::thread::sleep(open / 2);
                    cluster.finish_migration(migration);
                })
                .await;
                vec![rec(FaultKind::Migration, reach)]
            }
            (Deployment::Cluster(c), FaultSpec::Failover(n)) => {
                let port = self.master_of(c, n).await;
                let reach = self.names_on(c, port).await;
                let (owned, key) = (c.clone(), self.keys[usize::from(n)][0].clone());
                // The failover's record ends at the promotion: a release the new master runs
                // from then on must wake its waiter (see `FaultKind::Promoted`), and the steady
                // holds on these names let go soon after.
                let promoted = blocking(move || {
                    let cluster = locked(&owned);
                    let replica = cluster.replica_of(&cluster.node_for_key(&key));
                    cluster.promote(replica.port, None);
                    Instant::now()
                })
                .await;
                history.promotions.send_replace(Some(reach));
                let owned = c.clone();
                blocking(move || locked(&owned).wait_ok()).await;
                let failover = FaultRec {
                    to: promoted,
                    ..rec(FaultKind::Failover, reach)
                };
                let spread = FaultRec {
                    from: promoted,
                    ..rec(FaultKind::Promoted, reach)
                };
                let mut recs = vec![failover, spread];
                recs.extend(self.acknowledged_again(c, n).await);
                recs
            }
            (Deployment::Cluster(c), FaultSpec::KillMaster(n, down)) => {
                let master = self.master_of(c, n).await;
                let reach = self.names_on(c, master).await;
                let refused = kill_and_watch(c, master).await;
                restart_old_master(c, master, down).await;
                let mut recs = vec![rec(lost_kind(FaultKind::MasterKilled), reach)];
                recs.extend(refused);
                recs.extend(self.acknowledged_again(c, n).await);
                recs
            }
            (Deployment::Cluster(c), FaultSpec::KillMasterForGood(n)) => {
                let master = self.master_of(c, n).await;
                let reach = self.names_on(c, master).await;
                let refused = kill_and_watch(c, master).await;
                // The replica took over; the old master stays dead while the lockers must
                // reach the new one, then comes back empty as a replica. The record runs to
                // then: a node that restarts may serve its old slots for a moment.
                tokio::time::sleep(FOLLOW_WITHIN).await;
                self.probe_promoted(c, n, master).await;
                restart_old_master(c, master, Duration::ZERO).await;
                let mut recs = vec![rec(lost_kind(FaultKind::MasterKilled), reach)];
                recs.extend(refused);
                recs.extend(self.acknowledged_again(c, n).await);
                recs
            }
            (Deployment::Cluster(c), FaultSpec::PauseReplica(n, pause)) => {
                let master = self.master_of(c, n).await;
                let reach = self.names_on(c, master).await;
                let (owned, key) = (c.clone(), self.keys[usize::from(n)][0].clone());
                blocking(move || {
                    let mut cluster = locked(&owned);
                    let replica = cluster.replica_of(&cluster.node_for_key(&key)).port;
                    cluster.pause(replica);
                    std::thread::sleep(pause);
                    cluster.resume(replica);
                })
                .await;
                let stall = rec(FaultKind::SlotMapStall, Reach::ALL);
                let mut recs = vec![rec(FaultKind::ReplicaPaused, reach), stall];
                recs.extend(self.acknowledged_again(c, n).await);
                recs
            }
            (Deployment::Cluster(c), FaultSpec::HangMaster(n, pause)) => {
                let master = self.master_of(c, n).await;
                let reach = self.names_on(c, master).await;
                let owned = c.clone();
                blocking(move || {
                    let mut cluster = locked(&owned);
                    cluster.pause(master);
                    std::thread::sleep(pause);
                    cluster.resume(master);
                })
                .await;
                // Nothing moved: the replica stays in sync, the slot map stays as it was.
                vec![rec(FaultKind::MasterHung, reach)]
            }
            (Deployment::Sentinel(s), FaultSpec::Failover(_)) => self.switch(s, None, from).await,
            (Deployment::Sentinel(s), FaultSpec::MuteSentinel { index, span }) => {
                self.switch(s, Some((usize::from(index), span)), from).await
            }
            (Deployment::Sentinel(s), FaultSpec::KillMaster(_, down)) => {
                let s = s.clone();
                let moved = s.clone();
                let moved_back = s.clone();
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
                let restarted = Instant::now();
                let mut recs = vec![rec(lost_kind(FaultKind::MasterKilled), Reach::ALL)];
                recs.extend(self.listed_again(&moved_back).await.map(|to| FaultRec {
                    kind: FaultKind::Resync,
                    reach: Reach::ALL,
                    from: restarted,
                    to,
                }));
                recs
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
                vec![rec(FaultKind::ReplicaPaused, Reach::ALL)]
            }
            (_, other) => unreachable!("fault {other:?} planned for a distributed run"),
        }
    }

    /// `SENTINEL FAILOVER`, with one sentinel mute for a while if `mute` says which and how
    /// long.
    ///
    /// The failover may lose what the old master took (it stays writable until it follows the
    /// new one), but only what it took until the lockers could have heard of the new master:
    /// [`FOLLOW_WITHIN`] after the sentinels agree on it. A grant on the old master later than
    /// that is not excused. Until the old master follows, the new one has no replica:
    /// acknowledged writes fail, and that is a fault too, one that loses nothing.
    async fn switch(
        &self,
        set: &Arc<Mutex<RedisSentinel>>,
        mute: Option<(usize, Duration)>,
        from: Instant,
    ) -> Vec<FaultRec> {
        let moved = set.clone();
        blocking(move || {
            let mut set = locked(&moved);
            if let Some((index, _)) = mute {
                set.pause_sentinel(index);
            }
            set.failover()
        })
        .await;
        let promoted = Instant::now();
        self.follow_master(set).await;
        let mut recs = Vec::new();
        if let Some((index, span)) = mute {
            tokio::time::sleep_until(from + span).await;
            let set = set.clone();
            blocking(move || locked(&set).resume_sentinel(index)).await;
            recs.push(FaultRec {
                kind: FaultKind::SentinelMute,
                reach: Reach::ALL,
                from,
                to: Instant::now(),
            });
        }
        let settled = set.clone();
        blocking(move || locked(&settled).wait_ready()).await;
        self.listed_again(set).await;
        let kind = if self.acked {
            FaultKind::AckedFailover
        } else {
            FaultKind::Switch
        };
        let switch = FaultRec {
            kind,
            reach: Reach::ALL,
            from,
            to: promoted + FOLLOW_WITHIN,
        };
        recs.push(switch);
        // Only acknowledged writes need the replica.
        if self.acked {
            recs.push(FaultRec {
                kind: FaultKind::Resync,
                reach: Reach::ALL,
                from: promoted,
                to: Instant::now(),
            });
        }
        recs
    }

    /// In acknowledged runs, after a fault on the master serving name `n`: waits (up to 10 s)
    /// until that master's replica acknowledges writes again (`WAIT 1 100` answers 1). A
    /// replica that rejoined, or whose master changed, may sync for a while after the cluster
    /// says ok, and no acknowledged write can succeed meanwhile; then until the cluster lists
    /// it again and the lockers have read the list (until then their writes don't wait for
    /// it, so the next fault must not come before). That span, measured, is recorded as a
    /// fault of its own (one that loses nothing).
    async fn acknowledged_again(&self, c: &Arc<Mutex<RedisCluster>>, n: u8) -> Option<FaultRec> {
        if !self.acked {
            return None;
        }
        let from = Instant::now();
        let port = self.master_of(c, n).await;
        let reach = self.names_on(c, port).await;
        let url = format!("redis://127.0.0.1:{port}/");
        let client = redis::Client::open(url).ok()?;
        let give_up = from + Duration::from_secs(10);
        while Instant::now() < give_up {
            let acked = tokio::time::timeout(Duration::from_secs(1), async {
                let mut con = client.get_multiplexed_async_connection().await?;
                redis::cmd("WAIT")
                    .arg(1)
                    .arg(100)
                    .query_async::<i64>(&mut con)
                    .await
            })
            .await;
            if matches!(acked, Ok(Ok(n)) if n >= 1) {
                break;
            }
        }
        // Acknowledging, and listed too, for the lockers' writes to wait for it again.
        let listed = c.clone();
        blocking(move || locked(&listed).wait_replicas_listed()).await;
        tokio::time::sleep(RELISTED_WITHIN).await;
        let to = Instant::now();
        (to - from > REFUSALS_EVERY).then_some(FaultRec {
            kind: FaultKind::Resync,
            reach,
            from,
            to,
        })
    }

    /// In acknowledged runs, after a failover or a master's restart: waits until the sentinels
    /// list the replica in sync (they read a replica's state every 10 s), and the lockers have
    /// read that list ([`RELISTED_WITHIN`]). Meanwhile the lockers' writes don't wait for the
    /// replica (see `ReplicaAck::up_to_listed`), so the next fault must not come before. Returns
    /// when it is over (`None` in other runs).
    async fn listed_again(&self, set: &Arc<Mutex<RedisSentinel>>) -> Option<Instant> {
        if !self.acked {
            return None;
        }
        let set = set.clone();
        blocking(move || locked(&set).wait_replica_listed_in_sync()).await;
        tokio::time::sleep(RELISTED_WITHIN).await;
        Some(Instant::now())
    }

    /// Has every following locker take and give back a name of its own on the master that
    /// serves name `n`'s slot now — the replica promoted in place of `dead`, which stays dead
    /// meanwhile — and records a [`Invariant::Follows`] violation for each that fails or
    /// answers later than a command timeout (with room).
    async fn probe_promoted(&self, c: &Arc<Mutex<RedisCluster>>, n: u8, dead: u16) {
        let port = self.master_of(c, n).await;
        let owned = c.clone();
        let node = blocking(move || {
            locked(&owned)
                .masters()
                .into_iter()
                .find(|m| m.port == port)
        })
        .await;
        let (Some(node), Some(first)) = (node, self.followers.first()) else {
            return;
        };
        let serves = |name: &str| {
            (first.key_of(name).ok()).is_some_and(|k| {
                node.slots
                    .iter()
                    .any(|r| r.contains(&key_slot(k.as_bytes())))
            })
        };
        let Some(name) = (0..100_000)
            .map(|i| format!("promoted{i}"))
            .find(|n| serves(n))
        else {
            return;
        };
        let bound = COMMAND_TIMEOUT + Duration::from_millis(200);
        for (i, locker) in self.followers.iter().enumerate() {
            let asked = Instant::now();
            let answer = tokio::time::timeout(bound, locker.lock(name.as_str()).try_lock()).await;
            let problem = match answer {
                Ok(Ok(Some(guard))) => {
                    let _ = guard.release().await;
                    None
                }
                Ok(Ok(None)) => None,
                Ok(Err(err)) => Some(format!("failed: {err}")),
                Err(_) => Some(format!("gave no answer within {bound:?}")),
            };
            if let Some(problem) = problem {
                locked(&self.unfollowed).push(Violation {
                    invariant: Invariant::Follows,
                    summary: format!(
                        "locker {i}, asked {FOLLOW_WITHIN:?} after the cluster was ok again for \
                         `{name}` on the promoted master {port} (master {dead} dead since), \
                         {problem} ({:?} after it was asked)",
                        asked.elapsed()
                    ),
                    window: None,
                    hint: "",
                });
            }
        }
    }

    /// The port of the master that serves name `n`'s slot now.
    async fn master_of(&self, c: &Arc<Mutex<RedisCluster>>, n: u8) -> u16 {
        let (c, key) = (c.clone(), self.keys[usize::from(n)][0].clone());
        blocking(move || locked(&c).node_for_key(&key).port).await
    }

    /// The names whose slots the master on `port` serves now.
    async fn names_on(&self, c: &Arc<Mutex<RedisCluster>>, port: u16) -> Reach {
        let (c, keys) = (c.clone(), self.keys.clone());
        blocking(move || {
            let cluster = locked(&c);
            Reach::names(
                (keys.iter().enumerate())
                    .filter(|(_, k)| cluster.node_for_key(&k[0]).port == port)
                    .filter_map(|(i, _)| u8::try_from(i).ok()),
            )
        })
        .await
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
    pub(super) async fn masters(&self) -> Vec<u16> {
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
