//! A dependency down or a client that stalls: a quick, clear answer, never a 500 or a hang.

mod common;

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::shop;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// The database gone: every route that needs it answers 503 problem+json with `Retry-After`
/// within 2 s, saying nothing of the database's own error.
#[tokio::test]
async fn the_database_down_is_a_503_within_two_seconds() {
    let shop = shop().await;
    let alice = shop.login("alice").await;
    let voucher = shop.open_voucher(5).await;
    shop.app.db.close().await;
    for (method, uri, operator) in [
        ("GET", "/api/vouchers".to_owned(), false),
        ("GET", "/api/skus".to_owned(), false),
        ("GET", "/api/cart".to_owned(), false),
        ("POST", format!("/api/vouchers/{voucher}/orders"), false),
        ("GET", "/api/stats".to_owned(), true),
    ] {
        let started = Instant::now();
        let mut request = Request::builder()
            .method(method)
            .uri(&uri)
            .header("cookie", &alice.cookie);
        if operator {
            request = request.header(
                "authorization",
                format!("Bearer {}", common::OPERATOR_TOKEN),
            );
        }
        let answer = shop.send(request.body(Body::empty()).unwrap()).await;
        assert!(started.elapsed() < Duration::from_secs(2), "{uri}");
        assert_eq!(
            answer.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{uri}: {answer:?}"
        );
        assert_eq!(answer.headers["retry-after"], "1", "{uri}");
        for leak in ["pool", "closed", "sqlite", "sqlx"] {
            assert!(
                !answer.text.to_lowercase().contains(leak),
                "{uri}: {}",
                answer.text
            );
        }
    }
    let answer = shop
        .send(
            Request::post("/api/login")
                .header("content-type", "application/json")
                .body(Body::from(r#"{"name":"bob"}"#))
                .unwrap(),
        )
        .await;
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
}

/// A request body that stops arriving is cut after a few seconds with 408, and the connection
/// is closed: a slow client can't hold a connection and a task for long.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_stalls_is_cut_with_a_408() {
    let shop = shop().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let router = shop.router.clone();
    let server = tokio::spawn(async move { axum::serve(listener, router).await });
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    stream
        .write_all(
            b"POST /api/login HTTP/1.1\r\nhost: shop\r\ncontent-type: application/json\r\n\
              content-length: 100\r\n\r\n{\"name\":",
        )
        .await
        .unwrap();
    let started = Instant::now();
    let mut answer = Vec::new();
    // The whole answer, then the end of the stream: the shop closes the connection.
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .expect("an answer and a closed connection within 10 s")
        .unwrap();
    let took = started.elapsed();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("application/problem+json"), "{answer}");
    assert!(answer.contains("did not arrive within 5 s"), "{answer}");
    assert!(
        took >= Duration::from_secs(4) && took < Duration::from_secs(7),
        "{took:?}"
    );
    assert!(!server.is_finished());
    server.abort();
}
