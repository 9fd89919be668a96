use dlock_core::distributed_lock;

#[distributed_lock(key = "a:<id>")]
async fn f(id: u64) -> u64 {
    id
}

fn main() {}
