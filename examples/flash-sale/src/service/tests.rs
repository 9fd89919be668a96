//! The fences, deterministically: a holder paused past its lease is refused, whichever of it
//! and its successor reaches the row first — and a refused checkout writes nothing at all.

use dlock_core::{FencingToken, Locker};

use super::*;
use crate::model::{CartItem, NewSku, NewVoucher};
use crate::now_ms;

async fn shop() -> (App, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("shop.db").display());
    let app = crate::app(&url, dlock_core::Locker::memory(), true)
        .await
        .unwrap();
    (app, dir)
}

async fn open_voucher(app: &App, stock: i64) -> crate::model::Voucher {
    let new = NewVoucher {
        title: "v".into(),
        price_cents: 1,
        stock,
        starts_at_ms: now_ms() - 1_000,
        ends_at_ms: now_ms() + 60_000,
    };
    app.create_voucher(&new).await.unwrap()
}

async fn sku(app: &App, name: &str, stock: i64) -> i64 {
    let new = NewSku {
        name: name.into(),
        price_cents: 100,
        stock,
    };
    app.create_sku(&new).await.unwrap().id
}

async fn stale_refused(app: &App) -> u64 {
    app.stats().await.unwrap().stale_refused
}

#[tokio::test]
async fn a_stale_order_writer_is_refused_after_its_successor_claimed_the_slot() {
    let (app, _dir) = shop().await;
    let user = app.login("u").await.unwrap().id;
    let voucher = open_voucher(&app, 10).await;
    // Holder 5 claims and checks, then pauses; its lease runs out and holder 6 takes over.
    app.claim_order_slot(user, voucher.id, 5).await.unwrap();
    app.claim_order_slot(user, voucher.id, 6).await.unwrap();
    // Holder 5 wakes up and writes: refused, nothing written.
    let err = app
        .write_order(user, &voucher, Some(5), now_ms())
        .await
        .unwrap_err();
    assert!(matches!(err, AppError::Stale(_)), "{err:?}");
    // Holder 6 writes: accepted. One order, one unit of stock.
    let order = app
        .write_order(user, &voucher, Some(6), now_ms())
        .await
        .unwrap();
    assert_eq!(order.fencing_token, 6);
    // A holder with an older token can't even claim any more.
    let err = app.claim_order_slot(user, voucher.id, 4).await.unwrap_err();
    assert!(matches!(err, AppError::Stale(_)), "{err:?}");
    let stats = app.stats().await.unwrap();
    assert_eq!(stats.voucher_orders, 1);
    assert_eq!(stats.stale_refused, 2);
    assert_eq!(stats.units_lost, 0);
    assert_eq!(app.voucher(voucher.id).await.unwrap().stock, 9);
}

#[tokio::test]
async fn a_stale_order_writer_that_wrote_first_is_seen_by_its_successor() {
    let (app, _dir) = shop().await;
    let user = app.login("u").await.unwrap().id;
    let voucher = open_voucher(&app, 10).await;
    app.claim_order_slot(user, voucher.id, 5).await.unwrap();
    app.write_order(user, &voucher, Some(5), now_ms())
        .await
        .unwrap();
    // The successor claims after that write, so its check sees the order.
    let err = app
        .place_order(user, voucher.id, Some(6))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("one order per user"), "{err:?}");
    assert_eq!(app.stats().await.unwrap().voucher_orders, 1);
}

/// Fencing tokens numbered `token` above any the lock store mints (it mints from its clock, in
/// µs since 1970), so they count as newer than those of the locks the test's calls took.
fn fences(cart_of: i64, skus: &[i64], token: u64) -> Fences {
    const ABOVE_THE_CLOCK: u64 = 1 << 62;
    let token = FencingToken::new(ABOVE_THE_CLOCK + token);
    let mut fences = Fences::default();
    fences.insert(&cart_lock_name(cart_of).unwrap(), token);
    for sku in skus {
        fences.insert(&sku_lock_name(*sku).unwrap(), token);
    }
    fences
}

