//! Distributed locks for async Rust on Redis: atomic, fenced, renewed, woken, cancellable.
//!
//! ```no_run
//! use std::time::Duration;
//! use dlock_core::{LockError, LockName, Locker};
//!
//! # async fn place_order(_: u64) {}
//! # async fn demo(user_id: u64) -> Result<(), LockError> {
//! let locker = Locker::connect("redis://127.0.0.1:6379/").await?;
//!
//! let name = LockName::builder().literal("order:").value(user_id).build()?;
//! let guard = locker.lock(name).wait(Duration::from_secs(3)).await?;
//!
//! // Cancelled at its next `.await` if the lock is lost while it runs.
//! let token = guard.fencing_token().await?; // minted now, one round trip
//! guard.run(place_order(token.get())).await?;
//! assert!(guard.release().await.is_released());
//! # Ok(())
//! # }
//! ```
//!
//! Where to go from here:
//!
//! - [`Locker`]: connects to Redis and hands out locks; built by [`LockerBuilder`].
//! - [`LockRequest`]: one request for a lock: its wait and lease, then `.await` it.
//! - [`LockGuard`]: a lock you hold: its fencing token, [`run`](LockGuard::run),
//!   [`lost`](LockGuard::lost), [`release`](LockGuard::release).
//! - Other kinds: [`fair_lock`](Locker::fair_lock), [`read_write_lock`](Locker::read_write_lock),
//!   [`semaphore`](Locker::semaphore), [`lock_all`](Locker::lock_all) (several names at once).
//! - [`MasterSet`]: one lock on several independent Redis masters, a majority or all of them.
//! - [`LockerConfig`]: the whole configuration as data, read from `DLOCK_*` variables (or, with
//!   the `serde` feature, a file).
//! - [`metrics`](mod@crate::metrics): every metric dlock records, and what it means.
//! - `docs/DEPLOYING.md` in the repository: a single server, Sentinel, a Cluster or independent
//!   masters, and what a failover does to a lock in each.
//! - `docs/UPGRADING.md` in the repository: which versions may run side by side in a rolling
//!   deploy, and a checklist for one.
//!
//! # What a lock is
//!
//! - **Acquire** is one Lua script: if the name is free it records the owner (a random token)
//!   and sets the lease; otherwise it returns the holder's remaining lease. A plain lock's
//!   [`FencingToken`] is minted when the holder first asks for it
//!   ([`LockGuard::fencing_token`], one more round trip), so holders that never use one don't
//!   pay for it. Re-entering a hold inside a [`scope`](mod@crate::scope) only checks that Redis still has it and counts
//!   the new guard in this process, so nothing a re-entry does can be left behind.
//! - **Release** is one script: only the owner may delete the lock, which publishes a wake-up.
//!   [`LockGuard::release`] says whether the lock was released, had already expired, or had been
//!   taken over — or whether Redis could not be reached. A release whose answer was lost is sent
//!   once more, and recognised as the same release.
//! - **Leases**: by default a lock is leased for 30 s and renewed every 10 s while its guard lives
//!   (the *watchdog*). The watchdog renews every lock of a [`Locker`] in one round trip per tick.
//!   [`LockRequest::lease`] sets a fixed lease instead, and a `Locker` can start every request
//!   from another default [`Lease`] ([`LockerBuilder::default_lease`]).
//! - **Loss**: when a renewal finds the lock gone or taken, or the lease runs out without a
//!   renewal, [`LockGuard::lost`] resolves and [`LockGuard::run`] cancels the guarded future.
//!   Every guard (a lock's, a writer's, a reader's, a permit, several locks', a master set's)
//!   has these methods with the same signatures, and implements [`Hold`] for code that takes
//!   any of them ([`Fenced`] for those with one fencing token).
//! - **Fencing**: every fresh acquisition gets a token strictly greater than the last one for the
//!   same name. A lease cannot protect against a holder paused past its lease; a resource that
//!   refuses stale tokens can.
//! - **Failover**: tokens are the master's clock in microseconds at the grant (or the last token +
//!   1), so they keep rising after a failover to a replica that missed the latest grants (see
//!   [`FencingToken`]). On Sentinel and a Cluster a grant counts once a replica has it too
//!   (one the deployment lists as healthy, if any: [`ReplicaAck::up_to_listed`];
//!   [`LockerBuilder::replica_ack`] says more, and `replica_ack(ReplicaAck::none())`
//!   turns it off); on one server, once the master has it, unless [`ReplicaAck`] asks for more.
//! - **Independent masters**: a [`MasterSet`] holds a lock on every master
//!   ([`MasterSet::all`]) or on a majority ([`MasterSet::majority`], Redlock), so no single
//!   master's loss can hand it to a rival.
//! - **Waiting**: [`LockRequest::wait`] waits up to a deadline (`Duration::MAX`: for as long as
//!   it takes; without it, the `Locker`'s [`default_wait`](LockerBuilder::default_wait), one
//!   attempt unless configured); a failing backend is retried within it. Waiters sleep on a pub/sub
//!   wake-up (one subscriber connection per `Locker` for every waited name), with a fallback timer
//!   bounded by the holder's remaining lease. Waiters of one `Locker` queue in-process, and a
//!   release passes the lock to the next of them in its own round trip while no other process
//!   waits for it. Across processes the
//!   waiters take turns: the one that has waited longest goes next, even from a process farther
//!   from Redis than the others, and the release hands it the lock in the same step. A waiter
//!   that gives up or dies delays the lock by a few seconds at most (4 s with the defaults).
//!   How turns work inside is in the repository's ARCHITECTURE.md.
//! - **Fair locks**: [`Locker::fair_lock`] gives the lock to waiters in the order they came,
//!   across processes, from a line kept in Redis; a release wakes only the head of the line.
//! - **Semaphores**: [`Locker::semaphore`] lets at most N holders in at once; each [`Permit`]
//!   has its own lease, so a crashed holder's permit comes back.
//! - **Read-write locks**: [`Locker::read_write_lock`] lets many readers or one writer in;
//!   waiting writers keep new readers out unless configured.
//! - **Cancellation**: dropping an acquisition future at any point never leaks a lock.
//! - **Reentrancy** is scoped to a logical task, never a thread: see [`scope`](mod@crate::scope).
//!
//! # Keys
//!
//! A lock named `order:42` lives at `dlock:{order:42}` (the prefix is configurable); its fencing
//! counter and wake-up channel share the `{order:42}` hash tag. Untrusted values go into names
//! through [`LockName::builder`], which escapes them so that distinct values never collide.
//!
//! # Feature flags
//!
//! - `macros` (default): re-exports [`distributed_lock`], the attribute that guards an async
//!   function.
//! - `bb8`: `LockerBuilder::bb8_pool`, a `Locker` over an application's `bb8-redis` pool.
//! - `deadpool`: `LockerBuilder::deadpool`, a `Locker` over a `deadpool-redis` pool.
//! - `cluster`: `LockerBuilder::cluster`, a `Locker` on a Redis Cluster, woken through sharded
//!   pub/sub.
//! - `sentinel`: `LockerBuilder::sentinel`, a `Locker` on the master Redis Sentinel reports,
//!   following its failovers.
//! - `postgres`: `LockerBuilder::postgres` and `postgres_url` (and `postgres://` URLs given to
//!   `Locker::connect`): locks as PostgreSQL session advisory locks, over an application's sqlx
//!   pool or a URL; plain locks and multi-locks of them (see the README's "Redis or
//!   PostgreSQL?").
//! - `tls-rustls`: `rediss://` URLs and TLS clients. rustls needs a process-wide crypto provider,
//!   which is the application's choice: install one when the application starts (for example
//!   `rustls::crypto::aws_lc_rs::default_provider().install_default()`). dlock never installs
//!   one; building a TLS `Locker` without it is a [`LockError::Config`], not a panic.
//! - `http`: `ErrorResponses`, lock errors as HTTP answers (`application/problem+json`, the
//!   status per situation, `Retry-After` for a busy lock), the rendering dlock-tower's
//!   `LockLayer` uses.
//! - `axum` (implies `http`): `IntoResponse` for [`LockError`], so that an axum handler (a
//!   `#[distributed_lock]` one, or one whose error wraps a `LockError`) answers a lock error
//!   exactly as a `LockLayer` route answers the same situation: 409 with `Retry-After` when
//!   busy, 503 when Redis is unavailable or the lock was lost, 400 for an invalid name, 500
//!   otherwise, never with the backend's error text.
//!
//! # Connections, and which crates dlock exposes
//!
//! A `Locker` connects from a URL ([`Locker::connect`]) or runs over what the application already
//! has: a `redis::Client`, a [`redis::aio::ConnectionManager`], a multiplexed connection, or a
//! pool (see [`LockerBuilder`]); or it finds the master through Redis Sentinel, or runs on a
//! Redis Cluster. Those types appear in dlock's API, so dlock re-exports the one
//! crate a user must name to build them, [`redis`]: an application without its own `redis`
//! dependency uses `dlock_core::redis::Client`, and one with its own needs a `redis` 1.x, the
//! same major version. The pool crates are not re-exported: an application that has a pool
//! already depends on its crate (`bb8-redis` 0.26, `deadpool-redis` 0.23), and each pool is an
//! opt-in feature because a new major version of a pool crate is a new major version of the
//! feature that names it.
//!
//! # Testing your code
//!
//! [`Locker::memory`] gives a `Locker` over an in-process store that runs the very scripts a
//! Redis server runs (expiry, reentrancy, fencing, waiting, turns), on tokio's time, so
//! paused-time tests work.
//!
//! # Supported Rust versions
//!
//! The minimum supported Rust version is 1.88.

