//! Following the master through Redis Sentinel: a connection that asks the sentinels where the
//! master is, goes there, and moves when the master fails over — as soon as any sentinel
//! announces it (`+switch-master`: every sentinel is listened to, so a mute one costs nothing),
//! when a check every second finds a majority of the sentinels reporting another master, or when
//! the old master fails a command (`READONLY`, a dropped connection).
//!
//! Where the master is: the address a majority of the sentinels report (each asked with a short
//! timeout, all at once), so one sentinel that hangs or lags neither stalls nor misleads the
//! answer.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures_util::StreamExt as _;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::sentinel::SentinelClient;
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};
use tokio::sync::watch;

mod replicas;
use replicas::healthy_replicas;

/// How often the sentinels are asked where the master is, besides listening to them.
const RECHECK_EVERY: Duration = Duration::from_secs(1);

/// The longest one sentinel is waited for, to connect or to answer.
const SENTINEL_TIMEOUT: Duration = Duration::from_millis(500);

/// The master the sentinels report, and the connection to it.
pub(crate) struct SentinelMaster {
    name: String,
    /// Asks the sentinels; one question at a time. Used when the sentinels' own addresses are
    /// not known (a `SentinelClient` built by the application).
    sentinel: tokio::sync::Mutex<SentinelClient>,
    /// Each sentinel, when the `Locker` was given their URLs: asked and listened to one by one.
    sentinels: Vec<Sentinel>,
    current: Mutex<Option<Current>>,
    /// Counts the moves to another master (the subscriber follows them).
    moves: watch::Sender<u64>,
    /// The master of the last connection made, to tell a move from a reconnection.
    last_addr: Mutex<Option<String>>,
    connect_timeout: Duration,
    /// The tasks listening for `+switch-master` and checking every second, started with the
    /// first connection.
    listeners: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    ids: AtomicU64,
    /// How many healthy replicas the sentinels last listed, and for which master (`host:port`).
    listed: Mutex<Option<(String, u32)>>,
    /// Whether a background [`relist`](Self::relist) is under way: writes that fall short
    /// while a replica lags ask for one each, and one at a time is enough.
    relisting: AtomicBool,
}

/// One sentinel: how to reach it, and a connection to ask it on (dropped when it fails).
struct Sentinel {
    client: redis::Client,
    conn: tokio::sync::Mutex<Option<MultiplexedConnection>>,
}

impl Sentinel {
    /// `SENTINEL GET-MASTER-ADDR-BY-NAME name`, within [`SENTINEL_TIMEOUT`].
    async fn master_addr(&self, name: &str) -> RedisResult<(String, u16)> {
        let mut cmd = redis::cmd("SENTINEL");
        cmd.arg("GET-MASTER-ADDR-BY-NAME").arg(name);
        self.ask(&cmd).await
    }

    /// How many replicas of master `name` this sentinel reports healthy (`SENTINEL REPLICAS`,
    /// see [`healthy_replicas`]), within [`SENTINEL_TIMEOUT`].
    async fn replicas(&self, name: &str, master: &str) -> RedisResult<u32> {
        let mut cmd = redis::cmd("SENTINEL");
        cmd.arg("REPLICAS").arg(name);
        Ok(healthy_replicas(&self.ask(&cmd).await?, master))
    }

    /// Sends `cmd` on this sentinel's connection (made if there is none, dropped if the
    /// question fails), within [`SENTINEL_TIMEOUT`].
    async fn ask<T: redis::FromRedisValue>(&self, cmd: &Cmd) -> RedisResult<T> {
        let mut conn = self.conn.lock().await;
        let ask = async {
            let c = match conn.as_ref() {
                Some(c) => c.clone(),
                None => {
                    let config = redis::AsyncConnectionConfig::new()
                        .set_connection_timeout(Some(SENTINEL_TIMEOUT))
                        .set_response_timeout(Some(SENTINEL_TIMEOUT));
                    let c = (self.client)
                        .get_multiplexed_async_connection_with_config(&config)
                        .await?;
                    *conn = Some(c.clone());
                    c
                }
            };
            cmd.query_async::<T>(&mut c.clone()).await
        };
        let answer = bounded(SENTINEL_TIMEOUT, ask).await;
        if answer.is_err() {
            *conn = None;
        }
        answer
    }
}

