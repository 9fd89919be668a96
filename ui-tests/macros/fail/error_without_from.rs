use dlock_core::distributed_lock;

#[derive(Debug)]
struct MyError;

#[distributed_lock(key = "a:<id>")]
async fn f(id: u64) -> Result<u64, MyError> {
    Ok(id)
}

fn main() {}
