//! The `dlock.request` span: keys, time waited, outcome — recorded by a small in-test
//! subscriber, against a real `redis-server`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Path;
use axum::http::{Request, StatusCode};
use axum::routing::get;
use dlock_core::Locker;
use dlock_tests::{RedisServer, unique_name};
use dlock_tower::LockLayer;
use tower::ServiceExt as _;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

type Fields = BTreeMap<String, String>;

/// Keeps the fields of every `dlock.request` span.
#[derive(Clone, Default)]
struct Spans {
    next: Arc<AtomicU64>,
    spans: Arc<Mutex<BTreeMap<u64, Fields>>>,
}

struct Collect<'a>(&'a mut Fields);

impl Visit for Collect<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl Subscriber for Spans {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, span: &Attributes<'_>) -> Id {
        let id = self.next.fetch_add(1, Ordering::SeqCst) + 1;
        if span.metadata().name() == "dlock.request" {
            let mut fields = Fields::new();
            span.record(&mut Collect(&mut fields));
            self.spans.lock().unwrap().insert(id, fields);
        }
        Id::from_u64(id)
    }

    fn record(&self, span: &Id, values: &Record<'_>) {
        if let Some(fields) = self.spans.lock().unwrap().get_mut(&span.into_u64()) {
            values.record(&mut Collect(fields));
        }
    }

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, _: &Event<'_>) {}

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

impl Spans {
    fn taken(&self) -> Vec<Fields> {
        std::mem::take(&mut *self.spans.lock().unwrap())
            .into_values()
            .collect()
    }
}

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
    let spans = Spans::default();
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
    let [acquired] = <[Fields; 1]>::try_from(spans.taken()).unwrap();
    assert_eq!(acquired["outcome"], "acquired");
    assert_eq!(acquired["keys"], format!("{prefix}:1"));
    assert!(acquired["waited_us"].parse::<u64>().is_ok(), "{acquired:?}");

    // The layer's release runs in the background once the response is out.
    let held = locker
        .lock(format!("{prefix}:1"))
        .wait(Duration::from_secs(2))
        .await
        .unwrap();
    assert_eq!(status(&app, "/a/1").await, StatusCode::CONFLICT);
    let [busy] = <[Fields; 1]>::try_from(spans.taken()).unwrap();
    assert_eq!(busy["outcome"], "busy");
    assert_eq!(busy["keys"], format!("{prefix}:1"));
    assert!(busy.contains_key("waited_us"), "{busy:?}");
    assert!(held.release().await.is_released());

    assert_eq!(status(&app, "/a/none").await, StatusCode::OK);
    let [unlocked] = <[Fields; 1]>::try_from(spans.taken()).unwrap();
    assert_eq!(unlocked["outcome"], "unlocked");
    assert!(!unlocked.contains_key("keys"));

    assert_eq!(status(&app, "/a/x%0Ay").await, StatusCode::BAD_REQUEST);
    let [invalid] = <[Fields; 1]>::try_from(spans.taken()).unwrap();
    assert_eq!(invalid["outcome"], "invalid_key");
}

/// Every span's and event's fields, as text.
#[derive(Clone, Default)]
struct Everything {
    next: Arc<AtomicU64>,
    seen: Arc<Mutex<Vec<String>>>,
}

impl Subscriber for Everything {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, span: &Attributes<'_>) -> Id {
        let mut fields = Fields::new();
        span.record(&mut Collect(&mut fields));
        self.seen
            .lock()
            .unwrap()
            .push(format!("span {} {fields:?}", span.metadata().name()));
        Id::from_u64(self.next.fetch_add(1, Ordering::SeqCst) + 1)
    }

    fn record(&self, _: &Id, values: &Record<'_>) {
        let mut fields = Fields::new();
        values.record(&mut Collect(&mut fields));
        self.seen.lock().unwrap().push(format!("record {fields:?}"));
    }

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut fields = Fields::new();
        event.record(&mut Collect(&mut fields));
        self.seen
            .lock()
            .unwrap()
            .push(format!("event {} {fields:?}", event.metadata().level()));
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

// The layer's `hide_names` reaches the core: no span or event of either names the lock, on the
// acquired, busy and lost paths.
#[tokio::test]
async fn hidden_names_stay_out_of_every_span_and_event() {
    let everything = Everything::default();
    let _default = tracing::subscriber::set_default(everything.clone());
    let server = RedisServer::start();
    let mut admin = server.connection().await;
    let locker = Locker::builder()
        .url(server.url())
        .watchdog_lease(Duration::from_millis(300))
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

    let seen = everything.seen.lock().unwrap().clone();
    let leaked: Vec<&String> = seen.iter().filter(|s| s.contains("secret")).collect();
    assert!(leaked.is_empty(), "names leaked: {leaked:#?}");
    assert!(seen.iter().any(|s| s.contains("<hidden>")), "{seen:#?}");
    assert!(
        seen.iter()
            .any(|s| s.starts_with("event WARN") && s.contains("lost")),
        "{seen:#?}"
    );
}
