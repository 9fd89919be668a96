//! Following the master through Redis Sentinel: a connection that asks the sentinels where the
//! master is, goes there, and moves when the master fails over — as soon as a sentinel announces
//! it (`+switch-master`), or when the old master fails a command.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures_util::StreamExt as _;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::sentinel::SentinelClient;
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};
use tokio::sync::watch;

/// The master the sentinels report, and the connection to it.
pub(crate) struct SentinelMaster {
    name: String,
    /// Asks the sentinels; one question at a time.
    sentinel: tokio::sync::Mutex<SentinelClient>,
    current: Mutex<Option<Current>>,
    /// Counts the moves to another master (the subscriber follows them).
    moves: watch::Sender<u64>,
    connect_timeout: Duration,
    /// The task listening for `+switch-master`, started with the first connection.
    listener: Mutex<Option<tokio::task::JoinHandle<()>>>,
    ids: AtomicU64,
}

struct Current {
    id: u64,
    addr: String,
    conn: MultiplexedConnection,
}

impl fmt::Debug for SentinelMaster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SentinelMaster")
            .field("name", &self.name)
            .field("master", &self.current_addr())
            .finish_non_exhaustive()
    }
}

impl Drop for SentinelMaster {
    fn drop(&mut self) {
        if let Some(task) = lock(&self.listener).take() {
            task.abort();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl SentinelMaster {
    pub(crate) fn new(name: String, sentinel: SentinelClient, connect_timeout: Duration) -> Self {
        Self {
            name,
            sentinel: tokio::sync::Mutex::new(sentinel),
            current: Mutex::new(None),
            moves: watch::Sender::new(0),
            connect_timeout,
            listener: Mutex::new(None),
            ids: AtomicU64::new(1),
        }
    }

    /// The address of the master connected to now, if any.
    pub(crate) fn current_addr(&self) -> Option<String> {
        lock(&self.current).as_ref().map(|c| c.addr.clone())
    }

    /// Tells of every move to another master.
    pub(crate) fn moves(&self) -> watch::Receiver<u64> {
        self.moves.subscribe()
    }

    /// A client for the master the sentinels report now (for the subscriber connection).
    pub(crate) async fn master_client(&self) -> RedisResult<redis::Client> {
        let mut sentinel = self.sentinel.lock().await;
        bounded(self.connect_timeout, sentinel.async_get_client()).await
    }

    /// The connection to the master (connecting to the one the sentinels report if there is
    /// none), with its id for [`forget`](Self::forget).
    async fn connection(self: &Arc<Self>) -> RedisResult<(u64, MultiplexedConnection)> {
        self.listen();
        if let Some(c) = lock(&self.current).as_ref() {
            return Ok((c.id, c.conn.clone()));
        }
        let mut sentinel = self.sentinel.lock().await;
        // Another caller may have connected while this one waited for the sentinels.
        if let Some(c) = lock(&self.current).as_ref() {
            return Ok((c.id, c.conn.clone()));
        }
        let client = bounded(self.connect_timeout, sentinel.async_get_client()).await?;
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            // Every call is bounded by the command timeout already.
            .set_response_timeout(None);
        let conn = bounded(
            self.connect_timeout,
            client.get_multiplexed_async_connection_with_config(&config),
        )
        .await?;
        drop(sentinel);
        let addr = client.get_connection_info().addr().to_string();
        let id = self.ids.fetch_add(1, Ordering::Relaxed);
        let mut current = lock(&self.current);
        tracing::debug!(master = %addr, name = %self.name, "dlock: connected to the master");
        *current = Some(Current {
            id,
            addr,
            conn: conn.clone(),
        });
        Ok((id, conn))
    }

    /// Drops connection `id` (if it is still the current one): the next command asks the
    /// sentinels where the master is, and the subscriber moves.
    fn forget(&self, id: u64) {
        let mut current = lock(&self.current);
        if current.as_ref().is_some_and(|c| c.id == id) {
            *current = None;
            drop(current);
            self.moves.send_modify(|n| *n += 1);
        }
    }

    /// Drops the current connection if the sentinels now report another master.
    async fn recheck(&self) {
        let Ok(client) = self.master_client().await else {
            return;
        };
        let reported = client.get_connection_info().addr().to_string();
        let stale = lock(&self.current)
            .as_ref()
            .filter(|c| c.addr != reported)
            .map(|c| c.id);
        if let Some(id) = stale {
            tracing::debug!(master = %reported, name = %self.name, "dlock: the master moved");
            self.forget(id);
        }
    }

    /// Starts the `+switch-master` listener on the current runtime unless it runs.
    fn listen(self: &Arc<Self>) {
        let mut listener = lock(&self.listener);
        if listener.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            *listener = Some(runtime.spawn(listen(Arc::downgrade(self))));
        }
    }
}

/// Listens to one sentinel at a time for `+switch-master` of our master and drops the connection
/// to the old one. After every (re)subscription it checks where the master is, for announcements
/// missed while not listening.
async fn listen(master: Weak<SentinelMaster>) {
    let mut backoff = Duration::from_millis(50);
    loop {
        let Some(this) = master.upgrade() else { return };
        let client = {
            let mut sentinel = this.sentinel.lock().await;
            bounded(this.connect_timeout, sentinel.async_get_sentinel_client()).await
        };
        let timeout = this.connect_timeout;
        drop(this);
        let subscribed = match client {
            Ok(client) => match bounded(timeout, client.get_async_pubsub()).await {
                Ok(mut pubsub) => {
                    match bounded(timeout, pubsub.subscribe("+switch-master")).await {
                        Ok(()) => Some(pubsub),
                        Err(_) => None,
                    }
                }
                Err(_) => None,
            },
            Err(err) => {
                tracing::debug!(error = %err, "dlock: no sentinel to listen to");
                None
            }
        };
        if let Some(pubsub) = subscribed {
            backoff = Duration::from_millis(50);
            let Some(this) = master.upgrade() else { return };
            this.recheck().await;
            drop(this);
            let mut messages = pubsub.into_on_message();
            while let Some(msg) = messages.next().await {
                let Some(this) = master.upgrade() else { return };
                // "<name> <old ip> <old port> <new ip> <new port>"
                let payload: String = msg.get_payload().unwrap_or_default();
                let parts: Vec<&str> = payload.split(' ').collect();
                if let [name, _, _, ip, port] = parts[..]
                    && name == this.name
                {
                    tracing::debug!(switch = %payload, "dlock: the sentinels switched masters");
                    let new = format!("{ip}:{port}");
                    let stale = (lock(&this.current).as_ref())
                        .filter(|c| c.addr != new)
                        .map(|c| c.id);
                    if let Some(id) = stale {
                        this.forget(id);
                    }
                }
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
}

async fn bounded<T>(within: Duration, fut: impl Future<Output = RedisResult<T>>) -> RedisResult<T> {
    match tokio::time::timeout(within, fut).await {
        Ok(res) => res,
        Err(_) => Err(redis::RedisError::from(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "no answer in time",
        ))),
    }
}

/// Whether `err` says this connection no longer leads to a writable master.
fn moved_on(err: &redis::RedisError) -> bool {
    err.is_connection_dropped()
        || err.is_io_error()
        || err.is_unrecoverable_error()
        || matches!(err.code(), Some("READONLY" | "MASTERDOWN" | "LOADING"))
}

/// A connection to whichever node the sentinels report as the master (cheap to clone, like a
/// connection manager): it connects on the first command, and after a failover to the new
/// master.
#[derive(Clone)]
pub(crate) struct SentinelConnection {
    master: Arc<SentinelMaster>,
}

impl SentinelConnection {
    pub(crate) fn new(master: Arc<SentinelMaster>) -> Self {
        Self { master }
    }
}

impl ConnectionLike for SentinelConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let (id, mut conn) = self.master.connection().await?;
            let res = conn.req_packed_command(cmd).await;
            if let Err(err) = &res
                && moved_on(err)
            {
                self.master.forget(id);
            }
            res
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let (id, mut conn) = self.master.connection().await?;
            let res = conn.req_packed_commands(pipeline, offset, count).await;
            if let Err(err) = &res
                && moved_on(err)
            {
                self.master.forget(id);
            }
            res
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}
