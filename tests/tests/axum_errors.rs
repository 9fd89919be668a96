//! One lock situation, one answer: a `#[distributed_lock]` axum handler returning `LockError`,
//! a handler whose own error wraps one with `?`, and a `LockLayer` route answer the same
//! situation (busy, Redis down, invalid key, lost lock, a refusal inside the core) with the same
//! status, the same headers and the same body, against a real `redis-server`.

use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{FromRef, Path, State};
use axum::http::{HeaderMap, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use dlock_core::redis::AsyncCommands as _;
use dlock_core::{ErrorResponses, LockError, LockName, Locker, distributed_lock};
use dlock_tests::RedisServer;
use dlock_tower::LockLayer;
use http_body_util::BodyExt as _;
use tower::ServiceExt as _;

/// The router state: the `Locker`, how long handlers work, and the hand-written handler's lease.
#[derive(Clone)]
struct Shop {
    locker: Locker,
    hold: Duration,
    lease: Option<Duration>,
}

impl FromRef<Shop> for Locker {
    fn from_ref(shop: &Shop) -> Locker {
        shop.locker.clone()
    }
}

/// The lock every route takes for `/…/{id}`: `errors:` and the escaped id.
fn lock_name(id: &str) -> Result<LockName, LockError> {
    LockName::builder().literal("errors:").value(id).build()
}

async fn work(hold: Duration) -> String {
    tokio::time::sleep(hold).await;
    "ran".to_owned()
}

/// An application's error: lock errors answered by `LockError`'s own `IntoResponse`.
#[derive(Debug)]
enum AppError {
    Lock(LockError),
}

impl From<LockError> for AppError {
    fn from(err: LockError) -> Self {
        Self::Lock(err)
    }
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        match self {
            Self::Lock(err) => err.into_response(),
        }
    }
}

/// Other answers, shared by a layer and an application error.
const STRICT: ErrorResponses = ErrorResponses::new()
    .busy_status(StatusCode::LOCKED)
    .max_retry_after(Duration::from_secs(60))
    .hide_names(false);

/// An application's error answered under [`STRICT`].
#[derive(Debug)]
struct StrictError(LockError);

impl From<LockError> for StrictError {
    fn from(err: LockError) -> Self {
        Self(err)
    }
}

impl IntoResponse for StrictError {
    fn into_response(self) -> Response {
        STRICT.to_response(&self.0).into_response()
    }
}

#[distributed_lock(key = "errors:<id>", locker = shop.locker)]
async fn by_macro(State(shop): State<Shop>, Path(id): Path<String>) -> Result<String, LockError> {
    Ok(work(shop.hold).await)
}

#[distributed_lock(key = "errors:<id>", locker = shop.locker)]
async fn by_macro_strict(
    State(shop): State<Shop>,
    Path(id): Path<String>,
) -> Result<String, StrictError> {
    Ok(work(shop.hold).await)
}

/// No `locker = ...`, and no default `Locker` installed: a configuration error.
#[distributed_lock(key = "errors:<id>")]
async fn by_macro_without_a_locker(Path(id): Path<String>) -> Result<String, LockError> {
    Ok(id)
}

/// The lock taken by hand, its errors carried out by `?` into the application's error.
async fn by_hand(State(shop): State<Shop>, Path(id): Path<String>) -> Result<String, AppError> {
    let mut request = shop.locker.lock(lock_name(&id)?);
    if let Some(lease) = shop.lease {
        request = request.lease(lease);
    }
    let guard = request.await?;
    let out = guard.run(work(shop.hold)).await?;
    let _ = guard.release().await;
    Ok(out)
}

