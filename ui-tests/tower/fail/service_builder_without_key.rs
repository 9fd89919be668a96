use std::convert::Infallible;

use dlock_tower::LockLayer;
use tower::ServiceBuilder;

fn main() {
    let locker = dlock_core::Locker::memory();
    let _service = ServiceBuilder::new()
        .layer(LockLayer::with_state(locker, ()).wait(std::time::Duration::from_secs(1)))
        .service_fn(|_req: http::Request<String>| async {
            Ok::<_, Infallible>(http::Response::new(String::new()))
        });
}
