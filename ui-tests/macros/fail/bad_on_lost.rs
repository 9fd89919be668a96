use dlock_core::{LockError, distributed_lock};

#[distributed_lock(key = "a:<id>", on_lost = "ignore")]
async fn f(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
