//! A `Locker`'s default wait and lease, under tokio's paused clock: every request starts from
//! them, explicit settings override them, and the builder refuses bad ones.

use std::time::Duration;

use dlock_core::{DEFAULT_WATCHDOG_LEASE, Lease, LockError, Locker, MemoryStore};
use tokio::time::{Instant, sleep};

async fn with_defaults(store: &MemoryStore, wait: Duration, lease: Lease) -> Locker {
    Locker::builder()
        .memory(store.clone())
        .default_wait(wait)
        .default_lease(lease)
        .build()
        .await
        .expect("valid defaults")
}

/// `name` held by another `Locker` over the same store, with a fixed lease of `lease`.
async fn held_elsewhere(store: &MemoryStore, name: &str, lease: Duration) -> dlock_core::LockGuard {
    Locker::memory_with(store.clone())
        .lock(name)
        .lease(lease)
        .await
        .expect("free")
}

#[tokio::test(start_paused = true)]
async fn without_settings_a_locker_makes_one_attempt_with_a_30s_watchdog_lease() {
    for locker in [
        Locker::memory(),
        Locker::builder()
            .memory(MemoryStore::new())
            .build()
            .await
            .unwrap(),
    ] {
        assert_eq!(locker.default_wait(), Duration::ZERO);
        assert_eq!(
            locker.default_lease(),
            Lease::watchdog(DEFAULT_WATCHDOG_LEASE)
        );
        let guard = locker.lock("plain").await.unwrap();
        assert!(guard.is_watchdog());
        let started = Instant::now();
        let err = locker.lock("plain").await.unwrap_err();
        assert!(err.is_busy(), "{err}");
        assert_eq!(started.elapsed(), Duration::ZERO, "one attempt, no wait");
        assert!(guard.release().await.is_released());
    }
}

#[tokio::test(start_paused = true)]
async fn a_request_waits_the_lockers_default_wait_unless_it_says_otherwise() {
    let store = MemoryStore::new();
    let locker = with_defaults(
        &store,
        Duration::from_secs(2),
        Lease::watchdog(DEFAULT_WATCHDOG_LEASE),
    )
    .await;
    assert_eq!(locker.default_wait(), Duration::from_secs(2));
    let holder = held_elsewhere(&store, "busy", Duration::from_secs(60)).await;

    let started = Instant::now();
    let err = locker.lock("busy").await.unwrap_err();
    assert!(err.is_busy(), "{err}");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(2) && waited < Duration::from_millis(2_100),
        "{waited:?}"
    );

    // Explicit settings win, shorter or longer.
    let started = Instant::now();
    let err = locker.lock("busy").wait(Duration::ZERO).await.unwrap_err();
    assert!(err.is_busy(), "{err}");
    assert_eq!(started.elapsed(), Duration::ZERO);
    let started = Instant::now();
    let err = locker
        .lock("busy")
        .wait(Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(err.is_busy(), "{err}");
    assert!(started.elapsed() >= Duration::from_secs(5));

    // The same deadline, for all names of a multi-lock.
    let started = Instant::now();
    let err = locker.lock_all(["a-free", "busy"]).await.unwrap_err();
    assert!(err.is_busy(), "{err}");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(2) && waited < Duration::from_millis(2_100),
        "{waited:?}"
    );
    assert!(locker.lock("a-free").try_lock().await.unwrap().is_some());

    // A release within the default wait hands the lock over.
    let waiter = tokio::spawn({
        let locker = locker.clone();
        async move {
            let started = Instant::now();
            let guard = locker.lock("busy").await?;
            Ok::<_, LockError>((started.elapsed(), guard.release().await.is_released()))
        }
    });
    sleep(Duration::from_millis(500)).await;
    assert!(holder.release().await.is_released());
    let (waited, released) = waiter.await.unwrap().unwrap();
    assert!(released);
    assert!(waited < Duration::from_secs(1), "{waited:?}");
}

