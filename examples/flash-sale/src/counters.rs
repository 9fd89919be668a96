//! Request counters shared by every instance: each instance counts in memory and adds what it
//! counted to its own rows of the `counters` table (no row is written by two instances, so
//! counting costs no contention); `/api/stats` sums the rows. The same counts, and the lock
//! waits, also feed the instance's samples for the operator's plots ([`crate::series`]).

use std::sync::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sqlx::AnyPool;

use crate::series::{Purchase, Tally};

/// A lock acquisition that took longer than this counts as a lock wait (an uncontended
/// acquisition is one Redis round trip).
pub const LOCK_WAIT_THRESHOLD: Duration = Duration::from_millis(5);

/// The counters' names, as stored.
const NAMES: [&str; 5] = [
    "requests",
    "locked",
    "lock_waits",
    "conflicts",
    "stale_refused",
];

/// What this instance has counted and not yet written.
#[derive(Debug)]
pub struct Counters {
    instance: String,
    /// The name the instance's samples go by ([`Counters::name`]).
    name: RwLock<String>,
    /// Running totals for the operator's plots.
    tally: Tally,
    pending: [AtomicU64; 5],
    flushing: tokio::sync::Mutex<()>,
    /// Buyers in the order path now, and the most there were at once (this instance).
    buying: AtomicU64,
    most_buying: AtomicU64,
}

/// One buyer in the order path; counted out when dropped.
#[derive(Debug)]
pub struct Buying<'a>(&'a Counters);

impl Drop for Buying<'_> {
    fn drop(&mut self) {
        self.0.buying.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One of the counters.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum Counter {
    /// A purchase request (voucher order or checkout).
    Request = 0,
    /// A purchase request that ran under its lock(s).
    Locked = 1,
    /// Of those, one that waited for a lock.
    LockWait = 2,
    /// A 409 answer to a purchase request.
    Conflict = 3,
    /// A fenced write refused.
    StaleRefused = 4,
}

impl Counters {
    /// Counters of the instance called `instance` (unique per process).
    pub fn new(instance: String) -> Self {
        Self {
            name: RwLock::new(instance.clone()),
            instance,
            tally: Tally::default(),
            pending: Default::default(),
            flushing: tokio::sync::Mutex::new(()),
            buying: AtomicU64::new(0),
            most_buying: AtomicU64::new(0),
        }
    }

    /// Counts a buyer into the order path until the returned value is dropped.
    pub fn buying(&self) -> Buying<'_> {
        let now = self.buying.fetch_add(1, Ordering::Relaxed) + 1;
        self.most_buying.fetch_max(now, Ordering::Relaxed);
        Buying(self)
    }

    /// The most buyers this instance had in the order path at once.
    pub fn most_buying(&self) -> u64 {
        self.most_buying.load(Ordering::Relaxed)
    }

    /// This instance's name in the `counters` table.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// The name this instance's samples go by in the operator's plots: its address once it
    /// serves ([`crate::server::serve`] names it so), else its name in the `counters` table.
    pub fn name(&self) -> String {
        self.name
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Names this instance's samples from now on.
    pub fn set_name(&self, name: impl Into<String>) {
        *self
            .name
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = name.into();
    }

    /// The running totals the instance's samples are read from.
    pub(crate) fn tally(&self) -> &Tally {
        &self.tally
    }

    /// Counts one.
    pub fn bump(&self, counter: Counter) {
        self.pending[counter as usize].fetch_add(1, Ordering::Relaxed);
        self.tally.bump(counter);
    }

    /// A purchase was answered with success (for the plots; the database counts orders).
    pub fn sold(&self, purchase: Purchase) {
        self.tally.sold(purchase);
    }

    /// A request ran under its lock(s), after waiting `waited` for them. A wait of at least
    /// [`LOCK_WAIT_THRESHOLD`] counts as a lock wait: the lock was handed over from its holder.
    pub fn ran_locked(&self, waited: Duration) {
        self.bump(Counter::Locked);
        self.tally.waited(waited);
        if waited >= LOCK_WAIT_THRESHOLD {
            self.bump(Counter::LockWait);
        }
    }

    /// Adds what was counted since the last flush to this instance's rows. What fails to be
    /// written is kept for the next flush.
    pub async fn flush(&self, db: &AnyPool) -> Result<(), sqlx::Error> {
        let _one_at_a_time = self.flushing.lock().await;
        for (i, name) in NAMES.iter().enumerate() {
            let delta = self.pending[i].swap(0, Ordering::Relaxed);
            if delta == 0 {
                continue;
            }
            let written = sqlx::query(
                "INSERT INTO counters (instance, name, value) VALUES ($1, $2, $3)
                 ON CONFLICT (instance, name) DO UPDATE SET value = counters.value + excluded.value",
            )
            .bind(&self.instance)
            .bind(*name)
            .bind(i64::try_from(delta).unwrap_or(i64::MAX))
            .execute(db)
            .await;
            if let Err(err) = written {
                self.pending[i].fetch_add(delta, Ordering::Relaxed);
                return Err(err);
            }
        }
        Ok(())
    }
}

/// A fresh instance name: 64 random bits in hex.
pub(crate) fn random_id() -> String {
    let mut bytes = [0u8; 8];
    // Without randomness from the system, the process id and the time still tell instances
    // apart.
    if getrandom::fill(&mut bytes).is_err() {
        let fallback = u64::from(std::process::id()) << 32 ^ crate::now_ms().unsigned_abs();
        bytes = fallback.to_le_bytes();
    }
    format!("{:016x}", u64::from_le_bytes(bytes))
}
