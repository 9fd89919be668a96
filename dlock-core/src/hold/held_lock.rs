//! A view of a held lock that may be kept apart from its guard.

use std::sync::Arc;

use super::HoldState;
use crate::error::LockError;
use crate::fencing::FencingToken;

/// A view of a held lock, apart from its guard: its name, its fencing token, its loss. It
/// neither holds nor releases anything. See [`held_lock`](crate::scope::held_lock) and
/// [`LockGuard::held_lock`](crate::LockGuard::held_lock).
#[derive(Debug, Clone)]
pub struct HeldLock {
    pub(crate) hold: Arc<HoldState>,
}

impl HeldLock {
    /// The lock's name.
    pub fn name(&self) -> &crate::LockName {
        &self.hold.name
    }

    /// The fencing token of the hold, as
    /// [`LockGuard::fencing_token`](crate::LockGuard::fencing_token) gives it.
    pub async fn fencing_token(&self) -> Result<FencingToken, LockError> {
        self.hold.fencing_token().await
    }

    /// The fencing token if the hold has one already, without asking Redis (see
    /// [`LockGuard::minted_fencing_token`](crate::LockGuard::minted_fencing_token)).
    pub fn minted_fencing_token(&self) -> Option<FencingToken> {
        self.hold.fence.get().copied()
    }

    /// Whether the lock was lost.
    pub fn is_lost(&self) -> bool {
        self.hold.is_lost()
    }

    /// Resolves when the lock is lost (never, once it is released).
    pub fn lost(&self) -> crate::Lost {
        super::Lost::of(self.hold.clone())
    }
}