/// `/layer/{id}` under a `LockLayer` (with `responses`, if given), and the handlers beside it.
fn router(shop: Shop, responses: Option<ErrorResponses>) -> Router {
    let mut layer = LockLayer::from_state(shop.clone())
        .key(|Path(id): Path<String>| async move { lock_name(&id) });
    if let Some(lease) = shop.lease {
        layer = layer.lease(lease);
    }
    if let Some(responses) = responses {
        layer = layer.error_responses(responses);
    }
    Router::new()
        .route(
            "/layer/{id}",
            get(|State(shop): State<Shop>| async move { work(shop.hold).await }),
        )
        .route_layer(layer)
        .route("/macro/{id}", get(by_macro))
        .route("/strict/{id}", get(by_macro_strict))
        .route("/no-locker/{id}", get(by_macro_without_a_locker))
        .route("/hand/{id}", get(by_hand))
        .with_state(shop)
}

async fn locker(server: &RedisServer) -> Locker {
    Locker::builder()
        .url(server.url())
        .command_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_millis(500))
        // Losses are found within a third of this.
        .default_lease(dlock_core::Lease::watchdog(Duration::from_millis(600)))
        .build()
        .await
        .expect("connect")
}

fn shop(locker: &Locker) -> Shop {
    Shop {
        locker: locker.clone(),
        hold: Duration::ZERO,
        lease: None,
    }
}

