//! `LockLayer` through real axum routers, against a real `redis-server`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method, Request, StatusCode, Uri, Version};
use axum::routing::{get, post};
use dlock_core::redis::AsyncCommands as _;
use dlock_core::{ErrorResponses, LockError, Locker, distributed_lock};
use dlock_tests::{RedisServer, unique_name};
use dlock_tower::{HeldLocks, KeyFrom, LockLayer};
use http_body_util::BodyExt as _;
use tower::ServiceExt as _;

mod common;

use common::{fixed_key, locker, oneshot};

/// Serves `app` on a free loopback port; returns its base URL.
async fn serve(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    format!("http://{addr}")
}

type Client = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    http_body_util::Empty<bytes::Bytes>,
>;

fn client() -> Client {
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http()
}

async fn fetch(client: &Client, url: &str) -> (StatusCode, Option<String>, String) {
    let response = tokio::time::timeout(Duration::from_secs(10), client.get(url.parse().unwrap()))
        .await
        .expect("no hang")
        .unwrap();
    let status = response.status();
    let retry_after = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        retry_after,
        String::from_utf8_lossy(&body).into_owned(),
    )
}

#[derive(Clone, Default)]
struct Gauge {
    now: Arc<AtomicUsize>,
    max: Arc<AtomicUsize>,
}

impl Gauge {
    async fn during(&self, d: Duration) {
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(n, Ordering::SeqCst);
        tokio::time::sleep(d).await;
        self.now.fetch_sub(1, Ordering::SeqCst);
    }
}

fn slow_router(locker: &Locker, prefix: &str, gauge: Gauge, hold: Duration) -> Router {
    let prefix = prefix.to_owned();
    Router::new()
        .route(
            "/orders/{id}",
            get(move |held: HeldLocks| {
                let gauge = gauge.clone();
                async move {
                    gauge.during(hold).await;
                    format!("{:?}", held.fencing_token().await)
                }
            }),
        )
        .route_layer(
            LockLayer::new(locker.clone()).key(move |Path(id): Path<u64>| {
                let prefix = prefix.clone();
                async move { format!("{prefix}:{id}") }
            }),
        )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_requests_for_one_key_get_one_success_and_409s() {
    let server = RedisServer::start();
    let locker = locker(&server).await;
    let gauge = Gauge::default();
    let base = serve(slow_router(
        &locker,
        &unique_name("orders"),
        gauge.clone(),
        Duration::from_millis(400),
    ))
    .await;
    let client = client();
    let mut requests = Vec::new();
    for _ in 0..50 {
        let (client, url) = (client.clone(), format!("{base}/orders/1"));
        requests.push(tokio::spawn(async move { fetch(&client, &url).await }));
    }
    let (mut ok, mut busy) = (0, 0);
    for request in requests {
        let (status, retry_after, body) = request.await.unwrap();
        match status {
            StatusCode::OK => ok += 1,
            StatusCode::CONFLICT => {
                busy += 1;
                // At most the default cap, whatever the holder's lease.
                let secs: u64 = retry_after.expect("Retry-After").parse().unwrap();
                assert!((1..=2).contains(&secs), "{secs}");
                let problem: serde_json::Value = serde_json::from_str(&body).unwrap();
                assert_eq!(problem["status"], 409);
                // Names stay out of bodies unless shown on purpose.
                assert!(problem.get("lock").is_none(), "{problem}");
            }
            other => panic!("unexpected {other}: {body}"),
        }
    }
    assert!(ok >= 1, "no request got through");
    assert_eq!(ok + busy, 50);
    assert_eq!(
        gauge.max.load(Ordering::SeqCst),
        1,
        "two handlers overlapped"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn different_keys_run_in_parallel() {
    let server = RedisServer::start();
    let locker = locker(&server).await;
    let gauge = Gauge::default();
    let base = serve(slow_router(
        &locker,
        &unique_name("par"),
        gauge.clone(),
        Duration::from_millis(500),
    ))
    .await;
    let client = client();
    let (one, two) = (format!("{base}/orders/1"), format!("{base}/orders/2"));
    let started = Instant::now();
    let (a, b) = tokio::join!(fetch(&client, &one), fetch(&client, &two));
    assert_eq!((a.0, b.0), (StatusCode::OK, StatusCode::OK));
    assert_eq!(gauge.max.load(Ordering::SeqCst), 2);
    assert!(started.elapsed() < Duration::from_millis(950));
}

#[tokio::test]
async fn no_key_means_no_lock_and_extractor_rejections_pass_through() {
    let server = RedisServer::start();
    let locker = locker(&server).await;
    let gauge = Gauge::default();
    let prefix = unique_name("tenant");
    let app = Router::new()
        .route(
            "/work/{id}",
            get({
                let gauge = gauge.clone();
                move || {
                    let gauge = gauge.clone();
                    async move { gauge.during(Duration::from_millis(300)).await }
                }
            }),
        )
        .route_layer(LockLayer::new(locker.clone()).sync_key(
            move |Path(id): Path<u64>, Query(q): Query<Vec<(String, String)>>| {
                q.iter()
                    .find(|(k, _)| k == "tenant")
                    .map(|(_, tenant)| format!("{prefix}:{tenant}:{id}"))
            },
        ));
    // No tenant: no lock, so two requests for the same id run together.
    let (a, b) = tokio::join!(oneshot(&app, "/work/1"), oneshot(&app, "/work/1"));
    assert_eq!((a.0, b.0), (StatusCode::OK, StatusCode::OK));
    assert_eq!(gauge.max.load(Ordering::SeqCst), 2);
    // With a tenant: locked.
    let (a, b) = tokio::join!(
        oneshot(&app, "/work/1?tenant=acme"),
        oneshot(&app, "/work/1?tenant=acme")
    );
    let mut statuses = [a.0, b.0];
    statuses.sort();
    assert_eq!(statuses, [StatusCode::OK, StatusCode::CONFLICT]);
    // A path parameter that doesn't parse: axum's own rejection, untouched.
    let (status, body) = oneshot(&app, "/work/not-a-number").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(!body.contains("problem"), "{body}");
    assert!(body.contains("Cannot parse"), "{body}");
}

#[tokio::test]
async fn router_layer_works_and_a_missing_path_parameter_is_axums_rejection() {
    let server = RedisServer::start();
    let locker = locker(&server).await;
    // `Router::layer` wraps every route, including one without the `{id}` the key needs.
    let app = Router::new()
        .route("/items/{id}", get(|| async { "item" }))
        .route("/health", get(|| async { "up" }))
        .layer(
            LockLayer::new(locker).key(|Path(id): Path<u64>| async move { format!("item:{id}") }),
        );
    let (status, body) = oneshot(&app, "/items/5").await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "item"));
    let (status, body) = oneshot(&app, "/health").await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
    assert!(body.contains("Wrong number of path arguments"), "{body}");
    assert!(!body.contains("about:blank"), "{body}");
}

#[tokio::test]
async fn an_invalid_key_is_a_400() {
    let server = RedisServer::start();
    let locker = locker(&server).await;
    let app = Router::new()
        .route("/k/{raw}", get(|| async { "ran" }))
        .route_layer(LockLayer::new(locker).key(|Path(raw): Path<String>| async move { raw }));
    let (status, body) = oneshot(&app, &format!("/k/{}", "x".repeat(600))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, _) = oneshot(&app, "/k/a%0Ab").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, body) = oneshot(&app, "/k/fine").await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "ran"));
}

