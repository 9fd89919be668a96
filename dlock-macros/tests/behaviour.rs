//! `#[distributed_lock]` against a real `redis-server`: held during the body, released on every
//! exit path, re-entered when nested, cancelled (or signalled) on loss, keys from fields and
//! `self`, several names all-or-none, the default locker.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use dlock_core::redis::AsyncCommands as _;
use dlock_core::{LockError, Locker, distributed_lock};
use dlock_tests::{RedisServer, unique_name};
use tokio::sync::oneshot;

#[derive(Debug)]
enum AppError {
    Lock(LockError),
    Rejected,
}

impl From<LockError> for AppError {
    fn from(err: LockError) -> Self {
        AppError::Lock(err)
    }
}

impl AppError {
    fn lock(&self) -> Option<&LockError> {
        match self {
            AppError::Lock(err) => Some(err),
            AppError::Rejected => None,
        }
    }
}

async fn locker(server: &RedisServer) -> Locker {
    Locker::builder()
        .url(server.url())
        .default_lease(dlock_core::Lease::watchdog(Duration::from_millis(600)))
        .build()
        .await
        .expect("connect")
}

/// Polls until `name` can be taken (then releases it) or `within` passes.
async fn free_within(locker: &Locker, name: &str, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if let Ok(Some(guard)) = locker.lock(name).try_lock().await {
            assert!(guard.release().await.is_released());
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[distributed_lock(key = "job:<id>", locker = locker)]
async fn hold_until(
    locker: &Locker,
    id: &str,
    entered: oneshot::Sender<u64>,
    leave: oneshot::Receiver<()>,
) -> Result<(), AppError> {
    let token = dlock_core::scope::fencing_token().await?.get();
    let _ = entered.send(token);
    let _ = leave.await;
    Ok(())
}

#[distributed_lock(key = "job:<id>", locker = locker, wait = "0s")]
async fn try_job(locker: &Locker, id: &str) -> Result<u64, AppError> {
    Ok(dlock_core::scope::fencing_token().await?.get())
}

#[tokio::test]
async fn the_lock_is_held_during_the_body() {
    let server = RedisServer::start();
    let locker = locker(&server).await;
    let id = unique_name("held");
    let (entered_tx, entered_rx) = oneshot::channel();
    let (leave_tx, leave_rx) = oneshot::channel();
    let holder = tokio::spawn({
        let (locker, id) = (locker.clone(), id.clone());
        async move { hold_until(&locker, &id, entered_tx, leave_rx).await }
    });
    let token = entered_rx.await.expect("the body ran");
    assert!(token > 0, "the body sees its fencing token");
    let err = try_job(&locker, &id).await.unwrap_err();
    let err = err.lock().expect("a lock error");
    assert!(err.is_busy(), "{err}");
    assert!(err.retry_after().is_some());
    leave_tx.send(()).unwrap();
    holder.await.unwrap().unwrap();
    let next = try_job(&locker, &id).await.unwrap();
    assert!(next > token);
}

#[distributed_lock(key = "exit:<id>", locker = locker)]
async fn exits(locker: &Locker, id: &str, how: &str) -> Result<(), AppError> {
    match how {
        "early" => {
            Err(AppError::Rejected)?;
            unreachable!()
        }
        "panic" => panic!("the body panicked"),
        "hang" => {
            std::future::pending::<()>().await;
            Ok(())
        }
        _ => Ok(()),
    }
}

#[tokio::test]
async fn the_lock_is_released_on_every_exit_path() {
    let server = RedisServer::start();
    let locker = locker(&server).await;
    let id = unique_name("exit");
    let name = format!("exit:{id}");

    exits(&locker, &id, "normal").await.unwrap();
    assert!(
        free_within(&locker, &name, Duration::ZERO).await,
        "after a normal return"
    );

    assert!(matches!(
        exits(&locker, &id, "early").await,
        Err(AppError::Rejected)
    ));
    assert!(
        free_within(&locker, &name, Duration::ZERO).await,
        "after `?`"
    );

    let panicked = tokio::spawn({
        let (locker, id) = (locker.clone(), id.clone());
        async move { exits(&locker, &id, "panic").await }
    })
    .await;
    assert!(panicked.unwrap_err().is_panic());
    assert!(
        free_within(&locker, &name, Duration::from_secs(2)).await,
        "after a panic"
    );

    let cancelled =
        tokio::time::timeout(Duration::from_millis(100), exits(&locker, &id, "hang")).await;
    assert!(cancelled.is_err());
    assert!(
        free_within(&locker, &name, Duration::from_secs(2)).await,
        "after the caller's future was dropped"
    );
}

#[distributed_lock(key = "nested:<id>", locker = locker, wait = "200ms")]
async fn outer(locker: &Locker, id: &str) -> Result<(u64, u64), AppError> {
    let mine = dlock_core::scope::fencing_token().await?.get();
    let inner = inner(locker, id).await?;
    Ok((mine, inner))
}

#[distributed_lock(key = "nested:<id>", locker = locker, wait = "200ms")]
async fn inner(locker: &Locker, id: &str) -> Result<u64, AppError> {
    Ok(dlock_core::scope::fencing_token().await?.get())
}

#[distributed_lock(key = "nested:<id>", locker = locker, wait = "200ms", reentrant = false)]
async fn outer_not_reentrant(locker: &Locker, id: &str) -> Result<u64, AppError> {
    inner(locker, id).await
}

#[tokio::test]
async fn nested_calls_on_the_same_key_re_enter() {
    let server = RedisServer::start();
    let locker = locker(&server).await;
    let id = unique_name("nested");
    let (outer_token, inner_token) = outer(&locker, &id).await.unwrap();
    assert_eq!(outer_token, inner_token);
    assert!(free_within(&locker, &format!("nested:{id}"), Duration::ZERO).await);

    let err = outer_not_reentrant(&locker, &id).await.unwrap_err();
    assert!(err.lock().is_some_and(LockError::is_busy), "{err:?}");
}

#[distributed_lock(key = "doomed:<id>", locker = locker)]
async fn long_work(
    locker: &Locker,
    id: &str,
    started: oneshot::Sender<()>,
    finished: Arc<AtomicBool>,
) -> Result<(), AppError> {
    let _ = started.send(());
    tokio::time::sleep(Duration::from_secs(30)).await;
    finished.store(true, Ordering::SeqCst);
    Ok(())
}

#[distributed_lock(key = "signalled:<id>", locker = locker, on_lost = "signal")]
async fn watches_its_lock(
    locker: &Locker,
    id: &str,
    started: oneshot::Sender<()>,
) -> Result<bool, AppError> {
    let held = dlock_core::scope::held_lock().expect("inside the lock");
    let _ = started.send(());
    let lost = tokio::time::timeout(Duration::from_secs(5), held.lost()).await;
    Ok(lost.is_ok() && held.is_lost())
}

#[tokio::test]
async fn losing_the_lock_cancels_the_body_or_signals_it() {
    let server = RedisServer::start();
    let locker = locker(&server).await;
    let mut con = server.connection().await;

    let id = unique_name("doomed");
    let finished = Arc::new(AtomicBool::new(false));
    let (started_tx, started_rx) = oneshot::channel();
    let work = tokio::spawn({
        let (locker, id, finished) = (locker.clone(), id.clone(), finished.clone());
        async move { long_work(&locker, &id, started_tx, finished).await }
    });
    started_rx.await.unwrap();
    let key = locker.key_of(format!("doomed:{id}")).unwrap();
    let deleted_at = Instant::now();
    let () = con.del(&key).await.unwrap();
    let result = tokio::time::timeout(Duration::from_secs(5), work)
        .await
        .expect("the body was cancelled")
        .unwrap();
    let err = result.unwrap_err();
    assert!(err.lock().is_some_and(LockError::is_lost), "{err:?}");
    assert!(deleted_at.elapsed() < Duration::from_secs(1));
    assert!(!finished.load(Ordering::SeqCst));

    let id = unique_name("signalled");
    let (started_tx, started_rx) = oneshot::channel();
    let work = tokio::spawn({
        let (locker, id) = (locker.clone(), id.clone());
        async move { watches_its_lock(&locker, &id, started_tx).await }
    });
    started_rx.await.unwrap();
    let key = locker.key_of(format!("signalled:{id}")).unwrap();
    let () = con.del(&key).await.unwrap();
    assert!(
        work.await.unwrap().unwrap(),
        "the body saw the loss and ran on"
    );
}

struct Customer {
    id: u64,
    region: String,
}

struct Order {
    customer: Customer,
    number: u32,
}

struct Shop {
    locker: Locker,
    name: String,
    calls: AtomicU32,
}

impl Shop {
    #[distributed_lock(key = "shop:<self.name>:order:<order.customer.region>:<order.customer.id>:<order.number>", locker = self.locker)]
    async fn place(&self, order: &Order) -> Result<String, AppError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let held = dlock_core::scope::held_lock().expect("inside the lock");
        Ok(held.name().to_string())
    }

    #[distributed_lock(key = "shop:<self.name>:restock", locker = self.locker.clone())]
    async fn restock(&mut self, amount: u32) -> Result<u32, AppError> {
        self.name.push('!');
        Ok(amount)
    }
}

#[tokio::test]
async fn keys_come_from_struct_fields_and_self() {
    let server = RedisServer::start();
    let mut shop = Shop {
        locker: locker(&server).await,
        name: "north".to_owned(),
        calls: AtomicU32::new(0),
    };
    let order = Order {
        customer: Customer {
            id: 7,
            region: "eu:west".to_owned(),
        },
        number: 3,
    };
    let name = shop.place(&order).await.unwrap();
    // Values are escaped: the `:` inside the region can't forge another key.
    assert_eq!(name, "shop:north:order:eu%3Awest:7:3");
    assert_eq!(shop.restock(5).await.unwrap(), 5);
    assert_eq!(shop.name, "north!");
    assert_eq!(shop.calls.load(Ordering::SeqCst), 1);
}

#[distributed_lock(key = "sku:<skus*>", locker = locker, wait = "100ms")]
async fn checkout(locker: &Locker, skus: &[String]) -> Result<usize, AppError> {
    Ok(skus.len())
}

#[tokio::test]
async fn collections_are_locked_all_or_none() {
    let server = RedisServer::start();
    let locker = locker(&server).await;
    let prefix = unique_name("cart");
    let skus: Vec<String> = (1..=3).map(|i| format!("{prefix}-{i}")).collect();
    assert_eq!(checkout(&locker, &skus).await.unwrap(), 3);

    let blocker = locker.lock(format!("sku:{}", skus[1])).await.unwrap();
    let err = checkout(&locker, &skus).await.unwrap_err();
    assert!(err.lock().is_some_and(LockError::is_busy), "{err:?}");
    // None of the others stayed held.
    for sku in [&skus[0], &skus[2]] {
        assert!(free_within(&locker, &format!("sku:{sku}"), Duration::ZERO).await);
    }
    assert!(blocker.release().await.is_released());
    assert_eq!(checkout(&locker, &skus).await.unwrap(), 3);

    // Nothing to lock: the body runs.
    assert_eq!(checkout(&locker, &[]).await.unwrap(), 0);
}

#[distributed_lock(key = "cart:<user>", key = "sku:<skus*>", locker = locker, wait = "100ms")]
async fn checkout_cart(locker: &Locker, user: &str, skus: Vec<String>) -> Result<usize, AppError> {
    let held = dlock_core::scope::held_lock().expect("inside the lock");
    assert!(!held.is_lost());
    Ok(skus.len())
}

#[tokio::test]
async fn several_keys_are_locked_all_or_none() {
    let server = RedisServer::start();
    let locker = locker(&server).await;
    let user = unique_name("user");
    let prefix = unique_name("cart-sku");
    let skus: Vec<String> = (1..=2).map(|i| format!("{prefix}-{i}")).collect();
    let all: Vec<String> = std::iter::once(format!("cart:{user}"))
        .chain(skus.iter().map(|sku| format!("sku:{sku}")))
        .collect();

    assert_eq!(
        checkout_cart(&locker, &user, skus.clone()).await.unwrap(),
        2
    );
    for name in &all {
        assert!(free_within(&locker, name, Duration::ZERO).await, "{name}");
    }

    // The cart is busy: no SKU stays held.
    let blocker = locker.lock(all[0].as_str()).await.unwrap();
    let err = checkout_cart(&locker, &user, skus.clone())
        .await
        .unwrap_err();
    assert!(err.lock().is_some_and(LockError::is_busy), "{err:?}");
    for name in &all[1..] {
        assert!(free_within(&locker, name, Duration::ZERO).await, "{name}");
    }
    assert!(blocker.release().await.is_released());

    // A value the core refuses: an error before anything is locked.
    let mut bad = skus.clone();
    bad.push("line\nbreak".to_owned());
    let err = checkout_cart(&locker, &user, bad).await.unwrap_err();
    assert!(
        err.lock().is_some_and(LockError::is_invalid_name),
        "{err:?}"
    );
    for name in &all {
        assert!(free_within(&locker, name, Duration::ZERO).await, "{name}");
    }
}

#[distributed_lock(key = "default:<id>")]
async fn uses_the_default_locker(id: &str) -> Result<u64, AppError> {
    Ok(dlock_core::scope::fencing_token().await?.get())
}

#[tokio::test]
async fn the_default_locker_is_used_or_its_absence_is_a_clear_error() {
    let id = unique_name("default");
    let err = uses_the_default_locker(&id).await.unwrap_err();
    let err = err.lock().expect("a lock error");
    assert!(err.is_config(), "{err}");
    assert!(err.to_string().contains("set_default_locker"), "{err}");

    let server = RedisServer::start();
    dlock_core::set_default_locker(locker(&server).await).unwrap();
    assert!(uses_the_default_locker(&id).await.unwrap() > 0);
}

#[distributed_lock(key = "report:<day>", locker = locker, at_least = "700ms")]
async fn nightly_report(locker: &Locker, day: &str, runs: &AtomicU32) -> Result<(), LockError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

#[tokio::test]
async fn at_least_runs_a_job_once_per_period_across_instances() {
    let server = RedisServer::start();
    let (a, b) = (locker(&server).await, locker(&server).await);
    let day = unique_name("day");
    let runs = AtomicU32::new(0);
    let started = Instant::now();
    nightly_report(&a, &day, &runs).await.expect("first run");
    // Another instance, right after the first finished: the period is not over.
    let err = nightly_report(&b, &day, &runs)
        .await
        .expect_err("same period");
    assert!(err.is_busy(), "{err}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // The next period.
    assert!(free_within(&b, &format!("report:{day}"), Duration::from_secs(3)).await);
    assert!(started.elapsed() >= Duration::from_millis(700));
    nightly_report(&b, &day, &runs).await.expect("next period");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[distributed_lock(key = "ledger:<account>", locker = locker, wait = "10s", fair = true)]
async fn post_entry(
    locker: &Locker,
    account: &str,
    entry: u32,
    posted: &std::sync::Mutex<Vec<u32>>,
) -> Result<(), LockError> {
    posted.lock().unwrap().push(entry);
    tokio::time::sleep(Duration::from_millis(5)).await;
    Ok(())
}

#[tokio::test]
async fn fair_callers_take_turns_in_the_order_they_came() {
    let server = RedisServer::start();
    let (a, b) = (locker(&server).await, locker(&server).await);
    let account = unique_name("account");
    let posted = Arc::new(std::sync::Mutex::new(Vec::new()));
    let holder = (a.fair_lock(format!("ledger:{account}")).await).expect("first");
    let mut calls = Vec::new();
    for entry in 0..6u32 {
        let locker = if entry % 2 == 0 { a.clone() } else { b.clone() };
        let (own, posted) = (account.clone(), posted.clone());
        calls.push(tokio::spawn(async move {
            post_entry(&locker, &own, entry, &posted).await
        }));
        // The call stands in line before the next one comes.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let info = a
                .inspect(format!("ledger:{account}"))
                .await
                .expect("inspect");
            if info.queued_waiters == u64::from(entry) + 1 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "call {entry} not in line: {info:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    assert!(holder.release().await.is_released());
    for call in calls {
        call.await.expect("task").expect("posted");
    }
    assert_eq!(*posted.lock().unwrap(), vec![0, 1, 2, 3, 4, 5]);
}
