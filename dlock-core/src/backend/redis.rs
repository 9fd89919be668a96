//! The Redis backend: scripts by SHA over a connection manager, a multiplexed connection or a
//! pool (bb8 or deadpool), every call bounded by the command timeout.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, MultiplexedConnection};
use redis::{FromRedisValue, Pipeline, RedisResult, Value};

mod acks;
mod code;
mod locks;
mod renewals;
mod sorted_sets;

use super::memory::{MemoryConn, MemoryStore};
#[cfg(feature = "sentinel")]
use super::sentinel::SentinelConnection;
use crate::backend::wait::{Slots, Subscriber, SubscriberSource, Watch};
use crate::error::BackendError;
use crate::protocol::layout::FrozenLayout;
use crate::protocol::{Call, Publish};
use crate::replication::ReplicaAck;

use acks::Acked;
pub(crate) use code::ScriptCall;
use code::{Code, Functions, lua_of};

#[derive(Clone)]
pub(crate) enum RedisConn {
    Manager(ConnectionManager),
    Multiplexed(MultiplexedConnection),
    Pool(Pool),
    /// Whichever master the sentinels report.
    #[cfg(feature = "sentinel")]
    Sentinel(SentinelConnection),
    /// A Redis Cluster: each command goes to its key's slot.
    #[cfg(feature = "cluster")]
    Cluster(super::cluster::LazyCluster),
    /// A [`MemoryStore`](super::MemoryStore) in this process.
    Memory(MemoryConn),
}

impl RedisConn {
    fn kind(&self) -> &'static str {
        match self {
            Self::Manager(_) => "redis",
            #[cfg(feature = "sentinel")]
            Self::Sentinel(_) => "redis (sentinel)",
            #[cfg(feature = "cluster")]
            Self::Cluster(_) => "redis (cluster)",
            Self::Multiplexed(_) => "redis (multiplexed connection)",
            Self::Pool(p) => p.kind(),
            Self::Memory(_) => "memory",
        }
    }
}

/// An application's pool (without the `bb8` and `deadpool` features there is none).
#[derive(Clone)]
pub(crate) enum Pool {
    #[cfg(feature = "bb8")]
    Bb8(bb8::Pool<bb8_redis::RedisConnectionManager>),
    #[cfg(feature = "deadpool")]
    Deadpool(deadpool_redis::Pool),
}

impl Pool {
    pub(crate) fn kind(&self) -> &'static str {
        match *self {
            #[cfg(feature = "bb8")]
            Self::Bb8(_) => "redis (bb8 pool)",
            #[cfg(feature = "deadpool")]
            Self::Deadpool(_) => "redis (deadpool pool)",
        }
    }

    /// One connection of the pool. Both pools hand out multiplexed connections; a clone keeps
    /// the operation's commands in order on it after the pool has it back.
    ///
    /// Boxed: the pools' own futures are deeply nested types, and every async caller up to the
    /// application's handler would otherwise carry them in its layout (deep enough to exceed
    /// the compiler's query depth in an ordinary axum handler).
    fn checkout(
        &self,
    ) -> std::pin::Pin<
        Box<dyn Future<Output = Result<MultiplexedConnection, BackendError>> + Send + '_>,
    > {
        match *self {
            #[cfg(feature = "bb8")]
            Self::Bb8(ref p) => Box::pin(async move {
                match p.get().await {
                    Ok(c) => Ok((*c).clone()),
                    Err(err) => Err(BackendError::pool(err)),
                }
            }),
            #[cfg(feature = "deadpool")]
            Self::Deadpool(ref p) => Box::pin(async move {
                match p.get().await {
                    Ok(c) => Ok((*c).clone()),
                    Err(err) => Err(BackendError::pool(err)),
                }
            }),
        }
    }
}

/// The connection one operation runs on (see [`RedisBackend::op_conn`]).
#[derive(Clone)]
pub(crate) enum OpConn {
    Manager(ConnectionManager),
    #[cfg(feature = "cluster")]
    Cluster(super::cluster::LazyCluster),
    #[cfg(feature = "sentinel")]
    Sentinel(SentinelConnection),
    Multiplexed(MultiplexedConnection),
    /// A pool's connection, and the end of the command timeout that started when it was asked
    /// for: checking it out and the first command share one timeout.
    Pooled(MultiplexedConnection, tokio::time::Instant),
    Memory(MemoryConn),
}

