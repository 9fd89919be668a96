//! Configuring a `Locker`: where it connects and how it behaves.

use std::sync::Arc;
use std::time::Duration;

use super::url::redact_url;
use super::*;
use crate::backend::Backend;
use crate::backend::MemoryStore;
use crate::backend::redis::{Pool, RedisBackend, RedisConn};
use crate::backend::wait::SubscriberSource;
use crate::error::LockError;
use crate::name::validate_prefix;
use crate::protocol::layout::{self, FrozenLayout};
use crate::replication::{AckChoice, ReplicaAck};
use std::fmt;

use super::checks::{
    check_default_lease, check_holder_label, check_replica_ack, check_wake_ups, tls_ready,
    waitaof_supported,
};
use super::connect::{connect, connect_error, describe_client, url_error};

/// Configures and builds a [`Locker`].
#[derive(Default)]
pub struct LockerBuilder {
    source: Source,
    subscriber: Option<redis::Client>,
    prefix: Option<String>,
    default_wait: Option<Duration>,
    default_lease: Option<Lease>,
    fence_ttl: Option<Option<Duration>>,
    command_timeout: Option<Duration>,
    connect_timeout: Option<Duration>,
    poll_interval: Option<Duration>,
    dead_waiter_timeout: Option<Duration>,
    handoff: Option<bool>,
    metrics_name_label: bool,
    hide_names: bool,
    holder_label: Option<String>,
    span_level: Option<tracing::Level>,
    frozen_layout: Option<&'static FrozenLayout>,
    clock_apart_ms: i64,
    lazy: bool,
    polling: bool,
    replica_ack: AckChoice,
}

#[derive(Default)]
enum Source {
    #[default]
    None,
    Url(String),
    Client(redis::Client),
    Manager(redis::aio::ConnectionManager),
    #[cfg_attr(not(any(feature = "bb8", feature = "deadpool")), allow(dead_code))]
    Pool(Pool),
    Multiplexed(redis::aio::MultiplexedConnection),
    Memory(MemoryStore),
    #[cfg(feature = "cluster")]
    ClusterUrls(Vec<String>),
    #[cfg(feature = "cluster")]
    ClusterConnection(redis::cluster_async::ClusterConnection),
    #[cfg(feature = "sentinel")]
    SentinelUrls(Vec<String>, String),
    #[cfg(feature = "sentinel")]
    Sentinel(Box<redis::sentinel::SentinelClient>, String),
    #[cfg(feature = "postgres")]
    Postgres(super::postgres::PgSource),
}

impl fmt::Debug for LockerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let source = match &self.source {
            Source::None => "none".to_owned(),
            Source::Url(url) => redact_url(url),
            Source::Client(_) => "client".to_owned(),
            Source::Manager(_) => "connection manager".to_owned(),
            Source::Pool(p) => p.kind().to_owned(),
            Source::Multiplexed(_) => "multiplexed connection".to_owned(),
            Source::Memory(_) => "memory".to_owned(),
            #[cfg(feature = "cluster")]
            Source::ClusterUrls(urls) => {
                let shown: Vec<String> = urls.iter().map(|u| redact_url(u)).collect();
                format!("cluster ({})", shown.join(", "))
            }
            #[cfg(feature = "cluster")]
            Source::ClusterConnection(_) => "cluster connection".to_owned(),
            #[cfg(feature = "sentinel")]
            Source::SentinelUrls(_, name) | Source::Sentinel(_, name) => {
                format!("sentinel master `{name}`")
            }
            #[cfg(feature = "postgres")]
            Source::Postgres(source) => source.display(),
        };
        f.debug_struct("LockerBuilder")
            .field("source", &source)
            .field("prefix", &self.prefix)
            .field("default_wait", &self.default_wait)
            .field("default_lease", &self.default_lease)
            .finish_non_exhaustive()
    }
}

impl LockerBuilder {
    /// Connect to this Redis URL (a connection manager that reconnects by itself, plus one
    /// subscriber connection for wake-ups). A `postgres://` or `postgresql://` URL is
    /// [`postgres_url`](Self::postgres_url)'s (with the `postgres` feature).
    pub fn url(mut self, url: impl Into<String>) -> Self {
        let url = url.into();
        #[cfg(feature = "postgres")]
        if is_postgres_url(&url) {
            return self.postgres_url(url);
        }
        self.source = Source::Url(url);
        self
    }

