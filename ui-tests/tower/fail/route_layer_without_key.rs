use axum::Router;
use axum::routing::post;
use dlock_tower::LockLayer;

fn main() {
    let locker = dlock_core::Locker::memory();
    // Forgot `.key(..)`: this layer would lock nothing.
    let _app: Router = Router::new()
        .route("/orders", post(|| async { "ordered" }))
        .route_layer(LockLayer::new(locker));
}
