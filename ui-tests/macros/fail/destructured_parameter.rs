use dlock_core::{LockError, distributed_lock};

struct Ids(u64, u64);

#[distributed_lock(key = "pair:<ids>")]
async fn f(Ids(a, b): Ids) -> Result<u64, LockError> {
    Ok(a + b)
}

fn main() {}
