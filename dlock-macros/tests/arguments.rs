//! The `Locker`'s defaults when the attribute leaves `wait` or `lease` out, against a real
//! `redis-server`. Times are read on tokio's
//! monotonic clock and bounded generously: a lower bound shows that a wait was waited, an upper
//! bound far above it that it was not some other, longer one.

use std::time::Duration;

use dlock_core::redis::AsyncCommands as _;
use dlock_core::redis::aio::MultiplexedConnection;
use dlock_core::{Lease, LockError, LockGuard, Locker, distributed_lock};
use dlock_tests::{RedisServer, unique_name};
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
    assert!(err.lock().is_timeout(), "{err:?}");
    assert!(
        elapsed >= wait,
        "gave up after {elapsed:?}, before {wait:?}"
    );
    assert!(elapsed < wait + SLACK, "gave up after {elapsed:?}");
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
