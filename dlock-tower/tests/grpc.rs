//! A tonic gRPC service behind `LockLayer`, called by a tonic client over HTTP/2: the layer's
//! rejections arrive as gRPC statuses (code, message, retry metadata, `google.rpc.RetryInfo`),
//! against a real `redis-server`. The messages are written by hand, so no `protoc` is needed.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use dlock_core::redis::AsyncCommands as _;
use dlock_core::{ErrorResponses, LockName};
use dlock_tests::RedisServer;
use dlock_tower::{HeldLocks, IntoLockKeys as _, KeyFrom, LockKeys, LockLayer};
use http::request::Parts;
use http::uri::PathAndQuery;
use tonic::server::NamedService;
use tonic::{Code, Status};
use tonic_prost::ProstCodec;

mod common;

use common::locker;

#[derive(Clone, PartialEq, prost::Message)]
struct OrderRequest {
    #[prost(uint64, tag = "1")]
    voucher: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
struct OrderReply {
    #[prost(uint64, tag = "1")]
    fencing_token: u64,
}

/// `google.rpc.Status`, to read `grpc-status-details-bin`.
#[derive(Clone, PartialEq, prost::Message)]
struct RpcStatus {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
    #[prost(message, repeated, tag = "3")]
    details: Vec<ProtoAny>,
}

/// `google.protobuf.Any`.
#[derive(Clone, PartialEq, prost::Message)]
struct ProtoAny {
    #[prost(string, tag = "1")]
    type_url: String,
    #[prost(bytes = "vec", tag = "2")]
    value: Vec<u8>,
}

/// `google.rpc.RetryInfo`.
#[derive(Clone, PartialEq, prost::Message)]
struct RetryInfo {
    #[prost(message, optional, tag = "1")]
    retry_delay: Option<ProtoDuration>,
}

/// `google.protobuf.Duration`.
#[derive(Clone, PartialEq, prost::Message)]
struct ProtoDuration {
    #[prost(int64, tag = "1")]
    seconds: i64,
    #[prost(int32, tag = "2")]
    nanos: i32,
}

/// `shop.Orders/Place`: answers with the fencing token the layer holds for the call, after
/// `hold` (to be cancelled in), marking `dropped` if its future is dropped.
#[derive(Clone, Default)]
struct Orders {
    hold: Duration,
    started: Arc<tokio::sync::Notify>,
    dropped: Arc<AtomicBool>,
}

impl NamedService for Orders {
    const NAME: &'static str = "shop.Orders";
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl tower::Service<http::Request<tonic::body::Body>> for Orders {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let orders = self.clone();
        Box::pin(async move {
            let mut grpc =
                tonic::server::Grpc::new(ProstCodec::<OrderReply, OrderRequest>::default());
            Ok(grpc.unary(Place(orders), req).await)
        })
    }
}

struct Place(Orders);

/// Sets its flag when dropped: proof that a handler's future was dropped (cancelled).
struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

impl tonic::server::UnaryService<OrderRequest> for Place {
    type Response = OrderReply;
    type Future = BoxFuture<Result<tonic::Response<OrderReply>, Status>>;

    fn call(&mut self, request: tonic::Request<OrderRequest>) -> Self::Future {
        let orders = self.0.clone();
        Box::pin(async move {
            let held = request.extensions().get::<HeldLocks>().cloned();
            let _on_drop = SetOnDrop(orders.dropped.clone());
            orders.started.notify_one();
            tokio::time::sleep(orders.hold).await;
            let Some(held) = held else {
                return Err(Status::internal("no lock held"));
            };
            let token = (held.fencing_token().await).map_err(|e| Status::aborted(e.to_string()))?;
            Ok(tonic::Response::new(OrderReply {
                fencing_token: token.get(),
            }))
        })
    }
}
/// The key: a raw (trusted) name from `x-raw`, else the escaped `x-voucher` after `voucher:`.
fn key(parts: &Parts) -> LockKeys {
    match parts.headers.get("x-raw") {
        Some(raw) => String::from_utf8_lossy(raw.as_bytes())
            .into_owned()
            .into_lock_keys(),
        None => KeyFrom::header("x-voucher", "voucher:")(parts),
    }
}

fn voucher_lock(voucher: &str) -> LockName {
    LockName::builder()
        .literal("voucher:")
        .value(voucher)
        .build()
        .expect("a valid name")
}

/// Serves `orders` behind `layer` with tonic's server on a free loopback port.
async fn serve(layer: LockLayer, orders: Orders) -> tonic::transport::Channel {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .layer(layer)
            .add_service(orders)
            .serve_with_incoming(incoming)
            .await
            .unwrap();
    });
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .expect("the server answers")
}