#[tokio::test]
async fn a_slow_handler_keeps_its_lock_through_the_watchdog() {
    let server = RedisServer::start();
    let locker = locker(&server).await;
    let name = unique_name("slow");
    let app = Router::new()
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_millis(2_500)).await;
                "done"
            }),
        )
        .route_layer(
            LockLayer::new(locker.clone())
                .key(fixed_key(&name))
                .watchdog_lease(Duration::from_secs(1)),
        );
    let slow = tokio::spawn({
        let app = app.clone();
        async move { oneshot(&app, "/slow").await }
    });
    tokio::time::sleep(Duration::from_millis(1_600)).await;
    assert!(
        locker
            .lock(name.as_str())
            .try_lock()
            .await
            .unwrap()
            .is_none()
    );
    let (status, _) = oneshot(&app, "/slow").await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(slow.await.unwrap().0, StatusCode::OK);
}

/// Sets its flag when dropped: proof that a handler's future was dropped (cancelled).
struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[tokio::test]
async fn deleting_the_key_cancels_the_handler_with_503() {
    let server = RedisServer::start();
    let locker = locker(&server).await;
    let mut con = server.connection().await;
    // The default status, then a configured one.
    for lost_status in [None, Some(StatusCode::GONE)] {
        let name = unique_name("doomed");
        let finished = Arc::new(AtomicBool::new(false));
        let dropped = Arc::new(AtomicBool::new(false));
        let started = Arc::new(tokio::sync::Notify::new());
        let handler = {
            let (finished, dropped, started) = (finished.clone(), dropped.clone(), started.clone());
            move || async move {
                let _on_drop = SetOnDrop(dropped);
                started.notify_one();
                tokio::time::sleep(Duration::from_secs(10)).await;
                finished.store(true, Ordering::SeqCst);
                "finished"
            }
        };
        let mut layer = LockLayer::new(locker.clone())
            .key(fixed_key(&name))
            .watchdog_lease(Duration::from_millis(600))
            .hide_names(false);
        if let Some(status) = lost_status {
            layer = layer.lost_status_code(status);
        }
        let app = Router::new()
            .route("/doomed", get(handler))
            .route_layer(layer);
        let request = tokio::spawn({
            let app = app.clone();
            async move { oneshot(&app, "/doomed").await }
        });
        tokio::time::timeout(Duration::from_secs(3), started.notified())
            .await
            .expect("the handler runs");
        let () = con
            .del(locker.key_of(name.as_str()).unwrap())
            .await
            .unwrap();
        let (status, body) = tokio::time::timeout(Duration::from_secs(3), request)
            .await
            .expect("cancelled promptly")
            .unwrap();
        let expected = lost_status.unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(status, expected, "{body}");
        let problem: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(problem["status"], expected.as_u16());
        assert_eq!(problem["lock"].as_str(), Some(name.as_str()));
        assert!(
            problem["detail"].as_str().unwrap().contains("lost"),
            "{body}"
        );
        assert!(
            dropped.load(Ordering::SeqCst),
            "the handler was not cancelled"
        );
        assert!(!finished.load(Ordering::SeqCst));
    }
}

