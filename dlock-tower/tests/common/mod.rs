//! What the layer's test files share: a `Locker` that gives up on Redis fast, a one-shot GET
//! through a router, a key function for one fixed name.

#![allow(dead_code)]

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use dlock_core::Locker;
use dlock_tests::RedisServer;
use http_body_util::BodyExt as _;
use tower::ServiceExt as _;

/// A `Locker` on `server` whose commands and connections time out after 500 ms.
pub(crate) async fn locker(server: &RedisServer) -> Locker {
    Locker::builder()
        .url(server.url())
        .command_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_millis(500))
        .build()
        .await
        .expect("connect")
}

/// `GET uri` through `app`: the status and the body as text.
pub(crate) async fn oneshot(app: &Router, uri: &str) -> (StatusCode, String) {
    let response = app
        .clone()
        .oneshot(Request::get(uri).body(Body::empty()).expect("request"))
        .await
        .expect("infallible");
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// A key function (no extractors) that always locks `name`.
pub(crate) fn fixed_key(
    name: &str,
) -> impl Fn() -> std::future::Ready<String> + Clone + Send + Sync + 'static {
    let name = name.to_owned();
    move || std::future::ready(name.clone())
}
