//! Semaphores and read-write locks on PostgreSQL, against a real server the harness starts:
//! no more permits than the count across `Locker`s and tasks, several taken all or none,
//! readers that share and writers that exclude (the holds of one `Locker`, which share a
//! session, kept apart too), a waiting writer that keeps new readers out, a killed session's
//! permits and reads lost, and what an operator sees and frees.

use std::time::Duration;

use tokio::time::Instant;

use dlock_core::{Lease, LockError, Locker};
use dlock_tests::{PostgresServer, unique_name};

async fn locker(url: &str) -> Locker {
    Locker::connect(url).await.expect("a postgres Locker")
}

/// A `Locker` whose watchdog renews (and so checks its holds) every 300 ms.
async fn watched(url: &str) -> Locker {
    (Locker::builder().postgres_url(url))
        .default_lease(Lease::Watchdog(Duration::from_millis(900)))
        .build()
        .await
        .expect("a postgres Locker")
}

/// Permit slots held now, by any session.
async fn slots_held(pg: &PostgresServer) -> usize {
    pg.advisory_holders().await.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_hands_out_its_permits_and_no_more_across_lockers_and_tasks() {
    let pg = PostgresServer::start();
    let (a, b) = (locker(&pg.url()).await, locker(&pg.url()).await);
    let name = unique_name("pg-permits");
    let (sa, sb) = (a.semaphore(name.as_str(), 3), b.semaphore(name.as_str(), 3));
    // Two tasks of one `Locker` (one session) and one of another.
    let one = sa.acquire().await.expect("a first permit");
    let two = sa.acquire().await.expect("a second, in the same Locker");
    let three = sb.acquire().await.expect("a third, elsewhere");
    assert_eq!(slots_held(&pg).await, 3);
    for s in [&sa, &sb] {
        let more = s.acquire().try_lock().await.expect("try");
        assert!(more.is_none(), "a fourth permit of three");
    }
    assert_eq!(sa.status().await.expect("status").held, 3);

    // A waiter is woken by a release, not by polling.
    let waiter = {
        let sb = sb.clone();
        tokio::spawn(async move {
            let permit = sb.acquire().wait(Duration::from_secs(10)).await;
            (permit, Instant::now())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    assert!(two.release().await.is_released());
    let (permit, woke) = waiter.await.expect("the waiter");
    let permit = permit.expect("the released permit");
    assert!(
        woke - released < Duration::from_millis(200),
        "woken {:?} after the release",
        woke - released
    );
    for p in [one, permit, three] {
        assert!(p.release().await.is_released());
    }
    assert_eq!(slots_held(&pg).await, 0, "every slot unlocked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_permits_are_taken_all_or_none() {
    let pg = PostgresServer::start();
    let (a, b) = (locker(&pg.url()).await, locker(&pg.url()).await);
    let name = unique_name("pg-permits-many");
    let (sa, sb) = (a.semaphore(name.as_str(), 4), b.semaphore(name.as_str(), 4));
    let three = sb.acquire_many(3).await.expect("three of four");
    assert_eq!(three.permits(), 3);
    // Two are asked for and one is free: none is taken, the free one stays free.
    let two = sa.acquire_many(2).try_lock().await.expect("try");
    assert!(two.is_none(), "two of one free");
    assert_eq!(slots_held(&pg).await, 3);
    let last = sa.acquire().await.expect("the free one, still free");
    assert!(last.release().await.is_released());

    let waiter = {
        let sa = sa.clone();
        tokio::spawn(async move { sa.acquire_many(2).wait(Duration::from_secs(10)).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(three.release().await.is_released());
    let two = waiter
        .await
        .expect("the waiter")
        .expect("two once three went");
    assert_eq!(slots_held(&pg).await, 2);
    // Two of this `Locker`'s and one more of the same: the session's own slots are not
    // counted as free.
    let one = sa.acquire().await.expect("a third");
    let other = sa.acquire_many(2).try_lock().await.expect("try");
    assert!(other.is_none(), "two more of one free");
    assert!(two.release().await.is_released());
    assert!(one.release().await.is_released());
    assert_eq!(slots_held(&pg).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_share_and_writers_exclude_across_lockers_and_in_one() {
    let pg = PostgresServer::start();
    let (a, b) = (locker(&pg.url()).await, locker(&pg.url()).await);
    let name = unique_name("pg-rw");
    let (ra, rb) = (
        a.read_write_lock(name.as_str()),
        b.read_write_lock(name.as_str()),
    );
    let r1 = ra.read().await.expect("a reader");
    let r2 = ra.read().await.expect("another, in the same Locker");
    let r3 = rb.read().await.expect("a reader elsewhere");
    for (what, rw) in [("elsewhere", &rb), ("where readers are", &ra)] {
        let w = rw.write().try_lock().await.expect("try");
        assert!(w.is_none(), "a writer {what} while three read");
    }
    for r in [r1, r2, r3] {
        assert!(r.release().await.is_released());
    }
    let w = ra.write().await.expect("the writer, once nobody reads");
    let token = w.fencing_token().await.expect("a writer's token").get();
    for (what, rw) in [("elsewhere", &rb), ("in the writer's Locker", &ra)] {
        let r = rw.read().try_lock().await.expect("try");
        assert!(r.is_none(), "a reader {what} while one writes");
        let w2 = rw.write().try_lock().await.expect("try");
        assert!(w2.is_none(), "a second writer {what}");
    }
    assert!(w.release().await.is_released());
    let w = rb.write().await.expect("the next writer");
    assert!(w.fencing_token().await.expect("its token").get() > token);
    assert!(w.release().await.is_released());
    assert!(pg.advisory_holders().await.is_empty());
}

/// With writers preferred (the default), a writer that waits keeps new readers out, here and
/// elsewhere, and gets the lock when the readers it waited for are gone; without, readers go
/// on getting in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_writer_keeps_new_readers_out() {
    let pg = PostgresServer::start();
    let (a, b) = (locker(&pg.url()).await, locker(&pg.url()).await);
    let name = unique_name("pg-rw-waiting");
    let reading = b.read_write_lock(name.as_str()).read().await.expect("read");
    let writer = {
        let rw = a.read_write_lock(name.as_str());
        tokio::spawn(async move { rw.write().wait(Duration::from_secs(10)).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    for (what, locker) in [("elsewhere", &b), ("in the writer's Locker", &a)] {
        let rw = locker.read_write_lock(name.as_str());
        let r = rw.read().try_lock().await.expect("try");
        assert!(r.is_none(), "a new reader {what} while a writer waits");
    }
    // Not preferred: a reader gets in beside the one there.
    let plain = (b.read_write_lock(name.as_str()).prefer_writers(false))
        .read()
        .try_lock()
        .await
        .expect("try")
        .expect("a reader that does not defer to writers");
    assert!(plain.release().await.is_released());
    assert!(reading.release().await.is_released());
    let w = writer.await.expect("the writer").expect("the lock");
    assert!(w.release().await.is_released());
    // The writer is gone: readers get in again at once.
    let r = b.read_write_lock(name.as_str()).read().await.expect("read");
    assert!(r.release().await.is_released());
    assert!(pg.advisory_holders().await.is_empty(), "no gate left");
}

/// A writer that gives up waiting lets its gate go: readers get in again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_that_gives_up_lets_readers_in_again() {
    let pg = PostgresServer::start();
    let (a, b) = (locker(&pg.url()).await, locker(&pg.url()).await);
    let name = unique_name("pg-rw-gave-up");
    let reading = b.read_write_lock(name.as_str()).read().await.expect("read");
    let gave_up = (a.read_write_lock(name.as_str()).write())
        .wait(Duration::from_millis(400))
        .await;
    assert!(
        matches!(gave_up, Err(LockError::Busy { .. })),
        "{gave_up:?}"
    );
    let r = (a.read_write_lock(name.as_str()).read())
        .wait(Duration::from_secs(2))
        .await
        .expect("a reader once the writer gave up");
    assert!(r.release().await.is_released());
    assert!(reading.release().await.is_released());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_session_costs_its_permits_and_reads_and_frees_them() {
    let pg = PostgresServer::start();
    let (a, b) = (watched(&pg.url()).await, locker(&pg.url()).await);
    let name = unique_name("pg-kinds-killed");
    let permit = a
        .semaphore(name.as_str(), 1)
        .acquire()
        .await
        .expect("permit");
    let read = a.read_write_lock(name.as_str()).read().await.expect("read");
    let ended = pg
        .query_i64(
            "SELECT count(pg_terminate_backend(pid))::bigint FROM \
             (SELECT DISTINCT pid FROM pg_locks WHERE locktype = 'advisory' AND granted) s",
        )
        .await;
    assert!(ended[0] >= 1, "{ended:?}");
    for lost in [permit.lost(), read.lost()] {
        tokio::time::timeout(Duration::from_secs(5), lost)
            .await
            .expect("the loss is noticed");
    }
    let next = b.semaphore(name.as_str(), 1).acquire().await.expect("free");
    let write = b
        .read_write_lock(name.as_str())
        .write()
        .await
        .expect("free");
    assert!(next.release().await.is_released());
    assert!(write.release().await.is_released());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_shows_readers_writers_and_permits_and_force_release_frees_them() {
    let pg = PostgresServer::start();
    let (holder, operator) = (watched(&pg.url()).await, locker(&pg.url()).await);
    let name = unique_name("pg-kinds-operator");
    let permits = holder.semaphore(name.as_str(), 5).acquire_many(2).await;
    let permits = permits.expect("two permits");
    let read = holder
        .read_write_lock(name.as_str())
        .read()
        .await
        .expect("read");
    let info = operator.inspect(name.as_str()).await.expect("inspect");
    assert_eq!((info.permits_taken, info.readers), (2, 1), "{info:?}");
    assert!(info.writer.is_none(), "{info:?}");
    assert!(operator.force_release(name.as_str()).await.expect("force"));
    for lost in [permits.lost(), read.lost()] {
        tokio::time::timeout(Duration::from_secs(5), lost)
            .await
            .expect("the holder learns of the loss");
    }
    let write = operator.read_write_lock(name.as_str()).write().await;
    let write = write.expect("free");
    let info = operator.inspect(name.as_str()).await.expect("inspect");
    assert!(info.writer.is_some(), "{info:?}");
    assert!(write.release().await.is_released());
    assert!(pg.advisory_holders().await.is_empty());
}
