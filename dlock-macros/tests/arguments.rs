//! `wait`, `lease` and `on_lost` as constants and expressions, and the `Locker`'s defaults when
//! the attribute leaves them out, against a real `redis-server`. Times are read on tokio's
//! monotonic clock and bounded generously: a lower bound shows that a wait was waited, an upper
//! bound far above it that it was not some other, longer one.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use dlock_core::redis::AsyncCommands as _;
use dlock_core::redis::aio::MultiplexedConnection;
use dlock_core::{Lease, LockError, LockGuard, Locker, OnLost, distributed_lock};
use dlock_tests::{RedisServer, unique_name};
use tokio::sync::oneshot;
use tokio::time::Instant;

#[derive(Debug)]
enum AppError {
    Lock(LockError),
}

impl From<LockError> for AppError {
    fn from(err: LockError) -> Self {
        AppError::Lock(err)
    }
}

impl AppError {
    fn lock(&self) -> &LockError {
        match self {
            AppError::Lock(err) => err,
        }
    }
}

/// Slack for a loaded machine: a call that should return at once, or right after its wait,
/// returns within this.
const SLACK: Duration = Duration::from_secs(3);

async fn locker_with(server: &RedisServer, wait: Duration, lease: Lease) -> Locker {
    Locker::builder()
        .url(server.url())
        .default_wait(wait)
        .default_lease(lease)
        .build()
        .await
        .expect("connect")
}

/// Holds `name` with a long fixed lease through its own `Locker`, as another process would.
async fn hold(server: &RedisServer, name: &str) -> LockGuard {
    let other = Locker::connect(&server.url()).await.expect("connect");
    other
        .lock(name)
        .lease(Duration::from_secs(60))
        .await
        .expect("free")
}

/// The key's remaining time to live in Redis, in milliseconds.
async fn pttl(con: &mut MultiplexedConnection, locker: &Locker, name: &str) -> i64 {
    let key = locker.key_of(name).expect("a valid name");
    con.pttl(&key).await.expect("PTTL")
}

/// Asserts that `call` returned a timeout after waiting at least `wait`, and not much longer.
fn assert_timed_out_after(result: Result<(), AppError>, started: Instant, wait: Duration) {
    let elapsed = started.elapsed();
    let err = result.expect_err("busy");
    assert!(err.lock().is_busy(), "{err:?}");
    assert!(
        elapsed >= wait,
        "gave up after {elapsed:?}, before {wait:?}"
    );
    assert!(elapsed < wait + SLACK, "gave up after {elapsed:?}");
}

const SHORT_WAIT: Duration = Duration::from_millis(400);

#[distributed_lock(key = "const:<id>", locker = locker, wait = SHORT_WAIT)]
async fn waits_a_constant(locker: &Locker, id: &str) -> Result<(), AppError> {
    Ok(())
}

