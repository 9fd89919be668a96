//! Waiting against real Redis: deadlines kept whatever the subscriber does, waiting "forever",
//! transient failures inside the wait, hand-overs whose answer is lost, and clean-ups over a pool.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dlock_core::redis::{self, AsyncCommands as _};
use dlock_core::{LockError, Locker};
use dlock_tests::{Proxy, RedisServer, pause_writes, unique_name};

/// A task that waits up to 10 s for `name` on `locker`.
fn waiting_task(
    locker: &Locker,
    name: &str,
) -> tokio::task::JoinHandle<Result<dlock_core::LockGuard, LockError>> {
    let (locker, name) = (locker.clone(), name.to_owned());
    tokio::spawn(async move { locker.lock(name).wait(Duration::from_secs(10)).await })
}

/// A listener that accepts connections and never answers: a subscriber that can't confirm.
async fn black_hole() -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("redis://{}/", listener.local_addr().expect("address"));
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    (url, task)
}

#[tokio::test]
async fn a_wait_keeps_its_deadline_when_the_subscriber_never_confirms() {
    let server = RedisServer::start();
    let (silent, hole) = black_hole().await;
    let holder = Locker::connect(&server.url()).await.expect("connect");
    let waiter = Locker::builder()
        .url(server.url())
        .subscriber(redis::Client::open(silent.as_str()).expect("client"))
        .command_timeout(Duration::from_secs(1))
        .build()
        .await
        .expect("connect");
    let name = unique_name("deadline");
    let guard = holder.lock(name.as_str()).await.expect("lock");
    for _ in 0..3 {
        let started = Instant::now();
        let err = waiter
            .lock(name.as_str())
            .wait(Duration::from_millis(100))
            .await
            .expect_err("the lock is held");
        let took = started.elapsed();
        assert!(err.is_busy(), "{err}");
        assert!(
            took < Duration::from_millis(500),
            "wait(100ms) took {took:?}"
        );
    }
    assert!(guard.release().await.is_released());
    hole.abort();
}

