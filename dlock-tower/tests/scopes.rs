//! The lock scope the layer runs the handler in: kept by stacked layers, and the one a held body
//! is produced in — against a real `redis-server`.

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::StatusCode;
use axum::routing::get;
use dlock_tests::{RedisServer, unique_name};
use dlock_tower::{HeldLocks, LockLayer};

mod common;

use common::{fixed_key, locker, oneshot};

// Two stacked layers: the handler sees both locks (the outer layer's first), re-enters the outer
// one, and `fencing_token().await` gives the inner (innermost) lock's.
#[tokio::test]
async fn stacked_layers_keep_the_outer_lock_for_the_handler() {
    let server = RedisServer::start();
    let locker = locker(&server).await;
    let outer = unique_name("tenant");
    let inner = unique_name("order");
    let app = Router::new()
        .route(
            "/x",
            get({
                let (locker, outer) = (locker.clone(), outer.clone());
                move |held: HeldLocks| async move {
                    let names = held.names().to_vec();
                    let tokens = held.fencing_tokens().await.ok();
                    let in_scope = dlock_core::scope::fencing_token().await.ok();
                    let innermost = in_scope.is_some()
                        && in_scope == tokens.and_then(|tokens| tokens.get(1).copied());
                    // Same task, outer layer's name: re-enters, not busy.
                    let reentered = match locker.lock(outer.as_str()).try_lock().await {
                        Ok(Some(guard)) => {
                            let same =
                                match (held.fencing_token().await, guard.fencing_token().await) {
                                    (Ok(held), Ok(reentered)) => held == reentered,
                                    _ => false,
                                };
                            assert!(guard.release().await.is_released());
                            same
                        }
                        _ => false,
                    };
                    format!("{names:?} reentered={reentered} innermost={innermost}")
                }
            }),
        )
        .route_layer(LockLayer::new(locker.clone()).key(fixed_key(&inner)))
        .route_layer(LockLayer::new(locker.clone()).key(fixed_key(&outer)));
    let (status, body) = oneshot(&app, "/x").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(
        body.contains(&outer) && body.contains(&inner) && body.contains("reentered=true"),
        "handler sees only: {body}"
    );
    assert_eq!(
        body,
        format!("[{outer:?}, {inner:?}] reentered=true innermost=true")
    );
    // Both released once the response is out.
    for name in [&outer, &inner] {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
        loop {
            if let Some(guard) = locker.lock(name.as_str()).try_lock().await.unwrap() {
                assert!(guard.release().await.is_released());
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "{name} still held");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

// An inner layer whose key names no lock keeps the outer layer's scope and `HeldLocks` as they
// are.
#[tokio::test]
async fn an_inner_layer_without_a_key_keeps_the_outer_lock_for_the_handler() {
    let server = RedisServer::start();
    let locker = locker(&server).await;
    let outer = unique_name("tenant");
    let app = Router::new()
        .route(
            "/x",
            get({
                let (locker, outer) = (locker.clone(), outer.clone());
                move |held: HeldLocks| async move {
                    let reentered = locker
                        .lock(outer.as_str())
                        .try_lock()
                        .await
                        .map(|g| g.is_some())
                        .unwrap_or(false);
                    format!("{:?} reentered={reentered}", held.names())
                }
            }),
        )
        .route_layer(LockLayer::new(locker.clone()).key(|| async { None::<String> }))
        .route_layer(LockLayer::new(locker.clone()).key(fixed_key(&outer)));
    let (status, body) = oneshot(&app, "/x").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body, format!("[{outer:?}] reentered=true"));
}

// With `hold_until_body_ends`, the body is produced inside the request's lock scope, as the
// handler is: `fencing_token().await` answers there, and the key re-enters.
#[tokio::test]
async fn a_held_body_is_produced_inside_the_lock_scope() {
    let server = RedisServer::start();
    let locker = locker(&server).await;
    let name = unique_name("body-scope");
    let app = Router::new()
        .route(
            "/s",
            get({
                let (locker, name) = (locker.clone(), name.clone());
                move |held: HeldLocks| async move {
                    let token = held.fencing_token().await;
                    let chunk = futures_util::stream::once(async move {
                        let in_scope = dlock_core::scope::fencing_token().await;
                        let reentered = locker
                            .lock(name.as_str())
                            .try_lock()
                            .await
                            .map(|g| g.is_some())
                            .unwrap_or(false);
                        Ok::<_, std::io::Error>(bytes::Bytes::from(format!(
                            "handler={token:?} body={in_scope:?} reentered={reentered}"
                        )))
                    });
                    Body::from_stream(chunk)
                }
            }),
        )
        .route_layer(
            LockLayer::new(locker.clone())
                .key(fixed_key(&name))
                .hold_until_body_ends(true),
        );
    let (status, body) = oneshot(&app, "/s").await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        body.contains("handler=Ok(")
            && body.contains("body=Ok(")
            && body.contains("reentered=true"),
        "{body}"
    );
    let (handler, rest) = body.split_once(" body=").unwrap();
    let (in_body, _) = rest.split_once(" reentered").unwrap();
    assert_eq!(handler.trim_start_matches("handler="), in_body, "{body}");
}
