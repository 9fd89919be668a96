use dlock_core::{LockError, distributed_lock};

struct UserId(u64);

#[distributed_lock(key = "user:<user>")]
async fn f(user: UserId) -> Result<u64, LockError> {
    Ok(user.0)
}

fn main() {}
