//! Read-write locks (`Locker::read_write_lock`): readers together, a writer alone; writers not
//! starved by a stream of readers; re-entry and the refused upgrade; a reader that never comes
//! back leaves with its lease; a writer that gives up lets readers in at once — against real
//! Redis.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use dlock_core::redis::AsyncCommands as _;
use dlock_core::{LockError, Locker, ReleaseOutcome};
use dlock_tests::{RedisServer, unique_name};
use tokio::time::Instant;

#[derive(Default)]
struct Room {
    readers: AtomicU32,
    writers: AtomicU32,
    most_readers: AtomicU32,
    clash: AtomicBool,
}

impl Room {
    fn enter(&self, write: bool) {
        if write {
            let writers = self.writers.fetch_add(1, Ordering::SeqCst) + 1;
            if writers > 1 || self.readers.load(Ordering::SeqCst) > 0 {
                self.clash.store(true, Ordering::SeqCst);
            }
        } else {
            let readers = self.readers.fetch_add(1, Ordering::SeqCst) + 1;
            self.most_readers.fetch_max(readers, Ordering::SeqCst);
            if self.writers.load(Ordering::SeqCst) > 0 {
                self.clash.store(true, Ordering::SeqCst);
            }
        }
    }

    fn leave(&self, write: bool) {
        let count = if write { &self.writers } else { &self.readers };
        count.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn mixed(lockers: &[Locker], name: &str, tasks: usize) -> Arc<Room> {
    let room = Arc::new(Room::default());
    let mut handles = Vec::new();
    for i in 0..tasks {
        let lock = lockers[i % lockers.len()].read_write_lock(name);
        let room = room.clone();
        handles.push(tokio::spawn(async move {
            let write = i % 4 == 0;
            if write {
                let guard = (lock.write().wait(Duration::from_secs(30)).await).expect("write");
                room.enter(true);
                tokio::time::sleep(Duration::from_millis(2)).await;
                room.leave(true);
                assert!(guard.release().await.is_released());
            } else {
                let guard = (lock.read().wait(Duration::from_secs(30)).await).expect("read");
                room.enter(false);
                tokio::time::sleep(Duration::from_millis(3)).await;
                room.leave(false);
                assert!(guard.release().await.is_released());
            }
        }));
    }
    for handle in handles {
        handle.await.expect("task");
    }
    room
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_share_and_a_writer_is_alone_under_contention() {
    let server = RedisServer::start();
    let mut lockers = Vec::new();
    for _ in 0..3 {
        lockers.push(Locker::connect(&server.url()).await.expect("connect"));
    }
    let name = unique_name("rw-contention");
    let room = mixed(&lockers, &name, 120).await;
    assert!(!room.clash.load(Ordering::SeqCst), "a writer was not alone");
    assert!(
        room.most_readers.load(Ordering::SeqCst) > 1,
        "readers never shared"
    );
    let mut con = server.connection().await;
    let keys: Vec<String> = con.keys(format!("dlock:{{{name}}}*")).await.expect("KEYS");
    let left: Vec<&String> = keys.iter().filter(|k| !k.ends_with(":fence")).collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[tokio::test]
async fn the_memory_store_keeps_readers_and_writers_apart() {
    let store = dlock_core::MemoryStore::new();
    let lockers = [
        Locker::memory_with(store.clone()),
        Locker::memory_with(store),
    ];
    let room = mixed(&lockers, "rw-memory", 60).await;
    assert!(!room.clash.load(Ordering::SeqCst));
    assert!(room.most_readers.load(Ordering::SeqCst) > 1);
}

/// Readers coming and going without pause, overlapping, for `for_how_long`.
fn stream_of_readers(locker: &Locker, name: &str, prefer: bool, stop: Arc<AtomicBool>) {
    for _ in 0..4 {
        let lock = locker.read_write_lock(name).prefer_writers(prefer);
        let stop = stop.clone();
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                if let Ok(guard) = lock.read().wait(Duration::from_millis(50)).await {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    let _ = guard.release().await;
                }
            }
        });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_is_not_starved_by_a_stream_of_readers() {
    let server = RedisServer::start();
    let readers = Locker::connect(&server.url()).await.expect("connect");
    let writer = Locker::connect(&server.url()).await.expect("connect");
    let name = unique_name("rw-starve");
    let stop = Arc::new(AtomicBool::new(false));
    stream_of_readers(&readers, &name, true, stop.clone());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let asked = Instant::now();
    let guard = (writer.read_write_lock(name.as_str()).write())
        .wait(Duration::from_secs(5))
        .await
        .expect("the writer gets in");
    let waited = asked.elapsed();
    stop.store(true, Ordering::SeqCst);
    eprintln!("the writer waited {waited:?} behind a stream of readers holding 20 ms each");
    // The readers inside when it came leave within their 20 ms; no new one gets in meanwhile.
    assert!(waited < Duration::from_secs(1), "{waited:?}");
    assert!(guard.release().await.is_released());

    // Without the preference, a reader gets in beside another while a writer waits.
    let name = unique_name("rw-no-preference");
    let lock = writer.read_write_lock(name.as_str()).prefer_writers(false);
    let first = lock.read().await.expect("read");
    let waiting = tokio::spawn({
        let lock = lock.clone();
        async move { lock.write().wait(Duration::from_millis(400)).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let other = readers.read_write_lock(name.as_str()).prefer_writers(false);
    let second = other.read().try_lock().await.expect("try");
    assert!(second.is_some(), "a reader kept out while a writer waits");
    drop(second);
    assert!(matches!(
        waiting.await.expect("task"),
        Err(LockError::Busy { .. })
    ));
    drop(first);
}

#[tokio::test]
async fn a_writer_that_gives_up_lets_readers_in_at_once() {
    let server = RedisServer::start();
    // Waiting writers count for 30 s: only their leaving can let readers in within the test.
    let locker = (Locker::builder().url(server.url()))
        .dead_waiter_timeout(Duration::from_secs(30))
        .build()
        .await
        .expect("connect");
    let name = unique_name("rw-give-up");
    let lock = locker.read_write_lock(name.as_str());
    let reader = lock.read().await.expect("reader");
    // A writer that times out, and one whose future is dropped.
    let timed_out = lock.write().wait(Duration::from_millis(200));
    let dropped = tokio::spawn({
        let lock = lock.clone();
        async move { lock.write().wait(Duration::MAX).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        lock.read().try_lock().await.expect("try").is_none(),
        "writers wait"
    );
    assert!(matches!(timed_out.await, Err(LockError::Busy { .. })));
    dropped.abort();
    let _ = dropped.await;
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        if let Some(guard) = lock.read().try_lock().await.expect("try") {
            assert!(guard.release().await.is_released());
            break;
        }
        assert!(
            Instant::now() < deadline,
            "readers stayed out after the writers left"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(reader.release().await.is_released());
}

#[tokio::test]
async fn a_writer_reads_in_its_scope_and_a_reader_cannot_upgrade() {
    let server = RedisServer::start();
    let locker = Locker::connect(&server.url()).await.expect("connect");
    let name = unique_name("rw-scope");
    let lock = locker.read_write_lock(name.as_str());
    let first = lock.write().await.expect("write");
    let token = first.fencing_token().await.unwrap();
    assert!(first.release().await.is_released());
    dlock_core::scope(async {
        let write = lock.write().await.expect("write");
        assert!(
            write.fencing_token().await.unwrap() > token,
            "writers are fenced"
        );
        let read = lock
            .read()
            .try_lock()
            .await
            .expect("try")
            .expect("re-entered");
        assert!(read.is_reentrant());
        let again = lock
            .write()
            .try_lock()
            .await
            .expect("try")
            .expect("re-entered");
        assert!(again.is_reentrant());
        assert!(again.release().await.is_released());
        assert!(read.release().await.is_released());
        assert!(write.release().await.is_released());
    })
    .await;
    dlock_core::scope(async {
        let read = lock.read().await.expect("read");
        let nested = lock
            .read()
            .try_lock()
            .await
            .expect("try")
            .expect("re-entered");
        assert!(nested.is_reentrant());
        let upgrade = lock.write().try_lock().await;
        assert!(matches!(upgrade, Err(LockError::Config(_))), "{upgrade:?}");
        assert!(nested.release().await.is_released());
        assert!(read.release().await.is_released());
    })
    .await;
}

#[tokio::test]
async fn a_reader_is_renewed_while_held_and_one_never_released_leaves_with_its_lease() {
    let server = RedisServer::start();
    let locker = Locker::connect(&server.url()).await.expect("connect");
    let name = unique_name("rw-lease");
    let lock = locker.read_write_lock(name.as_str());
    let renewed = (lock.read().watchdog_lease(Duration::from_millis(300)))
        .await
        .expect("read");
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(!renewed.is_lost());
    assert!(renewed.release().await.is_released());

    let forgotten = (lock.read().lease(Duration::from_millis(400)))
        .await
        .expect("read");
    let granted = Instant::now();
    std::mem::forget(forgotten);
    let write = (lock.write().wait(Duration::from_secs(3)))
        .await
        .expect("the writer gets in when the lease ends");
    let waited = granted.elapsed();
    assert!(waited >= Duration::from_millis(350), "{waited:?}");
    assert!(waited < Duration::from_millis(900), "{waited:?}");
    assert!(write.release().await.is_released());

    let reader = (lock.read().watchdog_lease(Duration::from_millis(300)))
        .await
        .expect("read");
    let mut con = server.connection().await;
    let key = format!("{}:read", locker.key_of(name.as_str()).expect("key"));
    let removed: i64 = con.del(&key).await.expect("DEL");
    assert_eq!(removed, 1);
    // At the next renewal, a third of the lease later.
    let noticed = tokio::time::timeout(Duration::from_millis(300), reader.lost()).await;
    assert!(noticed.is_ok(), "the loss was not noticed within a renewal");
    assert!(matches!(reader.release().await, ReleaseOutcome::Expired));
}

/// A reader whose fixed lease ran out before its guard let go was gone: its release says
/// `Expired`, on Redis as in memory — also while another reader keeps the set (and the expired
/// member) in Redis.
#[tokio::test]
async fn an_expired_reader_released_is_expired_on_both_backends() {
    async fn outcome(locker: &Locker, name: &str) -> ReleaseOutcome {
        let rw = locker.read_write_lock(name);
        let other = (rw.read().lease(Duration::from_secs(30)).await).expect("other");
        let read = (rw.read().lease(Duration::from_millis(50)).await).expect("read");
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(read.is_lost(), "the reader's lease ran out");
        let outcome = read.release().await;
        assert!(other.release().await.is_released());
        outcome
    }
    let server = RedisServer::start();
    let redis = Locker::connect(&server.url()).await.expect("connect");
    let name = unique_name("rw-expired-release");
    let on_redis = outcome(&redis, &name).await;
    let on_memory = outcome(&Locker::memory(), &name).await;
    assert!(matches!(on_redis, ReleaseOutcome::Expired), "{on_redis:?}");
    assert!(
        matches!(on_memory, ReleaseOutcome::Expired),
        "{on_memory:?}"
    );
}

/// A writer's read re-entry shares its hold: the write hold lives on through the read guard
/// after the write guard goes, keeping other readers and writers out until the read goes too.
#[tokio::test]
async fn a_read_that_re_entered_the_write_hold_keeps_it_after_the_write_guard_goes() {
    let server = RedisServer::start();
    let locker = Locker::connect(&server.url()).await.expect("connect");
    let other = Locker::connect(&server.url()).await.expect("connect");
    let name = unique_name("rw-reenter-outlives");
    let rw = locker.read_write_lock(name.as_str());
    let orw = other.read_write_lock(name.as_str());
    let read = dlock_core::scope(async {
        let w = rw.write().await.expect("write");
        let r = rw.read().await.expect("read re-enters");
        assert!(r.is_reentrant());
        assert!(w.release().await.is_released());
        r
    })
    .await;
    // The write hold lives on through the read guard: no reader or writer elsewhere.
    assert!(orw.read().try_lock().await.expect("try").is_none());
    assert!(orw.write().try_lock().await.expect("try").is_none());
    assert!(read.release().await.is_released());
    let r2 = orw
        .read()
        .wait(Duration::from_secs(1))
        .await
        .expect("read after");
    assert!(r2.release().await.is_released());
}
