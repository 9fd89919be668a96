use dlock_core::distributed_lock;

#[distributed_lock(key = "a:<id>")]
async fn f(id: u64) {
    let _ = id;
}

fn main() {}