struct Current {
    id: u64,
    addr: String,
    /// The client the connection was made with (the subscriber connects with it too).
    client: redis::Client,
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
        for task in lock(&self.listeners).drain(..) {
            task.abort();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl SentinelMaster {
    /// A master found through `sentinel`, or through each of `sentinels` (their URLs) when
    /// there are any.
    pub(crate) fn new(
        name: String,
        sentinel: SentinelClient,
        sentinels: Vec<redis::Client>,
        connect_timeout: Duration,
    ) -> Self {
        Self {
            name,
            sentinel: tokio::sync::Mutex::new(sentinel),
            sentinels: (sentinels.into_iter())
                .map(|client| Sentinel {
                    client,
                    conn: tokio::sync::Mutex::new(None),
                })
                .collect(),
            current: Mutex::new(None),
            moves: watch::Sender::new(0),
            last_addr: Mutex::new(None),
            connect_timeout,
            listeners: Mutex::new(Vec::new()),
            ids: AtomicU64::new(1),
            listed: Mutex::new(None),
            relisting: AtomicBool::new(false),
        }
    }

    /// The master's address as a majority of the sentinels report it (all asked at once, each
    /// within [`SENTINEL_TIMEOUT`]; decided as soon as a majority agree, so a mute sentinel costs
    /// nothing); when fewer answer, the address all that answered agree on.
    async fn majority_addr(&self) -> RedisResult<(String, u16)> {
        use futures_util::stream::{FuturesUnordered, StreamExt as _};
        let mut answers: FuturesUnordered<_> = (self.sentinels.iter())
            .map(|s| s.master_addr(&self.name))
            .collect();
        let majority = self.sentinels.len() / 2 + 1;
        let mut counts: Vec<((String, u16), usize)> = Vec::new();
        let mut last_error = None;
        while let Some(answer) = answers.next().await {
            match answer {
                Ok(addr) => match counts.iter_mut().find(|(a, _)| *a == addr) {
                    Some((_, n)) => {
                        *n += 1;
                        if *n >= majority {
                            return Ok(addr);
                        }
                    }
                    None if majority <= 1 => return Ok(addr),
                    None => counts.push((addr, 1)),
                },
                Err(err) => last_error = Some(err),
            }
        }
        match &counts[..] {
            [(addr, _)] => Ok(addr.clone()),
            [] => Err(last_error.unwrap_or_else(|| {
                redis::RedisError::from((redis::ErrorKind::Client, "no sentinel answered"))
            })),
            _ => Err(redis::RedisError::from((
                redis::ErrorKind::Client,
                "the sentinels disagree on the master",
                format!("{counts:?}"),
            ))),
        }
    }

    /// How many healthy replicas the sentinels list for the master connected to now (`None`:
    /// not known, or listed for another master: a write made before the count has caught up
    /// with a move waits for every replica asked for).
    pub(crate) fn listed_replicas(&self) -> Option<u32> {
        let current = self.current_addr()?;
        lock(&self.listed)
            .as_ref()
            .filter(|(addr, _)| *addr == current)
            .map(|(_, n)| *n)
    }

    /// Asks the sentinels (each within [`SENTINEL_TIMEOUT`], all at once, until a majority
    /// answered) how many healthy replicas master `addr` has, and keeps the highest count: the
    /// safe side, for a wait that asks too much fails a write, where one that asks too little
    /// lets a write count that no replica has.
    async fn relist(&self, addr: String) {
        use futures_util::stream::{FuturesUnordered, StreamExt as _};
        let counts: Vec<u32> = if self.sentinels.is_empty() {
            let mut sentinel = self.sentinel.lock().await;
            let Ok(client) =
                bounded(self.connect_timeout, sentinel.async_get_sentinel_client()).await
            else {
                return;
            };
            drop(sentinel);
            let one = Sentinel {
                client,
                conn: tokio::sync::Mutex::new(None),
            };
            one.replicas(&self.name, &addr).await.into_iter().collect()
        } else {
            // A majority's answers are enough: a mute sentinel must not hold up the first
            // command to a new master.
            let majority = self.sentinels.len() / 2 + 1;
            (self.sentinels.iter())
                .map(|s| s.replicas(&self.name, &addr))
                .collect::<FuturesUnordered<_>>()
                .filter_map(|answer| async move { answer.ok() })
                .take(majority)
                .collect()
                .await
        };
        if let Some(most) = counts.into_iter().max() {
            *lock(&self.listed) = Some((addr, most));
        }
    }

    /// Asks the sentinels for the replicas again, in the background (a write waited for more
    /// replicas than acknowledged it), unless that is under way already.
    pub(crate) fn relist_soon(self: &Arc<Self>) {
        let (Some(addr), Ok(runtime)) =
            (self.current_addr(), tokio::runtime::Handle::try_current())
        else {
            return;
        };
        if self.relisting.swap(true, Ordering::AcqRel) {
            return;
        }
        let this = Arc::clone(self);
        runtime.spawn(async move {
            this.relist(addr).await;
            this.relisting.store(false, Ordering::Release);
        });
    }

    /// The address of the master connected to now, if any.
    pub(crate) fn current_addr(&self) -> Option<String> {
        lock(&self.current).as_ref().map(|c| c.addr.clone())
    }

    /// Tells of every move to another master.
    pub(crate) fn moves(&self) -> watch::Receiver<u64> {
        self.moves.subscribe()
    }

    /// A client for the subscriber connection: the one the commands' connection was made with,
    /// if there is one — the subscriber must listen where releases are published, and a look-up
    /// of its own could still find the old master while the sentinels catch up with a failover —
    /// else one for the master the sentinels report now.
    pub(crate) async fn subscriber_client(&self) -> RedisResult<redis::Client> {
        if let Some(c) = lock(&self.current).as_ref() {
            return Ok(c.client.clone());
        }
        self.master_client().await
    }

    /// A client for the master the sentinels report now.
    async fn master_client(&self) -> RedisResult<redis::Client> {
        if !self.sentinels.is_empty() {
            let (host, port) = self.majority_addr().await?;
            return redis::Client::open((host, port));
        }
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
        // Held while the master is looked up: one look-up at a time.
        let mut sentinel = self.sentinel.lock().await;
        // Another caller may have connected while this one waited for the sentinels.
        if let Some(c) = lock(&self.current).as_ref() {
            return Ok((c.id, c.conn.clone()));
        }
        let client = if self.sentinels.is_empty() {
            bounded(self.connect_timeout, sentinel.async_get_client()).await?
        } else {
            // Asks each sentinel on its own (`master_client` takes no lock with their URLs).
            self.master_client().await?
        };
        drop(sentinel);
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            // Every call is bounded by the command timeout already.
            .set_response_timeout(None);
        let conn = bounded(
            self.connect_timeout,
            client.get_multiplexed_async_connection_with_config(&config),
        )
        .await?;
        let addr = client.get_connection_info().addr().to_string();
        let relisted = addr.clone();
        let id = self.ids.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(master = %addr, name = %self.name, "dlock: connected to the master");
        let moved = {
            let mut current = lock(&self.current);
            let moved = lock(&self.last_addr)
                .replace(addr.clone())
                .is_some_and(|last| last != addr);
            *current = Some(Current {
                id,
                addr,
                client,
                conn: conn.clone(),
            });
            moved
        };
        // A subscriber that moved when the old connection was dropped may have found the old
        // master still reported: it follows the commands to this one.
        if moved {
            self.moves.send_modify(|n| *n += 1);
        }
        // The new master's replicas, for the next writes' acknowledgement to wait for.
        self.relist(relisted).await;
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
        self.relist(reported).await;
    }

    /// Starts the `+switch-master` listeners (one per sentinel) and the check every second on
    /// the current runtime unless they run.
    fn listen(self: &Arc<Self>) {
        let mut listeners = lock(&self.listeners);
        if !listeners.is_empty() && listeners.iter().all(|t| !t.is_finished()) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        for task in listeners.drain(..) {
            task.abort();
        }
        let weak = Arc::downgrade(self);
        if self.sentinels.is_empty() {
            listeners.push(runtime.spawn(listen(weak.clone(), None)));
        } else {
            for index in 0..self.sentinels.len() {
                listeners.push(runtime.spawn(listen(weak.clone(), Some(index))));
            }
        }
        listeners.push(runtime.spawn(recheck_every(weak)));
    }
}

/// Asks the sentinels where the master is every [`RECHECK_EVERY`], and moves if a majority
/// report another: an announcement can be missed (a sentinel mute or cut off while it was made).
async fn recheck_every(master: Weak<SentinelMaster>) {
    loop {
        let Some(this) = master.upgrade() else { return };
        if this.current_addr().is_some() {
            this.recheck().await;
        }
        drop(this);
        tokio::time::sleep(RECHECK_EVERY).await;
    }
}

/// Listens to sentinel `index` (or, without their URLs, to whichever sentinel the
/// `SentinelClient` picks) for `+switch-master` of our master and drops the connection to the old
/// one. After every (re)subscription it checks where the master is, for announcements missed
/// while not listening.
async fn listen(master: Weak<SentinelMaster>, index: Option<usize>) {
    let mut backoff = Duration::from_millis(50);
    loop {
        let Some(this) = master.upgrade() else { return };
        let client = match index {
            Some(i) => Ok(this.sentinels[i].client.clone()),
            None => {
                let mut sentinel = this.sentinel.lock().await;
                bounded(this.connect_timeout, sentinel.async_get_sentinel_client()).await
            }
        };
        let timeout = this
            .connect_timeout
            .min(SENTINEL_TIMEOUT.max(Duration::from_secs(1)));
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

    /// How many healthy replicas the sentinels list for the master connected to (see
    /// [`SentinelMaster::listed_replicas`]); `None` when not connected, or not known for it.
    pub(crate) fn listed_replicas(&self) -> Option<u32> {
        self.master.listed_replicas()
    }

    /// [`listed_replicas`](Self::listed_replicas) for the master the next command goes to:
    /// connected first if it is not, as that command would be (a new master's replicas are
    /// asked for when it is connected to).
    pub(crate) async fn listed_replicas_now(&self) -> Option<u32> {
        self.master.connection().await.ok()?;
        self.master.listed_replicas()
    }

    /// Asks the sentinels for the replicas again, in the background.
    pub(crate) fn relist_soon(&self) {
        self.master.relist_soon();
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
