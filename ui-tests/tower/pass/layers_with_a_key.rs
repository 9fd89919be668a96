//! A layer with a key function layers axum routers and tower services, before or after its
//! options.
use std::convert::Infallible;

use axum::Router;
use axum::extract::{FromRef, Path};
use axum::routing::post;
use dlock_core::Locker;
use dlock_tower::{KeyFrom, LockLayer, WithKey};
use tower::ServiceBuilder;

#[derive(Clone)]
struct AppState {
    locker: Locker,
}

impl FromRef<AppState> for Locker {
    fn from_ref(state: &AppState) -> Locker {
        state.locker.clone()
    }
}

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

    let state = AppState {
        locker: locker.clone(),
    };
    let _app: Router = Router::new()
        .route("/orders/{id}", post(|| async { "ordered" }))
        .route_layer(
            LockLayer::from_state(state.clone())
                .key(|Path(id): Path<u64>| async move { format!("order:{id}") }),
        )
        .with_state(state);

    let _service = ServiceBuilder::new()
        .layer(LockLayer::new(locker).key_from_parts(KeyFrom::header("x-account", "account:")))
        .service_fn(|_req: http::Request<String>| async {
            Ok::<_, Infallible>(http::Response::new(String::new()))
        });
}
