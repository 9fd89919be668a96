//! An in-process Redis for the protocol: a keyspace that answers the commands the scripts use,
//! and the very same Lua scripts run in process (Lua 5.1, as Redis embeds it). The Redis backend
//! runs over it as over any connection, so a `Locker` on a [`MemoryStore`] takes the same steps
//! as one on a server; what still differs is listed in ARCHITECTURE.md ("The memory store").
//!
//! Time is tokio's, so tests can pause it and move it forward: keys expire on tokio's clock,
//! and `TIME` is the wall clock at the store's creation moved on by tokio's time.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::aio::ConnectionLike;
use redis::{Cmd, Pipeline, RedisFuture, Value};
use tokio::time::Instant;

use crate::backend::wait::Slots;

mod keyspace;
mod lua;

use keyspace::{Channels, Reply};
use lua::Server;

/// A store of locks living in this process. Several `Locker`s built on clones of one store see
/// the same locks, as several processes sharing one Redis would.
///
/// ```
/// use dlock_core::{Locker, MemoryStore};
///
/// let store = MemoryStore::new();
/// let a = Locker::memory_with(store.clone());
/// let b = Locker::memory_with(store);
/// # let _ = (a, b);
/// ```
#[derive(Clone, Default)]
pub struct MemoryStore {
    inner: Arc<StoreInner>,
}

#[derive(Default)]
struct StoreInner {
    /// Made at the first command (making a Lua state can fail, a command can say so).
    server: Mutex<Option<Server>>,
    listeners: Arc<Listeners>,
    /// What the store's clock read at a moment of tokio's time, if it was set; else it reads
    /// the wall clock at the first command.
    clock_at: Option<(Duration, Instant)>,
}

/// The wake-up channels of every `Locker` on the store: one subscriber each, as each `Locker`
/// has one subscriber connection to a server.
#[derive(Default)]
struct Listeners {
    slots: Mutex<Vec<Weak<Slots>>>,
    /// Called with every message published (see [`MemoryStore::on_publish`]).
    hooks: Mutex<Vec<PublishHook>>,
}

type PublishHook = Box<dyn Fn(&str, &str) + Send + Sync>;

impl Listeners {
    fn each(&self, mut f: impl FnMut(&Slots)) {
        let mut all = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        all.retain(|weak| match weak.upgrade() {
            Some(slots) => {
                f(&slots);
                true
            }
            None => false,
        });
    }
}

/// `Listeners` as the keyspace publishes to them.
struct Subscribers(Arc<Listeners>);

