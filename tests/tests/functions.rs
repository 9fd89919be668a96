//! The scripts as a library of Redis functions: loaded where a server lacks it, given up for
//! `EVALSHA` where a server will not run it, and a release that works on a server out of memory.

use std::time::Duration;

use dlock_core::{LockError, Locker};
use dlock_tests::{RedisServer, unique_name};

/// The libraries a server has loaded (`FUNCTION LIST`), by name.
async fn libraries(server: &RedisServer) -> Vec<String> {
    let mut con = server.connection().await;
    let list: Vec<std::collections::HashMap<String, dlock_core::redis::Value>> =
        dlock_core::redis::cmd("FUNCTION")
            .arg("LIST")
            .query_async(&mut con)
            .await
            .expect("FUNCTION LIST");
    list.iter()
        .filter_map(|lib| match lib.get("library_name") {
            Some(dlock_core::redis::Value::BulkString(name)) => {
                Some(String::from_utf8_lossy(name).into_owned())
            }
            Some(dlock_core::redis::Value::SimpleString(name)) => Some(name.clone()),
            _ => None,
        })
        .collect()
}

/// A `Locker` on `url`.
async fn locker(url: &str) -> Locker {
    Locker::builder().url(url).build().await.expect("locker")
}

/// A contended acquisition, its hand-over to a waiter of another `Locker` and both releases:
/// every script of a plain lock's common path runs.
async fn contend(a: &Locker, b: &Locker) {
    let name = unique_name("functions");
    let held = a.lock(name.as_str()).await.expect("first holder");
    let waiter = {
        let b = b.clone();
        let name = name.clone();
        tokio::spawn(async move {
            let guard = (b.lock(name.as_str()))
                .wait(Duration::from_secs(5))
                .await
                .expect("the waiter gets the lock");
            let token = guard.fencing_token().await.expect("a token");
            (guard.release().await.is_released(), token)
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let first = held.fencing_token().await.expect("a token");
    assert!(held.release().await.is_released());
    let (released, second) = waiter.await.expect("waiter task");
    assert!(released);
    assert!(second > first, "{second} after {first}");
}

#[tokio::test]
async fn the_library_is_loaded_where_a_server_lacks_it() {
    let server = RedisServer::start();
    let locker = locker(&server.url()).await;
    assert!(libraries(&server).await.is_empty());
    contend(&locker, &locker.clone()).await;
    let loaded = libraries(&server).await;
    assert_eq!(loaded.len(), 1, "{loaded:?}");
    assert!(loaded[0].starts_with("dlock_"), "{loaded:?}");
    let stats = server.info_commandstats();
    assert_eq!(stats.get("function|load"), Some(&1), "{stats:?}");
    assert_eq!(stats.get("evalsha"), None, "{stats:?}");

    // Gone (a flush, a new master that never had it): loaded again by the next call.
    let mut con = server.connection().await;
    let _: () = (dlock_core::redis::cmd("FUNCTION").arg("FLUSH"))
        .query_async(&mut con)
        .await
        .expect("FUNCTION FLUSH");
    contend(&locker, &locker.clone()).await;
    assert_eq!(libraries(&server).await, loaded);
    let stats = server.info_commandstats();
    assert_eq!(stats.get("function|load"), Some(&2), "{stats:?}");
}

#[tokio::test]
async fn a_user_who_may_not_use_functions_locks_by_evalsha() {
    let server = RedisServer::start();
    let mut con = server.connection().await;
    let _: () = dlock_core::redis::cmd("ACL")
        .arg("SETUSER")
        .arg("locks")
        .arg("on")
        .arg(">locks-secret")
        // What DEPLOYING.md says a user needs, less the functions: the keys and channels under
        // the default prefix.
        .arg("~dlock:*")
        .arg("&dlock:*")
        .arg("+@all")
        .arg("-fcall")
        .arg("-function")
        .query_async(&mut con)
        .await
        .expect("ACL SETUSER");
    let url = format!("redis://locks:locks-secret@{}", server.addr());
    let refused = locker(&url).await;
    let allowed = locker(&server.url()).await;
    // Both ways at once, on one name: the same scripts.
    contend(&refused, &allowed).await;
    contend(&allowed, &refused).await;
    // Renewed by the watchdog, by EVALSHA, past three leases.
    let name = unique_name("functions-renewed");
    let guard = (refused.lock(name.as_str()))
        .watchdog_lease(Duration::from_millis(300))
        .await
        .expect("lock");
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(!guard.is_lost());
    assert!(guard.release().await.is_released());
    let stats = server.info_commandstats();
    assert!(stats.get("evalsha").is_some_and(|n| *n > 0), "{stats:?}");
    assert!(stats.get("fcall").is_some_and(|n| *n > 0), "{stats:?}");
}

#[tokio::test]
async fn a_hold_is_given_back_on_a_server_out_of_memory() {
    let server = RedisServer::start();
    let locker = locker(&server.url()).await;
    // Loaded, and a hold written by a script (a waiter's flag on it).
    contend(&locker, &locker.clone()).await;
    let name = unique_name("functions-oom");
    let guard = locker.lock(name.as_str()).await.expect("lock");
    let token = guard.fencing_token().await.expect("a token");
    assert!(u64::from(token) > 0);
    let mut con = server.connection().await;
    let set = |value: &'static str| {
        let mut cmd = dlock_core::redis::cmd("CONFIG");
        cmd.arg("SET").arg("maxmemory").arg(value);
        cmd
    };
    let _: () = set("1").query_async(&mut con).await.expect("CONFIG SET");
    // Nothing new is taken…
    let refused = locker.lock(unique_name("functions-oom-new").as_str()).await;
    assert!(matches!(refused, Err(LockError::Backend(_))), "{refused:?}");
    // …but what is held is given back.
    assert!(guard.release().await.is_released());
    let _: () = set("0").query_async(&mut con).await.expect("CONFIG SET");
    let again = locker.lock(name.as_str()).await.expect("free again");
    assert!(again.release().await.is_released());
}