#[tokio::test]
async fn redis_down_is_a_503_within_the_timeout() {
    let mut server = RedisServer::start();
    let locker = locker(&server).await;
    let app = Router::new()
        .route("/x", get(|| async { "ran" }))
        .route_layer(LockLayer::new(locker).key(|| async { "down" }));
    server.kill();
    let started = Instant::now();
    let (status, body) = oneshot(&app, "/x").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    // The backend's error (hosts, ports) stays out of the answer.
    assert!(
        !body.contains("127.0.0.1") && !body.contains("refused"),
        "{body}"
    );
}

#[distributed_lock(key = "order:<id>", locker = locker)]
async fn save_order(locker: &Locker, id: u64) -> Result<u64, LockError> {
    Ok(dlock_core::scope::fencing_token().await?.get())
}

#[tokio::test]
async fn a_nested_macro_call_on_the_same_key_re_enters() {
    let server = RedisServer::start();
    let locker = locker(&server).await;
    let app = Router::new()
        .route(
            "/orders/{id}",
            get(
                |State(locker): State<Locker>, Path(id): Path<u64>, held: HeldLocks| async move {
                    let saved = save_order(&locker, id).await;
                    let held_token = held.fencing_token().await;
                    match (saved, held_token) {
                        (Ok(token), Ok(held_token)) if token == held_token.get() => {
                            (StatusCode::OK, "re-entered".to_owned())
                        }
                        other => (StatusCode::INTERNAL_SERVER_ERROR, format!("{other:?}")),
                    }
                },
            ),
        )
        .route_layer(LockLayer::with_state(locker.clone(), locker.clone()).key(
            |State(_): State<Locker>, Path(id): Path<u64>| async move { format!("order:{id}") },
        ))
        .with_state(locker.clone());
    let id = std::process::id();
    let (status, body) = oneshot(&app, &format!("/orders/{id}")).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "re-entered"));
}

