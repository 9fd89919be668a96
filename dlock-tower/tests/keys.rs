//! Where a request's lock key comes from: keys built from the handler's own parse, and
//! `KeyFrom`'s ready-made keys, one lock per distinct raw value — against a real `redis-server`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::Path;
use axum::http::{Request, StatusCode};
use axum::routing::get;
use dlock_core::{LockName, Locker};
use dlock_tests::{RedisServer, unique_name};
use dlock_tower::{KeyFrom, LockKeys, LockLayer};

mod common;

use common::oneshot;

// `KeyFrom::path_segment` keys the text as sent; a `Path<u64>` handler reads `42`, `042` and
// `+42` as one account. A key built from the same `Path<u64>` parse takes one lock for all three.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_key_from_the_handlers_own_parse_takes_one_lock_for_every_spelling() {
    let server = RedisServer::start();
    let locker = Locker::builder()
        .url(server.url())
        .command_timeout(Duration::from_millis(500))
        .build()
        .await
        .expect("connect");
    let running = Arc::new(AtomicUsize::new(0));
    let max = Arc::new(AtomicUsize::new(0));
    let prefix = format!("{}:", unique_name("account"));
    let app = Router::new()
        .route(
            "/accounts/{id}/transfers",
            get({
                let (running, max) = (running.clone(), max.clone());
                move |Path(id): Path<u64>| async move {
                    let n = running.fetch_add(1, Ordering::SeqCst) + 1;
                    max.fetch_max(n, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(400)).await;
                    running.fetch_sub(1, Ordering::SeqCst);
                    format!("account {id}")
                }
            }),
        )
        .route_layer(
            LockLayer::new(locker.clone())
                .sync_key(move |Path(id): Path<u64>| format!("{prefix}{id}"))
                .wait(Duration::from_secs(5)),
        );
    let (a, b, c) = tokio::join!(
        oneshot(&app, "/accounts/42/transfers"),
        oneshot(&app, "/accounts/042/transfers"),
        oneshot(&app, "/accounts/+42/transfers"),
    );
    let ok = [&a, &b, &c]
        .iter()
        .filter(|r| r.0 == StatusCode::OK)
        .count();
    assert!(
        max.load(Ordering::SeqCst) <= 1,
        "{} handlers for account 42 ran at once ({ok} OK): {a:?} {b:?} {c:?}",
        max.load(Ordering::SeqCst)
    );
    // They waited for each other, one at a time.
    assert_eq!(ok, 3, "{a:?} {b:?} {c:?}");
    for (_, body) in [&a, &b, &c] {
        assert_eq!(body, "account 42");
    }
}

// The text as sent: the ready-made key tells the spellings apart (which is why the handler's
// own parse must build the key when it reads them as one).
#[test]
fn key_from_path_segment_keys_the_text_as_sent() {
    let key = KeyFrom::path_segment(1, "account:");
    let name = |uri: &str| {
        let (parts, ()) = Request::get(uri).body(()).unwrap().into_parts();
        match key(&parts) {
            LockKeys::One(Ok(n)) => n.to_string(),
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(name("/accounts/42/transfers"), "account:42");
    assert_eq!(name("/accounts/042/transfers"), "account:042");
    assert_eq!(name("/accounts/+42/transfers"), "account:%2B42");
}

// Header values that are not UTF-8 keep their bytes in the key: two different values never
// share a lock.
#[test]
fn key_from_header_gives_distinct_non_utf8_values_distinct_locks() {
    let parts = |v: &[u8]| {
        let (parts, ()) = http::Request::get("/")
            .header("idempotency-key", http::HeaderValue::from_bytes(v).unwrap())
            .body(())
            .unwrap()
            .into_parts();
        parts
    };
    let key = KeyFrom::header("idempotency-key", "payment:");
    let name = |v: &[u8]| match key(&parts(v)) {
        LockKeys::One(Ok(n)) => n,
        other => panic!("{other:?}"),
    };
    let a: LockName = name(b"pay-\xff");
    let b: LockName = name(b"pay-\xfe");
    assert_ne!(a, b, "distinct header values share the lock {a:?}");
    assert_eq!(a.as_str(), "payment:pay-%FF");
    // Nor with the text that spells the escape, nor with the replacement character.
    assert_ne!(a, name(b"pay-%FF"));
    assert_ne!(a, name("pay-\u{fffd}".as_bytes()));
    // UTF-8 values keep the keys they always had.
    assert_eq!(name(b"7:a").as_str(), "payment:7%3Aa");
}
