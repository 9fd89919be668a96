//! A release whose connection drops after Redis received it: the server is blocked with
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
