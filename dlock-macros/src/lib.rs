//! `#[distributed_lock]`: guard an async function with a distributed lock, declared at the edge.
//!
//! Use it through `dlock_core` (re-exported behind its default `macros` feature):
//!
//! ```no_run
//! use dlock_core::{LockError, distributed_lock};
//!
//! #[derive(Debug)]
//! enum AppError {
//!     Lock(LockError),
//! }
//!
//! impl From<LockError> for AppError {
//!     fn from(err: LockError) -> Self {
//!         AppError::Lock(err)
//!     }
//! }
//!
//! #[distributed_lock(key = "order:<user_id>:<voucher_id>", wait = "3s")]
//! async fn create_order(user_id: u64, voucher_id: u64) -> Result<u64, AppError> {
//!     // At most one call per (user, voucher) runs at a time, across every process.
//!     let token = dlock_core::fencing_token().expect("inside the lock");
//!     Ok(token.get())
//! }
//! ```

mod attr;
mod expand;
mod template;

use proc_macro::TokenStream;

/// Guards an `async fn` with a distributed lock.
///
/// The lock is taken before the body runs and released on every exit: a normal return, an early
/// `?`, a panic, or the caller dropping the future. The function must be `async` and return
/// `Result<_, E>` where `E: From<dlock_core::LockError>`: a lock that is busy, lost, misnamed or
/// unreachable comes back as `Err(E::from(lock_error))`.
///
/// # `key = "..."` (required)
///
/// A template of literal text and placeholders. `<name>` is a parameter of the function (`self`
/// included) and `<name.field.path>` a field reached through one; values are formatted with
/// `Display` and escaped, so `user_id = "1:admin"` can never produce the key of another user.
/// An unknown name is a compile error on the template.
///
/// `<name*>` (one per template) makes one key per item of a collection parameter (anything whose
/// reference iterates: `Vec`, slices, sets, arrays), and several `key = ...` arguments lock every
/// resulting name. Several names are locked all-or-none, in one global order, so two calls over
/// overlapping sets cannot deadlock.
///
/// ```no_run
/// # use dlock_core::{LockError, distributed_lock};
/// #[distributed_lock(key = "sku:<skus*>", key = "cart:<user_id>", wait = "2s")]
/// async fn checkout(user_id: u64, skus: Vec<String>) -> Result<(), LockError> {
///     Ok(())
/// }
/// ```
///
/// # `wait = "3s"`
///
/// How long to wait for a busy lock, counted from the call (default: one attempt). Durations
/// are written with the units `ms`, `s`, `m` and `h`, combined as in `1m30s`; they are checked at
/// compile time.
///
/// # `lease = "10s"`
///
/// A fixed lease: the lock is not renewed and expires after it. Without `lease`, the watchdog
/// keeps the lock alive (a 30 s lease by default, renewed every 10 s) for as long as the body
/// runs.
///
/// # `locker = <expr>`
///
/// Which `dlock_core::Locker` to use: an expression evaluated in the function's scope before the
/// body, such as `self.locker` or `state.locker`. Without it, the process-wide default installed
/// with `dlock_core::set_default_locker`; if none was installed, the call returns a
/// configuration error.
///
/// # `on_lost = "cancel" | "signal"`
///
/// What happens when the lock is lost while the body runs (it expired, was deleted, or was taken
/// over). `"cancel"` (the default) drops the body at its next `.await` and returns
/// `Err(LockError::Lost { .. }.into())`. `"signal"` lets the body run on; it can check
/// `dlock_core::held_lock()` (`is_lost()`, or await `lost()`).
///
/// # `reentrant = false`
///
/// By default the body runs in a lock scope (`dlock_core::scope`): a nested call in the same task
/// that locks the same name re-enters the hold instead of deadlocking. With `reentrant = false`
/// the hold can't be re-entered: a nested call on the same name waits like any other caller.
///
/// # `crate = "path"`
///
/// The path of `dlock_core` when it is renamed or re-exported (default `::dlock_core`).
///
/// # Fencing token
///
/// The body reads the fencing token of its lock with `dlock_core::fencing_token()` and hands it to
/// the resource it writes, which refuses tokens older than the newest it has seen.
///
/// # Equivalent code without the macro
///
/// ```no_run
/// # use std::time::Duration;
/// # use dlock_core::{LockError, LockName};
/// # async fn create_order_body(_: u64, _: u64) -> Result<u64, LockError> { Ok(0) }
/// async fn create_order(user_id: u64, voucher_id: u64) -> Result<u64, LockError> {
///     let locker = dlock_core::default_locker()?.clone();
///     let name = LockName::builder()
///         .literal("order:")
///         .value(user_id)
///         .literal(":")
///         .value(voucher_id)
///         .build()?;
///     dlock_core::scope(async move {
///         let guard = locker.lock(name).wait(Duration::from_secs(3)).await?;
///         // Cancelled at its next `.await` if the lock is lost.
///         let out = guard.run(create_order_body(user_id, voucher_id)).await?;
///         let _ = guard.release().await;
///         out
///     })
///     .await
/// }
/// ```
#[proc_macro_attribute]
pub fn distributed_lock(args: TokenStream, item: TokenStream) -> TokenStream {
    let item2 = proc_macro2::TokenStream::from(item.clone());
    let result = syn::parse::<attr::Args>(args).and_then(|args| {
        let func = syn::parse::<syn::ItemFn>(item)?;
        expand::expand(args, func)
    });
    match result {
        Ok(tokens) => tokens.into(),
        // Keep the function so the rest of the crate (and the IDE) still sees it.
        Err(err) => {
            let err = err.to_compile_error();
            quote::quote!(#item2 #err).into()
        }
    }
}
