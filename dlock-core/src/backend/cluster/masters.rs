//! A cluster's slot map, with the replicas it lists, and direct connections to its masters
//! for the watchdog's renewals.
//!
//! The renewals of every hold of a `Locker` go out at once, each slot's to its master. Sent
//! through redis-rs's cluster connection, they share its fate: while a master is dead and its
//! replica not yet promoted, that connection refreshes its slot map again and again, and a
//! refresh can stall every command on every node (it waits for a lock that a reconnection to
//! the dead master holds, and that reconnection is not driven while a refresh runs). So the watchdog
//! keeps a slot map and one multiplexed connection per master of its own: a master that dies,
//! hangs or gives its slots away costs only the renewals of the holds it keeps.
//!
//! The map is read with `CLUSTER SLOTS` from any master that answers (the seeds first time), and
//! read again after a renewal met `MOVED`, `ASK` or a broken connection. It also says how many
//! healthy replicas each master has — `CLUSTER SLOTS` leaves out a replica marked failed or not
//! yet synced — which is what a write waits for by default (`ReplicaAck::up_to_listed`); for
//! that, a map older than [`RELIST_EVERY`] is read again before the next write. Over an
//! application's cluster connection (no seeds, no settings to reach a master with), the map is
//! read through that connection and the renewals go through it too.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::SingleNodeRoutingInfo;
use redis::{AsyncConnectionConfig, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, Value};

/// The longest one node is waited for to answer `CLUSTER SLOTS`.
const SLOTS_TIMEOUT: Duration = Duration::from_millis(500);

/// How old the replica counts may be before they are read again.
const RELIST_EVERY: Duration = Duration::from_secs(1);

/// How many masters, at random, the map is asked of at once through an application's cluster
/// connection.
const VIA_READS: usize = 3;

/// A master, by the address the cluster gives for it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub(crate) struct Node {
    host: String,
    port: u16,
}

impl Node {
    /// A node from `host:port`, as a redirection (`ASK`, `MOVED`) names it.
    pub(crate) fn parse(addr: &str) -> Option<Self> {
        let (host, port) = addr.rsplit_once(':')?;
        Some(Self {
            host: host.to_owned(),
            port: port.parse().ok()?,
        })
    }
}

/// The masters of a cluster, with a connection to each that has been needed.
pub(crate) struct Masters {
    /// The seeds' connection settings (address, TLS, credentials): every master is reached with
    /// the first seed's settings and its own address.
    seeds: Vec<ConnectionInfo>,
    /// An application's cluster connection, when the `Locker` was given one instead of seeds:
    /// the map is read through it, and no master is reached directly.
    via: Option<ClusterConnection>,
    connect_timeout: Duration,
    state: Mutex<State>,
    /// One refresh of the map at a time.
    refreshing: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Masters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Masters").finish_non_exhaustive()
    }
}

#[derive(Default)]
struct State {
    /// Slot ranges (first, last) and their master, as the last `CLUSTER SLOTS` said.
    owners: Vec<(u16, u16, Node)>,
    /// Each master's healthy replicas, as the same `CLUSTER SLOTS` listed them.
    replicas: HashMap<Node, u32>,
    /// When the map was read.
    read_at: Option<Instant>,
    conns: HashMap<Node, MultiplexedConnection>,
    /// The map must be read again before it is trusted.
    stale: bool,
}

impl State {
    /// Whether the map can be trusted as it is: read while the cluster was ok, not marked
    /// stale since, and no older than [`RELIST_EVERY`].
    fn fresh(&self) -> bool {
        !self.stale && self.read_at.is_some_and(|at| at.elapsed() <= RELIST_EVERY)
    }
}

impl Masters {
    /// Masters reached through the cluster's seed URLs.
    pub(crate) fn new(urls: &[String], connect_timeout: Duration) -> redis::RedisResult<Self> {
        let seeds = (urls.iter())
            .map(|url| url.as_str().into_connection_info())
            .collect::<redis::RedisResult<Vec<_>>>()?;
        Ok(Self {
            seeds,
            via: None,
            connect_timeout,
            state: Mutex::new(State {
                stale: true,
                ..State::default()
            }),
            refreshing: tokio::sync::Mutex::new(()),
        })
    }