#[tokio::test]
async fn the_body_hold_option_keeps_the_lock_until_the_stream_ends() {
    let server = RedisServer::start();
    let locker = locker(&server).await;
    let name = unique_name("stream");
    let app = Router::new()
        .route(
            "/stream",
            get(|| async {
                let chunks = futures_util::stream::unfold(0u8, |n| async move {
                    if n == 3 {
                        return None;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    Some((
                        Ok::<_, std::io::Error>(bytes::Bytes::from(vec![b'a' + n])),
                        n + 1,
                    ))
                });
                Body::from_stream(chunks)
            }),
        )
        .route_layer(
            LockLayer::new(locker.clone())
                .key(fixed_key(&name))
                .hold_until_body_ends(true),
        );
    let response = app
        .clone()
        .oneshot(Request::get("/stream").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    // The head is out, the body is still streaming: still locked.
    assert!(
        locker
            .lock(name.as_str())
            .try_lock()
            .await
            .unwrap()
            .is_none()
    );
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"abc");
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        if let Some(guard) = locker.lock(name.as_str()).try_lock().await.unwrap() {
            assert!(guard.release().await.is_released());
            break;
        }
        assert!(Instant::now() < deadline, "the lock outlived the body");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn the_plain_tower_form_works_with_service_builder_and_a_custom_status() {
    let server = RedisServer::start();
    let locker = locker(&server).await;
    let prefix: &'static str = Box::leak(format!("{}:", unique_name("acct")).into_boxed_str());
    let service = tower::ServiceBuilder::new()
        .layer(
            LockLayer::new(locker.clone())
                .key_from_parts(KeyFrom::header("x-account", prefix))
                .with_status_code(StatusCode::TOO_MANY_REQUESTS)
                .hide_names(true),
        )
        .service_fn(|_req: Request<Body>| async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            Ok::<_, std::convert::Infallible>(axum::http::Response::new(Body::from("ok")))
        });
    let request = || {
        Request::get("/")
            .header("x-account", "7")
            .body(Body::empty())
            .unwrap()
    };
    let (a, b) = tokio::join!(
        service.clone().oneshot(request()),
        service.clone().oneshot(request())
    );
    let mut statuses = [a.unwrap().status(), b.unwrap().status()];
    statuses.sort();
    assert_eq!(statuses, [StatusCode::OK, StatusCode::TOO_MANY_REQUESTS]);
    let busy = tokio::join!(
        service.clone().oneshot(request()),
        service.clone().oneshot(request())
    );
    for response in [busy.0.unwrap(), busy.1.unwrap()] {
        if response.status() == StatusCode::TOO_MANY_REQUESTS {
            let body = response.into_body().collect().await.unwrap().to_bytes();
            let body = String::from_utf8_lossy(&body);
            assert!(!body.contains("\"lock\""), "the name leaked: {body}");
        }
    }
    // No header: no lock.
    let response = service
        .clone()
        .oneshot(Request::get("/").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_key_from_the_request_without_its_body() {
    let server = RedisServer::start();
    let locker = locker(&server).await;
    let tag = unique_name("method");
    let service = tower::ServiceBuilder::new()
        .layer(
            LockLayer::new(locker.clone()).key_from_request(move |req: &http::Request<()>| {
                format!("{tag}:{}:{}", req.method(), req.uri().path())
            }),
        )
        .service_fn(|req: Request<Body>| async move {
            // The body is still there for the handler.
            let body = req.into_body().collect().await.unwrap().to_bytes();
            tokio::time::sleep(Duration::from_millis(200)).await;
            Ok::<_, std::convert::Infallible>(axum::http::Response::new(Body::from(body)))
        });
    let request = || Request::post("/pay").body(Body::from("payload")).unwrap();
    let (a, b) = tokio::join!(
        service.clone().oneshot(request()),
        service.clone().oneshot(request())
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    let mut statuses = [a.status(), b.status()];
    statuses.sort();
    assert_eq!(statuses, [StatusCode::OK, StatusCode::CONFLICT]);
    let ok = if a.status() == StatusCode::OK { a } else { b };
    let body = ok.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"payload");
}

#[tokio::test]
async fn a_rejection_handler_replaces_the_answer() {
    let server = RedisServer::start();
    let locker = locker(&server).await;
    let name = unique_name("handled");
    let _held = locker.lock(name.as_str()).await.unwrap();
    let app = Router::new()
        .route("/h", get(|| async { "ran" }))
        .route_layer(
            LockLayer::new(locker.clone())
                .key(fixed_key(&name))
                .on_rejection(|rejection| {
                    let mut response = axum::http::Response::new(Body::from(format!(
                        "busy, retry in {}s",
                        rejection.retry_after_secs().unwrap_or(0)
                    )));
                    *response.status_mut() = StatusCode::LOCKED;
                    Some(response)
                }),
        );
    let (status, body) = oneshot(&app, "/h").await;
    assert_eq!(status, StatusCode::LOCKED);
    assert!(body.starts_with("busy, retry in "), "{body}");
}

#[tokio::test]
async fn redis_not_answering_is_a_503_within_the_command_timeout() {
    let server = RedisServer::start();
    let locker = locker(&server).await;
    let app = Router::new()
        .route("/x", get(|| async { "ran" }))
        .route("/wait", get(|| async { "ran" }))
        .route_layer(
            LockLayer::new(locker.clone())
                .key(|uri: Uri| async move { format!("paused:{}", uri.path()) }),
        );
    let waiting = Router::new()
        .route("/x", get(|| async { "ran" }))
        .route_layer(
            LockLayer::new(locker)
                .key(|| async { "paused-wait" })
                .wait(Duration::from_secs(1)),
        );
    server.pause();
    // The command timeout is 500 ms. Without a wait, one attempt; with a wait, the request
    // retries within it (Redis may be back in a moment) and then answers 503: within the wait
    // plus one command timeout, never a hang.
    for (app, bound) in [
        (&app, Duration::from_secs(1)),
        (&waiting, Duration::from_millis(2000)),
    ] {
        let started = Instant::now();
        let (status, body) = tokio::time::timeout(Duration::from_secs(5), oneshot(app, "/x"))
            .await
            .expect("no hang while redis is paused");
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        assert!(started.elapsed() < bound, "{:?}", started.elapsed());
    }
    server.resume();
}

/// `Retry-After` is the holder's remaining lease, capped (2 s by default), or this `Locker`'s
/// usual hold time when shorter: not the 20-30 s left on a watchdog lease of locks held for
/// milliseconds.
#[tokio::test]
async fn retry_after_comes_from_what_the_lock_is_doing_capped_small() {
    let server = RedisServer::start();
    let locker = locker(&server).await;
    let name = unique_name("ttl");
    let holder = locker
        .lock(name.as_str())
        .lease(Duration::from_millis(4_500))
        .await
        .unwrap();
    let layer = || LockLayer::new(locker.clone()).key(fixed_key(&name));
    let app = |layer: LockLayer<_>| {
        Router::new()
            .route("/r", get(|| async { "ran" }))
            .route_layer(layer)
    };
    let retry_after = |response: &axum::response::Response| -> u64 {
        response.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap()
    };
    // The default cap.
    let capped = app(layer().with_status_code(StatusCode::LOCKED));
    let response = capped
        .clone()
        .oneshot(Request::get("/r").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::LOCKED);
    assert_eq!(retry_after(&response), 2);
    let headers = response.headers().clone();
    assert_eq!(headers["content-type"], "application/problem+json");
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(problem["type"], "about:blank");
    assert_eq!(problem["title"], "Locked");
    assert_eq!(problem["status"], 423);
    assert!(problem.get("lock").is_none(), "{problem}");

    // A higher cap: the holder's remaining 4.5 s (a little less by now), rounded up; the
    // name shown on purpose.
    let uncapped = app(layer().error_responses(
        ErrorResponses::new()
            .max_retry_after(Duration::from_secs(60))
            .hide_names(false),
    ));
    let response = uncapped
        .clone()
        .oneshot(Request::get("/r").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert!(
        (4..=5).contains(&retry_after(&response)),
        "{:?}",
        response.headers()
    );
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(problem["lock"].as_str(), Some(name.as_str()));
    assert!(holder.release().await.is_released());
    assert_eq!(oneshot(&capped, "/r").await.0, StatusCode::OK);

    // Once the `Locker` has seen its holds last milliseconds, a holder with 25 s of watchdog
    // lease left means a retry in 1 s.
    for _ in 0..10 {
        let quick = locker.lock(unique_name("quick").as_str()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert!(quick.release().await.is_released());
    }
    let holder = locker
        .lock(name.as_str())
        .watchdog_lease(Duration::from_secs(25))
        .await
        .unwrap();
    let response = uncapped
        .clone()
        .oneshot(Request::get("/r").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(retry_after(&response), 1, "{:?}", response.headers());
    assert!(holder.release().await.is_released());
}

#[tokio::test]
async fn a_request_waits_for_a_short_holder() {
    let server = RedisServer::start();
    let locker = locker(&server).await;
    let name = unique_name("waited");
    let holder = locker.lock(name.as_str()).await.unwrap();
    let app = Router::new()
        .route("/w", get(|| async { "ran" }))
        .route_layer(
            LockLayer::new(locker.clone())
                .key(fixed_key(&name))
                .wait(Duration::from_secs(5)),
        );
    let started = Instant::now();
    let request = tokio::spawn({
        let app = app.clone();
        async move { oneshot(&app, "/w").await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(holder.release().await.is_released());
    let (status, body) = tokio::time::timeout(Duration::from_secs(3), request)
        .await
        .expect("woken by the release")
        .unwrap();
    assert_eq!((status, body.as_str()), (StatusCode::OK, "ran"));
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
}

// Without a `wait` of its own the layer waits the Locker's default; its own overrides it.
#[tokio::test]
async fn the_layer_waits_the_lockers_default_wait_unless_it_sets_one() {
    let server = RedisServer::start();
    let locker = Locker::builder()
        .url(server.url())
        .default_wait(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    let name = unique_name("default-wait");
    let app = Router::new()
        .route("/w", get(|| async { "ran" }))
        .route_layer(LockLayer::new(locker.clone()).key(fixed_key(&name)));
    let impatient = Router::new()
        .route("/w", get(|| async { "ran" }))
        .route_layer(
            LockLayer::new(locker.clone())
                .key(fixed_key(&name))
                .wait(Duration::ZERO),
        );
    let holder = locker.lock(name.as_str()).await.unwrap();
    assert_eq!(oneshot(&impatient, "/w").await.0, StatusCode::CONFLICT);
    let request = tokio::spawn({
        let app = app.clone();
        async move { oneshot(&app, "/w").await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!request.is_finished(), "the layer did not wait");
    assert!(holder.release().await.is_released());
    let (status, body) = tokio::time::timeout(Duration::from_secs(3), request)
        .await
        .expect("woken by the release")
        .unwrap();
    assert_eq!((status, body.as_str()), (StatusCode::OK, "ran"));
}

#[tokio::test]
async fn several_names_are_locked_all_or_none() {
    let server = RedisServer::start();
    let locker = locker(&server).await;
    let prefix = unique_name("sku");
    let app = Router::new()
        .route(
            "/carts/checkout",
            post(|held: HeldLocks| async move {
                match held.fencing_tokens().await {
                    Ok(tokens) => format!("{}:{}", held.names().len(), tokens.len()),
                    Err(err) => format!("no tokens: {err}"),
                }
            }),
        )
        .route_layer(LockLayer::new(locker.clone()).hide_names(false).sync_key({
            let prefix = prefix.clone();
            move |Query(q): Query<Vec<(String, String)>>| {
                q.into_iter()
                    .filter(|(k, _)| k == "sku")
                    .map(|(_, sku)| format!("{prefix}:{sku}"))
                    .collect::<Vec<_>>()
            }
        }));
    let checkout = |skus: &str| {
        Request::post(format!("/carts/checkout?{skus}"))
            .body(Body::empty())
            .unwrap()
    };
    let second = format!("{prefix}:2");
    let holder = locker.lock(second.as_str()).await.unwrap();
    let response = app.clone().oneshot(checkout("sku=1&sku=2")).await.unwrap();
    assert_eq!(response.status(), StatusCode::CONFLICT);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(problem["lock"].as_str(), Some(second.as_str()));
    // None of the names stays held: sku 1 is free.
    let first = locker
        .lock(format!("{prefix}:1"))
        .try_lock()
        .await
        .unwrap()
        .expect("all-or-none: the first name was let go");
    assert!(first.release().await.is_released());
    assert!(holder.release().await.is_released());
    let response = app.oneshot(checkout("sku=1&sku=2")).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"2:2");
}

#[derive(Clone)]
struct AppState {
    users: Arc<Vec<(&'static str, u64)>>,
}

/// A user-defined auth extractor that needs the router state.
struct CurrentUser {
    id: u64,
}

impl FromRequestParts<AppState> for CurrentUser {
    type Rejection = (StatusCode, &'static str);

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let token = parts
            .headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .ok_or((StatusCode::UNAUTHORIZED, "who are you?"))?;
        state
            .users
            .iter()
            .find(|(t, _)| *t == token)
            .map(|(_, id)| CurrentUser { id: *id })
            .ok_or((StatusCode::UNAUTHORIZED, "who are you?"))
    }
}

#[tokio::test]
async fn eight_extractors_with_router_state_and_the_body_untouched() {
    let server = RedisServer::start();
    let locker = locker(&server).await;
    let state = AppState {
        users: Arc::new(vec![("t-7", 7)]),
    };
    let prefix = unique_name("order");
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let app = Router::new()
        .route(
            "/vouchers/{id}/orders",
            post(
                |State(_): State<AppState>, held: HeldLocks, body: String| async move {
                    format!("{}|{body}", held.names().join(","))
                },
            ),
        )
        .route_layer(LockLayer::with_state(locker.clone(), state.clone()).key({
            let (prefix, seen) = (prefix.clone(), seen.clone());
            move |Path(id): Path<u64>,
                  Query(q): Query<Vec<(String, String)>>,
                  headers: HeaderMap,
                  State(state): State<AppState>,
                  user: CurrentUser,
                  method: Method,
                  uri: Uri,
                  version: Version| {
                let (prefix, seen) = (prefix.clone(), seen.clone());
                async move {
                    seen.lock().unwrap().push(format!(
                        "{method} {uri} {version:?} {} users={} q={}",
                        headers.len(),
                        state.users.len(),
                        q.len()
                    ));
                    dlock_core::LockName::builder()
                        .literal(&format!("{prefix}:"))
                        .value(user.id)
                        .literal(":")
                        .value(id)
                        .build()
                }
            }
        }))
        .with_state(state);
    let request = |token: &str| {
        Request::post("/vouchers/3/orders?src=web")
            .header("authorization", format!("Bearer {token}"))
            .body(Body::from("{\"qty\":1}"))
            .unwrap()
    };
    let response = app.clone().oneshot(request("t-7")).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(
        String::from_utf8_lossy(&body),
        format!("{prefix}:7:3|{{\"qty\":1}}")
    );
    assert_eq!(
        seen.lock().unwrap().as_slice(),
        ["POST /vouchers/3/orders?src=web HTTP/1.1 1 users=1 q=1"]
    );
    // The auth extractor's own rejection, untouched; the handler never ran.
    let (status, body) = {
        let response = app.oneshot(request("nope")).await.unwrap();
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    };
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::UNAUTHORIZED, "who are you?")
    );
}

#[tokio::test]
async fn a_nested_lock_on_the_same_key_re_enters_inside_the_handler() {
    let server = RedisServer::start();
    let locker = locker(&server).await;
    let name = unique_name("nested");
    let app = Router::new()
        .route(
            "/n",
            get({
                let (locker, name) = (locker.clone(), name.clone());
                move |held: HeldLocks| async move {
                    // Same task, same name, no wait: re-enters the layer's hold.
                    let inner = locker
                        .lock(name.as_str())
                        .await
                        .map_err(|e| e.to_string())?;
                    let inner_token = inner.fencing_token().await.map_err(|e| e.to_string())?;
                    let held_token = held.fencing_token().await.map_err(|e| e.to_string())?;
                    let scope_token = dlock_core::scope::fencing_token()
                        .await
                        .map_err(|e| e.to_string())?;
                    let same = inner_token == held_token && scope_token == held_token;
                    assert!(inner.release().await.is_released());
                    Ok::<_, String>(if same { "re-entered" } else { "other token" })
                }
            }),
        )
        .route_layer(LockLayer::new(locker.clone()).key(fixed_key(&name)));
    let (status, body) = oneshot(&app, "/n").await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "re-entered"));
    // The layer's hold is gone once the response is out (released in the background).
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        if let Some(guard) = locker.lock(name.as_str()).try_lock().await.unwrap() {
            assert!(guard.release().await.is_released());
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the layer's hold outlived the response"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn held_locks_is_there_only_when_a_lock_is_held() {
    let server = RedisServer::start();
    let locker = locker(&server).await;
    let prefix = unique_name("opt");
    let app = Router::new()
        .route(
            "/o",
            get(|held: Option<HeldLocks>| async move {
                match held {
                    Some(held) => format!("held {}", held.names().join(",")),
                    None => "no lock".to_owned(),
                }
            }),
        )
        .route("/strict", get(|_: HeldLocks| async { "ran" }))
        .route_layer(LockLayer::new(locker).sync_key({
            let prefix = prefix.clone();
            move |headers: HeaderMap| {
                headers
                    .get("x-job")
                    .and_then(|v| v.to_str().ok())
                    .map(|job| format!("{prefix}:{job}"))
            }
        }));
    let (status, body) = oneshot(&app, "/o").await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "no lock"));
    let response = app
        .clone()
        .oneshot(
            Request::get("/o")
                .header("x-job", "a")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(String::from_utf8_lossy(&body), format!("held {prefix}:a"));
    // The plain extractor on a request that took no lock: a 500 problem, not a panic, and
    // nothing about the server's set-up in the body (the cause is logged).
    let (status, body) = oneshot(&app, "/strict").await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    let problem: serde_json::Value = serde_json::from_str(&body).expect("a JSON problem");
    assert_eq!(problem["status"], 500, "{body}");
    assert!(
        !body.contains("LockLayer") && !body.contains("lock is held"),
        "{body}"
    );
}

#[tokio::test]
async fn a_lease_the_core_refuses_is_a_500() {
    let server = RedisServer::start();
    let locker = locker(&server).await;
    let app = Router::new()
        .route("/l", get(|| async { "ran" }))
        .route_layer(
            LockLayer::new(locker)
                .key(|| async { "short-lease" })
                .lease(Duration::from_millis(1)),
        );
    let (status, body) = oneshot(&app, "/l").await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
    let problem: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(problem["status"], 500);
}

#[tokio::test]
async fn losing_the_lock_while_a_held_body_streams_ends_the_body_with_an_error() {
    let server = RedisServer::start();
    let locker = locker(&server).await;
    let name = unique_name("stream-lost");
    let app = Router::new()
        .route(
            "/stream",
            get(|| async {
                let chunks = futures_util::stream::unfold(0u32, |n| async move {
                    if n == 50 {
                        return None;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    Some((
                        Ok::<_, std::io::Error>(bytes::Bytes::from_static(b".")),
                        n + 1,
                    ))
                });
                Body::from_stream(chunks)
            }),
        )
        .route_layer(
            LockLayer::new(locker.clone())
                .key(fixed_key(&name))
                .watchdog_lease(Duration::from_millis(600))
                .hold_until_body_ends(true),
        );
    let response = app
        .oneshot(Request::get("/stream").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    // A first chunk, then the key goes.
    let first = body.frame().await.unwrap().unwrap();
    assert_eq!(first.into_data().unwrap(), "."[..]);
    let mut con = server.connection().await;
    let () = con
        .del(locker.key_of(name.as_str()).unwrap())
        .await
        .unwrap();
    let started = Instant::now();
    let outcome = tokio::time::timeout(Duration::from_secs(3), async {
        loop {
            match body.frame().await {
                Some(Ok(_)) => continue,
                Some(Err(err)) => return Err(err),
                None => return Ok(()),
            }
        }
    })
    .await
    .expect("the body stops promptly");
    let err = outcome.expect_err("the body ends with an error");
    assert!(err.to_string().contains("lost"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[test]
fn the_layer_service_and_future_are_send_and_sync() {
    fn assert_send<T: Send>() {}
    fn assert_sync<T: Sync>() {}
    type Svc = axum::routing::Route;
    assert_send::<LockLayer>();
    assert_sync::<LockLayer>();
    assert_send::<dlock_tower::Lock<Svc>>();
    assert_sync::<dlock_tower::Lock<Svc>>();
    assert_send::<dlock_tower::ResponseFuture<Svc, Body>>();
    assert_send::<dlock_tower::LockBody<Body>>();
    // With router state.
    assert_send::<LockLayer<AppState>>();
    assert_sync::<LockLayer<AppState>>();
    assert_send::<dlock_tower::Lock<Svc, AppState>>();
    assert_sync::<dlock_tower::Lock<Svc, AppState>>();
    // What handlers and error handlers see.
    assert_send::<HeldLocks>();
    assert_sync::<HeldLocks>();
    assert_send::<dlock_tower::LockRejection>();
    assert_sync::<dlock_tower::LockRejection>();
}

#[tokio::test]
async fn an_empty_key_set_takes_no_lock_and_gives_no_held_locks() {
    let server = RedisServer::start();
    let locker = locker(&server).await;
    let app = Router::new()
        .route(
            "/e",
            get(|held: Option<HeldLocks>| async move { format!("{held:?}") }),
        )
        .route_layer(
            LockLayer::new(locker.clone()).key(|| std::future::ready(Vec::<String>::new())),
        );
    let (status, body) = oneshot(&app, "/e").await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "None"));
}

#[tokio::test]
async fn redis_down_with_a_wait_is_a_503_within_the_wait_plus_one_command_timeout() {
    let mut server = RedisServer::start();
    let locker = locker(&server).await; // command timeout 500 ms
    let wait = Duration::from_secs(4);
    let app = Router::new()
        .route("/x", get(|| async { "ran" }))
        .route_layer(
            LockLayer::new(locker)
                .wait(wait)
                .key(|| async { "down-with-wait" }),
        );
    server.kill();
    let started = Instant::now();
    let (status, body) = oneshot(&app, "/x").await;
    let took = started.elapsed();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    // The request keeps trying while it may wait; the last attempt ends within one command
    // timeout (and a little scheduling slack) after the wait.
    let bound = wait + Duration::from_millis(500) + Duration::from_millis(250);
    assert!(took < bound, "503 only after {took:?}");
}

/// Polls until `name` can be taken (then releases it); false if it is still held at `within`.
async fn frees_within(locker: &Locker, name: &str, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if let Some(guard) = locker.lock(name).try_lock().await.unwrap() {
            assert!(guard.release().await.is_released());
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Serves `app` and connects to it over plain TCP.
async fn connect(app: Router) -> tokio::net::TcpStream {
    let url = serve(app).await;
    tokio::net::TcpStream::connect(url.trim_start_matches("http://"))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_while_the_handler_runs_releases_the_lock() {
    use tokio::io::AsyncWriteExt as _;

    let server = RedisServer::start();
    let locker = locker(&server).await;
    let name = unique_name("disc-handler");
    let started = Arc::new(tokio::sync::Notify::new());
    let app = Router::new()
        .route(
            "/slow",
            get({
                let started = started.clone();
                move || async move {
                    started.notify_one();
                    tokio::time::sleep(Duration::from_secs(20)).await;
                    "done"
                }
            }),
        )
        .route_layer(LockLayer::new(locker.clone()).key(fixed_key(&name)));
    let mut tcp = connect(app).await;
    tcp.write_all(b"GET /slow HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(3), started.notified())
        .await
        .expect("handler ran");
    drop(tcp);
    assert!(
        frees_within(&locker, &name, Duration::from_secs(3)).await,
        "the lock outlived the client by 3 s"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_while_a_held_body_is_pending_releases_the_lock() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    let server = RedisServer::start();
    let locker = locker(&server).await;
    let name = unique_name("disc-body");
    let app = Router::new()
        .route(
            "/events",
            get(|| async {
                let first = futures_util::stream::once(async {
                    Ok::<_, std::io::Error>(bytes::Bytes::from_static(b"data: hi\n\n"))
                });
                // Then nothing for a long time.
                let rest = futures_util::stream::once(async {
                    tokio::time::sleep(Duration::from_secs(60)).await;
                    Ok::<_, std::io::Error>(bytes::Bytes::from_static(b"data: late\n\n"))
                });
                Body::from_stream(futures_util::StreamExt::chain(first, rest))
            }),
        )
        .route_layer(
            LockLayer::new(locker.clone())
                .key(fixed_key(&name))
                .hold_until_body_ends(true),
        );
    let mut tcp = connect(app).await;
    tcp.write_all(b"GET /events HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let mut got = Vec::new();
    while !String::from_utf8_lossy(&got).contains("data: hi") {
        let n = tokio::time::timeout(Duration::from_secs(3), tcp.read(&mut buf))
            .await
            .expect("first event")
            .unwrap();
        assert!(n > 0);
        got.extend_from_slice(&buf[..n]);
    }
    // Held while streaming.
    assert!(
        locker
            .lock(name.as_str())
            .try_lock()
            .await
            .unwrap()
            .is_none()
    );
    drop(tcp);
    assert!(
        frees_within(&locker, &name, Duration::from_secs(5)).await,
        "the lock outlived the client by 5 s (held body pending)"
    );
}
