//! Multi-locks on one server: one script for every name when they are free, all or none, and
//! taken one by one in key order when one is busy — against real Redis, counted with
//! `INFO commandstats`.

use std::time::Duration;

use dlock_core::Locker;
use dlock_core::redis::AsyncCommands as _;
use dlock_tests::{RedisServer, pause_writes, unique_name, unpause};

/// Script calls the server ran so far.
fn scripts(server: &RedisServer) -> u64 {
    server.script_calls()
}

fn names(prefix: &str, n: usize) -> Vec<String> {
    let base = unique_name(prefix);
    (0..n).map(|i| format!("{base}-{i}")).collect()
}

#[tokio::test]
async fn free_names_are_taken_in_one_script_with_a_token_each() {
    let server = RedisServer::start();
    let locker = Locker::connect(&server.url()).await.expect("connect");
    let rival = Locker::connect(&server.url()).await.expect("connect");
    let names = names("multi-one", 5);
    // The script is loaded by a first multi-lock; the second one is counted.
    drop(
        locker
            .lock_all(["warm-a", "warm-b"])
            .await
            .expect("warm up"),
    );
    tokio::time::sleep(Duration::from_millis(100)).await;

    let earlier = (locker.lock(names[3].as_str()).await).expect("one name alone");
    let earlier_token = earlier.fencing_token().await.unwrap();
    assert!(earlier.release().await.is_released());

    let before = scripts(&server);
    let all = locker
        .lock_all(names.iter().map(String::as_str))
        .await
        .expect("lock all");
    assert_eq!(
        scripts(&server) - before,
        1,
        "one script for five free names"
    );
    assert_eq!(all.len(), 5);
    // A token per lock, rising per name (names taken in one script may share a value: the
    // server's clock does not move within a script on every server).
    let tokens = all.fencing_tokens().await.unwrap();
    assert_eq!(tokens.len(), 5);
    assert!(
        tokens[3] > earlier_token,
        "{tokens:?} after {earlier_token:?}"
    );
    for name in &names {
        let busy = rival.lock(name.as_str()).try_lock().await.expect("try");
        assert!(busy.is_none(), "{name} is held");
    }
    // Each guard is a hold of its own: releasing one frees that name only.
    let mut guards = all.into_guards();
    let first = guards.remove(0);
    assert!(first.release().await.is_released());
    let free = rival.lock(names[0].as_str()).try_lock().await.expect("try");
    assert!(free.is_some(), "the released name is free");
    let busy = rival.lock(names[1].as_str()).try_lock().await.expect("try");
    assert!(busy.is_none(), "the others are still held");
    for guard in guards {
        assert!(guard.release().await.is_released());
    }
    assert_eq!(locker.stats().renewed_holds, 0);
}

#[tokio::test]
async fn one_busy_name_takes_nothing_and_a_try_makes_no_second_call() {
    let server = RedisServer::start();
    let locker = Locker::connect(&server.url()).await.expect("connect");
    let rival = Locker::connect(&server.url()).await.expect("connect");
    let names = names("multi-busy", 4);
    let blocker = rival.lock(names[2].as_str()).await.expect("blocker");
    drop(
        locker
            .lock_all(["warm-a", "warm-b"])
            .await
            .expect("warm up"),
    );
    tokio::time::sleep(Duration::from_millis(100)).await;

    let before = scripts(&server);
    let busy = locker
        .lock_all(names.iter().map(String::as_str))
        .try_lock()
        .await
        .expect("try");
    assert!(busy.is_none());
    assert_eq!(scripts(&server) - before, 1, "all or none in one call");
    let mut con = server.connection().await;
    for (i, name) in names.iter().enumerate().filter(|(i, _)| *i != 2) {
        let key = locker.key_of(name.as_str()).expect("key");
        let left: bool = con.exists(&key).await.expect("EXISTS");
        assert!(!left, "name {i} was written although one was busy");
    }
    // A request that waits takes them once the busy one is released.
    let releaser = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        blocker.release().await
    });
    let all = locker
        .lock_all(names.iter().map(String::as_str))
        .wait(Duration::from_secs(5))
        .await
        .expect("granted after the release");
    assert!(releaser.await.expect("releaser").is_released());
    assert_eq!(all.len(), 4);
    assert!(all.release().await.is_released());
    assert_eq!(locker.stats().renewed_holds, 0);
}

