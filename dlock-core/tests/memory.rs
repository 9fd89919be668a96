//! The in-memory backend under tokio's paused clock: expiry, renewal, loss, waiting, fencing and
//! reentrancy, with time moved by hand.

use std::time::Duration;

use dlock_core::{LockError, Locker, MemoryStore, ReleaseOutcome};
use tokio::time::{Instant, advance, sleep};

#[tokio::test(start_paused = true)]
async fn fixed_lease_expires_and_the_next_holder_gets_a_higher_token() {
    let locker = Locker::memory();
    let first = locker
        .lock("job")
        .lease(Duration::from_secs(5))
        .await
        .unwrap();
    assert!(!first.is_watchdog());
    let first_token = first.fencing_token().await.unwrap();
    assert!(locker.lock("job").try_lock().await.unwrap().is_none());

    advance(Duration::from_secs(6)).await;
    assert!(first.is_lost());
    assert_eq!(first.remaining(), Duration::ZERO);
    assert!(first.fencing_token().await.unwrap_err().is_lost());

    let second = locker.lock("job").try_lock().await.unwrap().unwrap();
    assert!(second.fencing_token().await.unwrap() > first_token);
    assert!(matches!(first.release().await, ReleaseOutcome::TakenOver));
    assert!(second.release().await.is_released());
}

#[tokio::test(start_paused = true)]
async fn watchdog_keeps_a_long_critical_section_alive() {
    let locker = Locker::builder()
        .memory(MemoryStore::new())
        .default_lease(dlock_core::Lease::watchdog(Duration::from_secs(3)))
        .build()
        .await
        .unwrap();
    let guard = locker.lock("long").await.unwrap();
    assert!(guard.is_watchdog());
    let rival = locker.clone();
    for _ in 0..10 {
        sleep(Duration::from_secs(2)).await;
        assert!(!guard.is_lost());
        assert!(rival.lock("long").try_lock().await.unwrap().is_none());
    }
    assert!(guard.remaining() > Duration::from_secs(1));
    // One round trip per tick, a tick every third of the lease: about 20 in 20 s.
    let trips = locker.stats().renewal_round_trips;
    assert!((18..=22).contains(&trips), "{trips} renewal round trips");
    assert!(guard.release().await.is_released());
    assert_eq!(locker.stats().renewed_holds, 0);
}

#[tokio::test(start_paused = true)]
async fn deleting_the_lock_cancels_the_guarded_future() {
    let store = MemoryStore::new();
    let locker = Locker::builder()
        .memory(store.clone())
        .default_lease(dlock_core::Lease::watchdog(Duration::from_secs(3)))
        .build()
        .await
        .unwrap();
    let guard = locker.lock("doomed").await.unwrap();
    let key = locker.key_of("doomed").unwrap();
    let started = Instant::now();
    let deleter = tokio::spawn({
        let store = store.clone();
        async move {
            sleep(Duration::from_millis(500)).await;
            assert!(store.delete(&key));
        }
    });
    let result = guard
        .run(async {
            sleep(Duration::from_secs(60)).await;
            "finished"
        })
        .await;
    deleter.await.unwrap();
    assert!(matches!(result, Err(LockError::Lost { .. })), "{result:?}");
    // Found by the next renewal tick (every second for a 3 s lease).
    assert!(started.elapsed() <= Duration::from_millis(1_600));
    assert!(guard.is_lost());
    assert!(matches!(guard.release().await, ReleaseOutcome::Expired));
}

#[tokio::test(start_paused = true)]
async fn a_waiter_is_woken_by_the_release_not_by_its_timer() {
    let store = MemoryStore::new();
    let a = Locker::memory_with(store.clone());
    let b = Locker::memory_with(store);
    let held = a.lock("w").lease(Duration::from_secs(30)).await.unwrap();
    let waiter = tokio::spawn(async move {
        let started = Instant::now();
        let guard = b.lock("w").wait(Duration::from_secs(20)).await.unwrap();
        (started.elapsed(), guard.release().await.is_released())
    });
    sleep(Duration::from_secs(1)).await;
    assert!(held.release().await.is_released());
    let (waited, released) = waiter.await.unwrap();
    assert!(released);
    assert!(waited < Duration::from_millis(1_100), "{waited:?}");
}