#[tokio::test]
async fn a_constant_wait_is_waited() {
    let server = RedisServer::start();
    let locker = locker_with(
        &server,
        Duration::ZERO,
        Lease::watchdog(Duration::from_secs(30)),
    )
    .await;
    let id = unique_name("const");
    let holder = hold(&server, &format!("const:{id}")).await;

    let started = Instant::now();
    assert_timed_out_after(waits_a_constant(&locker, &id).await, started, SHORT_WAIT);

    // Released within the wait: the call gets the lock.
    let call = tokio::spawn({
        let (locker, id) = (locker.clone(), id.clone());
        async move { waits_a_constant(&locker, &id).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(holder.release().await.is_released());
    call.await
        .expect("the call's task")
        .expect("acquired within the wait");
}

#[distributed_lock(key = "expr:<id>", locker = locker, wait = Duration::from_millis(wait_ms))]
async fn waits_its_argument(locker: &Locker, id: &str, wait_ms: u64) -> Result<(), AppError> {
    Ok(())
}

#[tokio::test]
async fn an_expression_wait_is_evaluated_with_the_functions_arguments() {
    let server = RedisServer::start();
    // A long default that neither call may fall back to.
    let default_wait = Duration::from_secs(30);
    let locker = locker_with(
        &server,
        default_wait,
        Lease::watchdog(Duration::from_secs(30)),
    )
    .await;
    let id = unique_name("expr");
    let _holder = hold(&server, &format!("expr:{id}")).await;

    let started = Instant::now();
    assert_timed_out_after(
        waits_its_argument(&locker, &id, 0).await,
        started,
        Duration::ZERO,
    );

    let started = Instant::now();
    assert_timed_out_after(
        waits_its_argument(&locker, &id, 700).await,
        started,
        Duration::from_millis(700),
    );
}

#[distributed_lock(key = "policy:<id>", locker = locker, on_lost = policy)]
async fn under_policy(
    locker: &Locker,
    id: &str,
    policy: OnLost,
    started: oneshot::Sender<()>,
) -> Result<bool, AppError> {
    let held = dlock_core::scope::held_lock().expect("inside the lock");
    let _ = started.send(());
    let lost = tokio::time::timeout(Duration::from_secs(5), held.lost()).await;
    Ok(lost.is_ok() && held.is_lost())
}

#[tokio::test]
async fn an_on_lost_expression_chooses_cancel_or_signal_at_run_time() {
    let server = RedisServer::start();
    let locker = locker_with(
        &server,
        Duration::ZERO,
        Lease::watchdog(Duration::from_millis(600)),
    )
    .await;
    let mut con = server.connection().await;

    for policy in [OnLost::Cancel, OnLost::Signal] {
        let id = unique_name("policy");
        let (started_tx, started_rx) = oneshot::channel();
        let call = tokio::spawn({
            let (locker, id) = (locker.clone(), id.clone());
            async move { under_policy(&locker, &id, policy, started_tx).await }
        });
        started_rx.await.expect("the body ran");
        let key = locker.key_of(format!("policy:{id}")).unwrap();
        let () = con.del(&key).await.unwrap();
        let result = tokio::time::timeout(Duration::from_secs(10), call)
            .await
            .expect("the call returned")
            .expect("the call's task");
        match policy {
            OnLost::Cancel => {
                let err = result.expect_err("cancelled");
                assert!(err.lock().is_lost(), "{err:?}");
            }
            _ => assert!(result.expect("ran on"), "the body saw the loss and ran on"),
        }
    }
}

#[distributed_lock(key = "dw:<id>", locker = locker)]
async fn only_a_key(locker: &Locker, id: &str) -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "dw:<id>", locker = locker, wait = "0s")]
async fn says_no_wait(locker: &Locker, id: &str) -> Result<(), AppError> {
    Ok(())
}

#[tokio::test]
async fn an_attribute_with_only_a_key_waits_the_lockers_default_wait() {
    let server = RedisServer::start();
    let default_wait = Duration::from_secs(2);
    let locker = locker_with(
        &server,
        default_wait,
        Lease::watchdog(Duration::from_secs(30)),
    )
    .await;
    let id = unique_name("dw");
    let holder = hold(&server, &format!("dw:{id}")).await;

    let started = Instant::now();
    assert_timed_out_after(only_a_key(&locker, &id).await, started, default_wait);

    // `wait = "0s"` overrides the default: one attempt.
    let started = Instant::now();
    assert_timed_out_after(says_no_wait(&locker, &id).await, started, Duration::ZERO);
    assert!(started.elapsed() < default_wait, "{:?}", started.elapsed());

    // Released within the default wait: the call gets the lock.
    let call = tokio::spawn({
        let (locker, id) = (locker.clone(), id.clone());
        async move { only_a_key(&locker, &id).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(holder.release().await.is_released());
    call.await
        .expect("the call's task")
        .expect("acquired within the default wait");
}

#[distributed_lock(key = "dl:<id>", locker = locker)]
async fn with_default_lease(
    locker: &Locker,
    con: &mut MultiplexedConnection,
    id: &str,
) -> Result<i64, AppError> {
    Ok(pttl(con, locker, &format!("dl:{id}")).await)
}

#[distributed_lock(key = "dl:<id>", locker = locker, lease = "20s")]
async fn literal_lease(
    locker: &Locker,
    con: &mut MultiplexedConnection,
    id: &str,
) -> Result<i64, AppError> {
    Ok(pttl(con, locker, &format!("dl:{id}")).await)
}

#[distributed_lock(key = "dl:<id>", locker = locker, lease = Duration::from_millis(lease_ms))]
async fn expression_lease(
    locker: &Locker,
    con: &mut MultiplexedConnection,
    id: &str,
    lease_ms: u64,
    ran: &AtomicBool,
) -> Result<i64, AppError> {
    ran.store(true, Ordering::SeqCst);
    Ok(pttl(con, locker, &format!("dl:{id}")).await)
}

#[tokio::test]
async fn the_lockers_default_lease_applies_unless_the_attribute_sets_one() {
    let server = RedisServer::start();
    let locker = locker_with(
        &server,
        Duration::ZERO,
        Lease::fixed(Duration::from_secs(8)),
    )
    .await;
    let mut con = server.connection().await;
    let id = unique_name("dl");

    let ttl = with_default_lease(&locker, &mut con, &id).await.unwrap();
    assert!(
        (4_000..=8_000).contains(&ttl),
        "PTTL {ttl} under the default 8 s lease"
    );
    let ttl = literal_lease(&locker, &mut con, &id).await.unwrap();
    assert!(
        (16_000..=20_000).contains(&ttl),
        "PTTL {ttl} under `lease = \"20s\"`"
    );
    let ran = AtomicBool::new(false);
    let ttl = expression_lease(&locker, &mut con, &id, 12_000, &ran)
        .await
        .unwrap();
    assert!(
        (8_000..=12_000).contains(&ttl),
        "PTTL {ttl} under a 12 s expression"
    );

    // A lease the core refuses is its typed error, and the body doesn't run.
    let ran = AtomicBool::new(false);
    let err = expression_lease(&locker, &mut con, &id, 5, &ran)
        .await
        .unwrap_err();
    assert!(err.lock().is_config(), "{err:?}");
    assert!(!ran.load(Ordering::SeqCst));
    let err = expression_lease(&locker, &mut con, &id, u64::MAX, &ran)
        .await
        .unwrap_err();
    assert!(err.lock().is_config(), "{err:?}");
    assert!(!ran.load(Ordering::SeqCst));
}

#[distributed_lock(key = "global:<id>")]
async fn through_the_default_locker(
    con: &mut MultiplexedConnection,
    id: &str,
) -> Result<i64, AppError> {
    let locker = dlock_core::default_locker()?;
    Ok(pttl(con, locker, &format!("global:{id}")).await)
}

#[tokio::test]
async fn the_process_wide_default_lockers_defaults_apply_too() {
    let server = RedisServer::start();
    let default_wait = Duration::from_secs(1);
    let locker = locker_with(&server, default_wait, Lease::fixed(Duration::from_secs(8))).await;
    dlock_core::set_default_locker(locker).expect("the only default locker of this binary");
    let mut con = server.connection().await;
    let id = unique_name("global");

    let ttl = through_the_default_locker(&mut con, &id).await.unwrap();
    assert!(
        (4_000..=8_000).contains(&ttl),
        "PTTL {ttl} under the default 8 s lease"
    );

    let _holder = hold(&server, &format!("global:{id}")).await;
    let started = Instant::now();
    let result = through_the_default_locker(&mut con, &id).await.map(drop);
    assert_timed_out_after(result, started, default_wait);
}
