use std::time::Duration;

use dlock_core::{LockError, distributed_lock};

const ORDER_WAIT: Duration = Duration::from_secs(3);

#[distributed_lock(key = "a:<id>", wait = "1s", lease = "10s", wait = ORDER_WAIT)]
async fn f(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
