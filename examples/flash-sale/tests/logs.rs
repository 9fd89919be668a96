//! What the shop logs: a span per request carrying its id, the status of every answer, lock
//! outcomes, and the cause of a 500 (which its body leaves out). Captured by the harness's
//! subscriber on a current-thread runtime, so everything the request runs reports to it.

mod common;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use dlock_tests::capture::Capture;
use tracing::Level;

#[tokio::test]
async fn requests_are_logged_with_their_id_status_and_lock_outcome() {
    let logs = Capture::default();
    let _default = tracing::subscriber::set_default(logs.clone());
    let shop = common::shop().await;
    let user = shop.login("logged").await;
    let sku = shop.sku("Logged mug", 3).await;
    shop.add(&user, sku, 1).await;
    let answer = shop
        .send(
            Request::post("/api/cart/checkout")
                .header("cookie", &user.cookie)
                .header("x-request-id", "log-test-1")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(answer.status, StatusCode::CREATED, "{}", answer.text);

    let request = logs
        .spans("request")
        .into_iter()
        .find(|s| s.fields.get("request_id").map(String::as_str) == Some("log-test-1"))
        .unwrap_or_else(|| panic!("no span for the request: {}", logs.text()));
    assert_eq!(
        request.fields.get("path").map(String::as_str),
        Some("/api/cart/checkout")
    );
    let locked = logs.events_saying("locks acquired");
    assert!(
        locked.iter().any(|e| e
            .fields
            .get("locks")
            .is_some_and(|l| l.contains(&format!("cart:{}", user.id)))),
        "{}",
        logs.text()
    );
    assert!(
        logs.events().iter().any(|e| e.message() == "request"
            && e.fields.get("status").map(String::as_str) == Some("201")),
        "{}",
        logs.text()
    );

    // A busy checkout's refusal is logged with its outcome.
    let held = shop
        .app
        .locker
        .lock(format!("cart:{}", user.id))
        .await
        .expect("hold the cart");
    shop.add(&user, sku, 1).await;
    let busy = shop
        .send(
            Request::post("/api/cart/checkout")
                .header("cookie", &user.cookie)
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    // Adding to the cart waits for the cart lock too: the add above was refused or waited;
    // either way the checkout is refused busy while the cart is held.
    assert_eq!(busy.status, StatusCode::CONFLICT, "{}", busy.text);
    assert!(
        logs.events_saying("checkout locks refused")
            .iter()
            .any(|e| e.fields.get("outcome").map(String::as_str) == Some("busy")),
        "{}",
        logs.text()
    );
    assert!(held.release().await.is_released());

    // A 500's cause goes to the log at ERROR, never to the body.
    shop.app.db.close().await;
    let broken = shop
        .send(Request::get("/api/skus").body(Body::empty()).unwrap())
        .await;
    assert!(broken.status.is_server_error(), "{}", broken.text);
    assert!(
        logs.events()
            .iter()
            .any(|e| e.level == Level::ERROR && e.message().contains("database")),
        "{}",
        logs.text()
    );
    assert!(
        !broken.text.to_ascii_lowercase().contains("pool"),
        "{}",
        broken.text
    );
}
