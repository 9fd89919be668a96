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
//!     // The token is minted by Redis at the first ask: a lost lock or an unreachable Redis is
//!     // an `Err`, and the write must not happen.
//!     let token = dlock_core::scope::fencing_token().await?;
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
/// `Result<_, E>` where `E: From<dlock_core::LockError>` (an alias whose name ends in `Result`,
/// such as `io::Result<T>` or `ApiResult<T>`, counts): a lock that is busy, lost, misnamed or
/// unreachable comes back as `Err(E::from(lock_error))`.
///
/// Everything that can be checked at compile time is: the arguments, the literal durations, the
/// key template against the function's parameters (names, fields, `Display`), the types of the
/// expressions given to `locker`, `wait`, `lease` and `on_lost`, the function's shape. Each
/// mistake is a compile error on the offending token, and the function itself is still emitted
/// so that the rest of the crate keeps compiling around it.
///
/// # `key = "..."` (required)
///
/// A template of literal text and placeholders. `<name>` is a parameter of the function (`self`
/// included) and `<name.field.path>` a field reached through one (`<pair.0>` for a tuple field).
/// Values are formatted with `Display` and escaped, so `user_id = "1:admin"` can never produce
/// the key of another user. A name that no parameter binds, a missing field or a value without
/// `Display` is a compile error on the template. A parameter written as a pattern
/// (`(a, b): (u64, u64)`) has no name of its own: use the names its pattern binds.
///
/// The literal text may not contain `{` or `}`: dlock wraps every name in a Redis Cluster hash
/// tag of its own.
///
/// ## Several names: `<name*>` and several `key`s
///
/// `<name*>` (at most one per template) makes one name per item of a collection: anything whose
/// reference iterates, such as `Vec<T>`, `&[T]`, `HashSet<T>`, `BTreeSet<T>` or `[T; N]` (or a
/// reference to one); each item is formatted with `Display`. Several `key = ...` arguments add
/// their names to the same set. Every name of the set is locked all-or-none
/// (`Locker::lock_all`), in one global order, so two calls over overlapping sets can't deadlock;
/// if any name stays busy past `wait`, none is held and the call returns the timeout. An empty
/// collection adds no name (and when no template adds any, the body runs without a lock, as
/// "lock every item of an empty cart" asks).
///
/// ```no_run
/// # use dlock_core::{LockError, distributed_lock};
/// #[distributed_lock(key = "sku:<skus*>", key = "cart:<user_id>", wait = "2s")]
/// async fn checkout(user_id: u64, skus: Vec<String>) -> Result<(), LockError> {
///     // Holds `cart:<user_id>` and every `sku:<sku>`.
///     Ok(())
/// }
/// ```
///
/// # `wait = "3s"` or `wait = <expr>`
///
/// How long to wait for a busy lock, counted from the call. A waiter sleeps until the lock is
/// released (a pub/sub wake-up), it does not poll.
///
/// - A string literal is a duration written with the units `ms`, `s`, `m` and `h`, combined as
///   in `1m30s`, and checked at compile time: a bad one is a compile error on the literal.
/// - Anything else is an expression of type `std::time::Duration`, evaluated at each call as if
///   it were the first line of the body (when the call's future first runs, before the key is
///   built and the lock taken), so it may use the parameters and `self`: a constant (`wait = ORDER_WAIT`), a field (`wait = self.wait`,
///   `wait = cfg.wait`), a call (`wait = Duration::from_millis(wait_ms)`). An expression of
///   another type is a type error on the expression.
/// - **Without `wait`**, the attribute doesn't set a wait, and the request waits what the `Locker`
///   it uses says: `LockerBuilder::default_wait`, which is zero — one attempt, busy at once —
///   unless that `Locker` was built with another. This holds for the process-wide default
///   `Locker` too. `wait = "0s"` always makes one attempt, whatever the `Locker`'s default.
///
/// ```no_run
/// # use std::time::Duration;
/// # use dlock_core::{LockError, distributed_lock};
/// const ORDER_WAIT: Duration = Duration::from_secs(3);
///
/// #[distributed_lock(key = "order:<id>", wait = ORDER_WAIT)]
/// async fn pay(id: u64) -> Result<(), LockError> {
///     Ok(())
/// }
///
/// #[distributed_lock(key = "report:<day>", wait = Duration::from_secs(patience_s))]
/// async fn report(day: u32, patience_s: u64) -> Result<(), LockError> {
///     Ok(())
/// }
/// ```
///
/// # `lease = "10s"` or `lease = <expr>`
///
/// A fixed lease: the lock is not renewed and expires after it, whether or not the body is done.
/// As with `wait`, a string literal is checked at compile time (and must be between `10ms` and
/// about ten years), and any other expression is a `std::time::Duration` evaluated at each call;
/// a value out of those bounds makes the call return a configuration error
/// (`LockError::Config`) without running the body.
///
/// Without `lease`, the lock takes the `Locker`'s default lease (`LockerBuilder::default_lease`):
/// unless configured, a 30 s watchdog lease renewed every 10 s, which keeps the lock alive for as
/// long as the body runs.
///
/// # `at_least = "30s"` or `at_least = <expr>`
///
/// Run at most once per period: the name stays taken until at least this long after the grant,
/// even when the body finishes sooner, so a scheduled job that every instance starts at the
/// same time runs on one of them per period (`LockRequest::at_least`). With a literal `lease`,
/// a literal `at_least` longer than it is a compile error; an expression is checked at each
/// call (`LockError::Config`).
///
/// ```
/// use dlock_core::{LockError, distributed_lock};
///
/// #[distributed_lock(key = "job:nightly-report", at_least = "30s")]
/// async fn nightly_report() -> Result<(), LockError> {
///     Ok(())
/// }
/// ```
///
/// # `locker = <expr>`
///
/// Which `dlock_core::Locker` to use: an expression evaluated in the function's scope before the
/// body, such as `self.locker`, `state.locker.clone()` or a `locker` parameter. It may be a
/// `Locker`, a reference to one, or a `Box`, `Arc` or `Rc` of one; it is cloned (cheaply) before
/// the body starts, so it borrows nothing for longer. Without `locker`, the process-wide default
/// installed with `dlock_core::set_default_locker`; if none was installed, the call returns a
/// configuration error (`LockError::Config`) without running the body.
///
/// # `on_lost = "cancel" | "signal" | <expr>`
///
/// What happens when the lock is lost while the body runs (it expired, was deleted, or was taken
/// over). A string literal is checked at compile time; any other expression is a
/// `dlock_core::OnLost` (`OnLost::Cancel` or `OnLost::Signal`) evaluated at each call, so the
/// policy can be chosen at run time (`on_lost = cfg.on_lost`).
///
/// - `"cancel"` (the default): the body is dropped at its next `.await` and the function returns
///   `Err(LockError::Lost { .. }.into())`.
/// - `"signal"`: the body runs on, and decides. It observes the loss through
///   `dlock_core::scope::held_lock()`, the lock it holds: `held.is_lost()` to check, `held.lost().await`
///   to wait for it (for example in a `tokio::select!` against the work).
///
/// ```no_run
/// # use dlock_core::{LockError, distributed_lock};
/// # async fn write_batch(_: u64) {}
/// #[distributed_lock(key = "export:<id>", on_lost = "signal")]
/// async fn export(id: u64) -> Result<bool, LockError> {
///     let held = dlock_core::scope::held_lock().expect("inside the lock");
///     tokio::select! {
///         () = write_batch(id) => Ok(true),
///         () = held.lost() => Ok(false), // another process may be exporting now
///     }
/// }
/// ```
///
/// # `reentrant = false`
///
/// By default the body runs in a lock scope of its own, nested in the caller's: a nested
/// `#[distributed_lock]` call (or `Locker::lock`) in the body on a name the body holds, through
/// the same `Locker`, re-enters the hold instead of deadlocking, and shares its fencing token.
/// Calls that run beside each other in one task (`join!`, `select!`, a `FuturesUnordered`) are
/// not nested: each has its own scope, and on one name they exclude each other as calls from
/// two tasks do, also inside an enclosing lock. With
/// `reentrant = false` the hold can't be re-entered, and the acquisition doesn't re-enter an
/// outer hold either: a nested call on the same name waits like any other caller (and times out).
///
/// # `fair = true`
///
/// Takes a fair lock (`Locker::fair_lock`): callers get it in the order they came, across
/// processes, and a release wakes only the next one in line. A key naming several locks (several
/// `key`s, or a collection placeholder) can't be fair: that is a compile error on `fair`.
///
/// ```
/// use dlock_core::{LockError, distributed_lock};
///
/// // Callers for one account take turns in the order they arrived.
/// #[distributed_lock(key = "ledger:<account_id>", wait = "10s", fair = true)]
/// async fn post_entry(account_id: u64, cents: i64) -> Result<i64, LockError> {
///     Ok(cents)
/// }
/// ```
///
/// # `crate = "path"`
///
/// The path of `dlock_core` when it is renamed or re-exported (default `::dlock_core`), e.g.
/// `crate = "my_app::dlock"`.
///
/// # Fencing token
///
/// The body reads the fencing token of its lock with `dlock_core::scope::fencing_token().await` (its own
/// call's lock, even while calls beside it in the task hold others) and hands it to the resource
/// it writes, which refuses tokens older than the newest it has seen. The first ask mints the
/// token in Redis (one round trip; later asks for the same hold don't go to Redis): it comes back
/// as `Some(Err(LockError::Lost { .. }))` if Redis no longer has the hold, and as
/// `Some(Err(LockError::Backend(..)))` if Redis can't be asked; either way the body must not
/// write, and `?` hands the error to the caller. It is `None` only outside any lock. With
/// several names, it is the token of the last name taken (names are taken in sorted order);
/// `dlock_core::scope::held_lock()` gives that lock's name as well.
///
/// # Equivalent code without the macro
///
/// `#[distributed_lock(key = "order:<user_id>:<voucher_id>", wait = "3s")]` on
/// `create_order` does what this hand-written version does (without `wait`, there is no
/// `.wait(...)` call, and the `Locker`'s default wait applies; an expression is evaluated in the
/// function, before the `scope`, and passed the same way):
///
/// ```no_run
/// # use std::time::Duration;
/// # use dlock_core::{LockError, LockName};
/// async fn create_order(user_id: u64, voucher_id: u64) -> Result<u64, LockError> {
///     let name = LockName::builder()
///         .literal("order:")
///         .value(user_id)
///         .literal(":")
///         .value(voucher_id)
///         .build()?;
///     let locker = dlock_core::default_locker()?.clone();
///     // A scope of this call's own, nested in the caller's (see `reentrant = false` above).
///     dlock_core::LockScope::nested().run(async move {
///         let guard = locker.lock(name).wait(Duration::from_secs(3)).await?;
///         // Cancelled at its next `.await` if the lock is lost: `Err(LockError::Lost { .. })`.
///         let out = guard
///             .run(async move {
///                 // The original body.
///                 Ok(user_id + voucher_id)
///             })
///             .await?;
///         // On a panic or a dropped future, the guard's `Drop` releases in the background.
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
