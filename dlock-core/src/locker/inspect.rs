//! Operator tools: what a name holds ([`Locker::inspect`]) and freeing it whoever holds it
//! ([`Locker::force_release`]).

use std::time::Duration;

use super::Locker;
use crate::backend::Backend;
use crate::error::LockError;
use crate::fencing::FencingToken;
use crate::name::{IntoLockName, NameKeys, escape_glob, glob_matches};

/// One holder of a lock, as an operator may see it — never its whole owner token, which would
/// let anyone who reads it release the lock.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holder {
    /// The first eight characters of the holder's owner token: enough to tell holders apart.
    pub token_prefix: String,
    /// The label of the `Locker` that took it ([`LockerBuilder::holder_label`]), if it had one.
    ///
    /// [`LockerBuilder::holder_label`]: crate::LockerBuilder::holder_label
    pub label: Option<String>,
}

/// What Redis holds for one name at the moment [`Locker::inspect`] read it (one script, so
/// every field is from the same instant): its lock (plain or fair), and its read-write lock
/// and semaphore, which live apart under the same name.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockInfo {
    /// The name.
    pub name: String,
    /// Who holds it (empty: nobody). A lock has one holder in Redis however many times its
    /// holder re-entered it: re-entries are counted in the holder's process.
    pub holders: Vec<Holder>,
    /// The current hold's fencing token.
    pub fencing_token: Option<FencingToken>,
    /// How long the key has left, read from Redis (`None`: no key).
    pub ttl: Option<Duration>,
    /// Taken by nobody: released within an `at_least` period, which ends with `ttl`.
    pub kept: bool,
    /// The lock's key, or the read-write lock's writer's, holds something other than a hold
    /// (written by someone else).
    pub foreign: bool,
    /// The last fencing token handed out for this name (`None`: none, or its counter expired).
    pub last_fencing_token: Option<FencingToken>,
    /// How many `Locker`s are waiting for a release (subscribers of the name's wake-up
    /// channel: one per `Locker`, however many of its tasks wait; `Locker`s that poll are not
    /// counted). A `Locker` stays subscribed for 100 ms after its last wait for the name ended
    /// (not on a Cluster), and is counted meanwhile.
    pub waiting_lockers: u64,
    /// How many waiters stand in the name's fair line ([`Locker::fair_lock`]; 0 for a plain
    /// lock), dead ones whose time is not yet up included.
    pub queued_waiters: u64,
    /// The writer of the read-write lock of this name ([`Locker::read_write_lock`]), if one
    /// holds it.
    pub writer: Option<Holder>,
    /// How long the writer's key has left (`None`: no writer).
    pub writer_ttl: Option<Duration>,
    /// How many readers hold the read-write lock of this name (those whose lease ran out are
    /// not counted).
    pub readers: u64,
    /// How many permits of the semaphore of this name ([`Locker::semaphore`]) are taken (those
    /// whose lease ran out are not counted).
    pub permits_taken: u64,
    /// The semaphore's permit count, if one was set at run time
    /// ([`Semaphore::set_permits`](crate::Semaphore::set_permits)); otherwise each
    /// `Semaphore` uses the count it was made with.
    pub permit_limit: Option<u32>,
}

impl LockInfo {
    /// Whether someone holds the lock, or it is kept after a release: a lock's acquisition now
    /// would find it busy.
    pub fn is_taken(&self) -> bool {
        !self.holders.is_empty() || self.kept || self.foreign
    }

    /// Whether anything of any kind holds the name: the lock ([`is_taken`](Self::is_taken)),
    /// the read-write lock's writer or readers, or a semaphore permit.
    pub fn is_held_by_any_kind(&self) -> bool {
        self.is_taken() || self.writer.is_some() || self.readers > 0 || self.permits_taken > 0
    }
}