#[tokio::test]
async fn a_stale_stock_writer_is_refused_and_writes_nothing() {
    let (app, _dir) = shop().await;
    let a = sku(&app, "a", 5).await;
    let b = sku(&app, "b", 5).await;
    let (one, two) = (
        app.login("one").await.unwrap().id,
        app.login("two").await.unwrap().id,
    );
    for user in [one, two] {
        for sku in [a, b] {
            let item = CartItem {
                sku_id: sku,
                qty: 1,
            };
            app.add_to_cart(user, &item).await.unwrap();
        }
    }
    // User 2's checkout holds newer tokens for both SKUs and goes through.
    app.checkout(two, Some(&fences(two, &[a, b], 8)))
        .await
        .unwrap();
    // User 1's checkout under older SKU tokens (a holder paused past its lease) is refused.
    let err = app
        .checkout(one, Some(&fences(one, &[a, b], 7)))
        .await
        .unwrap_err();
    assert!(matches!(err, AppError::Stale(_)), "{err:?}");
    let skus = app.skus().await.unwrap();
    assert!(skus.iter().all(|s| s.stock == 4), "{skus:?}");
    assert_eq!(
        app.cart(one).await.unwrap().items.len(),
        2,
        "the cart is kept"
    );
    assert!(app.cart(two).await.unwrap().items.is_empty());
    let stats = app.stats().await.unwrap();
    assert_eq!(stats.units_lost, 0, "{stats:?}");
    assert_eq!(stats.units_sold, 2, "{stats:?}");
    assert_eq!(stale_refused(&app).await, 1);
}

/// Defect 1: the layer chose the locks from the cart before the user added a SKU. The checkout
/// refuses the SKU it doesn't hold, writes no stock at all (not even the locked SKU's), and
/// keeps the cart.
#[tokio::test]
async fn checkout_refuses_a_sku_it_holds_no_lock_for_and_writes_nothing() {
    let (app, _dir) = shop().await;
    let user = app.login("u").await.unwrap().id;
    let locked = sku(&app, "locked", 5).await;
    let added = sku(&app, "added later", 5).await;
    for sku_id in [locked, added] {
        let item = CartItem { sku_id, qty: 2 };
        app.add_to_cart(user, &item).await.unwrap();
    }
    // The locks cover the cart and `locked` only: `added` came in after they were chosen.
    let err = app
        .checkout(user, Some(&fences(user, &[locked], 3)))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("cart changed"), "{err:?}");
    assert!(matches!(err, AppError::Conflict(_)), "{err:?}");
    assert!(app.skus().await.unwrap().iter().all(|s| s.stock == 5));
    assert_eq!(app.cart(user).await.unwrap().items.len(), 2);
    let stats = app.stats().await.unwrap();
    assert_eq!((stats.units_lost, stats.units_sold), (0, 0), "{stats:?}");
    // Without the cart lock the same checkout is refused too.
    let err = app
        .checkout(user, Some(&Fences::default()))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("cart changed"), "{err:?}");
    // Without locks the same cart goes through, unfenced.
    let order = app.checkout(user, None).await.unwrap();
    assert_eq!(order.items.len(), 2);
    assert_eq!(order.total_cents, 400);
    assert!(app.skus().await.unwrap().iter().all(|s| s.stock == 3));
}

/// A cart edit whose holder paused past its lease can't write after a checkout took the cart.
#[tokio::test]
async fn a_stale_cart_claim_is_refused() {
    let (app, _dir) = shop().await;
    let user = app.login("u").await.unwrap().id;
    app.claim_cart(user, 9).await.unwrap();
    let err = app.claim_cart(user, 8).await.unwrap_err();
    assert!(matches!(err, AppError::Stale(_)), "{err:?}");
}

