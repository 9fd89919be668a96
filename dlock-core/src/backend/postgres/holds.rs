//! What the PostgreSQL backend's sessions hold, as the backend keeps it: each hold, by the
//! advisory key of what it holds (a lock's key, a semaphore's permits, a read-write lock's
//! writer or readers), with the advisory locks its session took for it.
//!
//! PostgreSQL lets a session take a lock it holds already (and counts it), so this is what keeps
//! two owners of one `Locker` apart: an owner's attempt first looks here, and a hold of another
//! owner of the same `Locker` makes it busy without asking the server.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::time::Instant;

/// The advisory locks one hold is made of, in its session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Locks {
    /// One lock, exclusive: a plain lock's, a writer's, or a waiting writer's gate.
    Exclusive(i64),
    /// One lock, shared with other sessions' (and counted in this one): a reader's.
    Shared(i64),
    /// Exclusive locks on some of a semaphore's permit slots: one for each permit taken.
    Slots(Arc<[i64]>),
}

impl Locks {
    /// The advisory keys this hold's session must have.
    pub(super) fn keys(&self) -> &[i64] {
        match self {
            Self::Exclusive(key) | Self::Shared(key) => std::slice::from_ref(key),
            Self::Slots(keys) => keys,
        }
    }
}

/// One hold of this backend's sessions.
#[derive(Debug, Clone)]
pub(super) struct Held {
    /// Its owner token (a permit's or a reader's id), `#k:<owner>` while an `at_least` release
    /// keeps it, or [`GATE`] for the gate of a `Locker`'s waiting writers.
    pub(super) owner: Arc<str>,
    /// The connection whose session holds it.
    pub(super) conn: usize,
    /// That connection's session when it was taken: a hold of an earlier one is gone.
    pub(super) generation: u64,
    /// Its fencing token (0 for the kinds that have none).
    pub(super) fence: u64,
    /// When the backend unlocks it unless a renewal moves this on: its lease, counted from
    /// the answer that took or renewed it (no earlier than the holder counts it).
    pub(super) expires: Instant,
    pub(super) locks: Locks,
}

/// The owner of a waiting writers' gate: no owner's token has this form.
pub(super) const GATE: &str = "#gate";

/// Every hold, by the advisory key of what it holds.
#[derive(Debug, Default)]
pub(super) struct Holds(HashMap<i64, Vec<Held>>);

impl Holds {
    /// `owner`'s hold of `key` in session `generation`.
    pub(super) fn find(&self, key: i64, owner: &str, generation: u64) -> Option<&Held> {
        let holds = self.0.get(&key)?;
        holds
            .iter()
            .find(|h| h.generation == generation && *h.owner == *owner)
    }

    pub(super) fn find_mut(&mut self, key: i64, owner: &str, generation: u64) -> Option<&mut Held> {
        let holds = self.0.get_mut(&key)?;
        holds
            .iter_mut()
            .find(|h| h.generation == generation && *h.owner == *owner)
    }

    /// Every hold of `key` in session `generation`.
    pub(super) fn of(&self, key: i64, generation: u64) -> impl Iterator<Item = &Held> {
        (self.0.get(&key).into_iter().flatten()).filter(move |h| h.generation == generation)
    }

    /// Whether anyone holds `key` in session `generation`.
    pub(super) fn any(&self, key: i64, generation: u64) -> bool {
        self.of(key, generation).next().is_some()
    }

    /// The connection `owner`'s hold of `key` is on, whichever session took it.
    pub(super) fn conn_of(&self, key: i64, owner: &str) -> Option<usize> {
        let holds = self.0.get(&key)?;
        holds.iter().find(|h| *h.owner == *owner).map(|h| h.conn)
    }

    /// Any hold of `key`, of this session or an earlier one (the earliest taken).
    pub(super) fn first(&self, key: i64) -> Option<&Held> {
        self.0.get(&key).and_then(|holds| holds.first())
    }

    pub(super) fn insert(&mut self, key: i64, held: Held) {
        self.0.entry(key).or_default().push(held);
    }

    /// Takes `owner`'s hold of `key` in session `generation` out.
    pub(super) fn remove(&mut self, key: i64, owner: &str, generation: u64) -> Option<Held> {
        let holds = self.0.get_mut(&key)?;
        let at = holds
            .iter()
            .position(|h| h.generation == generation && *h.owner == *owner)?;
        let held = holds.swap_remove(at);
        if holds.is_empty() {
            self.0.remove(&key);
        }
        Some(held)
    }

    /// Forgets every hold of connection `conn`'s session `generation`, which ended.
    pub(super) fn ended(&mut self, conn: usize, generation: u64) {
        self.0.retain(|_, holds| {
            holds.retain(|h| !(h.conn == conn && h.generation == generation));
            !holds.is_empty()
        });
    }
}
