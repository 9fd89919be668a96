//! Redis Cluster: which slot a key lives in, and connecting to a cluster.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, RedisResult, Value};

use crate::error::BackendError;

mod masters;

pub(crate) use masters::{Masters, Node};

pub(crate) use crate::protocol::slot::key_slot;

/// The longest the cluster client waits on one node, to connect or for one answer (plus the
/// replicas' acknowledgement wait, when writes wait for one): every step of its slot-map refresh
/// is bounded by it (redis-rs waits without end by default, and a refresh that waits holds up
/// every command). Not shorter than dlock's default command timeout: redis-rs sends a command
/// whose answer timed out once more, and a write sent twice may apply twice.
const NODE_TIMEOUT: Duration = Duration::from_secs(2);

/// How to reach a cluster: its seed nodes' URLs and the connect timeout. The data connection
/// and the subscriber's (RESP3, for sharded pub/sub) are built from it.
#[derive(Debug, Clone)]
pub(crate) struct ClusterSeeds {
    pub(crate) urls: Vec<String>,
    pub(crate) connect_timeout: Duration,
    /// How long a write may wait for replicas to acknowledge it (`WAIT`), if writes wait.
    pub(crate) ack_wait: Option<Duration>,
}

impl ClusterSeeds {
    pub(crate) fn builder(&self) -> ClusterClientBuilder {
        ClusterClient::builder(self.urls.clone())
            .connection_timeout(self.connect_timeout.min(NODE_TIMEOUT))
            .response_timeout(NODE_TIMEOUT + self.ack_wait.unwrap_or_default())
            // Every call is bounded by dlock's command timeout; inside it the client follows
            // MOVED and ASK. A few retries only: each retry at a dead master sets off another
            // refresh of the slot map, during which no command moves.
            .retries(3)
            .min_retry_wait(10)
            .max_retry_wait(200)
    }
}

/// A cluster connection opened by the first command that needs it (and again by the next one
/// if that failed), so a `Locker` can be built while the cluster is down. Cheap to clone.
///
/// Once open, redis-rs's cluster connection reconnects to the nodes by itself — mostly. After a
/// master dies and its replica is promoted, a connection that had traffic to the dead master
/// can keep failing every command long after the cluster is ok again (its slot map is never
/// refreshed, or a refresh never ends). So failures are counted here: a burst of them (a few
/// calls failing on the connection, or cut off by dlock's timeout after a while) replaces the
/// connection with a new one from the client, which reads the cluster's current slot map. Calls
/// already in flight finish on the old one. At most one replacement a second.
#[derive(Clone)]
pub(crate) struct LazyCluster {
    inner: Arc<LazyInner>,
}

struct LazyInner {
    /// `None` over an application's connection, which is open from the start.
    client: Option<ClusterClient>,
    connect_timeout: Duration,
    open: Mutex<Option<ClusterConnection>>,
    /// One connection attempt at a time.
    opening: tokio::sync::Mutex<()>,
    /// Recent failures, and when the connection was last replaced.
    failures: Mutex<Failures>,
}

/// A call cut off after this long in flight counts as a failure of the connection (one cut off
/// sooner was given up by its caller, not failed by the connection).
const STALLED: Duration = Duration::from_millis(250);

/// This many failures within [`FAILURE_WINDOW`] replace the connection.
const FAILURES_TO_REPLACE: u32 = 3;

/// The window failures are counted in.
const FAILURE_WINDOW: Duration = Duration::from_secs(1);

/// The least time between two replacements.
const REPLACE_GAP: Duration = Duration::from_secs(1);

/// Failures of the open connection, counted per window.
#[derive(Debug, Default)]
struct Failures {
    count: u32,
    window_start: Option<std::time::Instant>,
    replaced_at: Option<std::time::Instant>,
    /// Said once: an application's connection can't be replaced.
    warned: bool,
}