#[tokio::test]
async fn a_multi_lock_dropped_or_timed_out_mid_flight_leaves_nothing_behind() {
    let server = RedisServer::start();
    let mut admin = server.connection().await;
    let locker = Locker::builder()
        .url(server.url())
        .command_timeout(Duration::from_millis(40))
        .build()
        .await
        .expect("connect");
    let rival = Locker::connect(&server.url()).await.expect("connect");
    let names = names("multi-cancel", 3);
    drop(
        locker
            .lock_all(["warm-a", "warm-b"])
            .await
            .expect("warm up"),
    );
    pause_writes(&mut admin, 300).await;
    for i in 0..10 {
        let request = locker.lock_all(names.iter().map(String::as_str));
        if i % 2 == 0 {
            // Dropped while the script waits in the paused server.
            let dropped = tokio::time::timeout(Duration::from_millis(5), request).await;
            if let Ok(Ok(all)) = dropped {
                drop(all.release().await);
            }
        } else {
            // Timed out by the command timeout: the script may still run later.
            match request.await {
                Ok(all) => drop(all.release().await),
                Err(err) => assert!(err.is_backend(), "{err}"),
            }
        }
    }
    unpause(&mut admin).await;
    // The clean-ups follow the scripts down their connections.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for name in &names {
        let key = locker.key_of(name.as_str()).expect("key");
        let left: bool = admin.exists(&key).await.expect("EXISTS");
        assert!(!left, "{name} outlived every request");
    }
    let all = rival
        .lock_all(names.iter().map(String::as_str))
        .try_lock()
        .await
        .expect("try");
    assert!(all.is_some(), "every name is free");
    assert_eq!(locker.stats().renewed_holds, 0);
}

#[tokio::test]
async fn inside_a_scope_a_held_name_is_re_entered_and_the_rest_taken() {
    let server = RedisServer::start();
    let locker = Locker::connect(&server.url()).await.expect("connect");
    let names = names("multi-scope", 3);
    dlock_core::scope(async {
        let outer = locker.lock(names[1].as_str()).await.expect("outer");
        let all = locker
            .lock_all(names.iter().map(String::as_str))
            .await
            .expect("all, one of them re-entered");
        assert_eq!(all.len(), 3);
        assert!(all.guards()[1].is_reentrant());
        assert_eq!(
            all.guards()[1].fencing_token().await.unwrap(),
            outer.fencing_token().await.unwrap(),
            "the re-entered hold keeps its token"
        );
        assert!(all.release().await.is_released());
        assert!(
            !outer.is_lost(),
            "releasing the inner guard keeps the outer hold"
        );
        assert!(outer.release().await.is_released());
    })
    .await;
    assert_eq!(locker.stats().renewed_holds, 0);
}

#[tokio::test]
async fn a_stalled_multi_lock_returns_within_its_wait_and_one_command_timeout() {
    let server = RedisServer::start();
    let mut admin = server.connection().await;
    let timeout = Duration::from_millis(300);
    let wait = Duration::from_millis(50);
    let locker = Locker::builder()
        .url(server.url())
        .command_timeout(timeout)
        .build()
        .await
        .expect("connect");
    let names = names("multi-stalled", 2);
    drop(
        locker
            .lock_all(["warm-a", "warm-b"])
            .await
            .expect("warm up"),
    );
    pause_writes(&mut admin, 1_500).await;
    let started = tokio::time::Instant::now();
    let err = (locker.lock_all(names.iter().map(String::as_str)).wait(wait))
        .await
        .expect_err("the server answers nothing");
    let took = started.elapsed();
    unpause(&mut admin).await;
    assert!(err.is_backend(), "{err}");
    // The one script timed out past the wait: no second command after it.
    assert!(
        took < wait + timeout + Duration::from_millis(200),
        "took {took:?}"
    );
}

/// No names: an empty guard at once; a name given twice is held once; an empty name is an
/// invalid-name error before anything is taken.
#[tokio::test]
async fn no_names_repeated_names_and_a_bad_name_in_a_multi_lock() {
    let server = RedisServer::start();
    let locker = Locker::connect(&server.url()).await.expect("connect");
    let empty: Vec<&str> = Vec::new();
    let g = locker.lock_all(empty.clone()).await.expect("empty");
    assert!(g.is_empty());
    assert!(
        locker
            .lock_all(empty)
            .try_lock()
            .await
            .expect("try")
            .is_some()
    );
    let a = unique_name("multi-edge-a");
    let b = unique_name("multi-edge-b");
    let dup = locker
        .lock_all([a.as_str(), a.as_str(), b.as_str()])
        .await
        .expect("dup");
    assert_eq!(dup.len(), 2);
    for o in dup.release_each().await {
        assert!(o.is_released(), "{o:?}");
    }
    let bad = locker.lock_all([a.as_str(), ""]).await;
    assert!(matches!(bad, Err(ref e) if e.is_invalid_name()), "{bad:?}");
    assert!(
        !locker
            .inspect(a.as_str())
            .await
            .expect("inspect")
            .is_taken()
    );
}
