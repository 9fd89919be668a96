//! `LockLayer` on a `Locker` built on PostgreSQL: the same layer, the same answers, against a
//! real server the harness starts.

use std::time::Duration;

use axum::Router;
use axum::extract::Path;
use axum::http::StatusCode;
use axum::routing::get;
use dlock_core::Locker;
use dlock_tests::{PostgresServer, unique_name};
use dlock_tower::LockLayer;

mod common;

use common::oneshot;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_is_locked_per_key_on_postgres_and_busy_answers_409() {
    let pg = PostgresServer::start();
    let locker = (Locker::builder().postgres_url(pg.url()).build())
        .await
        .expect("a postgres Locker");
    let prefix = unique_name("pg-layer");
    let app = Router::new()
        .route(
            "/orders/{id}",
            get(|Path(id): Path<u64>| async move {
                tokio::time::sleep(Duration::from_millis(400)).await;
                format!("order {id}")
            }),
        )
        .route_layer(
            LockLayer::new(locker.clone()).key(move |Path(id): Path<u64>| {
                let prefix = prefix.clone();
                async move { format!("{prefix}:{id}") }
            }),
        );
    let first = tokio::spawn({
        let app = app.clone();
        async move { oneshot(&app, "/orders/1").await }
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    // The same key while the first holds it: busy, at once.
    let (status, body) = oneshot(&app, "/orders/1").await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    // Another key: its own lock.
    let (status, body) = oneshot(&app, "/orders/2").await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "order 2"));
    let (status, body) = first.await.expect("the first request");
    assert_eq!((status, body.as_str()), (StatusCode::OK, "order 1"));
    // Given back with the response: free again.
    let (status, _) = oneshot(&app, "/orders/1").await;
    assert_eq!(status, StatusCode::OK);
}
