use dlock_core::{LockError, distributed_lock};

#[distributed_lock(key = "order:<user id>")]
async fn f(user: u64, id: u64) -> Result<u64, LockError> {
    Ok(user + id)
}

fn main() {}