#[tokio::test]
async fn waiting_for_duration_max_waits_as_long_as_it_takes() {
    let server = RedisServer::start();
    let locker = Locker::connect(&server.url()).await.expect("connect");
    let name = unique_name("forever");
    let free = locker
        .lock(name.as_str())
        .wait(Duration::MAX)
        .await
        .expect("a free lock");
    let waiting = tokio::spawn({
        let (locker, name) = (locker.clone(), name.clone());
        async move {
            let one = locker.lock(name.as_str()).wait(Duration::MAX).await?;
            let both = locker
                .lock_all([name.as_str(), "forever-other"])
                .wait(Duration::MAX);
            let released = one.release().await;
            let both = both.await?;
            assert!(both.release().await.is_released());
            Ok::<_, LockError>(released)
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(free.release().await.is_released());
    let released = waiting.await.expect("task").expect("lock");
    assert!(released.is_released());
    // A lease can't be "forever": a clear error, not a panic.
    for request in [
        locker.lock(name.as_str()).lease(Duration::MAX),
        Locker::memory().lock(name.as_str()).lease(Duration::MAX),
        Locker::memory()
            .lock(name.as_str())
            .watchdog_lease(Duration::MAX),
    ] {
        let err = request.await.expect_err("an endless lease");
        assert!(err.is_config(), "{err}");
    }
}

#[tokio::test]
async fn a_waiter_rides_out_a_stalled_server_within_its_wait() {
    let server = RedisServer::start();
    let holder = Locker::connect(&server.url()).await.expect("connect");
    let waiter = Locker::builder()
        .url(server.url())
        .command_timeout(Duration::from_millis(150))
        .build()
        .await
        .expect("connect");
    let name = unique_name("stall");
    let guard = holder
        .lock(name.as_str())
        .lease(Duration::from_millis(400))
        .await
        .expect("lock");
    std::mem::forget(guard);
    let waiting = tokio::spawn({
        let name = name.clone();
        async move {
            waiter
                .lock(name.as_str())
                .wait(Duration::from_secs(5))
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    server.pause();
    tokio::time::sleep(Duration::from_millis(600)).await;
    server.resume();
    let guard = waiting
        .await
        .expect("task")
        .expect("the waiter gave up on a transient failure");
    assert!(guard.release().await.is_released());
}

#[tokio::test]
async fn a_release_whose_hand_over_timed_out_reports_the_truth_and_leaks_nothing() {
    let server = RedisServer::start();
    let mut admin = server.connection().await;
    let locker = Locker::builder()
        .url(server.url())
        .command_timeout(Duration::from_millis(300))
        .build()
        .await
        .expect("connect");
    let name = unique_name("handoff-timeout");
    let key = locker.key_of(name.as_str()).unwrap();
    let mut guard = locker.lock(name.as_str()).await.expect("lock");
    for paused in [false, true] {
        let waiter = waiting_task(&locker, &name);
        // Let the waiter become the head and offer to take a hand-over.
        tokio::time::sleep(Duration::from_millis(200)).await;
        if paused {
            // The hand-over waits in the paused server past the command timeout; the release
            // that follows it arrives after the pause. (The first round, unpaused, loaded the
            // scripts: a command stuck in the pause must find them there.)
            pause_writes(&mut admin, 450).await;
        }
        let outcome = guard.release().await;
        assert!(outcome.is_released(), "paused: {paused}: {outcome:?}");
        guard = waiter
            .await
            .expect("task")
            .expect("the waiter gets the lock");
    }
    assert!(guard.release().await.is_released());
    let exists: bool = admin.exists(&key).await.expect("EXISTS");
    assert!(!exists);
}

#[tokio::test]
async fn over_a_pool_a_timed_out_acquisition_is_cleaned_up_after_it_ran() {
    let server = RedisServer::start();
    let mut admin = server.connection().await;
    let manager = bb8_redis::RedisConnectionManager::new(server.url()).expect("manager");
    let pool = bb8::Pool::builder()
        .max_size(4)
        .build(manager)
        .await
        .expect("pool");
    let locker = Locker::builder()
        .bb8_pool(pool)
        .subscriber(server.client())
        .command_timeout(Duration::from_millis(50))
        .build()
        .await
        .expect("build");
    for i in 0..10 {
        let name = unique_name("pool-cleanup");
        let key = locker.key_of(name.as_str()).unwrap();
        pause_writes(&mut admin, 150).await;
        let err = locker
            .lock(name.as_str())
            .await
            .expect_err("no answer while writes are paused");
        assert!(err.is_backend(), "{err}");
        tokio::time::sleep(Duration::from_millis(200)).await;
        let exists: bool = admin.exists(&key).await.expect("EXISTS");
        assert!(
            !exists,
            "round {i}: the late acquisition was left holding the lock"
        );
    }
}

#[tokio::test]
async fn waiters_that_give_up_together_leave_no_queue_or_subscription() {
    let server = RedisServer::start();
    let holder = Locker::connect(&server.url()).await.expect("connect");
    let locker = Locker::connect(&server.url()).await.expect("connect");
    let name = unique_name("give-up");
    let guard = holder.lock(name.as_str()).await.expect("lock");
    for round in 0..20u64 {
        let mut tasks = Vec::new();
        for i in 0..8u64 {
            let (locker, name) = (locker.clone(), name.clone());
            tasks.push(tokio::spawn(async move {
                let wait = Duration::from_millis(10 + (i * 7 + round) % 30);
                locker.lock(name.as_str()).wait(wait).await.map(drop)
            }));
        }
        for task in tasks {
            let err = task.await.expect("task").expect_err("the lock is held");
            assert!(err.is_busy(), "{err}");
        }
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    while locker.stats().watched_names != 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        locker.stats().watched_names,
        0,
        "a subscription outlived its waiters"
    );
    assert_eq!(
        locker.stats().queued_names,
        0,
        "a local queue outlived its waiters"
    );
    assert!(guard.release().await.is_released());
}

#[tokio::test]
async fn a_release_sent_in_time_is_not_a_loss_when_its_answer_comes_late() {
    let server = RedisServer::start();
    let proxy = dlock_tests::Proxy::start(server.addr()).await;
    let locker = Locker::builder()
        .url(proxy.url())
        .command_timeout(Duration::from_secs(2))
        .build()
        .await
        .expect("connect");
    let rival = Locker::connect(&server.url()).await.expect("connect");
    for with_waiter in [false, true] {
        let name = unique_name("late-answer");
        let guard = locker
            .lock(name.as_str())
            .lease(Duration::from_millis(400))
            .await
            .expect("lock");
        // A local waiter makes the release a hand-over attempt.
        let waiter = with_waiter.then(|| {
            let (locker, name) = (locker.clone(), name.clone());
            tokio::spawn(async move {
                locker
                    .lock(name.as_str())
                    .wait(Duration::from_secs(3))
                    .await
                    .map(drop)
            })
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        // Nothing reaches Redis for a while: the lease runs out there, and a rival takes the
        // lock, while the release (sent with 300 ms of lease left) waits in the stall.
        proxy.stall();
        let releasing = tokio::spawn(guard.release());
        let taken = rival
            .lock(name.as_str())
            .wait(Duration::from_secs(2))
            .await
            .expect("the rival takes the expired lock");
        proxy.unstall();
        let outcome = releasing.await.expect("task");
        assert!(
            outcome.is_released(),
            "with a waiter: {with_waiter}: {outcome:?}"
        );
        assert!(taken.release().await.is_released());
        if let Some(waiter) = waiter {
            let _ = waiter.await.expect("waiter task");
        }
    }
}

#[tokio::test]
async fn a_wait_over_a_dead_multiplexed_connection_gives_up_at_once() {
    let mut server = RedisServer::start();
    let locker = Locker::builder()
        .multiplexed(server.connection().await)
        .wake_by_polling()
        .build()
        .await
        .expect("build");
    let name = unique_name("dead-connection");
    let guard = locker.lock(name.as_str()).await.expect("lock");
    drop(guard);
    // The connection a `multiplexed` locker was given is not reconnected: once the server is
    // gone, no retry can help, and even a wait for "as long as it takes" must end.
    server.restart();
    let started = Instant::now();
    let err = tokio::time::timeout(
        Duration::from_secs(10),
        locker.lock(name.as_str()).wait(Duration::MAX),
    )
    .await
    .expect("the wait gave up")
    .expect_err("a dead connection");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    match &err {
        LockError::Backend(e) => assert!(e.is_permanent(), "{e}"),
        other => panic!("not a backend error: {other}"),
    }
}

/// A release wakes the waiters of a plain lock only when one of them found the hold taken (the
/// attempt flags the hold): any attempt does, a claim to the next turn or not — here a
/// `try_lock`, which claims nothing. One nobody tried publishes nothing.
#[tokio::test]
async fn a_release_publishes_once_an_attempt_found_the_hold_taken() {
    use futures_util::StreamExt as _;
    let server = RedisServer::start();
    let holder = Locker::connect(&server.url()).await.expect("connect");
    let other = Locker::connect(&server.url()).await.expect("connect");
    let name = unique_name("flagged");
    let channel = format!("{}:wake", holder.key_of(name.as_str()).expect("key"));
    let client = redis::Client::open(server.url()).expect("client");
    let mut listener = client.get_async_pubsub().await.expect("pub/sub");
    listener.subscribe(&channel).await.expect("SUBSCRIBE");
    let mut messages = listener.into_on_message();

    // Nobody tried: the release says nothing.
    let guard = holder.lock(name.as_str()).await.expect("lock");
    assert!(guard.release().await.is_released());
    let quiet = tokio::time::timeout(Duration::from_millis(300), messages.next()).await;
    assert!(quiet.is_err(), "a release nobody waited for published");

    // Another `Locker` found it taken: the release wakes whoever listens.
    let guard = holder.lock(name.as_str()).await.expect("lock");
    assert!(
        other
            .lock(name.as_str())
            .try_lock()
            .await
            .expect("try")
            .is_none()
    );
    assert!(guard.release().await.is_released());
    let woken = tokio::time::timeout(Duration::from_secs(2), messages.next()).await;
    assert!(
        woken.is_ok_and(|m| m.is_some()),
        "the release of a hold found taken published nothing"
    );
}

/// As above, with a waiter of another `Locker` too: the hand-over that times out releases the
/// lock instead (someone else waits), and the release sent after it finds the lock gone, or
/// already taken — the lock was the guard's until it let go all the same: `Released`.
#[tokio::test]
async fn a_release_after_a_lost_hand_over_that_released_instead_says_released() {
    let server = RedisServer::start();
    let mut admin = server.connection().await;
    let connect = || {
        Locker::builder()
            .url(server.url())
            .command_timeout(Duration::from_millis(300))
            .build()
    };
    let (locker, other) = (
        connect().await.expect("connect"),
        connect().await.expect("connect"),
    );
    let name = unique_name("handoff-released-instead");
    // Load the scripts first: a command stuck in the pause must find them there.
    let warm = locker.lock(name.as_str()).await.expect("lock");
    let warm_waiter = waiting_task(&locker, &name);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(warm.release().await.is_released());
    let guard = warm_waiter.await.expect("task").expect("handed over");

    // Each waiter lets go as soon as it has the lock, so the other gets it next.
    let wait = |locker: &Locker| {
        let (locker, name) = (locker.clone(), name.clone());
        tokio::spawn(async move {
            let got = locker
                .lock(name.as_str())
                .wait(Duration::from_secs(10))
                .await?;
            Ok::<_, dlock_core::LockError>(got.release().await)
        })
    };
    let (local, elsewhere) = (wait(&locker), wait(&other));
    // Both become heads of their lines and subscribe: the hand-over sees another listener.
    tokio::time::sleep(Duration::from_millis(300)).await;
    pause_writes(&mut admin, 450).await;
    let outcome = guard.release().await;
    assert!(outcome.is_released(), "{outcome:?}");
    for waiter in [local, elsewhere] {
        let released = (waiter.await)
            .expect("task")
            .expect("each waiter gets the lock in turn");
        assert!(released.is_released(), "{released:?}");
    }
}

/// The release sent after a hand-over whose answer was lost frees what the hand-over may have
/// given, and nothing the waiter got since. Here that release reaches a server that has not
/// loaded its script yet and is sent again after loading it, and the releaser's commands reach
/// the server 100 ms late (a proxy delays them): between the two sends, a waiter of another
/// `Locker` takes the lock and releases it, granting it to the turn the local waiter claimed
/// meanwhile. The resent release must leave that grant alone: the local waiter holds the lock,
/// and its release says so.
#[tokio::test]
async fn a_release_resent_after_a_lost_hand_over_frees_nothing_granted_since() {
    let server = RedisServer::start();
    let mut admin = server.connection().await;
    let far = Proxy::start_delayed(server.addr(), Duration::from_millis(100)).await;
    let build = |url: String| async move {
        (Locker::builder().url(url))
            .command_timeout(Duration::from_millis(600))
            .build()
            .await
            .expect("connect")
    };
    let (locker, other) = (build(far.url()).await, build(server.url()).await);
    let name = unique_name("handoff-resent");
    // The scripts of an attempt and a hand-over are loaded here; the release's is not: nothing
    // has been released but by hand-over.
    let warm = locker.lock(name.as_str()).await.expect("lock");
    let warm_waiter = waiting_task(&locker, &name);
    // Long enough for the waiter's delayed attempts to make it the head, offering a hand-over.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(warm.release().await.is_released());
    let guard = warm_waiter.await.expect("task").expect("handed over");

    // Each waiter holds the lock a while, then lets go.
    let wait = |locker: &Locker, hold: u64| {
        let (locker, name) = (locker.clone(), name.clone());
        tokio::spawn(async move {
            let got = locker
                .lock(name.as_str())
                .wait(Duration::from_secs(10))
                .await?;
            tokio::time::sleep(Duration::from_millis(hold)).await;
            Ok::<_, LockError>(got.release().await)
        })
    };
    // The other first: its claim to the next turn is the older one, so the hand-over, which
    // finds it listening, releases instead and keeps the lock for it.
    let elsewhere = wait(&other, 150);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let local = wait(&locker, 300);
    tokio::time::sleep(Duration::from_millis(800)).await;
    // The hand-over waits out the pause and times out; the release after it runs at the end of
    // the pause, finds no script, and is sent again 200 ms later. Meanwhile the other takes the
    // lock, the local waiter claims the next turn, and the other's release grants it that.
    pause_writes(&mut admin, 800).await;
    let outcome = guard.release().await;
    assert!(outcome.is_released(), "{outcome:?}");
    for waiter in [elsewhere, local] {
        let released = (waiter.await)
            .expect("task")
            .expect("each waiter gets the lock in turn");
        assert!(released.is_released(), "{released:?}");
    }
}

/// Sixteen tasks of one `Locker` take one name in turn for two seconds, asking for their fencing
/// token each time, as the benchmark's W2 does: every wait ends soon (a stall would show a lock
/// left to a token nobody waits on, or a wake-up lost), and the tokens rise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_tasks_of_one_locker_take_turns_without_a_stall() {
    let server = RedisServer::start();
    let locker = Locker::connect(&server.url()).await.expect("connect");
    let name = unique_name("sixteen");
    let end = tokio::time::Instant::now() + Duration::from_secs(2);
    let longest = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let (locker, name, longest) = (locker.clone(), name.clone(), longest.clone());
        tasks.push(tokio::spawn(async move {
            let mut last = 0;
            while tokio::time::Instant::now() < end {
                let asked = tokio::time::Instant::now();
                let guard = (locker.lock(name.as_str()))
                    .wait(Duration::from_secs(10))
                    .await
                    .expect("a turn");
                let waited = u64::try_from(asked.elapsed().as_micros()).unwrap_or(u64::MAX);
                longest.fetch_max(waited, Ordering::Relaxed);
                let token = guard.fencing_token().await.expect("token").get();
                assert!(token > last, "{token} after {last}");
                last = token;
                tokio::task::yield_now().await;
                assert!(guard.release().await.is_released());
            }
        }));
    }
    for task in tasks {
        task.await.expect("task");
    }
    let stats = locker.stats();
    let longest = longest.load(Ordering::Relaxed);
    eprintln!("{stats:?}, the longest wait {longest} µs");
    assert!(stats.handed_over > 0, "{stats:?}");
    assert!(longest < 500_000, "a wait took {longest} µs");
}
