use dlock_core::{LockError, distributed_lock};

#[distributed_lock(key = "ledger:<id>", fair = "yes")]
async fn f(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
