//! The Redis backend: scripts by SHA over a connection manager, a multiplexed connection or a
//! bb8 pool, every call bounded by the command timeout.

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, MultiplexedConnection};
use redis::{FromRedisValue, Pipeline, RedisResult, ScriptInvocation, Value};

use super::{AcquireReply, HandoffReply, ReleaseReply, RenewItem};
use crate::error::BackendError;
use crate::name::LockKeys;
use crate::script;
use crate::wait::{Slots, Subscriber, Watch};

/// How many locks one renewal script call carries; a tick pipelines as many calls as needed.
const RENEW_CHUNK: usize = 256;

#[derive(Clone)]
pub(crate) enum RedisConn {
    Manager(ConnectionManager),
    Multiplexed(MultiplexedConnection),
    Pool(bb8::Pool<bb8_redis::RedisConnectionManager>),
}

impl RedisConn {
    fn kind(&self) -> &'static str {
        match self {
            Self::Manager(_) => "redis",
            Self::Multiplexed(_) => "redis (multiplexed connection)",
            Self::Pool(_) => "redis (bb8 pool)",
        }
    }
}

#[derive(Clone)]
pub(crate) struct RedisBackend {
    conn: RedisConn,
    timeout: Duration,
    /// The client used for the subscriber connection, if any.
    client: Option<redis::Client>,
    subscriber: Arc<OnceLock<Subscriber>>,
    /// Slots used when there is no subscriber: waiters poll.
    poll_slots: Arc<Slots>,
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("kind", &self.conn.kind())
            .field("timeout", &self.timeout)
            .field("subscriber", &self.client.is_some())
            .finish()
    }
}

impl RedisBackend {
    pub(crate) fn new(conn: RedisConn, client: Option<redis::Client>, timeout: Duration) -> Self {
        Self {
            conn,
            timeout,
            client,
            subscriber: Arc::new(OnceLock::new()),
            poll_slots: Arc::new(Slots::default()),
        }
    }

