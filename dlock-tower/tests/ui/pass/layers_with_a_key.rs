use std::convert::Infallible;

use axum::Router;
use axum::extract::Path;
use axum::routing::post;
use dlock_core::Locker;
use dlock_tower::{KeyFrom, LockLayer, WithKey};
use tower::ServiceBuilder;

fn main() {
    let locker = Locker::memory();
    // Options before and after the key; the type names the key state only when asked.
    let layer: LockLayer<(), WithKey> = LockLayer::new(locker.clone())
        .wait(std::time::Duration::from_secs(1))
        .key(|Path(id): Path<u64>| async move { format!("order:{id}") })
        .hide_names(true);
    let _app: Router = Router::new()
        .route("/orders/{id}", post(|| async { "ordered" }))
        .route_layer(layer);

    let _service = ServiceBuilder::new()
        .layer(LockLayer::new(locker).key_from_parts(KeyFrom::header("x-account", "account:")))
        .service_fn(|_req: http::Request<String>| async {
            Ok::<_, Infallible>(http::Response::new(String::new()))
        });
}
