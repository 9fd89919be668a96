use dlock_core::{LockError, distributed_lock};

#[distributed_lock(key = "a:<id>", on_lost = cancel)]
async fn f(id: u64, cancel: bool) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
