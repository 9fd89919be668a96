//! `LockLayer::fair`: requests for one key get the lock in the order they came, across
//! `Locker`s; a key naming several locks can't be fair — against a real `redis-server`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::Path;
use axum::http::{Request, StatusCode};
use axum::routing::post;
use dlock_core::Locker;
use dlock_tests::{RedisServer, unique_name};
use dlock_tower::LockLayer;
use http_body_util::BodyExt as _;
use tower::ServiceExt as _;

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
