//! The `dlock.request` span (keys, time waited, outcome) and hidden names (the layer's, the
//! `Locker`'s), recorded by the harness's capturing subscriber, against a real `redis-server`.

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Path;
use axum::http::{Request, StatusCode};
use axum::routing::get;
use dlock_core::Locker;
use dlock_tests::capture::{Capture, Fields};
use dlock_tests::{RedisServer, unique_name};
use dlock_tower::LockLayer;
use tower::ServiceExt as _;

async fn status(app: &Router, uri: &str) -> StatusCode {
    app.clone()
        .oneshot(Request::get(uri).body(Body::empty()).unwrap())
        .await
        .unwrap()
        .status()
}

// A current-thread runtime: the subscriber set for this thread sees every poll.
#[tokio::test]
async fn each_request_has_a_span_with_keys_wait_and_outcome() {
    let spans = Capture::default();
    let _default = tracing::subscriber::set_default(spans.clone());
    let server = RedisServer::start();
    let locker = Locker::builder()
        .url(server.url())
        .command_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap();
    let prefix = unique_name("spans");
    let app = Router::new()
        .route("/a/{id}", get(|| async { "ran" }))
        .route_layer(LockLayer::new(locker.clone()).sync_key({
            let prefix = prefix.clone();
            move |Path(id): Path<String>| (id != "none").then(|| format!("{prefix}:{id}"))
        }));

    assert_eq!(status(&app, "/a/1").await, StatusCode::OK);
    // INFO by default: an `info` filter and an OpenTelemetry exporter see it.
    assert!(
        (spans.spans("dlock.request").iter()).all(|s| s.level == tracing::Level::INFO),
        "{:?}",
        spans.spans("dlock.request")
    );
    let [acquired] = <[Fields; 1]>::try_from(spans.take_spans("dlock.request")).unwrap();
    assert_eq!(acquired["outcome"], "acquired");
    assert_eq!(acquired["keys"], format!("{prefix}:1"));
    assert!(acquired["wait_ms"].parse::<u64>().is_ok(), "{acquired:?}");

    // The layer's release runs in the background once the response is out.
    let held = locker
        .lock(format!("{prefix}:1"))
        .wait(Duration::from_secs(2))
        .await
        .unwrap();
    assert_eq!(status(&app, "/a/1").await, StatusCode::CONFLICT);
    let [busy] = <[Fields; 1]>::try_from(spans.take_spans("dlock.request")).unwrap();
    assert_eq!(busy["outcome"], "busy");
    assert_eq!(busy["keys"], format!("{prefix}:1"));
    assert!(busy.contains_key("wait_ms"), "{busy:?}");
    assert!(held.release().await.is_released());

    assert_eq!(status(&app, "/a/none").await, StatusCode::OK);
    let [unlocked] = <[Fields; 1]>::try_from(spans.take_spans("dlock.request")).unwrap();
    assert_eq!(unlocked["outcome"], "unlocked");
    assert!(!unlocked.contains_key("keys"));

    assert_eq!(status(&app, "/a/x%0Ay").await, StatusCode::BAD_REQUEST);
    let [invalid] = <[Fields; 1]>::try_from(spans.take_spans("dlock.request")).unwrap();
    assert_eq!(invalid["outcome"], "invalid_key");
}

// The layer's `hide_names` reaches the core: no span or event of either names the lock, on the
// acquired, busy and lost paths.
#[tokio::test]
async fn hidden_names_stay_out_of_every_span_and_event() {
    let everything = Capture::default();
    let _default = tracing::subscriber::set_default(everything.clone());
    let server = RedisServer::start();
    let mut admin = server.connection().await;
    let locker = Locker::builder()
        .url(server.url())
        .default_lease(dlock_core::Lease::watchdog(Duration::from_millis(300)))
        .build()
        .await
        .unwrap();
    let prefix = unique_name("secret-customer");
    let app = Router::new()
        .route(
            "/a/{id}",
            get(|Path(id): Path<String>| async move {
                if id == "slow" {
                    tokio::time::sleep(Duration::from_secs(3)).await;
                }
                "ran"
            }),
        )
        .route_layer(LockLayer::new(locker.clone()).hide_names(true).sync_key({
            let prefix = prefix.clone();
            move |Path(id): Path<String>| format!("{prefix}:{id}")
        }));

    assert_eq!(status(&app, "/a/1").await, StatusCode::OK);
    let held = locker
        .lock(format!("{prefix}:1"))
        .hide_name(true)
        .wait(Duration::from_secs(2))
        .await
        .unwrap();
    assert_eq!(status(&app, "/a/1").await, StatusCode::CONFLICT);
    assert!(held.release().await.is_released());

    // Lost mid-request: the key is deleted while the handler sleeps.
    let key = locker.key_of(format!("{prefix}:slow")).unwrap();
    let deleter = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let _: i64 = dlock_core::redis::cmd("DEL")
            .arg(&key)
            .query_async(&mut admin)
            .await
            .unwrap();
    });
    assert_eq!(
        status(&app, "/a/slow").await,
        StatusCode::SERVICE_UNAVAILABLE
    );
    deleter.await.unwrap();

    let seen = everything.text();
    assert!(!seen.contains("secret"), "a name leaked: {seen}");
    assert!(seen.contains("<hidden>"), "{seen}");
    assert!(
        everything
            .events()
            .iter()
            .any(|e| e.level == tracing::Level::WARN && e.message().contains("lost")),
        "{seen}"
    );
}