/// Calls `shop.Orders/Place` with these metadata headers.
async fn place(
    channel: &tonic::transport::Channel,
    headers: &[(&'static str, &str)],
) -> Result<OrderReply, Status> {
    let mut client = tonic::client::Grpc::new(channel.clone());
    client.ready().await.expect("ready");
    let mut request = tonic::Request::new(OrderRequest { voucher: 7 });
    for (name, value) in headers {
        request
            .metadata_mut()
            .insert(*name, value.parse().expect("ASCII metadata"));
    }
    let call = client.unary(
        request,
        PathAndQuery::from_static("/shop.Orders/Place"),
        ProstCodec::<OrderRequest, OrderReply>::default(),
    );
    tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .expect("no hang")
        .map(tonic::Response::into_inner)
}

fn metadata(status: &Status, name: &str) -> Option<String> {
    status
        .metadata()
        .get(name)
        .map(|v| v.to_str().expect("ASCII").to_owned())
}

#[tokio::test]
async fn a_busy_lock_is_aborted_with_the_holders_lease_as_retry_pushback() {
    let server = RedisServer::start();
    let locker = locker(&server).await;
    // `:` is escaped in the name (`voucher:7%3Aa`), so the message needs percent-encoding.
    let name = voucher_lock("7:a");
    let holder = locker
        .lock(name.clone())
        .lease(Duration::from_millis(4_500))
        .await
        .unwrap();
    // The name shown on purpose, and a cap above the holder's lease.
    let channel = serve(
        LockLayer::new(locker.clone())
            .key_from_parts(key)
            .error_responses(
                ErrorResponses::new()
                    .hide_names(false)
                    .max_retry_after(Duration::from_secs(60)),
            ),
        Orders::default(),
    )
    .await;

    let status = place(&channel, &[("x-voucher", "7:a")]).await.unwrap_err();
    assert_eq!(status.code(), Code::Aborted, "{status:?}");
    assert_eq!(
        status.message(),
        format!("another request holds this lock; retry later (lock `{name}`)")
    );
    let pushback: u64 = metadata(&status, "grpc-retry-pushback-ms")
        .expect("grpc-retry-pushback-ms")
        .parse()
        .unwrap();
    assert!((3_000..=4_500).contains(&pushback), "{pushback}");
    let retry_after: u64 = metadata(&status, "retry-after").unwrap().parse().unwrap();
    assert_eq!(retry_after, pushback.div_ceil(1000));

    // `grpc-status-details-bin`: a `google.rpc.Status` with the same code and message, and a
    // `RetryInfo` of the same delay.
    let details = <RpcStatus as prost::Message>::decode(status.details()).expect("protobuf");
    assert_eq!(details.code, Code::Aborted as i32);
    assert_eq!(details.message, status.message());
    assert_eq!(details.details.len(), 1);
    assert_eq!(
        details.details[0].type_url,
        "type.googleapis.com/google.rpc.RetryInfo"
    );
    let retry = <RetryInfo as prost::Message>::decode(&details.details[0].value[..]).unwrap();
    let delay = retry.retry_delay.expect("retry_delay");
    assert_eq!(
        u64::try_from(delay.seconds).unwrap() * 1000
            + u64::try_from(delay.nanos).unwrap() / 1_000_000,
        pushback
    );

    // Once the holder lets go, the call runs under the lock and sees its fencing token.
    assert!(holder.release().await.is_released());
    let reply = place(&channel, &[("x-voucher", "7:a")])
        .await
        .expect("served");
    assert!(reply.fencing_token > 0);

    // With hidden names, the message leaves the name out; the retry metadata stays. An HTTP
    // error handler is not asked about gRPC calls.
    let _holder = locker.lock(name.clone()).await.unwrap();
    let hidden = serve(
        LockLayer::new(locker.clone())
            .key_from_parts(key)
            .hide_names(true)
            .on_rejection(|_| Some(http::Response::new(String::from("an HTTP page")))),
        Orders::default(),
    )
    .await;
    let status = place(&hidden, &[("x-voucher", "7:a")]).await.unwrap_err();
    assert_eq!(status.code(), Code::Aborted);
    assert_eq!(
        status.message(),
        "another request holds this lock; retry later"
    );
    assert!(metadata(&status, "grpc-retry-pushback-ms").is_some());
}

#[tokio::test]
async fn redis_down_is_unavailable_without_the_backends_error() {
    let mut server = RedisServer::start();
    let locker = locker(&server).await;
    let channel = serve(
        LockLayer::new(locker).key_from_parts(key),
        Orders::default(),
    )
    .await;
    server.kill();
    let started = Instant::now();
    let status = place(&channel, &[("x-voucher", "1")]).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        status.message(),
        "the lock service could not be reached; retry later"
    );
    assert!(metadata(&status, "grpc-retry-pushback-ms").is_none());
    assert!(status.details().is_empty());
}

#[tokio::test]
async fn losing_the_lock_cancels_the_call_with_aborted() {
    let server = RedisServer::start();
    let locker = locker(&server).await;
    let orders = Orders {
        hold: Duration::from_secs(10),
        ..Orders::default()
    };
    let channel = serve(
        LockLayer::new(locker.clone())
            .key_from_parts(key)
            .watchdog_lease(Duration::from_millis(600))
            .hide_names(false),
        orders.clone(),
    )
    .await;
    let call = tokio::spawn(async move { place(&channel, &[("x-voucher", "3")]).await });
    tokio::time::timeout(Duration::from_secs(3), orders.started.notified())
        .await
        .expect("the handler runs");
    let mut con = server.connection().await;
    let () = con
        .del(locker.key_of(voucher_lock("3")).unwrap())
        .await
        .unwrap();
    let status = tokio::time::timeout(Duration::from_secs(3), call)
        .await
        .expect("cancelled promptly")
        .unwrap()
        .unwrap_err();
    assert_eq!(status.code(), Code::Aborted, "{status:?}");
    assert_eq!(
        status.message(),
        "the lock was lost while the request ran; the request was cancelled (lock `voucher:3`)"
    );
    assert!(
        orders.dropped.load(Ordering::SeqCst),
        "the handler was not cancelled"
    );
}

#[tokio::test]
async fn an_invalid_key_is_invalid_argument_and_a_refused_lease_internal() {
    let server = RedisServer::start();
    let locker = locker(&server).await;
    let channel = serve(
        LockLayer::new(locker.clone()).key_from_parts(key),
        Orders::default(),
    )
    .await;
    let long = "x".repeat(600);
    let status = place(&channel, &[("x-raw", &long)]).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert_eq!(
        status.message(),
        "invalid lock name: 600 bytes is longer than the limit of 512"
    );

    // A fixed lease the core refuses: a server-side problem, told without its details.
    let refused = serve(
        LockLayer::new(locker)
            .key_from_parts(key)
            .lease(Duration::from_millis(1)),
        Orders::default(),
    )
    .await;
    let status = place(&refused, &[("x-voucher", "1")]).await.unwrap_err();
    assert_eq!(status.code(), Code::Internal, "{status:?}");
    assert_eq!(status.message(), "the lock could not be taken");
}

// With `hold_until_body_ends`, a lock lost while a streamed answer is sent ends the stream with
// `ABORTED` trailers (and a message without the internal error), not a bare stream reset.
#[tokio::test]
async fn losing_the_lock_while_a_held_stream_is_sent_ends_it_with_aborted_trailers() {
    use http_body_util::BodyExt as _;
    use tower::ServiceExt as _;

    let server = RedisServer::start();
    let locker = locker(&server).await;
    let name = dlock_tests::unique_name("grpc-stream");
    let service = tower::ServiceBuilder::new()
        .layer(
            LockLayer::new(locker.clone())
                .key_from_parts({
                    let name = name.clone();
                    move |_: &Parts| name.clone()
                })
                .watchdog_lease(Duration::from_millis(600))
                .hold_until_body_ends(true)
                .hide_names(false),
        )
        .service_fn(|_req: http::Request<axum::body::Body>| async {
            let chunks = futures_util::stream::unfold(0u32, |n| async move {
                if n == 50 {
                    return None;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                Some((
                    Ok::<_, std::io::Error>(bytes::Bytes::from_static(b"\0\0\0\0\0")),
                    n + 1,
                ))
            });
            let mut response = http::Response::new(axum::body::Body::from_stream(chunks));
            response.headers_mut().insert(
                "content-type",
                http::HeaderValue::from_static("application/grpc"),
            );
            Ok::<_, Infallible>(response)
        });
    let request = http::Request::post("/shop.Orders/Watch")
        .header("content-type", "application/grpc")
        .body(axum::body::Body::empty())
        .unwrap();
    let response = service.oneshot(request).await.unwrap();
    let mut body = response.into_body();
    let _first = body.frame().await.unwrap().unwrap();
    let mut con = server.connection().await;
    let () = con
        .del(locker.key_of(name.as_str()).unwrap())
        .await
        .unwrap();
    let mut trailers = None;
    let mut errored = None;
    loop {
        match tokio::time::timeout(Duration::from_secs(3), body.frame())
            .await
            .unwrap()
        {
            Some(Ok(frame)) => {
                if let Some(t) = frame.trailers_ref() {
                    trailers = Some(t.clone());
                }
            }
            Some(Err(e)) => {
                errored = Some(e.to_string());
                break;
            }
            None => break,
        }
    }
    let trailers = trailers.unwrap_or_else(|| {
        panic!("no ABORTED trailers; the body ended with {errored:?}");
    });
    assert_eq!(errored, None);
    assert_eq!(trailers["grpc-status"], "10");
    assert_eq!(
        trailers["grpc-message"],
        format!(
            "the lock was lost while the request ran; the request was cancelled (lock `{name}`)"
        )
        .as_str()
    );
}