#![cfg_attr(docsrs, feature(doc_cfg))]

mod backend;
mod clock;
mod engine;
mod error;
mod fencing;
mod hold;
mod locker;
#[doc(hidden)]
pub mod macro_support;
mod masters;
pub mod metrics;
mod multi;
mod name;
mod policy;
#[doc(hidden)]
pub mod protocol;
mod replication;
mod request;
#[cfg(feature = "http")]
mod response;
mod rw;
pub mod scope;
mod semaphore;
mod watchdog;

pub use backend::MemoryStore;
pub use engine::{
    DEFAULT_COMMAND_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_DEAD_WAITER_TIMEOUT,
    DEFAULT_FENCE_TTL, DEFAULT_POLL_INTERVAL, DEFAULT_PREFIX, DEFAULT_WATCHDOG_LEASE, Lease,
    LockGuard,
};
pub use error::{
    BackendError, InvalidName, LockError, MasterOutcome, MastersError, ReleaseOutcome,
};
pub use fencing::FencingToken;
pub use hold::{Fenced, HeldLock, Hold, Lost};
pub use locker::{
    AdvisoryLock, ConfigError, Holder, LockInfo, Locker, LockerBuilder, LockerConfig, LockerStats,
    default_locker, set_default_locker,
};
pub use masters::{MasterGuard, MasterRequest, MasterSet};
pub use multi::{MultiGuard, MultiLockRequest};
pub use name::{IntoLockName, LockName, MAX_NAME_LEN, NameBuilder, escape_glob};
pub use policy::OnLost;
pub use replication::ReplicaAck;
pub use request::LockRequest;
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub use response::{DEFAULT_MAX_RETRY_AFTER, ErrorResponses};
pub use rw::{ReadGuard, ReadRequest, ReadWriteLock, WriteGuard, WriteRequest};
#[allow(deprecated)]
pub use scope::moved::{fencing_token, held_lock, in_scope, isolated_scope};
pub use scope::{LockScope, Scoped, scope};
pub use semaphore::{Permit, PermitRequest, Semaphore, SemaphoreStatus};

/// The `redis` crate this version of dlock is built on: its `Client` and connection types are
/// what [`LockerBuilder`] takes.
pub use redis;

/// `tracing`, for the `__span_at!` macro that dlock's crates share.
#[doc(hidden)]
pub use tracing as __tracing;

#[cfg(feature = "macros")]
#[cfg_attr(docsrs, doc(cfg(feature = "macros")))]
pub use dlock_macros::distributed_lock;