impl LazyCluster {
    pub(crate) fn new(client: Option<ClusterClient>, connect_timeout: Duration) -> Self {
        Self {
            inner: Arc::new(LazyInner {
                client,
                connect_timeout,
                open: Mutex::new(None),
                opening: tokio::sync::Mutex::new(()),
                failures: Mutex::new(Failures::default()),
            }),
        }
    }

    /// Over an application's open connection.
    pub(crate) fn open(conn: ClusterConnection) -> Self {
        let lazy = Self::new(None, Duration::ZERO);
        *lazy.open_conn() = Some(conn);
        lazy
    }

    fn open_conn(&self) -> std::sync::MutexGuard<'_, Option<ClusterConnection>> {
        self.inner.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The open connection, opening it first if needed (within the connect timeout).
    pub(crate) async fn connection(&self) -> RedisResult<ClusterConnection> {
        if let Some(conn) = self.open_conn().as_ref() {
            return Ok(conn.clone());
        }
        let _opening = self.inner.opening.lock().await;
        if let Some(conn) = self.open_conn().as_ref() {
            return Ok(conn.clone());
        }
        let Some(client) = &self.inner.client else {
            return Err(redis::RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "no cluster connection",
            )));
        };
        let conn =
            match tokio::time::timeout(self.inner.connect_timeout, client.get_async_connection())
                .await
            {
                Ok(conn) => conn?,
                Err(_) => {
                    return Err(redis::RedisError::from(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "no cluster node answered in time",
                    )));
                }
            };
        *self.open_conn() = Some(conn.clone());
        Ok(conn)
    }
}

impl LazyCluster {
    /// Counts one failure of the open connection, and replaces the connection when failures
    /// come in a burst.
    fn failed(&self) {
        let now = std::time::Instant::now();
        let mut failures = self
            .inner
            .failures
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if (failures.window_start).is_none_or(|start| now.duration_since(start) > FAILURE_WINDOW) {
            failures.window_start = Some(now);
            failures.count = 0;
        }
        failures.count += 1;
        let due = (failures.replaced_at).is_none_or(|at| now.duration_since(at) >= REPLACE_GAP);
        if failures.count < FAILURES_TO_REPLACE || !due {
            return;
        }
        if self.inner.client.is_none() {
            if !std::mem::replace(&mut failures.warned, true) {
                tracing::warn!(
                    "dlock: the application's cluster connection keeps failing; it can't be \
                     replaced from here (build the Locker from seed URLs to have it replaced)"
                );
            }
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        failures.replaced_at = Some(now);
        failures.count = 0;
        drop(failures);
        runtime.spawn(self.clone().replace());
    }

    /// Opens a new connection (reading the cluster's slot map afresh) and makes it the one new
    /// calls use.
    async fn replace(self) {
        let Some(client) = &self.inner.client else {
            return;
        };
        // A connection being opened anyway will do.
        let Ok(_opening) = self.inner.opening.try_lock() else {
            return;
        };
        let fresh =
            tokio::time::timeout(self.inner.connect_timeout, client.get_async_connection()).await;
        match fresh {
            Ok(Ok(conn)) => {
                *self.open_conn() = Some(conn);
                tracing::info!("dlock: replaced a failing cluster connection");
            }
            Ok(Err(err)) => {
                tracing::debug!(error = %err, "dlock: a new cluster connection failed");
            }
            Err(_) => tracing::debug!("dlock: a new cluster connection timed out"),
        }
    }

    /// Runs one call on the open connection, counting its failure (an error of the connection,
    /// or being cut off by the caller after [`STALLED`]).
    async fn call<T>(
        &self,
        call: impl AsyncFnOnce(ClusterConnection) -> RedisResult<T>,
    ) -> RedisResult<T> {
        let conn = self.connection().await?;
        let mut watch = CallWatch {
            cluster: self,
            started: std::time::Instant::now(),
            done: false,
        };
        let res = call(conn).await;
        watch.done = true;
        if let Err(err) = &res
            && connection_failure(err)
        {
            self.failed();
        }
        res
    }
}

/// Whether `err` says the connection (not the command) failed.
fn connection_failure(err: &RedisError) -> bool {
    err.is_io_error()
        || err.is_timeout()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
        || err.kind() == ErrorKind::ClusterConnectionNotFound
}

/// Counts a call dropped unfinished after [`STALLED`] as a failure of the connection.
struct CallWatch<'a> {
    cluster: &'a LazyCluster,
    started: std::time::Instant,
    done: bool,
}