#[tokio::test(start_paused = true)]
async fn a_waiter_times_out_with_the_holders_ttl() {
    let locker = Locker::memory();
    let _held = locker
        .lock("t")
        .lease(Duration::from_secs(10))
        .await
        .unwrap();
    let started = Instant::now();
    let err = locker
        .lock("t")
        .wait(Duration::from_secs(2))
        .await
        .unwrap_err();
    assert!(err.is_busy());
    let waited = started.elapsed();
    assert!(waited >= Duration::from_secs(2) && waited < Duration::from_millis(2_100));
    let retry_after = err.retry_after().unwrap();
    assert!(retry_after <= Duration::from_secs(8) && retry_after > Duration::from_secs(7));
}

#[tokio::test(start_paused = true)]
async fn local_waiters_queue_and_each_gets_the_lock_once() {
    let locker = Locker::memory();
    let held = locker.lock("q").await.unwrap();
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let locker = locker.clone();
        tasks.push(tokio::spawn(async move {
            let guard = locker.lock("q").wait(Duration::from_secs(60)).await?;
            sleep(Duration::from_millis(10)).await;
            let token = guard.fencing_token().await.unwrap();
            assert!(guard.release().await.is_released());
            Ok::<_, LockError>(token)
        }));
    }
    sleep(Duration::from_millis(5)).await;
    assert!(held.release().await.is_released());
    let mut tokens = Vec::new();
    for task in tasks {
        tokens.push(task.await.unwrap().unwrap());
    }
    tokens.sort();
    tokens.dedup();
    assert_eq!(tokens.len(), 8);
}

#[tokio::test(start_paused = true)]
async fn reentrancy_is_scoped_to_the_task() {
    let locker = Locker::memory();
    dlock_core::scope(async {
        let outer = locker.lock("r").await.unwrap();
        assert_eq!(
            dlock_core::scope::fencing_token().await.unwrap(),
            outer.fencing_token().await.unwrap()
        );
        let inner = locker.lock("r").await.unwrap();
        assert!(inner.is_reentrant());
        assert_eq!(
            inner.fencing_token().await.unwrap(),
            outer.fencing_token().await.unwrap()
        );

        // Another task, even inside its own scope, does not share the hold.
        let other = locker.clone();
        let busy = tokio::spawn(dlock_core::scope(async move {
            other.lock("r").try_lock().await.map(|g| g.is_none())
        }))
        .await
        .unwrap()
        .unwrap();
        assert!(busy);

        assert!(inner.release().await.is_released());
        // Still held by the outer guard: another task still finds it busy.
        let other = locker.clone();
        let still_busy =
            tokio::spawn(async move { other.lock("r").try_lock().await.map(|g| g.is_none()) })
                .await
                .unwrap()
                .unwrap();
        assert!(still_busy);
        assert!(outer.release().await.is_released());
    })
    .await;
    assert!(locker.lock("r").try_lock().await.unwrap().is_some());
}

#[tokio::test(start_paused = true)]
async fn outside_a_scope_a_second_acquisition_waits_like_any_contender() {
    let locker = Locker::memory();
    let _outer = locker.lock("s").await.unwrap();
    let err = locker
        .lock("s")
        .wait(Duration::from_millis(100))
        .await
        .unwrap_err();
    assert!(err.is_busy());
}

