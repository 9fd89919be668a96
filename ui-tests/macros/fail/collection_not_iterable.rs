use dlock_core::{LockError, distributed_lock};

#[distributed_lock(key = "sku:<sku*>")]
async fn f(sku: u64) -> Result<u64, LockError> {
    Ok(sku)
}

fn main() {}