    /// Connect with this client (as [`url`](Self::url)).
    pub fn client(mut self, client: redis::Client) -> Self {
        self.source = Source::Client(client);
        self
    }

    /// Run over an application's connection manager (what most axum states hold). It
    /// reconnects by itself, as with [`url`](Self::url), but brings no subscriber: pass a
    /// [`subscriber`](Self::subscriber) client too (or choose
    /// [`wake_by_polling`](Self::wake_by_polling)), or `build` refuses.
    pub fn connection_manager(mut self, manager: redis::aio::ConnectionManager) -> Self {
        self.source = Source::Manager(manager);
        self
    }

    /// Run over an application's bb8 pool (`bb8-redis`). Each operation checks one connection
    /// out, within the command timeout. Pass a [`subscriber`](Self::subscriber) client too (or
    /// choose [`wake_by_polling`](Self::wake_by_polling)), or `build` refuses.
    #[cfg(feature = "bb8")]
    #[cfg_attr(docsrs, doc(cfg(feature = "bb8")))]
    pub fn bb8_pool(mut self, pool: bb8::Pool<bb8_redis::RedisConnectionManager>) -> Self {
        self.source = Source::Pool(Pool::Bb8(pool));
        self
    }

    /// Run over an application's `deadpool-redis` pool. Each operation checks one connection
    /// out, within the command timeout. Pass a [`subscriber`](Self::subscriber) client too (or
    /// choose [`wake_by_polling`](Self::wake_by_polling)), or `build` refuses.
    #[cfg(feature = "deadpool")]
    #[cfg_attr(docsrs, doc(cfg(feature = "deadpool")))]
    pub fn deadpool(mut self, pool: deadpool_redis::Pool) -> Self {
        self.source = Source::Pool(Pool::Deadpool(pool));
        self
    }

    /// Run over one multiplexed connection (it is not reconnected). Pass a
    /// [`subscriber`](Self::subscriber) client too (or choose
    /// [`wake_by_polling`](Self::wake_by_polling)), or `build` refuses.
    pub fn multiplexed(mut self, conn: redis::aio::MultiplexedConnection) -> Self {
        self.source = Source::Multiplexed(conn);
        self
    }

    /// Lock on a Redis Cluster reached through these seed nodes' URLs (one is enough; the
    /// client discovers the others). Every key of one lock shares its name's hash tag, so one
    /// lock lives in one slot and each script runs on that slot's master; the client follows
    /// `MOVED` and `ASK` through resharding and failovers. Waiters are woken through sharded
    /// pub/sub (`SSUBSCRIBE`/`SPUBLISH`, Redis 7.0 or newer), so a wake-up stays on its shard;
    /// the watchdog renews the locks of each slot in one script call, all slots at once.
    /// `build` connects (with [`connect_lazily`](Self::connect_lazily), the first command does,
    /// so a service can start while the cluster is down).
    #[cfg(feature = "cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
    pub fn cluster(mut self, seeds: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.source = Source::ClusterUrls(seeds.into_iter().map(Into::into).collect());
        self
    }

    /// Run over an application's cluster connection. It brings no subscriber, so `build`
    /// refuses it unless you choose [`wake_by_polling`](Self::wake_by_polling) (waiters retry
    /// every [`poll_interval`](Self::poll_interval)); use [`cluster`](Self::cluster) for
    /// wake-ups.
    ///
    /// Give that connection bounded waits per node (redis-rs's `ClusterClientBuilder::
    /// response_timeout`, and a few `retries`): with redis-rs's defaults (no response timeout,
    /// 16 retries) a node that hangs — a paused replica asked for the slot map, say — can hold
    /// up every command of the connection, the lock's too, for as long as it hangs. A `Locker`
    /// built with [`cluster`](Self::cluster) sets such bounds itself (2 s a node, 3 retries).
    #[cfg(feature = "cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
    pub fn cluster_connection(mut self, conn: redis::cluster_async::ClusterConnection) -> Self {
        self.source = Source::ClusterConnection(conn);
        self
    }

