//! A `Locker` over each connection an application may already have: a URL, its own
//! `ConnectionManager`, a bb8 pool, a deadpool pool, one multiplexed connection. Every source is
//! one lock to every other, wakes waiters when given a subscriber, and comes back after Redis
//! restarts (the multiplexed connection, which is never reconnected, excepted).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dlock_core::Locker;
use dlock_core::redis;
use dlock_tests::handover::release_to_waiter;
use dlock_tests::{RedisServer, unique_name};

async fn manager(server: &RedisServer) -> redis::aio::ConnectionManager {
    redis::aio::ConnectionManager::new(server.client())
        .await
        .expect("connection manager")
}

async fn bb8_pool(server: &RedisServer) -> bb8::Pool<bb8_redis::RedisConnectionManager> {
    let manager = bb8_redis::RedisConnectionManager::new(server.url()).expect("bb8 manager");
    bb8::Pool::builder()
        .max_size(4)
        .build(manager)
        .await
        .expect("bb8 pool")
}

fn deadpool(server: &RedisServer) -> deadpool_redis::Pool {
    deadpool_redis::Config::from_url(server.url())
        .builder()
        .expect("deadpool config")
        .max_size(4)
        .runtime(deadpool_redis::Runtime::Tokio1)
        .build()
        .expect("deadpool pool")
}

