use dlock_core::{LockError, distributed_lock};

#[distributed_lock(key = "order:<user>")]
async fn f(user_id: u64) -> Result<u64, LockError> {
    Ok(user_id)
}

fn main() {}