impl fmt::Debug for OpConn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Manager(_) => "OpConn::Manager",
            #[cfg(feature = "cluster")]
            Self::Cluster(_) => "OpConn::Cluster",
            #[cfg(feature = "sentinel")]
            Self::Sentinel(_) => "OpConn::Sentinel",
            Self::Multiplexed(_) => "OpConn::Multiplexed",
            Self::Pooled(..) => "OpConn::Pooled",
            Self::Memory(_) => "OpConn::Memory",
        })
    }
}

#[derive(Clone)]
pub(crate) struct RedisBackend {
    conn: RedisConn,
    timeout: Duration,
    /// Where the subscriber connection goes, if there is one.
    client: Option<SubscriberSource>,
    subscriber: Arc<Mutex<Option<Subscriber>>>,
    /// The channels the subscriber watches (kept across restarts of its task).
    sub_slots: Arc<Slots>,
    /// Slots used when there is no subscriber: waiters poll.
    poll_slots: Arc<Slots>,
    /// Replicas that must acknowledge every write, if any.
    ack: Option<ReplicaAck>,
    /// A cluster's slot map and the replicas it lists (which writes wait for by default); its
    /// masters are reached directly for the watchdog's renewals when the `Locker` was built from
    /// seed URLs.
    #[cfg(feature = "cluster")]
    masters: Option<Arc<super::cluster::Masters>>,
    /// An earlier version's scripts, run instead of this version's (tests of mixed fleets).
    frozen: std::sync::OnceLock<&'static FrozenLayout>,
    /// Whether scripts go by `FCALL` (the default) or, once a server refused functions, by
    /// `EVALSHA`.
    functions: Arc<Functions>,
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("kind", &self.conn.kind())
            .field("timeout", &self.timeout)
            .field("subscriber", &self.client.is_some())
            .field("ack", &self.ack)
            .finish()
    }
}

impl RedisBackend {
    pub(crate) fn new(
        conn: RedisConn,
        client: Option<SubscriberSource>,
        timeout: Duration,
    ) -> Self {
        Self {
            conn,
            timeout,
            client,
            subscriber: Arc::new(Mutex::new(None)),
            sub_slots: Arc::new(Slots::default()),
            poll_slots: Arc::new(Slots::default()),
            ack: None,
            #[cfg(feature = "cluster")]
            masters: None,
            frozen: std::sync::OnceLock::new(),
            functions: Arc::new(Functions::default()),
        }
    }

    /// Runs `layout`'s scripts from now on, instead of this version's.
    pub(crate) fn run_frozen_layout(&self, layout: &'static FrozenLayout) {
        let _ = self.frozen.set(layout);
    }

    /// Whether this runs an earlier layout's frozen scripts (which lack what later versions
    /// added: a fair waiter's place kept apart from its owner token, permits taken at once).
    pub(crate) fn runs_frozen_layout(&self) -> bool {
        self.frozen.get().is_some()
    }

