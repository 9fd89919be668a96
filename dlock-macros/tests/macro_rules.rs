//! Functions that a `macro_rules!` writes with the attribute on them — the error type, the whole
//! return type or the key template passed in by the caller — and a `Result` alias named
//! otherwise: they compile, and each takes its lock (on the memory store, the process's default
//! `Locker`).

use dlock_core::{LockError, Locker, distributed_lock};

/// The application's error, from a lock error.
#[derive(Debug)]
struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

// Only the error type comes from the caller.
macro_rules! with_error {
    ($name:ident, $err:ty) => {
        #[distributed_lock(key = "job:<id>")]
        async fn $name(id: u64) -> Result<u64, $err> {
            Ok(id)
        }
    };
}

// The whole return type comes from the caller.
macro_rules! with_return {
    ($name:ident -> $ret:ty) => {
        #[distributed_lock(key = "job:<id>")]
        async fn $name(id: u64) -> $ret {
            Ok(id + 1)
        }
    };
}

// The key template, and the parameter it names, come from the caller.
macro_rules! with_key {
    ($name:ident, $key:literal, $param:ident) => {
        #[distributed_lock(key = $key)]
        async fn $name($param: u64) -> Result<u64, AppError> {
            Ok($param + 2)
        }
    };
}

with_error!(error_passed_in, AppError);
with_return!(return_passed_in -> Result<u64, AppError>);
with_key!(key_passed_in, "job:<id>", id);

type ApiResult<T> = Result<T, LockError>;

/// A `Result` alias whose name ends in `Result`.
#[distributed_lock(key = "job:<id>")]
async fn returns_an_alias(id: u64) -> ApiResult<u64> {
    // Inside the lock: there is a token, and it is minted.
    dlock_core::scope::fencing_token().await?;
    Ok(id + 3)
}

#[tokio::test]
async fn functions_written_by_macro_rules_and_result_aliases_take_their_locks() {
    dlock_core::set_default_locker(Locker::memory()).expect("the only default locker");
    assert_eq!(error_passed_in(1).await.expect("error passed in"), 1);
    assert_eq!(return_passed_in(1).await.expect("return passed in"), 2);
    assert_eq!(key_passed_in(1).await.expect("key passed in"), 3);
    assert_eq!(returns_an_alias(1).await.expect("alias"), 4);
}