    /// Masters known only through an application's cluster connection: the map (and the
    /// replicas it lists) is read through `conn`, and the renewals go through it too.
    pub(crate) fn over(conn: ClusterConnection, connect_timeout: Duration) -> Self {
        Self {
            seeds: Vec::new(),
            via: Some(conn),
            connect_timeout,
            state: Mutex::new(State {
                stale: true,
                ..State::default()
            }),
            refreshing: tokio::sync::Mutex::new(()),
        }
    }

    /// Whether the masters can be reached directly (the `Locker` has the seeds' settings).
    pub(crate) fn direct(&self) -> bool {
        self.via.is_none()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The master of `slot`, as the map says (`None`: not known).
    pub(crate) fn owner(&self, slot: u16) -> Option<Node> {
        let state = self.state();
        (state.owners.iter())
            .find(|(first, last, _)| (*first..=*last).contains(&slot))
            .map(|(_, _, node)| node.clone())
    }

    /// How many healthy replicas the master of `slot` has (`None`: not known yet), or `Err`
    /// when the map must be read again first: it is stale, or older than [`RELIST_EVERY`].
    pub(crate) fn listed_replicas(&self, slot: u16) -> Result<Option<u32>, ()> {
        let state = self.state();
        if !state.fresh() {
            return Err(());
        }
        Ok((state.owners.iter())
            .find(|(first, last, _)| (*first..=*last).contains(&slot))
            .and_then(|(_, _, node)| state.replicas.get(node).copied()))
    }

    /// How many healthy replicas `node` has, as the map last said (`None`: not known).
    pub(crate) fn listed_replicas_of(&self, node: &Node) -> Option<u32> {
        self.state().replicas.get(node).copied()
    }

    /// Whether the map must be read (again) before it is used.
    pub(crate) fn is_stale(&self) -> bool {
        self.state().stale
    }

    /// Says the map may be wrong (a `MOVED`, an `ASK`, a master that did not answer).
    pub(crate) fn mark_stale(&self) {
        self.state().stale = true;
    }

    /// Drops the connection to `node` (it broke), and says the map may be wrong.
    pub(crate) fn forget(&self, node: &Node) {
        let mut state = self.state();
        state.conns.remove(node);
        state.stale = true;
    }

    /// Reads the map again from the first master (or seed) that answers within `within` each.
    /// Returns at once when another refresh is under way.
    pub(crate) async fn refresh(&self, within: Duration) {
        let Ok(_refreshing) = self.refreshing.try_lock() else {
            return;
        };
        self.read_map(within).await;
    }

    /// Reads the map again unless it is fresh ([`listed_replicas`](Self::listed_replicas)
    /// answers), waiting for a read under way (which may leave it fresh) rather than
    /// skipping it.
    pub(crate) async fn refresh_if_old(&self, within: Duration) {
        let Ok(_refreshing) = tokio::time::timeout(within, self.refreshing.lock()).await else {
            return;
        };
        let fresh = self.state().fresh();
        if !fresh {
            self.read_map(within).await;
        }
    }

    /// Reads the map from the first master (or seed) that answers within `within` each.
    async fn read_map(&self, within: Duration) {
        if let Some(conn) = &self.via {
            return self.read_map_via(conn, within).await;
        }
        let mut candidates: Vec<Node> = {
            let state = self.state();
            let mut known: Vec<Node> = state.owners.iter().map(|(_, _, n)| n.clone()).collect();
            known.dedup();
            known
        };
        for seed in &self.seeds {
            if let Some(node) = node_of(seed.addr())
                && !candidates.contains(&node)
            {
                candidates.push(node);
            }
        }
        // All at once, each briefly: a hung master must not hold up the map.
        let within = within.min(SLOTS_TIMEOUT);
        let reads: futures_util::stream::FuturesUnordered<_> = (candidates.into_iter())
            .map(|node| async move {
                let read = async {
                    let mut conn = self.connection(&node, within).await?;
                    let mut pipe = redis::pipe();
                    pipe.cmd("CLUSTER").arg("SLOTS").cmd("CLUSTER").arg("INFO");
                    let (slots, info): (Value, String) = pipe.query_async(&mut conn).await?;
                    Ok::<_, redis::RedisError>((slots, info.contains("cluster_state:ok")))
                };
                let reply = match tokio::time::timeout(within, read).await {
                    Ok(Ok(reply)) => Some(reply),
                    Ok(Err(err)) => {
                        tracing::debug!(port = node.port, error = %err, "dlock: CLUSTER SLOTS failed");
                        self.state().conns.remove(&node);
                        None
                    }
                    Err(_) => None,
                };
                (node, reply)
            })
            .collect();
        self.keep_first(reads).await;
    }

    /// [`read_map`](Self::read_map) through an application's cluster connection: asked of a
    /// few masters at random, all at once (a dead one must not keep the map unread). Masters
    /// only: a request to a paused replica can stall the whole connection (redis-rs reads its
    /// slot map again, and waits on that replica).
    async fn read_map_via(&self, conn: &ClusterConnection, within: Duration) {
        let within = within.min(SLOTS_TIMEOUT);
        let reads: futures_util::stream::FuturesUnordered<_> = (0..VIA_READS)
            .map(|_| async move {
                let mut pipe = redis::pipe();
                pipe.cmd("CLUSTER").arg("SLOTS").cmd("CLUSTER").arg("INFO");
                let mut conn = conn.clone();
                let read = conn.route_pipeline(pipe, 0, 2, SingleNodeRoutingInfo::RandomPrimary);
                let reply = match tokio::time::timeout(within, read).await {
                    Ok(Ok(values)) => {
                        let mut values = values.into_iter();
                        let slots = values.next();
                        let info: Option<String> =
                            values.next().and_then(|v| redis::from_redis_value(v).ok());
                        slots.zip(info.map(|i| i.contains("cluster_state:ok")))
                    }
                    Ok(Err(err)) => {
                        tracing::debug!(error = %err, "dlock: CLUSTER SLOTS failed");
                        None
                    }
                    Err(_) => None,
                };
                // A master announced without a host is on the one that answered, which this
                // route does not say: such entries keep an empty host (they are only compared
                // with one another).
                (Node::default(), reply)
            })
            .collect();
        self.keep_first(reads).await;
    }

    /// Keeps the first map from a node that says the cluster is ok; failing that, the first
    /// map at all, as stale: while a master is failing, its slots' owner and replicas are about
    /// to change, and a write must not wait for the replicas of a master that is gone.
    async fn keep_first(
        &self,
        mut reads: impl futures_util::Stream<Item = (Node, Option<(Value, bool)>)> + Unpin,
    ) {
        let mut failing = None;
        while let Some((node, reply)) = futures_util::StreamExt::next(&mut reads).await {
            let Some((slots, ok)) = reply else { continue };
            let Some(map) = parse_slots(slots, &node.host) else {
                continue;
            };
            if ok {
                self.keep(map, true);
                return;
            }
            failing.get_or_insert(map);
        }
        if let Some(map) = failing {
            self.keep(map, false);
        }
    }

    /// Keeps `map` as the slot map; `trusted` unless read while the cluster was failing.
    fn keep(&self, (owners, replicas): SlotMap, trusted: bool) {
        let mut state = self.state();
        let masters: Vec<&Node> = owners.iter().map(|(_, _, n)| n).collect();
        state.conns.retain(|n, _| masters.contains(&n));
        state.owners = owners;
        state.replicas = replicas;
        state.read_at = Some(Instant::now());
        state.stale = !trusted;
    }

    /// The connection to `node`, opened (within `within`) if there is none.
    pub(crate) async fn connection(
        &self,
        node: &Node,
        within: Duration,
    ) -> redis::RedisResult<MultiplexedConnection> {
        if let Some(conn) = self.state().conns.get(node) {
            return Ok(conn.clone());
        }
        let Some(seed) = self.seeds.first() else {
            return Err(redis::RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "no cluster seed URLs",
            )));
        };
        let info = seed.clone().set_addr(at(seed.addr(), node));
        let client = redis::Client::open(info)?;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout.min(within)))
            .set_response_timeout(None);
        let conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        self.state().conns.insert(node.clone(), conn.clone());
        Ok(conn)
    }
}

