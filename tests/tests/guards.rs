//! Every guard is a `Hold`, with the same methods and the same signatures: a lock's, a
//! writer's, a reader's, a permit, a multi-lock's and a master set's — against real Redis. A
//! guard of several locks is lost at its first loss and reports the worst of their releases.

use std::time::Duration;

use dlock_core::{Fenced, Hold, LockError, Locker, MasterSet, ReleaseOutcome};
use dlock_tests::{RedisServer, unique_name};

/// What every guard must do while held and when released, through the trait alone.
async fn holds_then_releases<G: Hold>(guard: G, name: &str) {
    assert_eq!(guard.name().as_str(), name);
    assert!(!guard.is_lost());
    assert!(guard.remaining() > Duration::ZERO);
    assert!(guard.valid_until() > tokio::time::Instant::now());
    assert_eq!(guard.run(async { 7 }).await.expect("held"), 7);
    let lost = guard.lost();
    tokio::pin!(lost);
    assert!(
        tokio::time::timeout(Duration::from_millis(20), &mut lost)
            .await
            .is_err(),
        "a held guard is not lost"
    );
    assert!(guard.release().await.is_released());
}

/// The token through the trait is the one the guard gives.
async fn token_of<G: Fenced>(guard: &G) -> Result<dlock_core::FencingToken, LockError> {
    guard.fencing_token().await
}

#[tokio::test]
async fn every_guard_is_a_hold() {
    let server = RedisServer::start();
    let locker = Locker::connect(&server.url()).await.expect("connect");
    let name = unique_name("hold-every");

    let guard = locker.lock(name.as_str()).await.expect("lock");
    let token = token_of(&guard).await.expect("token");
    assert_eq!(guard.fencing_token().await.expect("token"), token);
    holds_then_releases(guard, &name).await;

    let rw = locker.read_write_lock(name.as_str());
    let write = rw.write().await.expect("write");
    assert!(token_of(&write).await.expect("a writer's token") > token);
    holds_then_releases(write, &name).await;
    holds_then_releases(rw.read().await.expect("read"), &name).await;

    let permits = locker.semaphore(name.as_str(), 2);
    holds_then_releases(permits.acquire().await.expect("permit"), &name).await;

    let other = format!("{name}-z");
    let both = (locker.lock_all([other.as_str(), name.as_str()]).await).expect("both");
    holds_then_releases(both, &name).await;

    let set = MasterSet::all([locker.clone()]).expect("a set of one");
    holds_then_releases(set.lock(name.as_str()).await.expect("master"), &name).await;
}

#[tokio::test]
async fn a_multi_lock_is_lost_at_its_first_loss_and_releases_with_the_worst_outcome() {
    let server = RedisServer::start();
    let locker = Locker::connect(&server.url()).await.expect("connect");
    let operator = Locker::connect(&server.url()).await.expect("connect");
    let a = unique_name("hold-multi-a");
    let b = unique_name("hold-multi-b");
    let both = locker
        .lock_all([a.as_str(), b.as_str()])
        .watchdog_lease(Duration::from_millis(300))
        .await
        .expect("both");
    let lost = both.lost();

    assert!(operator.force_release(b.as_str()).await.expect("force"));
    tokio::time::timeout(Duration::from_secs(2), lost)
        .await
        .expect("the renewal after the force-release finds b gone");
    assert!(both.is_lost());
    assert_eq!(both.remaining(), Duration::ZERO);
    match both.run(async {}).await {
        Err(LockError::Lost { name, .. }) => assert_eq!(name, b),
        other => panic!("{other:?}"),
    }
    // One outcome for the two: b was gone before the guard let go.
    assert!(matches!(both.release().await, ReleaseOutcome::Expired));
    assert!(
        !locker
            .inspect(a.as_str())
            .await
            .expect("inspect")
            .is_taken()
    );
}

#[tokio::test]
async fn a_multi_lock_gives_each_names_token_and_each_release() {
    let server = RedisServer::start();
    let locker = Locker::connect(&server.url()).await.expect("connect");
    let a = unique_name("hold-tokens-a");
    let b = unique_name("hold-tokens-b");
    let both = (locker.lock_all([b.as_str(), a.as_str()]).await).expect("both");
    let tokens = both.fencing_tokens().await.expect("tokens");
    // Key order: a before b.
    assert_eq!(both.fencing_token_of(a.as_str()).await.unwrap(), tokens[0]);
    assert_eq!(both.fencing_token_of(b.as_str()).await.unwrap(), tokens[1]);
    assert!(matches!(
        both.fencing_token_of("not-held").await,
        Err(LockError::Config(_))
    ));
    assert_eq!(both.name().as_str(), a);
    let outcomes = both.release_each().await;
    assert_eq!(outcomes.len(), 2);
    assert!(outcomes.iter().all(ReleaseOutcome::is_released));
}

#[tokio::test]
async fn a_master_set_lock_is_lost_when_too_few_masters_hold_it() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let mut lockers = Vec::new();
    for server in &servers {
        let locker = Locker::builder()
            .url(server.url())
            .default_lease(dlock_core::Lease::watchdog(Duration::from_millis(300)))
            .build()
            .await
            .expect("connect");
        lockers.push(locker);
    }
    let set = MasterSet::majority(lockers.clone()).expect("set");
    let name = unique_name("hold-masters");
    let guard = set.lock(name.as_str()).await.expect("lock");
    let lost = guard.lost();
    tokio::pin!(lost);

    // One master's hold gone: two of three still hold it, which a majority needs.
    assert!(
        lockers[0]
            .force_release(name.as_str())
            .await
            .expect("force")
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(400), &mut lost)
            .await
            .is_err(),
        "two of three still hold it"
    );
    assert!(!guard.is_lost());
    assert!(guard.remaining() > Duration::ZERO);

    // A second one gone: lost.
    assert!(
        lockers[1]
            .force_release(name.as_str())
            .await
            .expect("force")
    );
    tokio::time::timeout(Duration::from_secs(2), &mut lost)
        .await
        .expect("lost once one master is left");
    assert!(guard.is_lost());
    assert_eq!(guard.remaining(), Duration::ZERO);
    assert!(matches!(guard.release().await, ReleaseOutcome::Expired));
}
