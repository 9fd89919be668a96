use dlock_core::{LockError, distributed_lock};

#[distributed_lock(key = "a:<id>", locker = url)]
async fn f(url: &str, id: u64) -> Result<u64, LockError> {
    let _ = url;
    Ok(id)
}

fn main() {}
