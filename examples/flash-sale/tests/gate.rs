//! The voucher gate: at most `buyers_per_voucher` buyers of one voucher in the order path at once,
//! on every instance together — a semaphore in the real `redis-server` both instances share.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use axum::http::StatusCode;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_the_gates_buyers_of_one_voucher_are_in_the_order_path_across_instances() {
    const GATE: u32 = 2;
    let mut shop = common::shop().await;
    shop.app.buyers_per_voucher = GATE;
    shop.router = flash_sale::router(shop.app.clone());
    // A second instance: its own locker and counters, the same Redis and database.
    let url = format!(
        "sqlite://{}?mode=rwc",
        shop._dir.path().join("shop.db").display()
    );
    let locker = flash_sale::server::locker(&shop.redis.url()).await.unwrap();
    let mut other = flash_sale::app(&url, locker.clone(), true).await.unwrap();
    other.buyers_per_voucher = GATE;
    let routers = [shop.router.clone(), flash_sale::router(other.clone())];

    let voucher = shop.open_voucher(1_000).await;
    let mut users = Vec::new();
    for i in 0..40 {
        users.push(shop.login(&format!("gate-{i}")).await);
    }
    // Redis's own count of the permits out, sampled while the buyers run.
    let semaphore = locker.semaphore(format!("sale:{voucher}"), GATE);
    let (done, most_seen) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU32::new(0)),
    );
    let sampler = tokio::spawn({
        let (done, most_seen) = (done.clone(), most_seen.clone());
        async move {
            while !done.load(Ordering::SeqCst) {
                let held = semaphore.status().await.expect("status").held;
                most_seen.fetch_max(held, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    });
    let mut buys = Vec::new();
    for (i, user) in users.into_iter().enumerate() {
        let router = routers[i % 2].clone();
        buys.push(tokio::spawn(async move {
            let request = axum::http::Request::post(format!("/api/vouchers/{voucher}/orders"))
                .header("cookie", user.cookie)
                .body(axum::body::Body::empty())
                .unwrap();
            tower::ServiceExt::oneshot(router, request)
                .await
                .unwrap()
                .status()
        }));
    }
    for buy in buys {
        assert_eq!(
            buy.await.unwrap(),
            StatusCode::CREATED,
            "every buyer gets in, in turn"
        );
    }
    done.store(true, Ordering::SeqCst);
    sampler.await.unwrap();
    let (here, there) = (
        shop.app.counters.most_buying(),
        other.counters.most_buying(),
    );
    assert!(
        here <= u64::from(GATE) && there <= u64::from(GATE),
        "{here} and {there}"
    );
    assert!(
        most_seen.load(Ordering::SeqCst) <= GATE,
        "Redis counted more permits out"
    );
    assert!(
        here + there >= 2,
        "the buyers never overlapped: {here} and {there}"
    );
}