/// One `Locker` per source, each with a subscriber so that waiters are woken.
async fn every_source(server: &RedisServer) -> Vec<(&'static str, Locker)> {
    let with_subscriber = |b: dlock_core::LockerBuilder| b.subscriber(server.client());
    vec![
        ("url", Locker::connect(&server.url()).await.expect("url")),
        (
            "connection manager",
            with_subscriber(Locker::builder().connection_manager(manager(server).await))
                .build()
                .await
                .expect("manager locker"),
        ),
        (
            "bb8",
            with_subscriber(Locker::builder().bb8_pool(bb8_pool(server).await))
                .build()
                .await
                .expect("bb8 locker"),
        ),
        (
            "deadpool",
            with_subscriber(Locker::builder().deadpool(deadpool(server)))
                .build()
                .await
                .expect("deadpool locker"),
        ),
        (
            "multiplexed",
            with_subscriber(Locker::builder().multiplexed(server.connection().await))
                .build()
                .await
                .expect("multiplexed locker"),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_source_excludes_every_other() {
    let server = RedisServer::start();
    let lockers = every_source(&server).await;
    let name = unique_name("shared");
    // A read-modify-write that loses updates unless the lock excludes: read, yield, write.
    let counter = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicU64::new(0));
    let rounds = 60;
    let mut tasks = Vec::new();
    for (source, locker) in &lockers {
        for _ in 0..3 {
            let (locker, name) = (locker.clone(), name.clone());
            let (counter, inside, source) = (counter.clone(), inside.clone(), *source);
            tasks.push(tokio::spawn(async move {
                for _ in 0..rounds {
                    let guard = locker
                        .lock(name.as_str())
                        .wait(Duration::from_secs(20))
                        .await
                        .unwrap_or_else(|e| panic!("{source}: {e}"));
                    assert_eq!(
                        inside.fetch_add(1, Ordering::SeqCst),
                        0,
                        "{source} overlapped"
                    );
                    let seen = counter.load(Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    counter.store(seen + 1, Ordering::SeqCst);
                    inside.fetch_sub(1, Ordering::SeqCst);
                    assert!(guard.release().await.is_released(), "{source}");
                }
            }));
        }
    }
    for task in tasks {
        task.await.expect("a contender panicked");
    }
    assert_eq!(
        counter.load(Ordering::SeqCst),
        lockers.len() as u64 * 3 * rounds
    );
}

#[tokio::test]
async fn every_source_wakes_its_waiter_on_release() {
    let server = RedisServer::start();
    let lockers = every_source(&server).await;
    let holder = Locker::connect(&server.url()).await.expect("holder");
    for (source, locker) in lockers {
        let name = unique_name("wake");
        // A lease far longer than the test: only the release's wake-up can end the wait early.
        let guard = holder
            .lock(name.as_str())
            .lease(Duration::from_secs(60))
            .await
            .expect("hold");
        let waiter = tokio::spawn(async move {
            let started = tokio::time::Instant::now();
            let got = locker
                .lock(name.as_str())
                .wait(Duration::from_secs(10))
                .await;
            let elapsed = started.elapsed();
            let token = match got {
                Ok(guard) => guard.fencing_token().await,
                Err(err) => Err(err),
            };
            (token, elapsed)
        });
        // Let the waiter subscribe and find the lock busy.
        tokio::time::sleep(Duration::from_millis(150)).await;
        let released_at = tokio::time::Instant::now();
        let first = guard.fencing_token().await.unwrap();
        assert!(guard.release().await.is_released());
        let (got, _) = waiter.await.expect("waiter");
        let token = got.unwrap_or_else(|e| panic!("{source}: {e}"));
        assert!(token > first, "{source}");
        let after_release = released_at.elapsed();
        assert!(
            after_release < Duration::from_secs(5),
            "{source}: woken {after_release:?} after the release"
        );
    }
}

#[tokio::test]
async fn managers_and_pools_come_back_after_a_restart() {
    let mut server = RedisServer::start();
    let lockers: Vec<_> = every_source(&server)
        .await
        .into_iter()
        .filter(|(source, _)| *source != "multiplexed")
        .collect();
    for (_, locker) in &lockers {
        let guard = locker
            .lock(unique_name("before").as_str())
            .await
            .expect("before");
        assert!(guard.release().await.is_released());
    }
    server.kill();
    server.restart();
    for (source, locker) in &lockers {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let name = unique_name("after");
        loop {
            match locker.lock(name.as_str()).await {
                Ok(guard) => {
                    assert!(guard.release().await.is_released(), "{source}");
                    break;
                }
                Err(err) => {
                    assert!(err.is_backend(), "{source}: {err}");
                    assert!(
                        tokio::time::Instant::now() < deadline,
                        "{source} did not come back: {err}"
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
}

#[tokio::test]
async fn a_source_without_a_subscriber_still_hands_over_by_polling() {
    let server = RedisServer::start();
    let locker = Locker::builder()
        .deadpool(deadpool(&server))
        .wake_by_polling()
        .poll_interval(Duration::from_millis(20))
        .build()
        .await
        .expect("deadpool locker");
    let holder = Locker::connect(&server.url()).await.expect("holder");
    let name = unique_name("poll");
    let guard = holder.lock(name.as_str()).await.expect("hold");
    release_to_waiter(guard, &locker, Duration::from_millis(100))
        .await
        .expect("acquired by polling");
}

#[tokio::test]
async fn the_locker_names_its_source_and_never_a_password() {
    let server = RedisServer::start_with_args(&["--requirepass", "pa55-word"]);
    let url = format!("redis://:pa55-word@127.0.0.1:{}/", server.port());
    let pool = deadpool_redis::Config::from_url(url.as_str())
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
        .expect("deadpool");
    let locker = Locker::builder()
        .deadpool(pool)
        .wake_by_polling()
        .build()
        .await
        .expect("locker");
    let shown = format!("{locker:?}");
    assert!(shown.contains("deadpool"), "{shown}");
    assert!(!shown.contains("pa55-word"), "{shown}");
    let guard = locker
        .lock(unique_name("auth").as_str())
        .await
        .expect("works");
    assert!(guard.release().await.is_released());
}

#[tokio::test]
async fn a_lazy_locker_builds_while_redis_is_down_and_locks_once_it_is_back() {
    let mut server = RedisServer::start();
    server.kill();
    let eager = Locker::builder()
        .url(server.url())
        .connect_timeout(Duration::from_millis(300))
        .build()
        .await;
    assert!(
        eager.is_err_and(|e| e.is_backend()),
        "an eager build needs Redis"
    );
    let locker = Locker::builder()
        .url(server.url())
        .connect_timeout(Duration::from_millis(300))
        .connect_lazily(true)
        .build()
        .await
        .expect("a lazy build needs no Redis");
    let name = unique_name("lazy");
    let err = locker.lock(name.as_str()).await.expect_err("Redis is down");
    assert!(err.is_backend(), "{err}");
    server.restart();
    // The first call after Redis is back gets the lock: the connection opens for it.
    let guard = locker.lock(name.as_str()).await.expect("Redis is back");
    let waiter = Locker::connect(&server.url()).await.expect("waiter");
    release_to_waiter(guard, &waiter, Duration::from_millis(100))
        .await
        .expect("handed over");
    // A bad URL is still refused at once.
    let bad = Locker::builder()
        .url("redis://[::1:6379")
        .connect_lazily(true)
        .build()
        .await;
    assert!(bad.is_err_and(|e| e.is_config()));
}

/// A source that brings no subscriber connection is refused unless the application gives one
/// or chooses polling on purpose: waiters never poll by surprise.
#[tokio::test]
async fn a_source_without_a_subscriber_needs_one_or_polling_chosen() {
    let server = RedisServer::start();
    let sources = [
        (
            "a connection manager",
            Locker::builder().connection_manager(manager(&server).await),
        ),
        (
            "a connection pool",
            Locker::builder().bb8_pool(bb8_pool(&server).await),
        ),
        (
            "a connection pool",
            Locker::builder().deadpool(deadpool(&server)),
        ),
        (
            "a multiplexed connection",
            Locker::builder().multiplexed(server.connection().await),
        ),
    ];
    for (what, builder) in sources {
        let err = builder
            .build()
            .await
            .expect_err("refused without a subscriber");
        assert!(err.is_config(), "{what}: {err}");
        let message = err.to_string();
        for named in [what, "subscriber(client)", "wake_by_polling()"] {
            assert!(message.contains(named), "{named:?} in {message}");
        }
    }
    // Polling chosen: built, and a waiter gets the lock after a release.
    let polling = Locker::builder()
        .multiplexed(server.connection().await)
        .wake_by_polling()
        .poll_interval(Duration::from_millis(20))
        .build()
        .await
        .expect("polling chosen");
    let holder = Locker::connect(&server.url()).await.expect("holder");
    let guard = holder.lock(unique_name("polled").as_str()).await.unwrap();
    release_to_waiter(guard, &polling, Duration::from_millis(100))
        .await
        .expect("acquired by polling");
    // Both, or polling where a subscriber comes with the source: a clear error.
    let both = Locker::builder()
        .multiplexed(server.connection().await)
        .subscriber(server.client())
        .wake_by_polling()
        .build()
        .await
        .expect_err("both");
    assert!(
        both.to_string().contains("drop `wake_by_polling`"),
        "{both}"
    );
    let url = Locker::builder()
        .url(server.url())
        .wake_by_polling()
        .build()
        .await
        .expect_err("a URL has a subscriber");
    assert!(
        url.to_string().contains("subscriber connection of its own"),
        "{url}"
    );
}

/// `LockerConfig` from `DLOCK_*` variables builds a working `Locker` for each deployment: one
/// server, a cluster, sentinels, and a set of independent masters, with the settings applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locker_is_built_from_dlock_variables_for_every_deployment() {
    use dlock_core::LockerConfig;
    use dlock_tests::{RedisCluster, RedisSentinel};

    let config = |pairs: Vec<(&'static str, String)>| {
        LockerConfig::from_vars(|name| {
            (pairs.iter())
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.clone())
        })
        .expect("config")
    };
    let settings = || {
        vec![
            ("DLOCK_PREFIX", "cfg:".to_owned()),
            ("DLOCK_HOLDER_LABEL", "from-env".to_owned()),
            ("DLOCK_DEFAULT_WAIT", "1s".to_owned()),
            ("DLOCK_DEFAULT_LEASE", "4s".to_owned()),
        ]
    };
    async fn works(locker: &Locker, what: &str) {
        assert_eq!(locker.prefix(), "cfg:", "{what}");
        assert_eq!(locker.default_wait(), Duration::from_secs(1), "{what}");
        let name = unique_name("cfg");
        let guard = locker.lock(name.as_str()).await.expect(what);
        let info = locker.inspect(name.as_str()).await.expect(what);
        assert_eq!(info.holders[0].label.as_deref(), Some("from-env"), "{what}");
        assert!(
            info.ttl.is_some_and(|t| t <= Duration::from_secs(4)),
            "{what}: {info:?}"
        );
        assert!(guard.release().await.is_released(), "{what}");
    }

    let server = RedisServer::start();
    let mut vars = settings();
    vars.push(("DLOCK_URL", server.url()));
    works(&config(vars).build().await.expect("url"), "url").await;

    let cluster = tokio::task::block_in_place(RedisCluster::start);
    let mut vars = settings();
    vars.push(("DLOCK_CLUSTER_URLS", cluster.seed_urls().join(",")));
    works(&config(vars).build().await.expect("cluster"), "cluster").await;

    let set = tokio::task::block_in_place(RedisSentinel::start);
    let mut vars = settings();
    vars.push(("DLOCK_SENTINEL_URLS", set.sentinel_urls().join(", ")));
    vars.push(("DLOCK_SENTINEL_MASTER", set.master_name().to_owned()));
    works(&config(vars).build().await.expect("sentinel"), "sentinel").await;

    let masters: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let mut vars = settings();
    let urls: Vec<String> = masters.iter().map(RedisServer::url).collect();
    vars.push(("DLOCK_MASTERS", urls.join(",")));
    let set = config(vars).build_master_set().await.expect("masters");
    assert_eq!((set.len(), set.needed()), (3, 2));
    let name = unique_name("cfg-masters");
    let guard = set.lock(name.as_str()).await.expect("a majority");
    assert_eq!(guard.granted().len(), 3);
    drop(guard);
}

/// The README's configuration table lists exactly the variables `LockerConfig::from_env`
/// reads.
#[test]
fn the_readme_lists_every_dlock_variable() {
    let readme = include_str!("../../README.md");
    let section = readme
        .split("## Configuration")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("a Configuration section");
    let listed: std::collections::BTreeSet<&str> = (section.lines())
        .filter_map(|line| line.strip_prefix("| `DLOCK_"))
        .filter_map(|rest| rest.split('`').next())
        .collect();
    let read: std::collections::BTreeSet<&str> = (dlock_core::LockerConfig::ENV_VARS.iter())
        .map(|(name, _)| name.trim_start_matches("DLOCK_"))
        .collect();
    assert_eq!(listed, read);
}
