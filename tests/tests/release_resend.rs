//! A command whose connection drops after Redis received it, sent again on a new connection.
//!
//! A release: the server is blocked with
//! `DEBUG SLEEP` so the release sits in its socket, and the proxy in front of it closes every
//! connection; when the server wakes it still runs the buffered release, and the client, its
//! connection gone, sends it again. A hold properly held until it let go must still hear
//! `Released` — for a plain lock, a permit and a read lock alike (the release's own retry knows
//! the hold was valid when it let go).

use std::time::Duration;

use dlock_core::{Locker, ReleaseOutcome};
use dlock_tests::{Proxy, RedisServer, unique_name};

async fn setup() -> (RedisServer, Proxy, Locker) {
    let server = RedisServer::start_with_args(&["--enable-debug-command", "yes"]);
    let proxy = Proxy::start(server.addr()).await;
    let locker = (Locker::builder().url(proxy.url()))
        .command_timeout(Duration::from_secs(4))
        .build()
        .await
        .expect("connect");
    (server, proxy, locker)
}

async fn block_then_cut<F>(server: &RedisServer, proxy: &Proxy, release: F) -> ReleaseOutcome
where
    F: std::future::Future<Output = ReleaseOutcome> + Send + 'static,
{
    let mut admin = server.connection().await;
    let sleeper = tokio::spawn(async move {
        let _: redis::RedisResult<()> = redis::cmd("DEBUG")
            .arg("SLEEP")
            .arg("1")
            .query_async(&mut admin)
            .await;
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    let release = tokio::spawn(release);
    // The release reaches the server's socket, which nobody reads while it sleeps.
    tokio::time::sleep(Duration::from_millis(250)).await;
    proxy.retarget(server.addr());
    let outcome = release.await.expect("release task");
    sleeper.await.expect("sleeper");
    outcome
}

#[tokio::test]
async fn a_permit_release_resent_after_a_drop_still_says_released() {
    let (server, proxy, locker) = setup().await;
    let name = unique_name("resend-permit");
    let sem = locker.semaphore(name.as_str(), 1);
    let permit = sem.acquire().await.expect("permit");
    let outcome = block_then_cut(&server, &proxy, permit.release()).await;
    let status = sem.status().await.expect("status");
    assert_eq!(status.held, 0, "the permit was given back");
    assert!(
        outcome.is_released(),
        "a properly held permit's release said {outcome:?}"
    );
}

#[tokio::test]
async fn a_plain_release_resent_after_a_drop_says_released() {
    let (server, proxy, locker) = setup().await;
    let name = unique_name("resend-plain");
    let guard = locker.lock(name.as_str()).await.expect("lock");
    let outcome = block_then_cut(&server, &proxy, guard.release()).await;
    assert!(outcome.is_released(), "{outcome:?}");
}

#[tokio::test]
async fn a_read_release_resent_after_a_drop_still_says_released() {
    let (server, proxy, locker) = setup().await;
    let name = unique_name("resend-read");
    let rw = locker.read_write_lock(name.as_str());
    let read = rw.read().await.expect("read");
    let outcome = block_then_cut(&server, &proxy, read.release()).await;
    assert!(
        outcome.is_released(),
        "a properly held read lock's release said {outcome:?}"
    );
}

/// Closes the proxy's connections with the answers it holds back still unsent, then lets new
/// connections through at once. (Closed first: answers let through before the connections
/// close would reach their clients.)
async fn drop_held_answers(proxy: &Proxy) {
    proxy.cut();
    tokio::time::sleep(Duration::from_millis(5)).await;
    proxy.restore();
    proxy.unstall_replies();
}

/// The other way the same thing happens: the server runs the release at once, but its answer is
/// held back on the way (the proxy stalls the replies), and then the connection closes with the
/// answer never sent. The resent release finds the hold gone — let go by its first try.
async fn answer_held_then_cut<F, T>(proxy: &Proxy, call: F) -> T
where
    F: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    proxy.stall_replies();
    let call = tokio::spawn(call);
    // The command reaches the server and runs; its answer waits in the proxy.
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop_held_answers(proxy).await;
    call.await.expect("the call's task")
}

#[tokio::test]
async fn a_release_whose_answer_was_lost_says_released() {
    let (server, proxy, locker) = setup().await;
    let mut con = server.connection().await;
    let name = unique_name("resend-held-plain");
    let key = locker.key_of(name.as_str()).expect("key");
    let guard = locker.lock(name.as_str()).await.expect("lock");
    let outcome = answer_held_then_cut(&proxy, guard.release()).await;
    let left: Option<String> = redis::AsyncCommands::get(&mut con, &key)
        .await
        .expect("GET");
    assert_eq!(left, None, "the lock was given back");
    assert!(outcome.is_released(), "plain: {outcome:?}");

    let sem = locker.semaphore(format!("{name}-sem"), 1);
    let permit = sem.acquire().await.expect("permit");
    let outcome = answer_held_then_cut(&proxy, permit.release()).await;
    assert_eq!(sem.status().await.expect("status").held, 0);
    assert!(outcome.is_released(), "permit: {outcome:?}");

    let rw = locker.read_write_lock(format!("{name}-rw"));
    let read = rw.read().await.expect("read");
    let outcome = answer_held_then_cut(&proxy, read.release()).await;
    assert!(outcome.is_released(), "read: {outcome:?}");
}

/// An acquisition, the same way: its `SET NX PX` takes the lock, its answer never comes, and the
/// resent `SET` finds the lock taken (by itself). The attempt that then finds the hold its own
/// sets the lease again from its own send, from which the guard counts it: the guard never
/// believes longer than Redis keeps the lock.
#[tokio::test]
async fn an_acquisition_whose_answer_was_lost_counts_its_lease_no_later_than_redis() {
    let (server, proxy, locker) = setup().await;
    let mut con = server.connection().await;
    let name = unique_name("resend-acquire");
    let key = locker.key_of(name.as_str()).expect("key");
    let lease = Duration::from_secs(3);
    let acquiring = {
        let (locker, name) = (locker.clone(), name.clone());
        async move {
            (locker.lock(name.as_str()).lease(lease))
                .wait(Duration::from_secs(10))
                .await
        }
    };
    let guard = answer_held_then_cut(&proxy, acquiring)
        .await
        .expect("acquired");
    let pttl: i64 = redis::AsyncCommands::pttl(&mut con, &key)
        .await
        .expect("PTTL");
    let read_by = tokio::time::Instant::now();
    let expires_by = read_by + Duration::from_millis(u64::try_from(pttl).expect("an expiry"));
    assert!(
        guard.valid_until() <= expires_by + Duration::from_millis(3),
        "the guard believes {:?} past Redis's expiry",
        guard.valid_until() - expires_by
    );
    assert!(guard.release().await.is_released());
}
