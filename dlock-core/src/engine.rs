//! The machinery every kind of lock shares: taking a hold (attempts, the local line, the wait
//! in Redis, re-entry), keeping it (the watchdog, `extend`), handing it over and releasing it,
//! and the guard that owns it.
//!
//! An [`Engine`] is what a `Locker` is inside: the backend, the settings, the watchdog and the
//! local lines, shared by every clone. The kinds (`request`, `rw`, `semaphore`, `multi`) build
//! their requests and guards on it; the `Locker` facade hands them out.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::backend::Backend;
use crate::error::LockError;
use crate::name::{IntoLockName, LockKeys, LockName};
use crate::scope;
use crate::watchdog::Watchdog;

mod acquire;
mod config;
mod fair;
mod guard;
mod head;
mod hold_times;
mod in_flight;
mod lease;
mod leave;
mod owner;
mod queue;
mod release;
pub(crate) mod spans;
mod waiter;

pub(crate) use acquire::{Attempted, TriedAll, held_or_timed_out, is_permanent};
pub(crate) use config::{Config, MIN_DEAD_WAITER_TIMEOUT};
pub use config::{
    DEFAULT_COMMAND_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_DEAD_WAITER_TIMEOUT,
    DEFAULT_FENCE_TTL, DEFAULT_POLL_INTERVAL, DEFAULT_PREFIX, DEFAULT_WATCHDOG_LEASE,
};
pub use guard::LockGuard;
pub(crate) use guard::{FromLockGuard, wrapped_guard_methods};
use hold_times::HoldTimes;
use in_flight::InFlight;
pub use lease::Lease;
pub(crate) use lease::{MAX_LEASE, check_at_least, check_lease};
use queue::{HeadWait, QueueEntry, handed};
pub(crate) use release::release_outcome;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn next_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

/// A handle on the machinery of one `Locker`: cheap to clone, every clone the same.
#[derive(Clone)]
pub(crate) struct Engine {
    pub(crate) inner: Arc<Shared>,
}

/// What every clone of a `Locker` shares.
pub(crate) struct Shared {
    id: u64,
    pub(crate) backend: Backend,
    pub(crate) config: Config,
    pub(crate) watchdog: Watchdog,
    queues: Mutex<HashMap<queue::ByLock, QueueEntry>>,
    /// The last acquisition attempt's round trip, in µs (0: none yet): how long a turn kept for
    /// one of this `Locker`'s waiters must last.
    pub(crate) round_trip_us: AtomicU64,
    /// How long this `Locker`'s holds lasted lately: a busy answer's `retry_after`.
    pub(crate) hold_times: HoldTimes,
    /// Locks its releases handed to one of its own waiters (`HANDOFF`).
    pub(crate) handed_over: AtomicU64,
    /// A random id, named in the turns this `Locker`'s waiters claim: its hand-overs may serve
    /// its own waiters, never pass over another `Locker`'s.
    turn_id: Arc<str>,
    /// Where its owner tokens come from.
    owners: owner::Owners,
    /// Where the locker points, with any password removed.
    pub(crate) display: String,
}

// Shown as the `Locker` it is, in every request and handle that keeps one.
impl fmt::Debug for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Locker")
            .field("backend", &self.inner.backend.kind())
            .field("at", &self.inner.display)
            .field("prefix", &self.inner.config.prefix)
            .field("default_wait", &self.inner.config.default_wait)
            .field("default_lease", &self.inner.config.default_lease)
            .field("held", &self.inner.watchdog.len())
            .finish()
    }
}

impl Engine {
    /// The machinery over `backend` with `config`; `display` says where it points, without a
    /// password.
    pub(crate) fn new(backend: Backend, config: Config, display: String) -> Self {
        let owners = owner::Owners::draw();
        let turn_id = owners.next(config.token_tag, None);
        Self {
            inner: Arc::new(Shared {
                id: next_id(),
                backend,
                config,
                watchdog: Watchdog::default(),
                queues: Mutex::new(HashMap::new()),
                round_trip_us: AtomicU64::new(0),
                hold_times: HoldTimes::default(),
                handed_over: AtomicU64::new(0),
                turn_id,
                owners,
                display,
            }),
        }
    }

    /// A fresh owner token for one acquisition, with this `Locker`'s holder label.
    pub(crate) fn new_owner(&self) -> Arc<str> {
        let config = &self.inner.config;
        self.inner
            .owners
            .next(config.token_tag, config.holder_label.as_deref())
    }

    /// This `Locker`'s id, unique in the process: what a scope records its holds under.
    pub(crate) fn id(&self) -> u64 {
        self.inner.id
    }

    /// How long a request waits when it doesn't say.
    pub(crate) fn default_wait(&self) -> Duration {
        self.inner.config.default_wait
    }

    /// How a request leases its lock when it doesn't say.
    pub(crate) fn default_lease(&self) -> Lease {
        self.inner.config.default_lease
    }

    /// `name`, validated and hidden from logs if this `Locker` hides every name.
    pub(crate) fn name(&self, name: impl IntoLockName) -> Result<LockName, LockError> {
        let name = name.into_lock_name()?;
        Ok(if self.inner.config.hide_names {
            name.hidden(true)
        } else {
            name
        })
    }

    /// A connection for one operation's commands (see `Backend::session`), its failure a
    /// [`LockError::Backend`].
    pub(crate) fn session(
        &self,
    ) -> impl std::future::Future<Output = Result<crate::backend::Session, LockError>> + Send + '_
    {
        use futures_util::FutureExt as _;
        (self.inner.backend.session()).map(|session| session.map_err(LockError::Backend))
    }

    /// How many local lines are open (for `Locker::stats`).
    pub(crate) fn queue_count(&self) -> usize {
        self.queues().len()
    }

    /// A writer's keys; its wait is recorded (keeping new readers out) when writers are
    /// preferred and the request may wait.
    pub(crate) fn write_keys(
        &self,
        name: &LockName,
        prefer_writers: bool,
        wait: Duration,
    ) -> Result<Arc<LockKeys>, LockError> {
        let prefix = &self.inner.config.prefix;
        let counts = (!wait.is_zero()).then_some(self.inner.config.dead_waiter_timeout);
        let keys = LockKeys::read_write(prefix, name, true, prefer_writers, counts);
        let read = LockKeys::read_write(prefix, name, false, prefer_writers, None);
        if scope::find(self.inner.id, &keys.lock).is_none()
            && scope::find(self.inner.id, &read.lock).is_some()
        {
            return Err(LockError::Config(format!(
                "the read lock on {name} can't be upgraded to a write lock: release it first"
            )));
        }
        Ok(Arc::new(keys))
    }
}