#[derive(Debug, PartialEq)]
struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Answer {
    fn body(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    fn problem(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("a JSON body")
    }
}

async fn get_answer(app: &Router, uri: &str) -> Answer {
    let request = Request::get(uri).body(Body::empty()).unwrap();
    let response = tokio::time::timeout(Duration::from_secs(5), app.clone().oneshot(request))
        .await
        .expect("no hang")
        .unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    Answer {
        status,
        headers,
        body,
    }
}

/// Asks every path; asserts they all answered as the first one did; returns that answer.
async fn same_answer(app: &Router, paths: &[String]) -> Answer {
    let first = get_answer(app, &paths[0]).await;
    for path in &paths[1..] {
        let other = get_answer(app, path).await;
        assert_eq!(other, first, "{path} answered otherwise than {}", paths[0]);
    }
    first
}

fn paths(routes: &[&str], id: &str) -> Vec<String> {
    routes
        .iter()
        .map(|route| format!("/{route}/{id}"))
        .collect()
}

#[tokio::test]
async fn busy_is_the_same_409_with_retry_after() {
    let server = RedisServer::start();
    let locker = locker(&server).await;
    let holder = locker
        .lock(lock_name("7").unwrap())
        .lease(Duration::from_millis(4_500))
        .await
        .unwrap();

    let app = router(shop(&locker), None);
    let answer = same_answer(&app, &paths(&["layer", "macro", "hand"], "7")).await;
    assert_eq!(answer.status, StatusCode::CONFLICT, "{}", answer.body());
    assert_eq!(answer.headers["content-type"], "application/problem+json");
    // 4.5 s left, capped at 2 s by default.
    assert_eq!(answer.headers["retry-after"], "2");
    let problem = answer.problem();
    assert_eq!(problem["type"], "about:blank");
    assert_eq!(problem["title"], "Conflict");
    assert_eq!(problem["status"], 409);
    // Names stay out of bodies unless shown on purpose.
    assert!(problem.get("lock").is_none(), "{}", answer.body());

    // Other statuses, a higher cap and the name shown: one value for the layer and the
    // application's error.
    let strict = router(shop(&locker), Some(STRICT));
    let answer = same_answer(&strict, &paths(&["layer", "strict"], "7")).await;
    assert_eq!(answer.status, StatusCode::LOCKED, "{}", answer.body());
    // 4.5 s left (a little less by now), rounded up to whole seconds.
    assert_eq!(answer.headers["retry-after"], "5");
    assert_eq!(answer.problem()["lock"], "errors:7");

    assert!(holder.release().await.is_released());
    let key = locker.key_of(lock_name("7").unwrap()).unwrap();
    let mut con = server.connection().await;
    for path in paths(&["layer", "macro", "hand"], "7") {
        let answer = get_answer(&app, &path).await;
        assert_eq!(
            (answer.status, answer.body()),
            (StatusCode::OK, "ran".into()),
            "{path}"
        );
        // The layer releases in the background, after its answer: wait for the lock to go.
        let deadline = Instant::now() + Duration::from_secs(3);
        while con.exists::<_, bool>(&key).await.unwrap() {
            assert!(Instant::now() < deadline, "{path} never released");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

#[tokio::test]
async fn redis_down_is_the_same_503_without_the_backends_error() {
    let mut server = RedisServer::start();
    let locker = locker(&server).await;
    let app = router(shop(&locker), None);
    server.kill();
    let started = Instant::now();
    let answer = same_answer(&app, &paths(&["layer", "macro", "hand"], "1")).await;
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        answer.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        answer.body()
    );
    assert_eq!(answer.headers["content-type"], "application/problem+json");
    assert!(!answer.headers.contains_key("retry-after"));
    let body = answer.body();
    for leak in ["127.0.0.1", "refused", "onnection", "redis"] {
        assert!(!body.contains(leak), "{body}");
    }
    assert_eq!(
        answer.problem()["detail"],
        "the lock service could not be reached; retry later"
    );
}

#[tokio::test]
async fn an_invalid_key_is_the_same_400() {
    let server = RedisServer::start();
    let locker = locker(&server).await;
    let app = router(shop(&locker), None);
    let long = "x".repeat(600);
    let answer = same_answer(&app, &paths(&["layer", "macro", "hand"], &long)).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{}", answer.body());
    assert_eq!(answer.headers["content-type"], "application/problem+json");
    assert_eq!(
        answer.problem()["detail"],
        "invalid lock name: 607 bytes is longer than the limit of 512"
    );
}

#[tokio::test]
async fn a_lost_lock_is_the_same_503() {
    let server = RedisServer::start();
    let locker = locker(&server).await;
    let app = router(
        Shop {
            hold: Duration::from_secs(10),
            ..shop(&locker)
        },
        None,
    );
    let key = locker.key_of(lock_name("9").unwrap()).unwrap();
    let mut con = server.connection().await;
    let mut answers = Vec::new();
    // One route at a time, as they take the same lock.
    for path in paths(&["layer", "macro", "hand"], "9") {
        let request = tokio::spawn({
            let app = app.clone();
            async move { get_answer(&app, &path).await }
        });
        let deadline = Instant::now() + Duration::from_secs(3);
        while !con.exists::<_, bool>(&key).await.unwrap() {
            assert!(Instant::now() < deadline, "the lock was never taken");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let () = con.del(&key).await.unwrap();
        let answer = tokio::time::timeout(Duration::from_secs(3), request)
            .await
            .expect("cancelled promptly")
            .unwrap();
        answers.push(answer);
    }
    assert_eq!(answers[1], answers[0], "the macro's answer");
    assert_eq!(answers[2], answers[0], "the hand-written handler's answer");
    let answer = &answers[0];
    assert_eq!(
        answer.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        answer.body()
    );
    assert!(!answer.headers.contains_key("retry-after"));
    let problem = answer.problem();
    assert!(problem.get("lock").is_none(), "{}", answer.body());
    assert_eq!(
        problem["detail"],
        "the lock was lost while the request ran; the request was cancelled"
    );
}

#[tokio::test]
async fn a_refusal_inside_the_core_is_the_same_500_without_its_reason() {
    let server = RedisServer::start();
    let locker = locker(&server).await;
    // The layer and the hand-written handler with a lease the core refuses; the macro without a
    // `Locker` to use.
    let app = router(
        Shop {
            lease: Some(Duration::from_millis(1)),
            ..shop(&locker)
        },
        None,
    );
    let answer = same_answer(&app, &paths(&["layer", "no-locker", "hand"], "3")).await;
    assert_eq!(
        answer.status,
        StatusCode::INTERNAL_SERVER_ERROR,
        "{}",
        answer.body()
    );
    assert_eq!(answer.headers["content-type"], "application/problem+json");
    assert_eq!(answer.problem()["detail"], "the lock could not be taken");
    let body = answer.body();
    assert!(
        !body.contains("lease") && !body.contains("locker"),
        "{body}"
    );
}