    /// Find the master through Redis Sentinel: `sentinels` are the sentinels' URLs
    /// (`redis://host:26379/`), `master_name` the name they monitor it under. The `Locker`
    /// connects to the master they report and follows it when it fails over: at once when a
    /// sentinel announces the switch (`+switch-master`), or when the old master fails a
    /// command. Its subscriber connection follows too. The data nodes are reached without a
    /// password; for passwords, TLS or a database, build the `SentinelClient` yourself and pass
    /// it to [`sentinel_client`](Self::sentinel_client).
    ///
    /// What a failover does to the locks themselves depends on acknowledgement: see
    /// [`replica_ack`](Self::replica_ack).
    #[cfg(feature = "sentinel")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
    pub fn sentinel(
        mut self,
        sentinels: impl IntoIterator<Item = impl Into<String>>,
        master_name: impl Into<String>,
    ) -> Self {
        let urls = sentinels.into_iter().map(Into::into).collect();
        self.source = Source::SentinelUrls(urls, master_name.into());
        self
    }

    /// As [`sentinel`](Self::sentinel), with a `SentinelClient` built by the application (its
    /// server type must be `Master`); `master_name` is the name it was built with.
    #[cfg(feature = "sentinel")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
    pub fn sentinel_client(
        mut self,
        client: redis::sentinel::SentinelClient,
        master_name: impl Into<String>,
    ) -> Self {
        self.source = Source::Sentinel(Box::new(client), master_name.into());
        self
    }

    /// Lock on PostgreSQL, reached by this URL (`postgres://user:password@host/database`):
    /// each lock is a session advisory lock held on a connection the `Locker` opens and
    /// watches, woken by `LISTEN`/`NOTIFY`, fenced by a sequence (see the README's "Redis or
    /// PostgreSQL?" for what a lease means there and which kinds are offered). `build`
    /// connects once (with [`connect_lazily`](Self::connect_lazily), the first lock does).
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub fn postgres_url(mut self, url: impl Into<String>) -> Self {
        self.source = Source::Postgres(super::postgres::PgSource::Url(url.into()));
        self
    }

    /// Lock on the PostgreSQL database of an application's sqlx pool, as
    /// [`postgres_url`](Self::postgres_url) does. The `Locker` connects as the pool does, on
    /// connections of its own: a lock held on a pooled connection would pass with it to its next
    /// user.
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub fn postgres(mut self, pool: sqlx::PgPool) -> Self {
        self.source = Source::Postgres(super::postgres::PgSource::Pool(pool));
        self
    }

    /// Run over an in-process store.
    pub fn memory(mut self, store: MemoryStore) -> Self {
        self.source = Source::Memory(store);
        self
    }

    /// The client that opens the subscriber connection for wake-ups (with a pool, a connection
    /// manager or a multiplexed connection; a URL or client source has one already).
    pub fn subscriber(mut self, client: redis::Client) -> Self {
        self.subscriber = Some(client);
        self
    }

    /// Waiters retry every [`poll_interval`](Self::poll_interval) instead of being woken by a
    /// release: the choice for a connection manager, a pool, a multiplexed connection or a
    /// cluster connection when no [`subscriber`](Self::subscriber) can be given. Without one
    /// or the other, `build` refuses those sources, so that nobody polls by surprise. A waiter
    /// that polls learns of a release up to a poll interval late, and each poll is a command.
    pub fn wake_by_polling(mut self) -> Self {
        self.polling = true;
        self
    }

