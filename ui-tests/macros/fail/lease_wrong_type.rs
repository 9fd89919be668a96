use std::time::Duration;

use dlock_core::{LockError, distributed_lock};

#[distributed_lock(key = "a:<id>", lease = Duration::from_secs(secs).as_millis())]
async fn f(id: u64, secs: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
