//! `LockLayer::fair`: requests for one key get the lock in the order they came, across
//! `Locker`s; a `Vec` naming one lock is that lock; a key naming several locks can't be fair; a
//! waiter whose client went away leaves the line — against a real `redis-server`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::Path;
use axum::http::{Request, StatusCode};
use axum::routing::{get, post};
use dlock_core::Locker;
use dlock_tests::{RedisServer, unique_name};
use dlock_tower::LockLayer;
use http_body_util::BodyExt as _;
use tower::ServiceExt as _;

mod common;

use common::oneshot;

fn router(locker: &Locker, prefix: &str, served: Arc<Mutex<Vec<u32>>>) -> Router {
    let prefix = prefix.to_owned();
    Router::new()
        .route(
            "/accounts/{id}/entries/{n}",
            post(move |Path((_, n)): Path<(u64, u32)>| {
                let served = served.clone();
                async move {
                    served.lock().unwrap().push(n);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    "posted"
                }
            }),
        )
        .route_layer(
            LockLayer::new(locker.clone())
                .key(move |Path((id, _)): Path<(u64, u32)>| {
                    let prefix = prefix.clone();
                    async move { format!("{prefix}:{id}") }
                })
                .wait(Duration::from_secs(10))
                .fair(true),
        )
}

async fn post_entry(app: Router, n: u32) -> (StatusCode, String) {
    let uri = format!("/accounts/7/entries/{n}");
    let response = (app.oneshot(Request::post(uri).body(Body::empty()).unwrap()))
        .await
        .unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test]
async fn requests_for_one_key_are_served_in_the_order_they_came() {
    let server = RedisServer::start();
    let a = Locker::connect(&server.url()).await.expect("connect");
    let b = Locker::connect(&server.url()).await.expect("connect");
    let prefix = unique_name("account");
    let served = Arc::new(Mutex::new(Vec::new()));
    let apps = [
        router(&a, &prefix, served.clone()),
        router(&b, &prefix, served.clone()),
    ];
    let name = format!("{prefix}:7");
    let holder = a.fair_lock(name.as_str()).await.expect("holder");
    let mut calls = Vec::new();
    for n in 0..6u32 {
        calls.push(tokio::spawn(post_entry(apps[n as usize % 2].clone(), n)));
        let deadline = Instant::now() + Duration::from_secs(5);
        while a
            .inspect(name.as_str())
            .await
            .expect("inspect")
            .queued_waiters
            != u64::from(n) + 1
        {
            assert!(Instant::now() < deadline, "request {n} never stood in line");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    assert!(holder.release().await.is_released());
    for call in calls {
        assert_eq!(
            call.await.expect("task"),
            (StatusCode::OK, "posted".to_owned())
        );
    }
    assert_eq!(*served.lock().unwrap(), vec![0, 1, 2, 3, 4, 5]);
}

#[tokio::test]
async fn a_fair_layer_whose_key_names_several_locks_answers_without_running_the_handler() {
    let server = RedisServer::start();
    let locker = Locker::connect(&server.url()).await.expect("connect");
    let ran = Arc::new(Mutex::new(false));
    let app = Router::new()
        .route(
            "/transfer/{from}/{to}",
            post({
                let ran = ran.clone();
                move || async move {
                    *ran.lock().unwrap() = true;
                    "moved"
                }
            }),
        )
        .route_layer(
            LockLayer::new(locker)
                .key(|Path((from, to)): Path<(u64, u64)>| async move {
                    vec![format!("account:{from}"), format!("account:{to}")]
                })
                .fair(true),
        );
    let response = (app.oneshot(Request::post("/transfer/1/2").body(Body::empty()).unwrap()))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let body = String::from_utf8_lossy(&body);
    assert!(
        !body.contains("several"),
        "internal detail in the answer: {body}"
    );
    assert!(!*ran.lock().unwrap(), "the handler ran");
}

#[tokio::test]
async fn a_fair_layer_takes_a_vec_naming_one_lock() {
    let server = RedisServer::start();
    let locker = Locker::connect(&server.url()).await.expect("connect");
    let name = unique_name("fair-one");
    let app = Router::new()
        .route("/f", get(|| async { "ran" }))
        .route_layer(LockLayer::new(locker.clone()).fair(true).key({
            let name = name.clone();
            move || std::future::ready(vec![name.clone()])
        }));
    let (status, body) = oneshot(&app, "/f").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // Taken fairly, as a single name is: busy while someone holds it. (The layer's release
    // goes in the background: the holder waits for it.)
    let holder = (locker.fair_lock(name.as_str()).wait(Duration::from_secs(2)))
        .await
        .expect("holder");
    assert_eq!(oneshot(&app, "/f").await.0, StatusCode::CONFLICT);
    assert!(holder.release().await.is_released());
}

// Fair mode: a waiter whose client went away (its response future dropped while in line) leaves
// the line at once, and does not hold up the next waiter until the dead-waiter timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_waiter_whose_client_went_away_leaves_the_line() {
    let server = RedisServer::start();
    let locker = Locker::connect(&server.url()).await.expect("connect");
    let name = unique_name("fair-ghost");
    let app = Router::new()
        .route("/f", get(|| async { "ran" }))
        .route_layer(
            LockLayer::new(locker.clone())
                .fair(true)
                .wait(Duration::from_secs(10))
                .key({
                    let name = name.clone();
                    move || std::future::ready(name.clone())
                }),
        );
    let holder = locker.fair_lock(name.as_str()).await.unwrap();
    let ghost = tokio::spawn({
        let app = app.clone();
        async move { oneshot(&app, "/f").await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    ghost.abort();
    let _ = ghost.await;
    let next = tokio::spawn({
        let app = app.clone();
        async move { oneshot(&app, "/f").await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released_at = Instant::now();
    assert!(holder.release().await.is_released());
    let (status, body) = next.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(
        released_at.elapsed() < Duration::from_secs(2),
        "the next waiter got the lock {:?} after the release",
        released_at.elapsed()
    );
}
