//! What guarded code does when its lock is lost.

/// What happens to the guarded code when its lock is lost while it runs (the lease ran out, the
/// key was deleted, or another owner took it over).
///
/// This is the type of `#[distributed_lock(on_lost = ...)]` when the policy is chosen at run
/// time: the attribute takes `"cancel"` or `"signal"`, or an expression of this type evaluated
/// when the function is called.
///
/// ```no_run
/// # #[cfg(feature = "macros")]
/// # mod demo {
/// use dlock_core::{LockError, OnLost, distributed_lock};
///
/// // A dry run may watch its lock; the real export must stop the moment it loses it.
/// #[distributed_lock(key = "export:<id>", on_lost = if dry_run { OnLost::Signal } else { OnLost::Cancel })]
/// async fn export(id: u64, dry_run: bool) -> Result<(), LockError> {
///     Ok(())
/// }
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum OnLost {
    /// The guarded code is dropped at its next `.await` and the call returns
    /// [`LockError::Lost`](crate::LockError::Lost), as [`LockGuard::run`](crate::LockGuard::run)
    /// does. The default.
    #[default]
    Cancel,
    /// The guarded code runs on and decides: it sees the loss through
    /// [`held_lock`](crate::scope::held_lock) (`is_lost()`, `lost().await`).
    Signal,
}