#[tokio::test(start_paused = true)]
async fn a_fixed_default_lease_is_not_renewed_unless_a_request_says_otherwise() {
    let store = MemoryStore::new();
    let locker = with_defaults(&store, Duration::ZERO, Lease::fixed(Duration::from_secs(5))).await;
    assert_eq!(locker.default_lease(), Lease::fixed(Duration::from_secs(5)));

    let fixed = locker.lock("fixed").await.unwrap();
    assert!(!fixed.is_watchdog());
    assert!(fixed.remaining() <= Duration::from_secs(5));
    let watched = locker
        .lock("watched")
        .watchdog_lease(Duration::from_secs(3))
        .await
        .unwrap();
    assert!(watched.is_watchdog());
    let longer = locker
        .lock("longer")
        .lease(Duration::from_secs(20))
        .await
        .unwrap();
    let many = locker.lock_all(["m1", "m2"]).await.unwrap();

    // Slept, not advanced in one jump, so that the watchdog's ticks run on the way.
    sleep(Duration::from_secs(6)).await;
    assert!(fixed.is_lost(), "the default lease ran out");
    assert!(many.is_lost(), "a multi-lock takes the default lease too");
    assert!(!watched.is_lost(), "renewed");
    assert!(!longer.is_lost());
    assert!(locker.lock("fixed").try_lock().await.unwrap().is_some());
    assert!(watched.release().await.is_released());
    assert!(longer.release().await.is_released());
}

#[tokio::test(start_paused = true)]
async fn a_watchdog_default_lease_sets_the_renewed_length() {
    let store = MemoryStore::new();
    let locker = with_defaults(
        &store,
        Duration::ZERO,
        Lease::watchdog(Duration::from_secs(3)),
    )
    .await;
    let guard = locker.lock("renewed").await.unwrap();
    assert!(guard.is_watchdog());
    assert!(guard.remaining() <= Duration::from_secs(3));
    sleep(Duration::from_secs(10)).await;
    assert!(!guard.is_lost());
    assert!(guard.remaining() <= Duration::from_secs(3));
    // A fixed lease per request overrides it.
    let fixed = locker
        .lock("once")
        .lease(Duration::from_secs(1))
        .await
        .unwrap();
    assert!(!fixed.is_watchdog());
    assert!(guard.release().await.is_released());
}

#[tokio::test(start_paused = true)]
async fn watchdog_lease_and_default_lease_set_the_same_thing_and_the_last_call_wins() {
    let fixed_last = Locker::builder()
        .memory(MemoryStore::new())
        .default_lease(dlock_core::Lease::watchdog(Duration::from_secs(3)))
        .default_lease(Lease::fixed(Duration::from_secs(4)))
        .build()
        .await
        .unwrap();
    assert_eq!(
        fixed_last.default_lease(),
        Lease::fixed(Duration::from_secs(4))
    );
    let watchdog_last = Locker::builder()
        .memory(MemoryStore::new())
        .default_lease(Lease::fixed(Duration::from_secs(4)))
        .default_lease(dlock_core::Lease::watchdog(Duration::from_secs(3)))
        .build()
        .await
        .unwrap();
    assert_eq!(
        watchdog_last.default_lease(),
        Lease::watchdog(Duration::from_secs(3))
    );
}

#[tokio::test(start_paused = true)]
async fn the_builder_refuses_a_default_lease_a_request_could_not_have() {
    let refused = [
        Lease::fixed(Duration::from_millis(9)),
        Lease::fixed(Duration::ZERO),
        Lease::fixed(Duration::MAX),
        Lease::watchdog(Duration::from_millis(29)),
        Lease::watchdog(Duration::MAX),
    ];
    for lease in refused {
        let err = Locker::builder()
            .memory(MemoryStore::new())
            .default_lease(lease)
            .build()
            .await
            .expect_err("a bad default lease");
        assert!(err.is_config(), "{lease:?}: {err}");
        assert!(err.to_string().contains("lease"), "{err}");
    }
    let err = Locker::builder()
        .memory(MemoryStore::new())
        .default_lease(dlock_core::Lease::watchdog(Duration::MAX))
        .build()
        .await
        .expect_err("an endless watchdog lease");
    assert!(err.is_config(), "{err}");

    // The bounds themselves are accepted, and any wait is.
    for lease in [
        Lease::fixed(Duration::from_millis(10)),
        Lease::watchdog(Duration::from_millis(30)),
    ] {
        let locker = Locker::builder()
            .memory(MemoryStore::new())
            .default_lease(lease)
            .default_wait(Duration::MAX)
            .build()
            .await
            .unwrap();
        assert_eq!(locker.default_lease(), lease);
        assert_eq!(locker.default_wait(), Duration::MAX);
    }
}