impl Channels for Subscribers {
    fn publish(&self, channel: &str, message: &str) -> i64 {
        for hook in self
            .0
            .hooks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            hook(channel, message);
        }
        let mut heard = 0;
        self.0.each(|slots| {
            if slots.wake_with(channel, Some(message.as_bytes())) > 0 {
                heard += 1;
            }
        });
        heard
    }

    fn subscribers(&self, channel: &str) -> i64 {
        let mut count = 0;
        self.0
            .each(|slots| count += i64::from(slots.watchers(channel) > 0));
        count
    }
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("keys", &self.len())
            .finish()
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty store whose clock reads `since_1970` (a time since 1970) now, and moves on with
    /// tokio's time. The store's clock is what fencing tokens and the order of waiters' claims
    /// come from; with it set, and tokio's clock paused, a test over the store replays the very
    /// same history every time it runs (a store made with [`new`](Self::new) starts from the
    /// wall clock, so its tokens differ from run to run).
    pub fn with_clock_at(since_1970: Duration) -> Self {
        Self {
            inner: Arc::new(StoreInner {
                clock_at: Some((since_1970, Instant::now())),
                ..StoreInner::default()
            }),
        }
    }

    fn server(&self) -> MutexGuard<'_, Option<Server>> {
        self.inner.server.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the store's server, made first if need be; `Err` when it can't be made.
    fn with_server<T>(&self, f: impl FnOnce(&mut Server) -> T) -> Result<T, String> {
        let mut server = self.server();
        if server.is_none() {
            let channels = Box::new(Subscribers(self.inner.listeners.clone()));
            let clock = self.inner.clock_at.unwrap_or_else(|| {
                let wall = (SystemTime::now().duration_since(UNIX_EPOCH)).unwrap_or_default();
                (wall, Instant::now())
            });
            *server = Some(Server::new(channels, clock)?);
        }
        match server.as_mut() {
            Some(server) => Ok(f(server)),
            None => Err("no server".to_owned()),
        }
    }

    /// Removes a key as an outside actor would (`DEL` on Redis): for tests of loss handling.
    /// `key` is the full key, as the `Locker` derives it (`<prefix>{<name>}`): a lock's hold, a
    /// semaphore's permits, a read-write lock's readers.
    pub fn delete(&self, key: &str) -> bool {
        let deleted = self.with_server(|s| s.with_keyspace(|k| k.delete(key)));
        deleted.ok().flatten().unwrap_or(false)
    }

    /// How many unexpired keys the store holds, fencing counters aside (they outlive the
    /// locks, as on Redis, until their TTL): a lock's hold, a fair lock's line, a semaphore's
    /// permits, a read-write lock's readers, … — none once every lock is released and every
    /// lease and waiter's place in line has run out.
    pub fn len(&self) -> usize {
        let keys = self.with_server(|s| s.with_keyspace(|k| k.keys()));
        let keys = keys.ok().flatten().unwrap_or_default();
        keys.iter().filter(|k| !k.ends_with(":fence")).count()
    }

    /// Whether the store holds no unexpired key but fencing counters.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The store's clock (its `TIME`), since 1970: the wall clock when the store was made, moved
    /// on by tokio's time.
    pub(crate) fn now(&self) -> Duration {
        let now = self.with_server(|s| s.with_keyspace(|k| k.time()));
        now.ok().flatten().unwrap_or_default()
    }

    /// A connection to the store, as to a Redis server: for tests that look behind the
    /// library's back with Redis commands.
    #[doc(hidden)]
    pub fn connection(&self) -> impl ConnectionLike + Clone + Send + Sync + 'static {
        MemoryConn::new(self.clone())
    }

    /// Calls `f` with every message published on the store (its channel and its text), as it
    /// is published: for tests that count wake-ups.
    #[doc(hidden)]
    pub fn on_publish(&self, f: impl Fn(&str, &str) + Send + Sync + 'static) {
        let mut hooks = (self.inner.listeners.hooks.lock()).unwrap_or_else(|e| e.into_inner());
        hooks.push(Box::new(f));
    }

    /// Adds a `Locker`'s wake-up channels: a release's message on a channel they watch reaches
    /// them, and they count as that channel's one subscriber.
    pub(crate) fn listen(&self, slots: &Arc<Slots>) {
        let mut all = (self.inner.listeners.slots.lock()).unwrap_or_else(|e| e.into_inner());
        all.push(Arc::downgrade(slots));
    }

    /// Runs one command as a server would, and answers as it would.
    fn run(&self, cmd: &Cmd) -> Value {
        let mut words = Vec::with_capacity(cmd.args_iter().len());
        for arg in cmd.args_iter() {
            match arg {
                redis::Arg::Simple(bytes) => match std::str::from_utf8(bytes) {
                    Ok(word) => words.push(word),
                    Err(_) => return error("ERR the memory store takes UTF-8 arguments only"),
                },
                // A `SCAN` iterator's cursor: the store answers every key in one batch.
                redis::Arg::Cursor => words.push("0"),
                _ => return error("ERR the memory store takes plain arguments only"),
            }
        }
        match self.with_server(|server| server.command(&words)) {
            Ok(reply) => value(reply),
            Err(e) => error(&format!("ERR the memory store has no Lua: {e}")),
        }
    }
}

/// A reply as the client reads it.
fn value(reply: Reply) -> Value {
    match reply {
        Reply::Nil => Value::Nil,
        Reply::Int(n) => Value::Int(n),
        Reply::Bulk(s) => Value::BulkString(s.into_bytes()),
        Reply::Array(items) => Value::Array(items.into_iter().map(value).collect()),
        Reply::Status(s) if s == "OK" => Value::Okay,
        Reply::Status(s) => Value::SimpleString(s),
        Reply::Error(e) => error(&e),
    }
}

/// An error reply, read by the client's own parser so it has the kind a server's would
/// (`NOSCRIPT`, `WRONGTYPE`, …).
fn error(text: &str) -> Value {
    let line = format!("-{}\r\n", text.replace(['\r', '\n'], " "));
    match redis::parse_redis_value(line.as_bytes()) {
        Ok(value) => value,
        Err(_) => Value::SimpleString(text.to_owned()),
    }
}

/// A connection to a [`MemoryStore`]: each command runs at once, in order.
#[derive(Clone, Debug)]
pub(crate) struct MemoryConn {
    store: MemoryStore,
}

impl MemoryConn {
    pub(crate) fn new(store: MemoryStore) -> Self {
        Self { store }
    }

    pub(crate) fn store(&self) -> &MemoryStore {
        &self.store
    }
}

impl ConnectionLike for MemoryConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let reply = self.store.run(cmd);
        Box::pin(std::future::ready(Ok(reply)))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let replies: Vec<Value> = pipeline.cmd_iter().map(|c| self.store.run(c)).collect();
        let replies = replies.into_iter().skip(offset).take(count).collect();
        Box::pin(std::future::ready(Ok(replies)))
    }

    fn get_db(&self) -> i64 {
        0
    }
}
