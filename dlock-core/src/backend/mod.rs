//! Where locks live: Redis (single server, over a connection manager, a multiplexed connection or
//! a bb8 pool) or an in-process memory store with the same semantics.

use std::time::Duration;

use crate::error::BackendError;
use crate::name::LockKeys;
use crate::wait::Watch;

pub(crate) mod memory;
pub(crate) mod redis;

pub use memory::MemoryStore;

/// The answer to one acquisition attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AcquireReply {
    /// Held now, with this fencing token; `reentered` when the owner already held it.
    Acquired { fence: u64, reentered: bool },
    /// Held by someone else, who has this much lease left (`None`: unknown or no expiry).
    Busy { pttl: Option<Duration> },
}

/// The answer to one release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReleaseReply {
    /// Released; `woke` subscribers received the wake-up (0 when none listened, or unknown).
    Released {
        woke: u32,
    },
    StillHeld(u32),
    Expired,
    TakenOver,
}

impl ReleaseReply {
    /// A released reply with the number of subscribers woken.
    pub(crate) fn released(woke: i64) -> Self {
        Self::Released {
            woke: u32::try_from(woke).unwrap_or(0),
        }
    }

    pub(crate) fn from_code(code: i64) -> Self {
        match code {
            0 => Self::Released { woke: 0 },
            -1 => Self::Expired,
            -2 => Self::TakenOver,
            n => Self::StillHeld(u32::try_from(n).unwrap_or(u32::MAX)),
        }
    }
}

/// The answer to a hand-over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HandoffReply {
    HandedOver { fence: u64 },
    NotHandedOver(ReleaseReply),
}

/// One lock to renew in a batch.
#[derive(Debug, Clone)]
pub(crate) struct RenewItem {
    pub(crate) key: String,
    pub(crate) owner: String,
    pub(crate) lease_ms: u64,
}

#[derive(Debug, Clone)]
pub(crate) enum Backend {
    Redis(std::sync::Arc<redis::RedisBackend>),
    Memory(memory::MemoryBackend),
}

impl Backend {
    pub(crate) async fn acquire(
        &self,
        keys: &LockKeys,
        owner: &str,
        lease: Duration,
        fence_ttl: Option<Duration>,
        reenter: bool,
    ) -> Result<AcquireReply, BackendError> {
        match self {
            Self::Redis(r) => r.acquire(keys, owner, lease, fence_ttl, reenter).await,
            Self::Memory(m) => Ok(m.acquire(keys, owner, lease, reenter)),
        }
    }

    pub(crate) async fn release(
        &self,
        keys: &LockKeys,
        owner: &str,
    ) -> Result<ReleaseReply, BackendError> {
        match self {
            Self::Redis(r) => r.release(keys, owner).await,
            Self::Memory(m) => Ok(m.release(keys, owner)),
        }
    }

    pub(crate) async fn handoff(
        &self,
        keys: &LockKeys,
        from: &str,
        to: &str,
        lease: Duration,
        fence_ttl: Option<Duration>,
    ) -> Result<HandoffReply, BackendError> {
        match self {
            Self::Redis(r) => r.handoff(keys, from, to, lease, fence_ttl).await,
            Self::Memory(m) => Ok(m.handoff(keys, from, to, lease)),
        }
    }

    pub(crate) async fn renew(&self, items: &[RenewItem]) -> Result<Vec<bool>, BackendError> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        match self {
            Self::Redis(r) => r.renew(items).await,
            Self::Memory(m) => Ok(m.renew(items)),
        }
    }

    /// Registers interest in wake-ups on `channel`. Subscribes (and waits for the confirmation)
    /// before returning, so a release published after this returns is never missed.
    pub(crate) async fn watch(&self, channel: &str) -> Watch {
        match self {
            Self::Redis(r) => r.watch(channel).await,
            Self::Memory(m) => m.watch(channel),
        }
    }

    /// Whether this backend runs acquisitions over the network (and so needs a cancellation-safe
    /// attempt).
    pub(crate) fn is_remote(&self) -> bool {
        matches!(self, Self::Redis(_))
    }

    /// Whether every command goes down one pipelined connection, in order: then a clean-up
    /// release sent after an attempt always reaches Redis after it.
    pub(crate) fn is_ordered(&self) -> bool {
        match self {
            Self::Redis(r) => r.is_pipelined(),
            Self::Memory(_) => true,
        }
    }

    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Self::Redis(r) => r.kind(),
            Self::Memory(_) => "memory",
        }
    }
}
