//! Redis Cluster: which slot a key lives in, and connecting to a cluster.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, RedisResult, Value};

use crate::error::BackendError;

/// The number of hash slots of a Redis Cluster.
pub(crate) const SLOTS: u16 = 16384;

/// The hash slot of `key`: CRC16 (XMODEM) of its hash tag — the part between the first `{` and
/// the next `}` when that is not empty — or of the whole key, modulo 16384. Every key of one lock
/// shares the `{name}` tag, so one lock lives in one slot.
pub(crate) fn key_slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16(tagged.unwrap_or(key)) % SLOTS
}

/// CRC16-CCITT (XMODEM): polynomial 0x1021, initial value 0, no reflection.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// How to reach a cluster: its seed nodes' URLs and the connect timeout. The data connection
/// and the subscriber's (RESP3, for sharded pub/sub) are built from it.
#[derive(Debug, Clone)]
pub(crate) struct ClusterSeeds {
    pub(crate) urls: Vec<String>,
    pub(crate) connect_timeout: Duration,
}

impl ClusterSeeds {
    pub(crate) fn builder(&self) -> ClusterClientBuilder {
        ClusterClient::builder(self.urls.clone())
            .connection_timeout(self.connect_timeout)
            // Every call is bounded by dlock's command timeout; inside it the client follows
            // MOVED and ASK and retries while a failover settles.
            .retries(16)
            .min_retry_wait(10)
            .max_retry_wait(200)
    }
}

/// A cluster connection opened by the first command that needs it (and again by the next one
/// if that failed), so a `Locker` can be built while the cluster is down. Once open, redis-rs's
/// cluster connection reconnects to the nodes by itself. Cheap to clone.
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
}

impl LazyCluster {
    pub(crate) fn new(client: Option<ClusterClient>, connect_timeout: Duration) -> Self {
        Self {
            inner: Arc::new(LazyInner {
                client,
                connect_timeout,
                open: Mutex::new(None),
                opening: tokio::sync::Mutex::new(()),
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

impl ConnectionLike for LazyCluster {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move { self.connection().await?.req_packed_command(cmd).await })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            (self.connection().await?)
                .req_packed_commands(pipeline, offset, count)
                .await
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_the_ones_redis_cluster_documents() {
        // From the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"foo{}{bar}"), key_slot(b"foo{}{bar}"));
        assert_ne!(key_slot(b"foo{}{bar}"), key_slot(b"bar"));
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
        assert_eq!(
            key_slot(b"dlock:{order:1}"),
            key_slot(b"dlock:{order:1}:fence")
        );
    }
}
