//! The process-wide default `Locker`, used by `#[distributed_lock]` without `locker = ...`.

use std::sync::OnceLock;

use super::Locker;
use crate::error::LockError;

static DEFAULT_LOCKER: OnceLock<Locker> = OnceLock::new();

/// Installs the process-wide default `Locker` (used by `#[distributed_lock]` without `locker =`).
/// Fails if one was installed already.
pub fn set_default_locker(locker: Locker) -> Result<(), LockError> {
    DEFAULT_LOCKER
        .set(locker)
        .map_err(|_| LockError::Config("a default locker is already installed".to_owned()))
}

/// The process-wide default `Locker`, or a configuration error naming
/// [`set_default_locker`] if none was installed.
pub fn default_locker() -> Result<&'static Locker, LockError> {
    DEFAULT_LOCKER.get().ok_or_else(|| {
        LockError::Config(
            "no default locker installed: call dlock_core::set_default_locker at start-up, or pass `locker = ...`"
                .to_owned(),
        )
    })
}