    pub(crate) fn kind(&self) -> &'static str {
        self.conn.kind()
    }

    /// One multiplexed connection (directly or through the manager): commands stay in order.
    pub(crate) fn is_pipelined(&self) -> bool {
        !matches!(self.conn, RedisConn::Pool(_))
    }

    async fn bounded<T>(
        &self,
        fut: impl Future<Output = Result<T, BackendError>>,
    ) -> Result<T, BackendError> {
        match tokio::time::timeout(self.timeout, fut).await {
            Ok(res) => res,
            Err(_) => Err(BackendError::timeout(self.timeout)),
        }
    }

    async fn invoke<T: FromRedisValue>(
        &self,
        inv: &ScriptInvocation<'_>,
    ) -> Result<T, BackendError> {
        self.bounded(async {
            let res: RedisResult<T> = match &self.conn {
                RedisConn::Manager(c) => inv.invoke_async(&mut c.clone()).await,
                RedisConn::Multiplexed(c) => inv.invoke_async(&mut c.clone()).await,
                RedisConn::Pool(p) => {
                    let mut c = p.get().await.map_err(BackendError::pool)?;
                    inv.invoke_async(&mut *c).await
                }
            };
            res.map_err(BackendError::redis)
        })
        .await
    }

    async fn pipeline(
        &self,
        pipe: &Pipeline,
        reload: &[&redis::Script],
    ) -> Result<Vec<Value>, BackendError> {
        async fn go<C: ConnectionLike>(
            c: &mut C,
            pipe: &Pipeline,
            reload: &[&redis::Script],
        ) -> RedisResult<Vec<Value>> {
            match pipe.query_async::<Vec<Value>>(c).await {
                Err(err)
                    if err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                {
                    for s in reload {
                        s.prepare_invoke().load_async(c).await?;
                    }
                    pipe.query_async(c).await
                }
                other => other,
            }
        }
        self.bounded(async {
            let res = match &self.conn {
                RedisConn::Manager(c) => go(&mut c.clone(), pipe, reload).await,
                RedisConn::Multiplexed(c) => go(&mut c.clone(), pipe, reload).await,
                RedisConn::Pool(p) => {
                    let mut c = p.get().await.map_err(BackendError::pool)?;
                    go(&mut *c, pipe, reload).await
                }
            };
            res.map_err(BackendError::redis)
        })
        .await
    }

    /// One `PING`, bounded by the command timeout.
    pub(crate) async fn ping(&self) -> Result<(), BackendError> {
        let mut pipe = redis::pipe();
        pipe.cmd("PING");
        self.pipeline(&pipe, &[]).await.map(|_| ())
    }

    pub(crate) async fn acquire(
        &self,
        keys: &LockKeys,
        owner: &str,
        lease: Duration,
        fence_ttl: Option<Duration>,
        reenter: bool,
    ) -> Result<AcquireReply, BackendError> {
        let mut inv = script::ACQUIRE.prepare_invoke();
        inv.key(&keys.lock)
            .key(&keys.fence)
            .arg(owner)
            .arg(millis(lease))
            .arg(fence_ttl.map_or(0, millis))
            .arg(u8::from(reenter));
        let (code, value): (i64, i64) = self.invoke(&inv).await?;
        match code {
            1 | 2 => Ok(AcquireReply::Acquired {
                fence: u64::try_from(value)
                    .map_err(|_| BackendError::protocol("negative fencing token"))?,
                reentered: code == 2,
            }),
            0 => Ok(AcquireReply::Busy {
                pttl: u64::try_from(value).ok().map(Duration::from_millis),
            }),
            other => Err(BackendError::protocol(format!(
                "acquire script answered {other}"
            ))),
        }
    }

    pub(crate) async fn release(
        &self,
        keys: &LockKeys,
        owner: &str,
    ) -> Result<ReleaseReply, BackendError> {
        let mut inv = script::RELEASE.prepare_invoke();
        inv.key(&keys.lock)
            .key(&keys.fence)
            .key(&keys.channel)
            .arg(owner);
        let (code, woke): (i64, i64) = self.invoke(&inv).await?;
        Ok(match code {
            0 => ReleaseReply::released(woke),
            code => ReleaseReply::from_code(code),
        })
    }

    pub(crate) async fn handoff(
        &self,
        keys: &LockKeys,
        from: &str,
        to: &str,
        lease: Duration,
        fence_ttl: Option<Duration>,
    ) -> Result<HandoffReply, BackendError> {
        let mut inv = script::HANDOFF.prepare_invoke();
        inv.key(&keys.lock)
            .key(&keys.fence)
            .key(&keys.channel)
            .arg(from)
            .arg(to)
            .arg(millis(lease))
            .arg(fence_ttl.map_or(0, millis));
        let (code, value): (i64, i64) = self.invoke(&inv).await?;
        if code == 1 {
            Ok(HandoffReply::HandedOver {
                fence: u64::try_from(value)
                    .map_err(|_| BackendError::protocol("negative fencing token"))?,
            })
        } else {
            Ok(HandoffReply::NotHandedOver(ReleaseReply::from_code(value)))
        }
    }

    /// Renews every item in one round trip: one script call per chunk, all pipelined.
    pub(crate) async fn renew(&self, items: &[RenewItem]) -> Result<Vec<bool>, BackendError> {
        let mut pipe = redis::pipe();
        let hash = script::RENEW.get_hash();
        for chunk in items.chunks(RENEW_CHUNK) {
            let cmd = pipe.cmd("EVALSHA").arg(hash).arg(chunk.len());
            for item in chunk {
                cmd.arg(&item.key);
            }
            for item in chunk {
                cmd.arg(&item.owner).arg(item.lease_ms);
            }
        }
        let replies = self.pipeline(&pipe, &[&script::RENEW]).await?;
        let mut out = Vec::with_capacity(items.len());
        for reply in replies {
            let flags: Vec<i64> = FromRedisValue::from_redis_value(reply)
                .map_err(|e| BackendError::protocol(format!("renew reply: {e}")))?;
            out.extend(flags.into_iter().map(|f| f == 1));
        }
        if out.len() != items.len() {
            return Err(BackendError::protocol("renew reply has the wrong length"));
        }
        Ok(out)
    }

    pub(crate) async fn watch(&self, channel: &str) -> Watch {
        match &self.client {
            Some(client) => {
                let sub = self
                    .subscriber
                    .get_or_init(|| Subscriber::spawn(client.clone(), self.timeout));
                sub.watch(channel).await
            }
            None => Watch::new(self.poll_slots.clone(), channel, None).0,
        }
    }

    /// The number of channels the subscriber watches now (for diagnostics and tests).
    pub(crate) fn watched_channels(&self) -> usize {
        self.subscriber.get().map_or(0, |s| s.slots.len())
    }

    /// Whether the subscriber connection is up (false when none was started).
    pub(crate) fn subscriber_healthy(&self) -> bool {
        self.subscriber.get().is_some_and(Subscriber::is_healthy)
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}
