//! The layer's metrics, against a real `redis-server`: each request counted once under its
//! outcome, a loss counted apart, and every metric described and documented.

use std::time::Duration;

use axum::Router;
use axum::extract::Path;
use axum::http::StatusCode;
use axum::routing::get;
use dlock_core::Locker;
use dlock_core::redis::AsyncCommands as _;
use dlock_tests::{RedisServer, unique_name};
use dlock_tower::{LockLayer, metrics as lm};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

mod common;

async fn status(app: &Router, uri: &str) -> StatusCode {
    common::oneshot(app, uri).await.0
}

// A current-thread runtime: the thread's recorder sees everything the layer records.
#[tokio::test]
async fn each_request_is_counted_under_its_outcome() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    lm::describe();
    let mut server = RedisServer::start();
    let locker = Locker::builder()
        .url(server.url())
        .default_lease(dlock_core::Lease::watchdog(Duration::from_millis(300)))
        .command_timeout(Duration::from_millis(300))
        .build()
        .await
        .unwrap();
    let prefix = unique_name("layer-metrics");
    let app = Router::new()
        .route(
            "/a/{id}",
            get(|Path(id): Path<String>| async move {
                if id == "slow" {
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
                "ran"
            }),
        )
        .route_layer(LockLayer::new(locker.clone()).sync_key({
            let prefix = prefix.clone();
            move |Path(id): Path<String>| match id.as_str() {
                "none" => None,
                "bad" => Some(format!("{prefix}:{{bad}}")),
                id => Some(format!("{prefix}:{id}")),
            }
        }));

    assert_eq!(status(&app, "/a/1").await, StatusCode::OK);
    assert_eq!(status(&app, "/a/none").await, StatusCode::OK);
    assert_eq!(status(&app, "/a/bad").await, StatusCode::BAD_REQUEST);
    let holder = locker.lock(format!("{prefix}:2").as_str()).await.unwrap();
    assert_eq!(status(&app, "/a/2").await, StatusCode::CONFLICT);
    drop(holder);
    // Lost while the handler runs: the key goes, the handler is cancelled.
    let mut admin = server.connection().await;
    let slow = tokio::spawn({
        let app = app.clone();
        async move { status(&app, "/a/slow").await }
    });
    let key = locker.key_of(format!("{prefix}:slow").as_str()).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    while !admin.exists::<_, bool>(&key).await.unwrap() {
        assert!(tokio::time::Instant::now() < deadline, "never locked");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let () = admin.del(&key).await.unwrap();
    assert_eq!(slow.await.unwrap(), StatusCode::SERVICE_UNAVAILABLE);
    server.kill();
    assert_eq!(status(&app, "/a/3").await, StatusCode::SERVICE_UNAVAILABLE);

    let seen = snapshotter.snapshot().into_vec();
    let count = |name: &str, outcome: Option<&str>| -> u64 {
        (seen.iter())
            .filter(|(key, ..)| key.key().name() == name)
            .filter(|(key, ..)| {
                outcome.is_none_or(|o| {
                    key.key()
                        .labels()
                        .any(|l| l.key() == "outcome" && l.value() == o)
                })
            })
            .map(|(.., value)| match value {
                DebugValue::Counter(n) => *n,
                _ => panic!("{name} is not a counter"),
            })
            .sum()
    };
    for (outcome, n) in [
        ("acquired", 2),
        ("unlocked", 1),
        ("invalid_key", 1),
        ("busy", 1),
        ("unavailable", 1),
    ] {
        assert_eq!(count(lm::REQUESTS, Some(outcome)), n, "{outcome}");
    }
    assert_eq!(count(lm::REQUESTS, None), 6);
    assert_eq!(count(lm::LOST, None), 1);
    // Every metric: recorded, described, and in the table of `dlock_tower::metrics`.
    let docs = include_str!("../src/metrics.rs");
    for metric in lm::ALL {
        let of: Vec<_> = (seen.iter())
            .filter(|(key, ..)| key.key().name() == metric)
            .collect();
        assert!(!of.is_empty(), "{metric} was never recorded");
        assert!(
            of.iter()
                .all(|(_, _, description, _)| description.is_some())
        );
        assert!(
            docs.lines()
                .any(|l| l.starts_with(&format!("//! | `{metric}` | counter |"))),
            "{metric} is missing from the table"
        );
    }
}
