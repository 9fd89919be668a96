use dlock_core::{LockError, distributed_lock};

#[distributed_lock(key = "job:<id>", lease = "10s", at_least = "1m")]
async fn f(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