// `LockerBuilder::hide_names(true)` keeps every name of the `Locker` out of spans and events,
// behind a layer that does not hide names itself (its default).
#[tokio::test]
async fn a_lockers_hidden_names_stay_hidden_behind_a_layer() {
    let everything = Capture::default();
    let _default = tracing::subscriber::set_default(everything.clone());
    let server = RedisServer::start();
    let locker = Locker::builder()
        .url(server.url())
        .hide_names(true)
        .build()
        .await
        .unwrap();
    let prefix = unique_name("secret-customer");
    let app = Router::new()
        .route("/a/{id}", get(|| async { "ran" }))
        .route_layer(LockLayer::new(locker.clone()).sync_key({
            let prefix = prefix.clone();
            move |Path(id): Path<String>| format!("{prefix}:{id}")
        }))
        .route(
            "/many/{id}",
            get(|| async { "ran" }).route_layer(LockLayer::new(locker.clone()).sync_key({
                let prefix = prefix.clone();
                move |Path(id): Path<String>| vec![format!("{prefix}:{id}"), format!("{prefix}:x")]
            })),
        );
    // The locker alone keeps it hidden.
    let g = locker.lock(format!("{prefix}:0")).await.unwrap();
    assert!(g.release().await.is_released());
    assert!(
        !everything.text().contains("secret"),
        "core leaked by itself"
    );

    assert_eq!(status(&app, "/a/1").await, StatusCode::OK);
    // The layer lets go of a request's locks in the background once its response is out: the
    // next request for the same name waits for that here, not as a 409.
    let free = (locker.lock(format!("{prefix}:1")))
        .wait(Duration::from_secs(2))
        .await
        .unwrap();
    assert!(free.release().await.is_released());
    assert_eq!(status(&app, "/many/1").await, StatusCode::OK);
    let held = locker
        .lock(format!("{prefix}:2"))
        .wait(Duration::from_secs(2))
        .await
        .unwrap();
    assert_eq!(status(&app, "/a/2").await, StatusCode::CONFLICT);
    assert_eq!(status(&app, "/many/2").await, StatusCode::CONFLICT);
    assert!(held.release().await.is_released());
    let seen = everything.text();
    let leaks: Vec<_> = seen
        .match_indices("secret-customer")
        .map(|(i, _)| i)
        .collect();
    assert!(
        leaks.is_empty(),
        "a name of a hide_names(true) Locker leaked {} times, e.g. {}",
        leaks.len(),
        leaks.first().map_or("", |&i| &seen
            [i.saturating_sub(200)..(i + 80).min(seen.len())])
    );
    assert!(seen.contains("<hidden>"), "{seen}");
    let spans = everything.take_spans("dlock.request");
    assert_eq!(spans.len(), 4);
    assert!(spans.iter().all(|s| s["keys"] == "<hidden>"), "{spans:?}");
}

// An empty key set takes no lock, and its span says so.
#[tokio::test]
async fn an_empty_key_set_is_unlocked_in_the_span() {
    let spans = Capture::default();
    let _default = tracing::subscriber::set_default(spans.clone());
    let server = RedisServer::start();
    let locker = Locker::connect(&server.url()).await.unwrap();
    let app = Router::new()
        .route("/e", get(|| async { "ran" }))
        .route_layer(LockLayer::new(locker).key(|| std::future::ready(Vec::<String>::new())));
    assert_eq!(status(&app, "/e").await, StatusCode::OK);
    let [unlocked] = <[Fields; 1]>::try_from(spans.take_spans("dlock.request")).unwrap();
    assert_eq!(unlocked["outcome"], "unlocked");
    assert!(!unlocked.contains_key("keys"));
    assert!(!unlocked.contains_key("waited_us"));
}