#[tokio::test(start_paused = true)]
async fn multi_lock_is_all_or_none() {
    let locker = Locker::memory();
    let blocker = locker.lock("sku:2").await.unwrap();
    let err = locker
        .lock_all(["sku:3", "sku:1", "sku:2"])
        .wait(Duration::from_millis(50))
        .await
        .unwrap_err();
    assert!(err.is_busy());
    // Nothing of the failed set stays held.
    assert!(locker.lock("sku:1").try_lock().await.unwrap().is_some());
    assert!(locker.lock("sku:3").try_lock().await.unwrap().is_some());
    drop(blocker);
    tokio::task::yield_now().await;
    let all = locker
        .lock_all(["sku:3", "sku:1", "sku:2", "sku:1"])
        .wait(Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(all.len(), 3);
    let names: Vec<_> = all.names().map(|n| n.as_str().to_owned()).collect();
    assert_eq!(names, ["sku:1", "sku:2", "sku:3"]);
    assert!(all.release().await.is_released());
}

#[tokio::test(start_paused = true)]
async fn a_dropped_guard_is_released_in_the_background() {
    let locker = Locker::memory();
    let guard = locker.lock("d").await.unwrap();
    drop(guard);
    tokio::task::yield_now().await;
    assert!(locker.lock("d").try_lock().await.unwrap().is_some());
}

#[tokio::test(start_paused = true)]
async fn extend_moves_the_deadline() {
    let locker = Locker::memory();
    let guard = locker
        .lock("e")
        .lease(Duration::from_secs(2))
        .await
        .unwrap();
    advance(Duration::from_secs(1)).await;
    guard.extend(Duration::from_secs(10)).await.unwrap();
    advance(Duration::from_secs(5)).await;
    assert!(!guard.is_lost());
    assert!(guard.remaining() > Duration::from_secs(4));
}

#[tokio::test]
async fn bad_names_are_typed_errors() {
    let locker = Locker::memory();
    let err = locker.lock("a\u{0}b").await.unwrap_err();
    assert!(err.is_invalid_name(), "{err}");
    let err = locker.lock("").try_lock().await.unwrap_err();
    assert!(err.is_invalid_name());
    let err = locker
        .lock("x".repeat(dlock_core::MAX_NAME_LEN + 1))
        .await
        .unwrap_err();
    assert!(err.is_invalid_name());
    assert_eq!(
        err.to_string(),
        format!(
            "invalid lock name: {} bytes is longer than the limit of {}",
            dlock_core::MAX_NAME_LEN + 1,
            dlock_core::MAX_NAME_LEN
        )
    );
}

#[tokio::test(start_paused = true)]
async fn extend_to_a_shorter_lease_moves_the_deadline_earlier() {
    let locker = Locker::memory();
    let guard = locker
        .lock("shorter")
        .lease(Duration::from_secs(30))
        .await
        .unwrap();
    guard.extend(Duration::from_secs(2)).await.unwrap();
    assert!(guard.remaining() <= Duration::from_secs(2));
    // The lost future learns of the earlier deadline without waiting for the old one.
    let started = Instant::now();
    guard.lost().await;
    assert!(started.elapsed() <= Duration::from_secs(2));
    // The guard stops believing a drift margin before the store lets the lock go.
    sleep(Duration::from_millis(50)).await;
    assert!(locker.lock("shorter").try_lock().await.unwrap().is_some());
}

#[tokio::test(start_paused = true)]
async fn a_watchdog_lock_extended_shorter_is_renewed_at_the_shorter_lease() {
    let locker = Locker::memory();
    let guard = locker.lock("renewed-shorter").await.unwrap();
    guard.extend(Duration::from_secs(3)).await.unwrap();
    for _ in 0..10 {
        sleep(Duration::from_secs(2)).await;
        assert!(!guard.is_lost());
        assert!(guard.remaining() <= Duration::from_secs(3));
    }
    assert!(guard.release().await.is_released());
}

#[tokio::test(start_paused = true)]
async fn re_entering_a_deleted_lock_reports_the_loss_and_mints_nothing() {
    let store = MemoryStore::new();
    let locker = Locker::memory_with(store.clone());
    dlock_core::scope(async {
        let outer = locker.lock("gone").await.unwrap();
        assert!(store.delete(&locker.key_of("gone").unwrap()));
        let err = locker.lock("gone").await.unwrap_err();
        assert!(err.is_lost(), "{err}");
        assert!(outer.is_lost());
        assert!(store.is_empty());
        assert!(!outer.release().await.is_released());
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn inner_releases_count_down_in_the_process_and_the_last_one_releases() {
    let store = MemoryStore::new();
    let locker = Locker::memory_with(store.clone());
    dlock_core::scope(async {
        let outer = locker.lock("nested").await.unwrap();
        let inner = locker.lock("nested").await.unwrap();
        let innermost = locker.lock("nested").await.unwrap();
        assert!(innermost.release().await.is_released());
        assert!(outer.release().await.is_released());
        // The middle guard still holds it.
        assert_eq!(store.len(), 1);
        assert!(inner.release().await.is_released());
        assert!(store.is_empty());
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn waiting_for_duration_max_does_not_overflow() {
    let locker = Locker::memory();
    let first = locker.lock("max").await.unwrap();
    let waiter = tokio::spawn({
        let locker = locker.clone();
        async move { locker.lock("max").wait(Duration::MAX).await }
    });
    sleep(Duration::from_secs(3600)).await;
    assert!(first.release().await.is_released());
    let second = waiter.await.unwrap().unwrap();
    assert!(second.release().await.is_released());
    let all = locker
        .lock_all(["a", "b"])
        .wait(Duration::MAX)
        .await
        .unwrap();
    assert_eq!(all.len(), 2);
    let err = locker.lock("max").lease(Duration::MAX).await.unwrap_err();
    assert!(err.is_config(), "{err}");
}

#[tokio::test(start_paused = true)]
async fn at_least_keeps_the_name_taken_after_an_early_release() {
    let store = MemoryStore::new();
    let locker = Locker::builder()
        .memory(store.clone())
        .build()
        .await
        .unwrap();
    let rival = Locker::builder().memory(store).build().await.unwrap();
    let first = (locker.lock("job").at_least(Duration::from_secs(30)))
        .await
        .unwrap();
    let token = first.fencing_token().await.unwrap();
    advance(Duration::from_secs(1)).await;
    assert!(first.release().await.is_released());
    assert!(rival.lock("job").try_lock().await.unwrap().is_none());
    advance(Duration::from_secs(28)).await;
    assert!(rival.lock("job").try_lock().await.unwrap().is_none());
    advance(Duration::from_secs(2)).await;
    let second = rival.lock("job").try_lock().await.unwrap().unwrap();
    assert!(second.fencing_token().await.unwrap() > token);
    assert!(second.release().await.is_released());
    // Without a period, free at once.
    assert!(locker.lock("job").try_lock().await.unwrap().is_some());
}

/// A fair lock's release that keeps the name for an `at_least` period wakes the head of the
/// line, which then waits out only the period — not the holder's whole lease or its own
/// heartbeat — as on Redis.
#[tokio::test(start_paused = true)]
async fn a_fair_release_within_at_least_wakes_the_head_of_the_line() {
    let store = MemoryStore::new();
    let build = || async {
        (Locker::builder().memory(store.clone()))
            .dead_waiter_timeout(Duration::from_secs(60))
            .build()
            .await
            .unwrap()
    };
    let (holder, waiter) = (build().await, build().await);
    let first = (holder.fair_lock("job").lease(Duration::from_secs(120)))
        .at_least(Duration::from_secs(2))
        .await
        .unwrap();
    let started = Instant::now();
    let waiting = tokio::spawn(async move {
        let got = waiter.fair_lock("job").wait(Duration::from_secs(100)).await;
        let at = Instant::now();
        let token = match got {
            Ok(guard) => Ok(guard.fencing_token().await.unwrap()),
            Err(err) => Err(err),
        };
        (token, at)
    });
    sleep(Duration::from_millis(500)).await;
    let first_token = first.fencing_token().await.unwrap();
    assert!(first.release().await.is_released());
    let (token, at) = waiting.await.unwrap();
    assert!(token.unwrap() > first_token);
    let waited = at - started;
    assert!(
        waited >= Duration::from_secs(2) && waited < Duration::from_secs(3),
        "the head waited {waited:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn inspect_and_force_release_in_memory() {
    let store = MemoryStore::new();
    let locker = Locker::builder()
        .memory(store.clone())
        .holder_label("memory-a")
        .build()
        .await
        .unwrap();
    let rival = Locker::builder().memory(store).build().await.unwrap();
    assert!(!locker.inspect("job").await.unwrap().is_taken());
    let guard = locker
        .lock("job")
        .lease(Duration::from_secs(10))
        .await
        .unwrap();
    advance(Duration::from_secs(1)).await;
    // A lock taken at a first attempt has its token minted when its holder first asks, as on
    // Redis (the store runs the same scripts).
    assert_eq!(rival.inspect("job").await.unwrap().fencing_token, None);
    let token = guard.fencing_token().await.unwrap();
    let info = rival.inspect("job").await.unwrap();
    assert_eq!(info.holders.len(), 1);
    assert_eq!(info.holders[0].label.as_deref(), Some("memory-a"));
    assert_eq!(info.holders[0].token_prefix.len(), 8);
    assert_eq!(info.fencing_token, Some(token));
    assert_eq!(info.ttl, Some(Duration::from_secs(9)));
    assert!(rival.force_release("job").await.unwrap());
    assert!(!rival.inspect("job").await.unwrap().is_taken());
    assert!(matches!(guard.release().await, ReleaseOutcome::Expired));
    assert!(!rival.force_release("job").await.unwrap());
}
