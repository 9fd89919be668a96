//! Key layouts across versions, on a real server: a hold in a layout this version does not
//! speak is busy and never written; a hold of layout 1 (untagged) is spoken; `Locker`s running
//! layout 1's frozen scripts beside this version's never hold one name at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use dlock_core::redis::AsyncCommands as _;
use dlock_core::{LockError, Locker};
use dlock_tests::capture::Capture;
use dlock_tests::hold::HoldValue;
use dlock_tests::layouts::layout_1;
use dlock_tests::{RedisServer, unique_name};
use tokio::time::Instant;

/// A later version's hold: its token tagged `v9/`, with a fencing token and a sequence number.
const NEWER: &str = "v9/0123456789abcdef0123456789abcdef f7 s3";

/// What `key` holds and its PTTL.
async fn state(
    con: &mut dlock_core::redis::aio::MultiplexedConnection,
    key: &str,
) -> (String, i64) {
    let value: String = con.get(key).await.expect("GET");
    let pttl: i64 = con.pttl(key).await.expect("PTTL");
    (value, pttl)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_in_a_layout_this_version_does_not_speak_is_busy_and_never_written() {
    let logs = Capture::default();
    let _default = tracing::subscriber::set_global_default(logs.clone());
    let server = RedisServer::start();
    let mut con = server.connection().await;
    let locker = Locker::builder()
        .url(server.url())
        .poll_interval(Duration::from_millis(20))
        .build()
        .await
        .expect("locker");

    // The plain lock, the fair lock, the writer and a reader of a read-write lock, and a
    // multi-lock: each finds the newer version's hold busy.
    let name = unique_name("newer");
    let key = locker.key_of(name.as_str()).expect("key");
    let write_key = format!("{key}:write");
    for k in [&key, &write_key] {
        let () = con.pset_ex(k, NEWER, 60_000).await.expect("SET");
    }
    let rw = locker.read_write_lock(name.as_str());
    let other = unique_name("free");
    let started = Instant::now();
    let answers = [
        (
            "lock",
            locker
                .lock(name.as_str())
                .wait(Duration::from_millis(300))
                .await
                .map(drop),
        ),
        (
            "fair",
            (locker
                .fair_lock(name.as_str())
                .wait(Duration::from_millis(300))
                .await)
                .map(drop),
        ),
        (
            "write",
            rw.write().wait(Duration::from_millis(300)).await.map(drop),
        ),
        (
            "read",
            rw.read().wait(Duration::from_millis(300)).await.map(drop),
        ),
    ];
    for (kind, answer) in answers {
        let err = answer.expect_err(kind);
        assert!(
            matches!(err, LockError::HeldInForeignLayout { .. }) && err.is_busy(),
            "{kind}: {err:?}"
        );
    }
    assert!(
        locker
            .lock(name.as_str())
            .try_lock()
            .await
            .expect("answers")
            .is_none()
    );
    let all = locker
        .lock_all([other.as_str(), name.as_str()])
        .try_lock()
        .await;
    assert!(all.expect("answers").is_none());
    assert!(
        locker
            .lock(other.as_str())
            .try_lock()
            .await
            .expect("answers")
            .is_some()
    );

    // Left exactly as it was: no flag, no claim, no lease change.
    for k in [&key, &write_key] {
        let (value, pttl) = state(&mut con, k).await;
        assert_eq!(value, NEWER, "{k}");
        assert!(
            pttl <= 60_000 - i64::try_from(started.elapsed().as_millis()).expect("ms") + 5,
            "{k}: {pttl}"
        );
    }
    // Said once per acquisition, at WARN.
    let warned = logs.events_saying("does not speak");
    assert!(warned.len() >= 4, "{warned:#?}");
    assert!(warned.iter().all(|e| e.level == tracing::Level::WARN));

    // Polled, not woken: taken soon after the newer hold ends, though nothing announces it.
    let () = con.pexpire(&key, 200).await.expect("PEXPIRE");
    let waited = Instant::now();
    let guard = (locker
        .lock(name.as_str())
        .wait(Duration::from_secs(5))
        .await)
        .expect("taken once the newer hold is gone");
    assert!(
        waited.elapsed() < Duration::from_secs(1),
        "{:?}",
        waited.elapsed()
    );
    assert!(guard.release().await.is_released());
}

#[tokio::test]
async fn a_layout_1_hold_is_spoken_flagged_and_claimed() {
    let server = RedisServer::start();
    let mut con = server.connection().await;
    let old = Locker::builder()
        .url(server.url())
        .frozen_layout(layout_1())
        .build()
        .await
        .expect("layout-1 locker");
    let new = Locker::connect(&server.url()).await.expect("locker");
    let name = unique_name("old-hold");
    let key = new.key_of(name.as_str()).expect("key");

    let held = old.lock(name.as_str()).await.expect("free");
    let owner = HoldValue::read(&mut con, &key)
        .await
        .expect("GET")
        .and_then(|h| h.owner);
    let owner = owner.expect("an owner");
    assert!(
        owner.len() == 32 && owner.bytes().all(|b| b.is_ascii_hexdigit()),
        "layout 1's tokens are untagged: {owner}"
    );
    // This version's waiter flags the old hold and claims the next turn, as layout 1 would.
    let waiter = tokio::spawn({
        let new = new.clone();
        let name = name.clone();
        async move { new.lock(name.as_str()).wait(Duration::from_secs(5)).await }
    });
    let mut flagged = None;
    for _ in 0..100 {
        let hold = HoldValue::read(&mut con, &key)
            .await
            .expect("GET")
            .expect("held");
        if hold.waited_for && hold.claim.is_some() {
            flagged = Some(hold);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let hold = flagged.expect("the waiter flags the hold and claims its turn");
    assert_eq!(hold.owner.as_deref(), Some(owner.as_str()));
    let claim = hold.claim_value().expect("a claim this version reads");
    assert!(
        claim.locker.starts_with(dlock_core::protocol::layout::TAG),
        "{claim:?}"
    );
    // The old holder's release passes the turn on; the new waiter is woken and takes it.
    let released = Instant::now();
    assert!(held.release().await.is_released());
    let guard = waiter.await.expect("task").expect("the turn passes");
    assert!(released.elapsed() < Duration::from_secs(1));
    let owner = HoldValue::read(&mut con, &key)
        .await
        .expect("GET")
        .and_then(|h| h.owner);
    assert!(owner.is_some_and(|o| o.starts_with(dlock_core::protocol::layout::TAG)));
    assert!(guard.release().await.is_released());
}

/// Two `Locker`s of each layout, eight tasks each, on four names: no two holders at once, and
/// every task gets its turns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockers_of_layout_1_and_this_layout_never_overlap() {
    let server = RedisServer::start();
    let mut lockers = Vec::new();
    for old in [true, false, true, false] {
        let builder = Locker::builder()
            .url(server.url())
            .default_lease(dlock_core::Lease::watchdog(Duration::from_millis(600)));
        let builder = if old {
            builder.frozen_layout(layout_1())
        } else {
            builder
        };
        lockers.push(builder.build().await.expect("locker"));
    }
    let names: Vec<String> = (0..4).map(|i| unique_name(&format!("mixed-{i}"))).collect();
    let inside: Arc<Vec<AtomicBool>> = Arc::new((0..4).map(|_| AtomicBool::new(false)).collect());
    let taken = Arc::new(AtomicU32::new(0));
    let mut tasks = Vec::new();
    for (l, locker) in lockers.iter().enumerate() {
        for t in 0..8 {
            let (locker, names) = (locker.clone(), names.clone());
            let (inside, taken) = (inside.clone(), taken.clone());
            tasks.push(tokio::spawn(async move {
                for round in 0..10 {
                    let n = (l + t + round) % names.len();
                    let guard = (locker.lock(names[n].as_str()).wait(Duration::from_secs(20)))
                        .await
                        .expect("a turn within the wait");
                    assert!(
                        !inside[n].swap(true, Ordering::SeqCst),
                        "two holders of {n}"
                    );
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    inside[n].store(false, Ordering::SeqCst);
                    taken.fetch_add(1, Ordering::Relaxed);
                    assert!(guard.release().await.is_released());
                }
            }));
        }
    }
    for task in tasks {
        task.await.expect("no overlap, every turn taken");
    }
    assert_eq!(taken.load(Ordering::Relaxed), 4 * 8 * 10);
}