/// `addr` with the host and port of `node`, its TLS settings kept.
fn at(addr: &ConnectionAddr, node: &Node) -> ConnectionAddr {
    match addr {
        ConnectionAddr::TcpTls {
            insecure,
            tls_params,
            ..
        } => ConnectionAddr::TcpTls {
            host: node.host.clone(),
            port: node.port,
            insecure: *insecure,
            tls_params: tls_params.clone(),
        },
        _ => ConnectionAddr::Tcp(node.host.clone(), node.port),
    }
}

fn node_of(addr: &ConnectionAddr) -> Option<Node> {
    match addr {
        ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => Some(Node {
            host: host.clone(),
            port: *port,
        }),
        _ => None,
    }
}

/// A master of each slot range, and how many replicas each master has.
type SlotMap = (Vec<(u16, u16, Node)>, HashMap<Node, u32>);

/// `CLUSTER SLOTS`'s reply as (first, last, master) ranges, with the replicas listed for each
/// master (the reply leaves out failed replicas and ones not yet synced); a master announced
/// without a host (`""` or `"?"`) is on the host that answered.
fn parse_slots(reply: Value, answered_by: &str) -> Option<SlotMap> {
    let Value::Array(ranges) = reply else {
        return None;
    };
    let mut owners = Vec::with_capacity(ranges.len());
    let mut replicas = HashMap::new();
    for range in ranges {
        let Value::Array(parts) = range else {
            return None;
        };
        let mut parts = parts.into_iter();
        let first: u16 = redis::from_redis_value(parts.next()?).ok()?;
        let last: u16 = redis::from_redis_value(parts.next()?).ok()?;
        let Value::Array(master) = parts.next()? else {
            return None;
        };
        // What follows the master: one entry per replica.
        let listed = u32::try_from(parts.len()).unwrap_or(u32::MAX);
        let mut master = master.into_iter();
        let host: String = redis::from_redis_value(master.next()?).ok()?;
        let port: u16 = redis::from_redis_value(master.next()?).ok()?;
        let host = if host.is_empty() || host == "?" {
            answered_by.to_owned()
        } else {
            host
        };
        let node = Node { host, port };
        let count = replicas.entry(node.clone()).or_insert(listed);
        *count = (*count).max(listed);
        owners.push((first, last, node));
    }
    (!owners.is_empty()).then_some((owners, replicas))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn slots_are_read_with_their_masters() {
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                Value::Array(vec![text("127.0.0.1"), Value::Int(7000), text("id0")]),
                Value::Array(vec![text("127.0.0.1"), Value::Int(7003), text("id3")]),
            ]),
            Value::Array(vec![
                Value::Int(5461),
                Value::Int(16383),
                Value::Array(vec![text(""), Value::Int(7001), text("id1")]),
            ]),
        ]);
        let (owners, replicas) = parse_slots(reply, "10.0.0.9").unwrap();
        assert_eq!(
            owners,
            vec![
                (
                    0,
                    5460,
                    Node {
                        host: "127.0.0.1".into(),
                        port: 7000
                    }
                ),
                (
                    5461,
                    16383,
                    Node {
                        host: "10.0.0.9".into(),
                        port: 7001
                    }
                ),
            ]
        );
        let at = |host: &str, port| Node {
            host: host.into(),
            port,
        };
        assert_eq!(replicas.get(&at("127.0.0.1", 7000)), Some(&1));
        assert_eq!(replicas.get(&at("10.0.0.9", 7001)), Some(&0));
        assert_eq!(parse_slots(Value::Array(vec![]), "h"), None);
        assert_eq!(parse_slots(Value::Nil, "h"), None);
    }
}
