use dlock_core::{LockError, distributed_lock};

#[distributed_lock(key = "sku:<skus*>", fair = true)]
async fn f(skus: Vec<u64>) -> Result<usize, LockError> {
    Ok(skus.len())
}

fn main() {}
