//! The PostgreSQL backend against a real server the harness starts (`initdb`, a free loopback
//! port): session advisory locks that exclude across `Locker`s and tasks, waiters woken by
//! `NOTIFY`, fencing tokens from a sequence that survive a restart, a killed session and a
//! silent client noticed and their guarded work cancelled, the lease mapped on the session's
//! idle timeout, and the kinds it does not offer refused by name. Semaphores and read-write
//! locks: `postgres_kinds.rs`.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use dlock_core::{Lease, LockError, Locker};
use dlock_tests::{PostgresServer, Proxy, unique_name};

/// A `Locker` with the default settings, as `Locker::connect` makes one for a `postgres://`
/// URL.
async fn locker(url: &str) -> Locker {
    Locker::connect(url).await.expect("a postgres Locker")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_excludes_other_lockers_and_other_tasks_and_goes_back_on_release() {
    let pg = PostgresServer::start();
    let (a, b) = (locker(&pg.url()).await, locker(&pg.url()).await);
    let name = unique_name("pg-plain");

    let held = a.lock(name.as_str()).await.expect("free");
    let first = held.fencing_token().await.expect("a token").get();
    // Another process, and another task of the same one: both find it taken.
    let other = b.lock(name.as_str()).await;
    assert!(matches!(other, Err(LockError::Busy { .. })), "{other:?}");
    let same = a.lock(name.as_str()).await;
    assert!(matches!(same, Err(LockError::Busy { .. })), "{same:?}");
    assert_eq!(pg.advisory_holders().await.len(), 1);

    assert!(held.release().await.is_released());
    assert!(
        pg.advisory_holders().await.is_empty(),
        "unlocked in PostgreSQL"
    );
    let next = b.lock(name.as_str()).await.expect("free again");
    let second = next.fencing_token().await.expect("a token").get();
    assert!(second > first, "tokens rise: {first} then {second}");
    assert!(next.release().await.is_released());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_woken_by_the_release_not_by_polling() {
    let pg = PostgresServer::start();
    let holder = locker(&pg.url()).await;
    // It would poll only every 10 s: its wait ends with the release's NOTIFY.
    let waiter = Locker::builder()
        .postgres_url(pg.url())
        .poll_interval(Duration::from_secs(10))
        .build()
        .await
        .expect("connect");
    let name = unique_name("pg-wake");
    let held = holder.lock(name.as_str()).await.expect("lock");
    let waiting = tokio::spawn({
        let (waiter, name) = (waiter.clone(), name.clone());
        async move {
            let guard = waiter
                .lock(name.as_str())
                .wait(Duration::from_secs(8))
                .await;
            (guard, Instant::now())
        }
    });
    // The waiter listens before its next attempt; give it time to attempt and sleep.
    let until = Instant::now() + Duration::from_secs(5);
    while !waiter.stats().subscriber_connected || waiter.stats().watched_names == 0 {
        assert!(Instant::now() < until, "the waiter never listened");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let released = Instant::now();
    assert!(held.release().await.is_released());
    let (guard, got) = waiting.await.expect("waiter task");
    let guard = guard.expect("the waiter gets the lock");
    let after = got.duration_since(released);
    assert!(
        after < Duration::from_secs(2),
        "woken {after:?} after the release"
    );
    assert!(guard.release().await.is_released());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_keep_rising_across_a_server_restart() {
    let pg = PostgresServer::start();
    let name = unique_name("pg-fence");
    let before = {
        let locker = locker(&pg.url()).await;
        let guard = locker.lock(name.as_str()).await.expect("lock");
        let token = guard.fencing_token().await.expect("a token").get();
        assert!(guard.release().await.is_released());
        token
    };
    pg.restart();
    let locker = locker(&pg.url()).await;
    let guard = locker
        .lock(name.as_str())
        .await
        .expect("lock after the restart");
    let after = guard.fencing_token().await.expect("a token").get();
    assert!(after > before, "{before} before the restart, {after} after");
    assert!(guard.release().await.is_released());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_session_is_noticed_and_its_guarded_work_cancelled() {
    let pg = PostgresServer::start();
    let a = Locker::builder()
        .postgres_url(pg.url())
        .default_lease(Lease::Watchdog(Duration::from_millis(900)))
        .build()
        .await
        .expect("connect");
    let b = locker(&pg.url()).await;
    let name = unique_name("pg-killed");
    let guard = a.lock(name.as_str()).await.expect("lock");
    let work = {
        let guard = Arc::new(guard);
        let running = guard.clone();
        let task = tokio::spawn(async move {
            running
                .run(tokio::time::sleep(Duration::from_secs(30)))
                .await
        });
        (guard, task)
    };
    // An operator ends the session that holds it: PostgreSQL unlocks at once.
    let ended = pg
        .query_i64(
            "SELECT count(pg_terminate_backend(pid))::bigint FROM pg_locks \
         WHERE locktype = 'advisory' AND objsubid = 1 AND granted",
        )
        .await;
    assert_eq!(ended, [1]);
    let killed = Instant::now();
    let (guard, task) = work;
    let outcome = tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the guarded work ended")
        .expect("the work's task");
    assert!(
        matches!(outcome, Err(LockError::Lost { .. })),
        "the work was cancelled with the loss: {outcome:?}"
    );
    // Noticed at the next renewal: a third of the lease, and the query's answer.
    assert!(
        killed.elapsed() < Duration::from_secs(2),
        "{:?}",
        killed.elapsed()
    );
    assert!(guard.is_lost());
    let taken = b.lock(name.as_str()).await.expect("free after the kill");
    assert!(taken.release().await.is_released());
    // The Locker goes on with a session of its own again.
    let again = a.lock(name.as_str()).await.expect("a new session");
    assert!(again.release().await.is_released());
}

/// A lock an `at_least` release keeps, on a session an operator then ends: the server unlocked
/// it with the session, and once the kept time is over the `Locker` takes it again. The first
/// query on a killed session is answered with the server's FATAL error, not a broken
/// connection; taken for an error of the query alone, it left the kept lock in the `Locker`'s
/// books, and every later request of the `Locker` found the name taken by nobody, forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_lock_whose_session_was_killed_is_free_again_after_the_kept_time() {
    let pg = PostgresServer::start();
    let a = locker(&pg.url()).await;
    let name = unique_name("pg-kept-killed");
    let guard = (a.lock(name.as_str()).at_least(Duration::from_millis(500)))
        .await
        .expect("lock");
    assert!(guard.release().await.is_released());
    let ended = pg
        .query_i64(
            "SELECT count(pg_terminate_backend(pid))::bigint FROM pg_locks \
         WHERE locktype = 'advisory' AND objsubid = 1 AND granted",
        )
        .await;
    assert_eq!(ended, [1], "the kept lock's session");
    let again = (a.lock(name.as_str()).wait(Duration::from_secs(5)))
        .await
        .expect("free again once the kept time is over");
    assert!(again.release().await.is_released());
    assert!(pg.advisory_holders().await.is_empty());
}

/// A client cut off from the server (its connections stalled, as by a partition or a paused
/// process) says nothing: the server ends its session after the lease and unlocks, and the
/// client's guard stopped believing it held the lock before anyone else could take it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_client_loses_its_lock_after_its_lease_and_believed_no_longer() {
    let pg = PostgresServer::start();
    let proxy = Proxy::start(pg.addr()).await;
    let lease = Duration::from_millis(1500);
    let far = Locker::builder()
        .postgres_url(PostgresServer::url_at(proxy.port()))
        .default_lease(Lease::Watchdog(lease))
        .command_timeout(Duration::from_millis(300))
        .build()
        .await
        .expect("connect through the proxy");
    let near = locker(&pg.url()).await;
    let name = unique_name("pg-silent");
    let guard = far.lock(name.as_str()).await.expect("lock");
    proxy.stall();
    let stalled = Instant::now();
    let taken = near
        .lock(name.as_str())
        .wait(Duration::from_secs(10))
        .await
        .expect("the server frees the lock of a silent session");
    let freed = Instant::now();
    assert!(
        freed.duration_since(stalled) >= lease / 2,
        "freed {:?} after the stall: before the lease could have run out",
        freed.duration_since(stalled)
    );
    assert!(
        guard.valid_until() <= freed,
        "the silent side believed it held the lock until {:?} after another took it",
        guard.valid_until().duration_since(freed)
    );
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("the silent side learns of the loss");
    assert!(taken.release().await.is_released());
    proxy.unstall();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_are_taken_all_or_none_and_fixed_leases_end() {
    let pg = PostgresServer::start();
    let (a, b) = (locker(&pg.url()).await, locker(&pg.url()).await);
    let (x, y) = (unique_name("pg-multi-x"), unique_name("pg-multi-y"));
    let one = b.lock(y.as_str()).await.expect("y");
    // y is taken: x is not kept either.
    let both = a.lock_all([x.as_str(), y.as_str()]).await;
    assert!(matches!(both, Err(LockError::Busy { .. })), "{both:?}");
    assert!(
        b.lock(x.as_str())
            .await
            .expect("x was left free")
            .release()
            .await
            .is_released()
    );
    assert!(one.release().await.is_released());
    let both = a.lock_all([x.as_str(), y.as_str()]).await.expect("both");
    assert!(both.release().await.is_released());

    // A fixed lease is unlocked when it runs out, though its holder never releases.
    let short = a
        .lock(x.as_str())
        .lease(Duration::from_millis(300))
        .await
        .expect("x");
    let taken = b
        .lock(x.as_str())
        .wait(Duration::from_secs(5))
        .await
        .expect("x once the lease ran out");
    assert!(short.valid_until() <= Instant::now());
    drop(short);
    assert!(taken.release().await.is_released());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kinds_it_does_not_offer_are_refused_by_name() {
    let pg = PostgresServer::start();
    let locker = locker(&pg.url()).await;
    let name = unique_name("pg-kinds");
    let fair = locker.fair_lock(name.as_str()).await;
    assert!(
        matches!(&fair, Err(LockError::Config(m)) if m.contains("`fair`")),
        "{fair:?}"
    );
    // A semaphore's permits are slots of one block of advisory keys, and its count is its
    // handle's.
    let huge = locker.semaphore(name.as_str(), 70_000).acquire().await;
    assert!(
        matches!(&huge, Err(LockError::Config(m)) if m.contains("65536")),
        "{huge:?}"
    );
    let set = locker.semaphore(name.as_str(), 2).set_permits(3).await;
    assert!(matches!(set, Err(LockError::Config(_))), "{set:?}");
    // Replica acknowledgement is Redis's.
    let acked = Locker::builder()
        .postgres_url(pg.url())
        .replica_ack(dlock_core::ReplicaAck::new(1, Duration::from_secs(1)))
        .build()
        .await;
    assert!(matches!(acked, Err(LockError::Config(_))), "{acked:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_url_or_a_down_server_is_a_clear_error_without_the_password() {
    let bad = Locker::builder()
        .postgres_url("postgres://me:hunter2@127.0.0.1:notaport/db")
        .build()
        .await;
    let err = bad.expect_err("a bad URL");
    assert!(matches!(err, LockError::Config(_)), "{err:?}");
    assert!(!err.to_string().contains("hunter2"), "{err}");
    let port = dlock_tests::free_port();
    let down = Locker::builder()
        .postgres_url(format!("postgres://me:hunter2@127.0.0.1:{port}/db"))
        .command_timeout(Duration::from_millis(500))
        .build()
        .await;
    let err = down.expect_err("nothing listens");
    assert!(err.is_backend(), "{err:?}");
    assert!(!format!("{err} {err:?}").contains("hunter2"), "{err:?}");
}

#[dlock_core::distributed_lock(key = "pg-order:<user_id>", locker = locker, wait = "5s")]
async fn place_order(
    locker: &Locker,
    user_id: u64,
    placed: &std::sync::Mutex<Vec<u64>>,
) -> Result<u64, LockError> {
    let token = dlock_core::scope::fencing_token().await?;
    placed.lock().expect("orders").push(user_id);
    tokio::time::sleep(Duration::from_millis(50)).await;
    Ok(token.get())
}

/// `#[distributed_lock]` on a `Locker` built on PostgreSQL, unchanged: calls for one user take
/// turns, each with a fencing token of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_macro_takes_turns_on_postgres() {
    let pg = PostgresServer::start();
    let (a, b) = (locker(&pg.url()).await, locker(&pg.url()).await);
    let placed = std::sync::Mutex::new(Vec::new());
    let started = Instant::now();
    let (x, y) = tokio::join!(place_order(&a, 7, &placed), place_order(&b, 7, &placed));
    let (x, y) = (x.expect("first"), y.expect("second"));
    assert_ne!(x, y, "each hold has its own token");
    // One after the other: both slept 50 ms under the lock.
    assert!(started.elapsed() >= Duration::from_millis(100));
    assert_eq!(*placed.lock().expect("orders"), [7, 7]);
}

/// The server paused (every process of it stopped) and continued, then restarted: each time
/// the holder's renewals go unanswered or find the session gone, its guard is lost, and the
/// lock is free again for another once the server runs — never while the guard believed it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_or_restarted_server_costs_the_holds_and_frees_the_locks() {
    let pg = PostgresServer::start();
    let holder = Locker::builder()
        .postgres_url(pg.url())
        .default_lease(Lease::Watchdog(Duration::from_millis(900)))
        .command_timeout(Duration::from_millis(300))
        .build()
        .await
        .expect("connect");
    let other = locker(&pg.url()).await;

    // Paused for longer than the lease.
    let name = unique_name("pg-paused");
    let guard = holder.lock(name.as_str()).await.expect("lock");
    pg.pause();
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("the holder learns its renewals go unanswered");
    tokio::time::sleep(Duration::from_millis(800)).await;
    pg.resume();
    let taken = other
        .lock(name.as_str())
        .wait(Duration::from_secs(10))
        .await
        .expect("free once the server runs again");
    assert!(guard.valid_until() <= Instant::now());
    assert!(taken.release().await.is_released());

    // Restarted as after a crash.
    let name = unique_name("pg-restarted");
    let guard = holder.lock(name.as_str()).await.expect("lock");
    pg.restart();
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("the holder learns its session is gone");
    let taken = other
        .lock(name.as_str())
        .wait(Duration::from_secs(10))
        .await
        .expect("free after the restart");
    assert!(taken.release().await.is_released());
    // And the holder's Locker goes on.
    let again = holder.lock(name.as_str()).await.expect("a new session");
    assert!(again.release().await.is_released());
}

/// Inside a lock scope a task takes a name it holds again (a second guard on the same session
/// lock), another task of the same `Locker` does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scope_re_enters_a_name_it_holds_on_postgres() {
    let pg = PostgresServer::start();
    let locker = locker(&pg.url()).await;
    let name = unique_name("pg-reenter");
    dlock_core::scope(async {
        let outer = locker.lock(name.as_str()).await.expect("outer");
        let inner = locker.lock(name.as_str()).await.expect("re-entered");
        assert!(inner.is_reentrant());
        let elsewhere = tokio::spawn({
            let (locker, name) = (locker.clone(), name.clone());
            async move { locker.lock(name.as_str()).await.map(drop) }
        });
        let elsewhere = elsewhere.await.expect("another task");
        assert!(
            matches!(elsewhere, Err(LockError::Busy { .. })),
            "{elsewhere:?}"
        );
        assert!(inner.release().await.is_released());
        // Still held by the outer guard.
        assert_eq!(pg.advisory_holders().await.len(), 1);
        assert!(outer.release().await.is_released());
    })
    .await;
    assert!(pg.advisory_holders().await.is_empty());
}

/// An operator's view: `inspect` names the session that holds a name, and `force_release`
/// ends that session, so the lock is free and its holder learns of the loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_and_force_release_reach_the_holding_session() {
    let pg = PostgresServer::start();
    let holder = Locker::builder()
        .postgres_url(pg.url())
        .default_lease(Lease::Watchdog(Duration::from_millis(900)))
        .build()
        .await
        .expect("connect");
    let operator = locker(&pg.url()).await;
    let name = unique_name("pg-operator");
    let guard = holder.lock(name.as_str()).await.expect("lock");
    let info = operator.inspect(name.as_str()).await.expect("inspect");
    let pid = pg.advisory_holders().await;
    assert_eq!(
        info.holders
            .iter()
            .map(|h| h.token_prefix.clone())
            .collect::<Vec<_>>(),
        [format!("pid {}", pid[0])]
    );
    assert!(operator.force_release(name.as_str()).await.expect("force"));
    tokio::time::timeout(Duration::from_secs(3), guard.lost())
        .await
        .expect("the holder learns of the loss");
    let taken = operator.lock(name.as_str()).await.expect("free");
    assert!(taken.release().await.is_released());
    assert!(
        !operator
            .force_release(name.as_str())
            .await
            .expect("nothing held")
    );
    let listed = operator.list("*").await;
    assert!(matches!(listed, Err(LockError::Config(_))), "{listed:?}");
    // What stands in for it: every advisory lock held, by key.
    let again = holder.lock(name.as_str()).await.expect("lock");
    let key = operator.advisory_key(name.as_str()).expect("a key");
    let locks = operator.advisory_locks().await.expect("advisory locks");
    assert!(
        locks
            .iter()
            .any(|l| l.key == key && !l.shared && l.application == "dlock"),
        "{locks:?}"
    );
    assert!(again.release().await.is_released());
}
