//! Calls that run side by side in one task (`tokio::join!`) are not nested: each has a lock
//! scope of its own, so on one name they exclude each other — outside any scope and inside an
//! enclosing lock alike — and each body's fencing token is its own lock's — against a real
//! `redis-server`.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use dlock_core::{LockError, Locker, distributed_lock};
use dlock_tests::{RedisServer, unique_name};

async fn locker(server: &RedisServer) -> Locker {
    Locker::builder()
        .url(server.url())
        .build()
        .await
        .expect("connect")
}

/// A read-modify-write that must never run twice at once for one account.
#[distributed_lock(key = "acct:<account>", locker = locker, wait = "5s")]
async fn withdraw(
    locker: &Locker,
    account: &str,
    inside: &AtomicU32,
    most: &AtomicU32,
) -> Result<(), LockError> {
    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
    most.fetch_max(now, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(300)).await;
    inside.fetch_sub(1, Ordering::SeqCst);
    Ok(())
}

/// A batch job under its own lock that processes two withdrawals of one account concurrently.
#[distributed_lock(key = "batch:<batch>", locker = locker)]
async fn batch(
    locker: &Locker,
    batch: &str,
    account: &str,
    inside: &AtomicU32,
    most: &AtomicU32,
) -> Result<(), LockError> {
    // The second withdrawal starts a little later (as with a stream of work items).
    let (a, b) = tokio::join!(withdraw(locker, account, inside, most), async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        withdraw(locker, account, inside, most).await
    });
    a?;
    b?;
    Ok(())
}

#[tokio::test]
async fn two_calls_side_by_side_outside_any_scope_exclude_each_other() {
    let server = RedisServer::start();
    let locker = locker(&server).await;
    let account = unique_name("acct");
    let (inside, most) = (AtomicU32::new(0), AtomicU32::new(0));
    let (a, b) = tokio::join!(withdraw(&locker, &account, &inside, &most), async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        withdraw(&locker, &account, &inside, &most).await
    });
    a.unwrap();
    b.unwrap();
    assert_eq!(most.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn two_calls_side_by_side_inside_an_outer_lock_exclude_each_other() {
    let server = RedisServer::start();
    let locker = locker(&server).await;
    let account = unique_name("acct");
    let (inside, most) = (AtomicU32::new(0), AtomicU32::new(0));
    batch(&locker, &unique_name("batch"), &account, &inside, &most)
        .await
        .unwrap();
    assert_eq!(
        most.load(Ordering::SeqCst),
        1,
        "two bodies guarded by `acct:<account>` ran at the same time"
    );
}

/// The lock a body believes it holds, and its fencing token.
type Belief = (String, u64);

/// Reports the lock its body believes it holds, after `delay`.
#[distributed_lock(key = "res:<name>", locker = locker, wait = "5s")]
async fn write_resource(locker: &Locker, name: &str, delay: Duration) -> Result<Belief, LockError> {
    tokio::time::sleep(delay).await;
    let held = dlock_core::scope::held_lock().expect("inside the lock");
    let token = dlock_core::scope::fencing_token().await?.get();
    Ok((held.name().to_string(), token))
}

#[distributed_lock(key = "outer:<outer>", locker = locker)]
async fn two_resources(
    locker: &Locker,
    outer: &str,
    a: &str,
    b: &str,
) -> Result<(Belief, Belief), LockError> {
    let (ra, rb) = tokio::join!(
        write_resource(locker, a, Duration::from_millis(200)),
        async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            write_resource(locker, b, Duration::from_millis(400)).await
        }
    );
    Ok((ra?, rb?))
}

#[tokio::test]
async fn the_fencing_token_in_a_body_is_the_token_of_its_own_lock() {
    let server = RedisServer::start();
    let locker = locker(&server).await;
    let (a, b) = (unique_name("a"), unique_name("b"));
    let ((name_a, token_a), (name_b, _)) = two_resources(&locker, &unique_name("o"), &a, &b)
        .await
        .unwrap();
    assert_eq!(name_b, format!("res:{b}"));
    assert_eq!(
        name_a,
        format!("res:{a}"),
        "the body guarded by `res:{a}` sees another lock as its own (token {token_a})"
    );
}