    /// `call`'s script: this version's, or the frozen layout's that stands in for it.
    pub(crate) fn lua_of(&self, call: &impl Call) -> &'static crate::protocol::Lua {
        lua_of(call, self.frozen.get().copied())
    }

    /// `call` as `FCALL` of this version's library, or as `EVALSHA` of the frozen layout's
    /// script (or this version's, once a server refused functions).
    pub(crate) fn script_call(&self, call: &impl Call) -> ScriptCall<'_> {
        ScriptCall::of(call, self.frozen.get().copied(), &self.functions)
    }

    /// `call` as `EVAL`, of this version's script or the frozen layout's.
    pub(crate) fn script_eval(&self, call: &impl Call) -> redis::Cmd {
        ScriptCall::eval(call, self.frozen.get().copied())
    }

    /// A backend over `store`, in this process: its wake-ups come straight from the store's
    /// releases, and count as one subscriber, as a server's would over the subscriber
    /// connection.
    pub(crate) fn memory(store: MemoryStore, timeout: Duration) -> Self {
        let backend = Self::new(RedisConn::Memory(MemoryConn::new(store)), None, timeout);
        if let RedisConn::Memory(conn) = &backend.conn {
            conn.store().listen(&backend.sub_slots);
        }
        backend
    }

    /// Milliseconds since 1970 on the clock that orders claims to the next turn: this machine's
    /// (0 if it is set before then), or a memory store's, which follows tokio's time so a paused
    /// test replays. Only the order of claims depends on it: hosts whose clocks are apart by
    /// some milliseconds favour one by that much.
    pub(crate) fn wall_ms(&self) -> u64 {
        let since_1970 = match &self.conn {
            RedisConn::Memory(c) => c.store().now(),
            _ => (std::time::SystemTime::now())
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default(),
        };
        u64::try_from(since_1970.as_millis()).unwrap_or(u64::MAX)
    }

    /// Whether the store is in this process (its commands run at once, and cannot be lost).
    pub(crate) fn is_memory(&self) -> bool {
        matches!(self.conn, RedisConn::Memory(_))
    }

    /// Writes wait for the replicas `masters` lists; renewals go to the masters directly, not
    /// through the cluster connection, when they can be reached so.
    #[cfg(feature = "cluster")]
    pub(crate) fn with_masters(mut self, masters: super::cluster::Masters) -> Self {
        self.masters = Some(Arc::new(masters));
        self
    }

    /// Every write waits for `ack` (see [`ReplicaAck`]).
    pub(crate) fn with_ack(mut self, ack: Option<ReplicaAck>) -> Self {
        self.ack = ack;
        self
    }

    /// The bound on each command.
    pub(crate) fn command_timeout(&self) -> Duration {
        self.timeout
    }

    /// How a release wakes waiters: sharded pub/sub on a cluster, so the wake-up stays on the
    /// lock's shard.
    fn publish(&self) -> Publish {
        match self.conn {
            #[cfg(feature = "cluster")]
            RedisConn::Cluster(_) => Publish::Sharded,
            _ => Publish::Plain,
        }
    }

    pub(crate) fn kind(&self) -> &'static str {
        self.conn.kind()
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

    /// A connection for one operation: the manager or the multiplexed connection itself, or one
    /// connection of the pool (a multiplexed connection, kept in order for the operation).
    pub(crate) async fn op_conn(&self) -> Result<OpConn, BackendError> {
        match &self.conn {
            RedisConn::Manager(c) => Ok(OpConn::Manager(c.clone())),
            #[cfg(feature = "sentinel")]
            RedisConn::Sentinel(c) => Ok(OpConn::Sentinel(c.clone())),
            #[cfg(feature = "cluster")]
            RedisConn::Cluster(c) => Ok(OpConn::Cluster(c.clone())),
            RedisConn::Multiplexed(c) => Ok(OpConn::Multiplexed(c.clone())),
            RedisConn::Memory(c) => Ok(OpConn::Memory(c.clone())),
            RedisConn::Pool(pool) => {
                let until = tokio::time::Instant::now() + self.timeout;
                let pooled = self.bounded(pool.checkout()).await?;
                Ok(OpConn::Pooled(pooled, until))
            }
        }
    }

    /// Runs a script, bounded by the command timeout, followed in the same pipeline by `WAIT`
    /// when `ack` asks for acknowledgement (as [`ack_for`](Self::ack_for) the call's first key
    /// says); returns its reply and, then, how many did. An
    /// `idempotent` script (one that does the same thing when it runs twice) is sent once more
    /// on a connection manager whose connection turned out to be gone (a restarted server, or a
    /// runtime that shut down with the old connection's task): the manager reconnects for the
    /// second try.
    async fn invoke<T: FromRedisValue>(
        &self,
        conn: &OpConn,
        call: ScriptCall<'_>,
        idempotent: bool,
        ack: Option<ReplicaAck>,
    ) -> Result<(T, Acked), BackendError> {
        let until = tokio::time::Instant::now() + self.timeout;
        self.invoke_until(conn, call, idempotent, ack, until).await
    }

    /// [`invoke`](Self::invoke), bounded by `until` rather than one command timeout from now:
    /// the second command of an operation shares the first one's bound.
    async fn invoke_until<T: FromRedisValue>(
        &self,
        conn: &OpConn,
        call: ScriptCall<'_>,
        idempotent: bool,
        ack: Option<ReplicaAck>,
        until: tokio::time::Instant,
    ) -> Result<(T, Acked), BackendError> {
        let started = tokio::time::Instant::now();
        // The call's key is read only for a wait that depends on it: not on the common path.
        let ack = match ack {
            Some(listed) if listed.is_up_to_listed() => match call.first_key() {
                Some(key) => self.ack_for(key).await,
                None => ack,
            },
            other => other,
        };
        let until = match conn {
            OpConn::Pooled(_, pooled) => (*pooled).min(until),
            _ => until,
        };
        // Boxed, with the command: the call's future is the largest part of every acquisition
        // and release future, and it is needed only while the command is in flight, not while a
        // waiter sleeps (10,000 waiters each keep their futures for as long as they wait).
        let run = Box::pin(async move {
            let res: RedisResult<(T, Acked)> = match conn {
                OpConn::Manager(c) => {
                    let first = call.run(&mut c.clone(), ack).await;
                    match first {
                        Err(err) if idempotent && err.is_connection_dropped() => {
                            call.run(&mut c.clone(), ack).await
                        }
                        other => other,
                    }
                }
                // Like a manager: a dropped connection is replaced by one to the master the
                // sentinels report, so an idempotent call is sent once more.
                #[cfg(feature = "sentinel")]
                OpConn::Sentinel(c) => {
                    let first = call.run(&mut c.clone(), ack).await;
                    match first {
                        Err(err) if idempotent && err.is_connection_dropped() => {
                            call.run(&mut c.clone(), ack).await
                        }
                        other => other,
                    }
                }
                OpConn::Pooled(c, _) => call.run(&mut c.clone(), ack).await,
                OpConn::Memory(c) => call.run(&mut c.clone(), ack).await,
                // The cluster client follows MOVED and ASK and retries while a failover settles.
                #[cfg(feature = "cluster")]
                OpConn::Cluster(c) => call.run(&mut c.clone(), ack).await,
                // The one connection the `Locker` was given: once it is gone, it stays gone.
                OpConn::Multiplexed(c) => {
                    return call.run(&mut c.clone(), ack).await.map_err(|err| {
                        let dropped = err.is_connection_dropped() || err.is_unrecoverable_error();
                        let err = BackendError::redis(err);
                        if dropped { err.permanent() } else { err }
                    });
                }
            };
            res.map_err(BackendError::redis)
        });
        let res = match tokio::time::timeout_at(until, run).await {
            Ok(res) => res,
            Err(_) => Err(BackendError::timeout(until - started)),
        };
        // A master that failed or moved may have taken its replicas with it: the list of
        // replicas is read again before the next write waits for them.
        #[cfg(feature = "cluster")]
        if res.is_err()
            && let Some(masters) = &self.masters
            && self.ack.is_some_and(|a| a.is_up_to_listed())
        {
            masters.mark_stale();
        }
        res
    }

    /// Sends `pipe`, its scripts' `code` loaded where the server lacks it. A server that
    /// refuses functions fails this call, and gets `EVALSHA` from the next one on.
    async fn pipeline(
        &self,
        pipe: &Pipeline,
        code: Option<Code>,
    ) -> Result<Vec<Value>, BackendError> {
        async fn run<C: ConnectionLike>(
            c: &mut C,
            pipe: &Pipeline,
            code: Option<Code>,
            functions: &Functions,
        ) -> RedisResult<Vec<Value>> {
            match (pipe.query_async::<Vec<Value>>(c).await, code) {
                (Err(err), Some(code)) if code::is_missing(&err) => {
                    code.load(c).await?;
                    pipe.query_async(c).await
                }
                (Err(err), Some(Code::Function(_))) if code::refuses_functions(&err) => {
                    functions.refuse();
                    Err(err)
                }
                (other, _) => other,
            }
        }
        self.bounded(async {
            let res = match &self.conn {
                // Lease changes carry sequence numbers: a second try is harmless.
                RedisConn::Manager(c) => {
                    match run(&mut c.clone(), pipe, code, &self.functions).await {
                        Err(err) if err.is_connection_dropped() => {
                            run(&mut c.clone(), pipe, code, &self.functions).await
                        }
                        other => other,
                    }
                }
                #[cfg(feature = "sentinel")]
                RedisConn::Sentinel(c) => {
                    match run(&mut c.clone(), pipe, code, &self.functions).await {
                        Err(err) if err.is_connection_dropped() => {
                            run(&mut c.clone(), pipe, code, &self.functions).await
                        }
                        other => other,
                    }
                }
                RedisConn::Multiplexed(c) => run(&mut c.clone(), pipe, code, &self.functions).await,
                #[cfg(feature = "cluster")]
                RedisConn::Cluster(c) => run(&mut c.clone(), pipe, code, &self.functions).await,
                RedisConn::Pool(pool) => {
                    run(&mut pool.checkout().await?, pipe, code, &self.functions).await
                }
                RedisConn::Memory(c) => run(&mut c.clone(), pipe, code, &self.functions).await,
            };
            res.map_err(BackendError::redis)
        })
        .await
    }

    /// Every key matching `pattern` (`SCAN`, never `KEYS`), each batch bounded by the command
    /// timeout; on a cluster, every master's keys in turn (a key may come twice if a slot moves
    /// meanwhile, and one moved during the scan may be missed).
    pub(crate) async fn scan(&self, pattern: &str) -> Result<Vec<String>, BackendError> {
        const COUNT: usize = 1000;
        #[cfg(feature = "cluster")]
        if let RedisConn::Cluster(cluster) = &self.conn {
            return cluster.scan(pattern, COUNT, self.timeout).await;
        }
        let mut keys = Vec::new();
        let mut cursor = 0u64;
        loop {
            let mut pipe = redis::pipe();
            pipe.cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(COUNT);
            let reply = self.pipeline(&pipe, None).await?;
            let (next, batch): (u64, Vec<String>) = match reply.into_iter().next() {
                Some(value) => redis::from_redis_value(value)
                    .map_err(|e| BackendError::protocol(format!("SCAN: {e}")))?,
                None => return Err(BackendError::protocol("SCAN answered nothing")),
            };
            keys.extend(batch);
            cursor = next;
            if cursor == 0 {
                return Ok(keys);
            }
        }
    }

    /// Whether the server knows `command` (`COMMAND INFO` answers nil for an unknown one).
    pub(crate) async fn knows_command(&self, command: &str) -> Result<bool, BackendError> {
        let mut pipe = redis::pipe();
        pipe.cmd("COMMAND").arg("INFO").arg(command);
        let reply = self.pipeline(&pipe, None).await?;
        Ok(match reply.into_iter().next() {
            Some(Value::Array(items)) => items.first().is_some_and(|i| *i != Value::Nil),
            _ => false,
        })
    }

    /// One `PING`, bounded by the command timeout.
    pub(crate) async fn ping(&self) -> Result<(), BackendError> {
        let mut pipe = redis::pipe();
        pipe.cmd("PING");
        self.pipeline(&pipe, None).await.map(|_| ())
    }

    pub(crate) async fn watch(&self, channel: &str, deadline: tokio::time::Instant) -> Watch {
        if self.is_memory() {
            // The store publishes to `sub_slots` itself: subscribed at once.
            let (watch, _) = Watch::new(self.sub_slots.clone(), channel, None);
            watch.mark_confirmed();
            return watch;
        }
        match &self.client {
            Some(client) => {
                let sub = self.subscriber(client);
                sub.watch(channel, deadline).await
            }
            None => Watch::new(self.poll_slots.clone(), channel, None).0,
        }
    }

    /// The subscriber task's handle, (re)started on the current runtime if it is not running: a
    /// runtime that shuts down takes its tasks with it, and a `Locker` may outlive the runtime
    /// that first used it.
    fn subscriber(&self, client: &SubscriberSource) -> Subscriber {
        let mut current = self.subscriber.lock().unwrap_or_else(|e| e.into_inner());
        match current.as_ref() {
            Some(sub) if sub.is_running() => sub.clone(),
            _ => {
                let sub = Subscriber::spawn(client.clone(), self.timeout, self.sub_slots.clone());
                *current = Some(sub.clone());
                sub
            }
        }
    }

    /// Whether wake-ups on `channel` are heard now without a new subscription: a wait on its
    /// name is under way or ended moments ago (see `wait::LINGER`). Never in process, where an
    /// attempt costs nothing.
    pub(crate) fn hears(&self, channel: &str) -> bool {
        !self.is_memory() && self.client.is_some() && self.sub_slots.hears(channel)
    }

    /// The number of channels the subscriber watches now (for diagnostics and tests).
    pub(crate) fn watched_channels(&self) -> usize {
        self.sub_slots.len()
    }

    /// Whether the subscriber connection is up (false when none was started; always true in
    /// process).
    pub(crate) fn subscriber_healthy(&self) -> bool {
        self.is_memory()
            || self
                .subscriber
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref()
                .is_some_and(|s| s.is_running() && s.is_healthy())
    }
}
