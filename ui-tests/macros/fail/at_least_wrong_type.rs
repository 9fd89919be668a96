use dlock_core::{LockError, distributed_lock};

#[distributed_lock(key = "job:<id>", at_least = 30)]
async fn f(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