    /// The prefix of every key (default `dlock:`).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = Some(prefix.into());
        self
    }

    /// How long a request waits for a busy lock when it doesn't say (default: zero, one attempt).
    ///
    /// Every request of the `Locker` starts from it — [`Locker::lock`], [`Locker::lock_all`] and
    /// `#[distributed_lock]` without `wait` — and [`LockRequest::wait`] overrides it. As there,
    /// the wait is counted from the call, and `Duration::MAX` waits for as long as it takes.
    pub fn default_wait(mut self, wait: Duration) -> Self {
        self.default_wait = Some(wait);
        self
    }

    /// How a request leases its lock when it doesn't say (default: a 30 s watchdog lease,
    /// renewed every 10 s).
    ///
    /// Every request of the `Locker` starts from it — [`Locker::lock`], [`Locker::lock_all`] and
    /// `#[distributed_lock]` without `lease` — and [`LockRequest::lease`] or
    /// [`LockRequest::watchdog_lease`] override it. [`build`](Self::build) refuses a lease
    /// outside the bounds of a request's lease (10 ms to about ten years), and a watchdog lease
    /// under 30 ms, with [`LockError::Config`].
    ///
    /// `default_lease(Lease::watchdog(Duration::from_secs(10)))`: a 10 s watchdog lease;
    /// `default_lease(Lease::fixed(..))`: a lease that is never renewed.
    pub fn default_lease(mut self, lease: Lease) -> Self {
        self.default_lease = Some(lease);
        self
    }

    /// The old shorthand for `default_lease(Lease::watchdog(lease))`, which sets the same
    /// thing: one setting, one name.
    #[deprecated(note = "use `default_lease(Lease::watchdog(lease))`")]
    pub fn watchdog_lease(mut self, lease: Duration) -> Self {
        self.default_lease = Some(Lease::Watchdog(lease));
        self
    }

    /// How long an idle fencing counter lives (default 7 days; `None`: forever). Tokens keep
    /// increasing across an expiry because a new counter starts from the server clock.
    pub fn fence_ttl(mut self, ttl: Option<Duration>) -> Self {
        self.fence_ttl = Some(ttl);
        self
    }

    /// The bound on every Redis command (default 2 s).
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = Some(timeout);
        self
    }

    /// The bound on connecting (default 2 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = Some(timeout);
        self
    }

    /// How often a waiter retries when wake-ups can't be delivered (default 50 ms).
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = Some(interval);
        self
    }

    /// How long a waiter for a [fair lock](Locker::fair_lock) keeps its place in line without
    /// showing that it is alive (default 5 s, from 30 ms up). A waiting task renews its place
    /// with every attempt, and attempts at least every third of this; a waiter whose process
    /// crashed or froze loses its place once this has passed since its last attempt, so it holds
    /// up the line for at most this plus a third of it.
    pub fn dead_waiter_timeout(mut self, timeout: Duration) -> Self {
        self.dead_waiter_timeout = Some(timeout);
        self
    }

    /// Whether a release hands the lock over to a waiter of the same `Locker` in the same
    /// round trip (default on). Off, a release frees the name and wakes the waiters, which then
    /// try for it as anyone would.
    pub fn hand_over(mut self, enabled: bool) -> Self {
        self.handoff = Some(enabled);
        self
    }

    /// The old name of [`hand_over`](Self::hand_over), which the documentation spells
    /// "hand-over" throughout.
    #[deprecated(note = "renamed `hand_over`")]
    pub fn handoff(self, enabled: bool) -> Self {
        self.hand_over(enabled)
    }

    /// With a URL or client: build without connecting (default off: `build` connects, and
    /// fails if Redis can't be reached). The connection is opened by the first command and
    /// reopened after failures, so a service can start while Redis is down; its lock calls
    /// answer [`LockError::Backend`] until Redis is back. A bad URL is still an error at once.
    pub fn connect_lazily(mut self, lazy: bool) -> Self {
        self.lazy = lazy;
        self
    }

    /// Labels dlock's metrics with the lock's name (default off). Each name becomes a time
    /// series of its own in the recorder: turn it on only for a small, fixed set of names.
    /// Hidden names are never labelled. See [`crate::metrics`].
    pub fn metrics_name_label(mut self, enabled: bool) -> Self {
        self.metrics_name_label = enabled;
        self
    }

    /// The level of dlock's spans, `dlock.acquire` and `dlock.release` (default INFO, so that
    /// an `info` filter and an OpenTelemetry exporter see them). Each records its outcome, its
    /// wait or hold time (`wait_ms`, `held_ms`) and the fencing token on itself; see
    /// [`crate::metrics`] for the fields. dlock's events keep their own levels.
    pub fn span_level(mut self, level: tracing::Level) -> Self {
        self.span_level = Some(level);
        self
    }

    /// Runs an earlier version's scripts, frozen, and writes that version's tokens: for tests
    /// that run `Locker`s of two versions side by side against one Redis (see
    /// `protocol::layout`). Not for applications.
    #[doc(hidden)]
    pub fn frozen_layout(mut self, layout: &'static FrozenLayout) -> Self {
        self.frozen_layout = Some(layout);
        self
    }

    /// Sets the clock this `Locker` reads for its claims to the next turn (their order, and the
    /// send time a release reads a claim's age from) `ms` milliseconds apart from this
    /// machine's: for tests of hosts whose clocks disagree. Not for applications.
    #[doc(hidden)]
    pub fn clock_apart(mut self, ms: i64) -> Self {
        self.clock_apart_ms = ms;
        self
    }

    /// Keeps every lock name of this `Locker` out of dlock's logs, spans and metric labels
    /// (default off; see [`LockName::hidden`](crate::LockName::hidden) for one name at a time).
    pub fn hide_names(mut self, hide: bool) -> Self {
        self.hide_names = hide;
        self
    }

    /// A label carried by every lock this `Locker` takes — say `"web-3:4711"` (host and pid) —
    /// which [`Locker::inspect`] shows operators next to the holder's token prefix. At most 64
    /// bytes, no control characters or whitespace; [`build`](Self::build) refuses others. It is
    /// part of each owner token (no extra command), so keep it short.
    pub fn holder_label(mut self, label: impl Into<String>) -> Self {
        self.holder_label = Some(label.into());
        self
    }

    /// Every lock write waits until this many replicas have it (`WAIT`), so that a failover to
    /// one of them keeps it. Grants not acknowledged in time are rolled back; hand-over between
    /// waiters is off. See [`ReplicaAck`] for exactly what each operation then guarantees.
    /// [`build`](Self::build) refuses it over the in-memory store, with no replicas, or with a
    /// timeout not under the [command timeout](Self::command_timeout).
    ///
    /// The default depends on where the `Locker` runs. On Sentinel (`sentinel`) and on a
    /// Cluster (`cluster`, or an application's `cluster_connection`), where a failover is what
    /// the set-up is for, one replica acknowledges every write, waiting a quarter of the
    /// [command timeout](Self::command_timeout) and at most 250 ms — but never for more
    /// replicas than the deployment lists as healthy for the write's master
    /// ([`ReplicaAck::up_to_listed`]): over masters without replicas, or a master whose replica
    /// died, writes don't wait. On one server, writes count once the master has them.
    /// `replica_ack(ReplicaAck::none())` turns the default off (see [`ReplicaAck::none`] for
    /// what that gives up).
    pub fn replica_ack(mut self, ack: ReplicaAck) -> Self {
        self.replica_ack = if ack.is_none() {
            AckChoice::Off
        } else {
            AckChoice::On(ack)
        };
        self
    }

    /// The old way to say `replica_ack(ReplicaAck::none())`.
    #[deprecated(note = "use `replica_ack(ReplicaAck::none())`")]
    pub fn without_replica_ack(self) -> Self {
        self.replica_ack(ReplicaAck::none())
    }

    /// Connects (for a URL or client) and builds the `Locker`.
    pub async fn build(self) -> Result<Locker, LockError> {
        let fsync = matches!(self.replica_ack, AckChoice::On(a) if a.fsyncs()) && !self.lazy;
        let frozen = self.frozen_layout;
        let locker = self.build_locker().await?;
        if let (Some(layout), Backend::Redis(backend)) = (frozen, &locker.engine.inner.backend) {
            backend.run_frozen_layout(layout);
        }
        if fsync {
            waitaof_supported(&locker).await?;
        }
        Ok(locker)
    }

    async fn build_locker(self) -> Result<Locker, LockError> {
        let prefix = self.prefix.unwrap_or_else(|| DEFAULT_PREFIX.to_owned());
        validate_prefix(&prefix)?;
        let default_lease = self
            .default_lease
            .unwrap_or(Lease::Watchdog(DEFAULT_WATCHDOG_LEASE));
        check_default_lease(default_lease)?;
        let command_timeout = self.command_timeout.unwrap_or(DEFAULT_COMMAND_TIMEOUT);
        let connect_timeout = self.connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT);
        // Sentinel and a Cluster list each master's replicas, so their writes wait for one by
        // default (see `ReplicaAck::up_to_listed`).
        #[cfg(feature = "cluster")]
        let cluster = matches!(
            self.source,
            Source::ClusterUrls(_) | Source::ClusterConnection(_)
        );
        #[cfg(not(feature = "cluster"))]
        let cluster = false;
        #[cfg(feature = "sentinel")]
        let sentinel = matches!(self.source, Source::SentinelUrls(..) | Source::Sentinel(..));
        #[cfg(not(feature = "sentinel"))]
        let sentinel = false;
        #[cfg(feature = "postgres")]
        let postgres = matches!(self.source, Source::Postgres(_));
        #[cfg(not(feature = "postgres"))]
        let postgres = false;
        if postgres && matches!(self.replica_ack, AckChoice::On(_)) {
            return Err(LockError::Config(
                "replica acknowledgement waits for Redis replicas; a postgres `Locker` has none \
                 to wait for (PostgreSQL's own replication settings apply)"
                    .into(),
            ));
        }
        let ack = self
            .replica_ack
            .resolve(command_timeout, cluster || sentinel);
        if let Some(ack) = ack {
            check_replica_ack(
                ack,
                command_timeout,
                matches!(self.source, Source::Memory(_)),
            )?;
        }
        let dead_waiter_timeout = self
            .dead_waiter_timeout
            .unwrap_or(DEFAULT_DEAD_WAITER_TIMEOUT);
        if !(MIN_DEAD_WAITER_TIMEOUT..=MAX_LEASE).contains(&dead_waiter_timeout) {
            return Err(LockError::Config(format!(
                "dead_waiter_timeout {dead_waiter_timeout:?} is out of range: from \
                 {MIN_DEAD_WAITER_TIMEOUT:?} to {} days",
                MAX_LEASE.as_secs() / 86_400
            )));
        }
        let without_subscriber = match &self.source {
            Source::Manager(_) => Some("a connection manager"),
            Source::Pool(_) => Some("a connection pool"),
            Source::Multiplexed(_) => Some("a multiplexed connection"),
            #[cfg(feature = "cluster")]
            Source::ClusterConnection(_) => Some("a cluster connection"),
            _ => None,
        };
        check_wake_ups(
            without_subscriber,
            cluster,
            self.subscriber.is_some(),
            self.polling,
        )?;
        let config = Config {
            prefix,
            dead_waiter_timeout,
            default_wait: self.default_wait.unwrap_or(Duration::ZERO),
            default_lease,
            fence_ttl: self.fence_ttl.unwrap_or(Some(DEFAULT_FENCE_TTL)),
            poll_interval: self.poll_interval.unwrap_or(DEFAULT_POLL_INTERVAL),
            // A hand-over is a grant nobody could roll back when it is not acknowledged.
            // And on PostgreSQL a release only unlocks: the next waiter's attempt takes it.
            handoff: self.handoff.unwrap_or(true) && ack.is_none() && !postgres,
            metrics_name_label: self.metrics_name_label,
            hide_names: self.hide_names,
            holder_label: check_holder_label(self.holder_label)?,
            span_level: self.span_level.unwrap_or(tracing::Level::INFO),
            token_tag: self.frozen_layout.map_or(layout::TAG, |l| l.tag()),
            clock_apart_ms: self.clock_apart_ms,
        };
        let (client, display) = match self.source {
            Source::None => {
                return Err(LockError::Config(
                    "no backend: call `url`, `client`, `connection_manager`, `bb8_pool`, \
                     `deadpool`, `multiplexed`, `cluster`, `cluster_connection`, `sentinel`, \
                     `sentinel_client` or `memory`"
                        .into(),
                ));
            }
            Source::Memory(store) => {
                return Ok(Locker::from_parts(
                    Backend::Redis(Arc::new(RedisBackend::memory(store, command_timeout))),
                    config,
                    "memory".to_owned(),
                ));
            }
            Source::Pool(pool) => {
                let display = pool.kind().to_owned();
                let backend = RedisBackend::new(
                    RedisConn::Pool(pool),
                    self.subscriber.map(SubscriberSource::client),
                    command_timeout,
                )
                .with_ack(ack);
                return Ok(Locker::from_parts(
                    Backend::Redis(Arc::new(backend)),
                    config,
                    display,
                ));
            }
            Source::Manager(manager) => {
                let backend = RedisBackend::new(
                    RedisConn::Manager(manager),
                    self.subscriber.clone().map(SubscriberSource::client),
                    command_timeout,
                )
                .with_ack(ack);
                return Ok(Locker::from_parts(
                    Backend::Redis(Arc::new(backend)),
                    config,
                    "connection manager".to_owned(),
                ));
            }
            Source::Multiplexed(conn) => {
                let backend = RedisBackend::new(
                    RedisConn::Multiplexed(conn),
                    self.subscriber.clone().map(SubscriberSource::client),
                    command_timeout,
                )
                .with_ack(ack);
                return Ok(Locker::from_parts(
                    Backend::Redis(Arc::new(backend)),
                    config,
                    "multiplexed connection".to_owned(),
                ));
            }
            #[cfg(feature = "cluster")]
            Source::ClusterUrls(urls) => {
                return super::cluster::locker(
                    urls,
                    self.lazy,
                    config,
                    ack,
                    command_timeout,
                    connect_timeout,
                )
                .await;
            }
            #[cfg(feature = "cluster")]
            Source::ClusterConnection(conn) => {
                return Ok(super::cluster::over_connection(
                    conn,
                    config,
                    ack,
                    (command_timeout, connect_timeout),
                ));
            }
            #[cfg(feature = "postgres")]
            Source::Postgres(source) => {
                return super::postgres::locker(source, self.lazy, config, command_timeout).await;
            }
            #[cfg(feature = "sentinel")]
            source @ (Source::SentinelUrls(..) | Source::Sentinel(..)) => {
                let (client, sentinels, name) = match source {
                    Source::SentinelUrls(urls, name) => {
                        let sentinels = super::sentinel::each(&urls)?;
                        (super::sentinel::client(urls, &name)?, sentinels, name)
                    }
                    Source::Sentinel(client, name) => (*client, Vec::new(), name),
                    _ => unreachable!("matched above"),
                };
                return super::sentinel::locker(
                    client,
                    sentinels,
                    name,
                    self.subscriber,
                    self.lazy,
                    config,
                    ack,
                    command_timeout,
                    connect_timeout,
                )
                .await;
            }
            Source::Url(url) => {
                let display = redact_url(&url);
                if is_postgres_url(&url) {
                    return Err(LockError::Config(format!(
                        "`{display}` is a PostgreSQL URL: enable dlock-core's `postgres` feature"
                    )));
                }
                let client = redis::Client::open(url.as_str()).map_err(|e| {
                    LockError::Config(format!("bad redis url `{display}`: {}", url_error(&e)))
                })?;
                (client, display)
            }
            Source::Client(client) => {
                let display = describe_client(&client);
                (client, display)
            }
        };
        if matches!(
            client.get_connection_info().addr(),
            redis::ConnectionAddr::TcpTls { .. }
        ) {
            tls_ready(&display)?;
        }
        let manager_config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            // Every call is bounded by the command timeout already; a second timer per command
            // would only cost.
            .set_response_timeout(None)
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(10))
            .set_max_delay(Duration::from_millis(500));
        let manager = if self.lazy {
            // Connects at the first command, and again after every failure: a Locker built
            // while Redis is down answers backend errors until it is back.
            redis::aio::ConnectionManager::new_lazy_with_config(client.clone(), manager_config)
                .map_err(|err| connect_error(&display, err))?
        } else {
            connect(client.clone(), manager_config, connect_timeout, &display).await?
        };
        let subscriber = self.subscriber.unwrap_or(client);
        let backend = RedisBackend::new(
            RedisConn::Manager(manager),
            Some(SubscriberSource::client(subscriber)),
            command_timeout,
        )
        .with_ack(ack);
        Ok(Locker::from_parts(
            Backend::Redis(Arc::new(backend)),
            config,
            display,
        ))
    }
}

/// Whether `url` names a PostgreSQL server (`postgres://` or `postgresql://`).
fn is_postgres_url(url: &str) -> bool {
    let scheme = url.split_once("://").map_or("", |(scheme, _)| scheme);
    scheme.eq_ignore_ascii_case("postgres") || scheme.eq_ignore_ascii_case("postgresql")
}