impl Drop for CallWatch<'_> {
    fn drop(&mut self) {
        if !self.done && self.started.elapsed() >= STALLED {
            self.cluster.failed();
        }
    }
}

/// A master of the cluster, as the client's slot map names it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Master {
    host: String,
    port: u16,
}

impl LazyCluster {
    /// Every master that serves slots, as the client's slot map has them: a `PING` to all
    /// masters, whose answers come back by address.
    async fn masters(&self) -> RedisResult<Vec<Master>> {
        let mut conn = self.connection().await?;
        let all = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
        let reply = conn.route_command(redis::cmd("PING"), all).await?;
        let Value::Map(answers) = reply else {
            return Err(protocol("PING to every master: not one answer per master"));
        };
        let mut masters = Vec::with_capacity(answers.len());
        for (address, answer) in answers {
            if let Value::ServerError(err) = answer {
                return Err(err.into());
            }
            let address: String = redis::from_redis_value(address)?;
            let master = (address.rsplit_once(':'))
                .and_then(|(host, port)| Some((host, port.parse().ok()?)))
                .map(|(host, port)| Master {
                    host: host.to_owned(),
                    port,
                })
                .ok_or_else(|| protocol("PING to every master: an address without a port"))?;
            masters.push(master);
        }
        masters.sort();
        masters.dedup();
        Ok(masters)
    }

    /// Every key matching `pattern` on every master, `SCAN` by `SCAN` (`count` keys a batch),
    /// each call bounded by `timeout`. Unsorted; a key may come twice if its slot moves meanwhile.
    pub(crate) async fn scan(
        &self,
        pattern: &str,
        count: usize,
        timeout: Duration,
    ) -> Result<Vec<String>, BackendError> {
        async fn bounded<T>(
            timeout: Duration,
            call: impl Future<Output = RedisResult<T>>,
        ) -> Result<T, BackendError> {
            match tokio::time::timeout(timeout, call).await {
                Ok(res) => res.map_err(BackendError::redis),
                Err(_) => Err(BackendError::timeout(timeout)),
            }
        }
        let mut keys = Vec::new();
        for master in bounded(timeout, self.masters()).await? {
            let mut cursor = 0u64;
            loop {
                let batch = self.scan_batch(&master, cursor, pattern, count);
                let (next, batch) = bounded(timeout, batch).await?;
                keys.extend(batch);
                cursor = next;
                if cursor == 0 {
                    break;
                }
            }
        }
        Ok(keys)
    }

    /// One `SCAN` batch on `master`: the next cursor (0 at the end) and the keys it returned.
    async fn scan_batch(
        &self,
        master: &Master,
        cursor: u64,
        pattern: &str,
        count: usize,
    ) -> RedisResult<(u64, Vec<String>)> {
        let mut conn = self.connection().await?;
        let mut scan = redis::cmd("SCAN");
        scan.arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(count);
        let at = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
            host: master.host.clone(),
            port: master.port,
        });
        Ok(redis::from_redis_value(
            conn.route_command(scan, at).await?,
        )?)
    }
}

fn protocol(message: &'static str) -> RedisError {
    RedisError::from((ErrorKind::Client, "unexpected reply", message.to_owned()))
}

impl std::fmt::Debug for LazyCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LazyCluster").finish_non_exhaustive()
    }
}

impl ConnectionLike for LazyCluster {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            self.call(async |mut conn| conn.req_packed_command(cmd).await)
                .await
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            self.call(async |mut conn| conn.req_packed_commands(pipeline, offset, count).await)
                .await
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}