/// A shop locking on a real Redis, and another `Locker` on it: an operator's.
async fn shop_on_redis() -> (App, Locker, dlock_tests::RedisServer, tempfile::TempDir) {
    let redis = dlock_tests::RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("shop.db").display());
    let locker = crate::server::locker(&redis.url()).await.unwrap();
    let app = crate::app(&url, locker, true).await.unwrap();
    let operator = crate::server::locker(&redis.url()).await.unwrap();
    (app, operator, redis, dir)
}

/// The fencing counter of lock `name` (`<lock key>:fence`, a hash), replaced with a string
/// (`broken`) or removed: while it is broken, a lock of that name is still granted but Redis
/// answers the ask for its token with an error, as an unreachable Redis would fail it.
async fn fencing_counter(redis: &dlock_tests::RedisServer, app: &App, name: &str, broken: bool) {
    let key = format!("{}:fence", app.locker.key_of(name).unwrap());
    let mut con = redis.connection().await;
    let mut cmd = dlock_core::redis::cmd(if broken { "SET" } else { "DEL" });
    cmd.arg(&key);
    if broken {
        cmd.arg("not a counter");
    }
    cmd.query_async::<()>(&mut con).await.unwrap();
}

/// A voucher order that can't have its fencing token writes nothing — no slot claimed, no
/// stock taken, no order — and is answered 503, not 500.
#[tokio::test]
async fn an_order_without_its_fencing_token_writes_nothing() {
    let (app, operator, redis, _dir) = shop_on_redis().await;
    let user = app.login("u").await.unwrap().id;
    let voucher = open_voucher(&app, 10).await;
    let name = format!("order:{user}:{}", voucher.id);
    fencing_counter(&redis, &app, &name, true).await;
    let err = app.buy(user, voucher.id).await.unwrap_err();
    assert!(
        matches!(&err, AppError::Lock(lock) if lock.is_backend()),
        "{err:?}"
    );
    assert_eq!(err.status(), axum::http::StatusCode::SERVICE_UNAVAILABLE);
    let slots: i64 = sqlx::query("SELECT COUNT(*) AS n FROM order_slots")
        .fetch_one(&app.db)
        .await
        .unwrap()
        .try_get("n")
        .unwrap();
    assert_eq!(slots, 0);
    assert_eq!(app.voucher(voucher.id).await.unwrap().stock, 10);
    assert_eq!(app.stats().await.unwrap().voucher_orders, 0);
    // Mended (the failed release left the lock to its lease: freed by the operator), the same
    // order goes through under a minted token.
    fencing_counter(&redis, &app, &name, false).await;
    operator.force_release(name.as_str()).await.unwrap();
    let order = app.buy(user, voucher.id).await.unwrap();
    assert!(order.fencing_token > 0, "{order:?}");
}

/// A cart edit that can't have its fencing token changes nothing, and is answered 503.
#[tokio::test]
async fn a_cart_edit_without_its_fencing_token_writes_nothing() {
    let (app, operator, redis, _dir) = shop_on_redis().await;
    let user = app.login("u").await.unwrap().id;
    let sku_id = sku(&app, "mug", 5).await;
    let name = cart_lock_name(user).unwrap().to_string();
    fencing_counter(&redis, &app, &name, true).await;
    let err = app
        .add_to_cart(user, &CartItem { sku_id, qty: 1 })
        .await
        .unwrap_err();
    assert!(
        matches!(&err, AppError::Lock(lock) if lock.is_backend()),
        "{err:?}"
    );
    assert_eq!(err.status(), axum::http::StatusCode::SERVICE_UNAVAILABLE);
    assert!(app.cart(user).await.unwrap().items.is_empty());
    fencing_counter(&redis, &app, &name, false).await;
    operator.force_release(name.as_str()).await.unwrap();
    let cart = app
        .add_to_cart(user, &CartItem { sku_id, qty: 1 })
        .await
        .unwrap();
    assert_eq!(cart.items.len(), 1);
}
