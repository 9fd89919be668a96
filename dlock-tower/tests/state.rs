//! The `Locker` taken from the router state (`Locker: FromRef<S>`), with key extractors that
//! need that state, through a real axum router against a real `redis-server`.

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{FromRef, FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::http::{Request, StatusCode};
use axum::routing::post;
use dlock_core::redis::AsyncCommands as _;
use dlock_core::{LockName, Locker};
use dlock_tests::RedisServer;
use dlock_tower::{HeldLocks, LockLayer};
use http_body_util::BodyExt as _;
use tower::ServiceExt as _;

/// The application's state: the `Locker` lives here, next to what the handlers need.
#[derive(Clone)]
struct Shop {
    locker: Locker,
    name: &'static str,
    tenants: Vec<(&'static str, u64)>,
}

impl FromRef<Shop> for Locker {
    fn from_ref(shop: &Shop) -> Locker {
        shop.locker.clone()
    }
}

/// The caller's tenant, from a header the state knows: an extractor that needs the state.
struct Tenant(u64);

impl FromRequestParts<Shop> for Tenant {
    type Rejection = StatusCode;

    async fn from_request_parts(parts: &mut Parts, shop: &Shop) -> Result<Self, StatusCode> {
        let header = parts
            .headers
            .get("x-tenant")
            .ok_or(StatusCode::UNAUTHORIZED)?;
        shop.tenants
            .iter()
            .find(|(name, _)| name.as_bytes() == header.as_bytes())
            .map(|(_, id)| Tenant(*id))
            .ok_or(StatusCode::UNAUTHORIZED)
    }
}

async fn import(State(shop): State<Shop>, Path(batch): Path<u64>, held: HeldLocks) -> String {
    tokio::time::sleep(Duration::from_millis(300)).await;
    format!(
        "{}: batch {batch} under {}",
        shop.name,
        held.names().join(",")
    )
}

fn request(tenant: &str) -> Request<Body> {
    Request::post("/imports/5")
        .header("x-tenant", tenant)
        .body(Body::empty())
        .unwrap()
}

async fn send(app: &Router, tenant: &str) -> (StatusCode, String) {
    let response = app.clone().oneshot(request(tenant)).await.unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test]
async fn the_locker_comes_from_the_router_state() {
    let server = RedisServer::start();
    let locker = Locker::builder()
        .url(server.url())
        .build()
        .await
        .expect("connect");
    let shop = Shop {
        locker: locker.clone(),
        name: "shop",
        tenants: vec![("acme", 7), ("globex", 8)],
    };
    let app = Router::new()
        .route("/imports/{batch}", post(import))
        .route_layer(
            // One value: the layer's `Locker` and its extractors' state.
            LockLayer::from_state(shop.clone()).key(
                |State(shop): State<Shop>, Tenant(tenant): Tenant| async move {
                    LockName::builder()
                        .literal(shop.name)
                        .literal(":import:")
                        .value(tenant)
                        .build()
                },
            ),
        )
        .with_state(shop);

    // One import at a time per tenant; tenants don't wait for each other.
    let (a, b, c) = tokio::join!(send(&app, "acme"), send(&app, "acme"), send(&app, "globex"));
    let mut acme = [a.0, b.0];
    acme.sort();
    assert_eq!(acme, [StatusCode::OK, StatusCode::CONFLICT], "{a:?} {b:?}");
    assert_eq!(
        (c.0, c.1.as_str()),
        (StatusCode::OK, "shop: batch 5 under shop:import:8")
    );

    // The lock lives in the state's Redis: held there while a request runs. (The first acme
    // hold is released in the background; wait for it to go first.)
    let name = LockName::builder()
        .literal("shop:import:")
        .value(7)
        .build()
        .unwrap();
    let key = locker.key_of(name).unwrap();
    let mut con = server.connection().await;
    let held = async |con: &mut dlock_core::redis::aio::MultiplexedConnection, want: bool| {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
        while con.exists::<_, bool>(&key).await.unwrap() != want {
            assert!(
                tokio::time::Instant::now() < deadline,
                "never became {want}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    held(&mut con, false).await;
    let running = tokio::spawn({
        let app = app.clone();
        async move { send(&app, "acme").await }
    });
    held(&mut con, true).await;
    assert_eq!(running.await.unwrap().0, StatusCode::OK);

    // The state's extractor rejects before any lock is taken.
    assert_eq!(send(&app, "initech").await.0, StatusCode::UNAUTHORIZED);
}