impl Locker {
    /// The names of this `Locker`'s prefix that hold something in Redis now — a lock, held or
    /// kept after a release, a read-write lock's writer or readers, or semaphore permits —
    /// whose name matches `pattern` (a Redis glob: `*`, `?`, `[...]`; `"*"` for all), sorted.
    /// Reads with `SCAN` in batches, never `KEYS`, so a large database is not blocked; each
    /// batch is bounded by the command timeout. On a cluster it scans every master in turn and
    /// merges their names; a name whose slot moves during the scan may be missed.
    pub async fn list(&self, pattern: &str) -> Result<Vec<String>, LockError> {
        let prefix = &self.engine.inner.config.prefix;
        let keys = match &self.engine.inner.backend {
            Backend::Redis(r) => {
                // `{name}` and the kinds' keys after it: `{name}:write`, `{name}:permits`, ...
                let glob = format!("{}{{{pattern}}}*", escape_glob(prefix));
                (r.scan(&glob).await).map_err(operator_error)?
            }
            // An advisory lock is a number in `pg_locks`: the name it was made from is not
            // kept anywhere to be listed.
            #[cfg(feature = "postgres")]
            Backend::Postgres(_) => {
                return Err(LockError::Config(
                    "a postgres `Locker` cannot list names: PostgreSQL keeps each lock as a \
                     number made from its name; inspect a name you know, or see every \
                     advisory lock held with `advisory_locks`"
                        .into(),
                ));
            }
        };
        let mut names: Vec<String> = (keys.iter())
            .filter_map(|k| k.strip_prefix(prefix.as_str())?.strip_prefix('{'))
            // A name has no `}`: the first one closes it.
            .filter_map(|k| k.split_once('}'))
            .filter(|(_, suffix)| NameKeys::HOLD_SUFFIXES.contains(suffix))
            .map(|(name, _)| name)
            .filter(|name| glob_matches(pattern, name))
            .map(str::to_owned)
            .collect();
        names.sort();
        names.dedup();
        Ok(names)
    }

    /// Reads what Redis holds for `name`: its lock's holder (a token prefix and the holder's
    /// label), the remaining TTL, the current and the last fencing token, how many `Locker`s
    /// wait; the read-write lock's writer and readers and the semaphore's permits of the same
    /// name. Read-only; one round trip.
    pub async fn inspect(&self, name: impl IntoLockName) -> Result<LockInfo, LockError> {
        let name = self.engine.name(name)?;
        let keys = NameKeys::new(&self.engine.inner.config.prefix, &name);
        let session = self.engine.session().await?;
        let raw = (session.inspect(&keys).await).map_err(operator_error)?;
        Ok(LockInfo {
            name: name.to_string(),
            holders: (raw.holders.into_iter())
                .map(|(token_prefix, label)| Holder {
                    token_prefix,
                    label,
                })
                .collect(),
            fencing_token: raw.token.map(FencingToken::new),
            ttl: raw.ttl,
            kept: raw.kept,
            foreign: raw.foreign,
            last_fencing_token: raw.last_token.map(FencingToken::new),
            waiting_lockers: raw.waiting,
            queued_waiters: raw.queued,
            writer: raw.writer.map(|(token_prefix, label)| Holder {
                token_prefix,
                label,
            }),
            writer_ttl: raw.writer_ttl,
            readers: raw.readers,
            permits_taken: raw.permits,
            permit_limit: raw.permit_limit,
        })
    }

    /// Frees `name` whoever holds it, for operators: removes its lock (or what a release kept
    /// for an `at_least` period), the read-write lock's writer and readers, and the
    /// semaphore's permits of that name, and wakes the waiters of each. Their holders learn of
    /// the loss at their next renewal (within a third of the lease, with the watchdog) and
    /// their guarded work is cancelled or signalled as for any loss; a holder with a fixed
    /// lease learns it only when it extends or releases. Returns whether there was anything to
    /// remove.
    ///
    /// The next holder gets a higher fencing token, so a resource that checks tokens refuses
    /// the old holder's late writes.
    pub async fn force_release(&self, name: impl IntoLockName) -> Result<bool, LockError> {
        let name = self.engine.name(name)?;
        let keys = NameKeys::new(&self.engine.inner.config.prefix, &name);
        let session = self.engine.session().await?;
        let removed = (session.force_release(&keys).await).map_err(operator_error)?;
        tracing::warn!(
            name = name.for_logs(),
            removed,
            "dlock: lock released by force"
        );
        Ok(removed > 0)
    }
}

/// A command of the operator tools that failed, counted as `inspect`.
fn operator_error(err: crate::error::BackendError) -> LockError {
    crate::metrics::backend_error("inspect");
    LockError::Backend(err)
}
