//! Fair locks (`Locker::fair_lock`): first come, first served across tasks, `Locker`s and
//! processes; a release wakes only the head of the line; a dead waiter holds the line up for at
//! most its timeout and a third; nothing is left in Redis once the line is empty — against real
//! Redis.

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_core::redis::AsyncCommands as _;
use dlock_core::{LockError, Locker};
use dlock_tests::{RedisServer, unique_name};
use tokio::time::Instant;

/// Waits (up to 5 s) until `name`'s line holds `n` waiters.
async fn until_queued(locker: &Locker, name: &str, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let info = locker.inspect(name).await.expect("inspect");
        if info.queued_waiters == n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{} in line, expected {n}",
            info.queued_waiters
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Every key in Redis for `name` (`SCAN`).
async fn keys_of(server: &RedisServer, name: &str) -> Vec<String> {
    let mut con = server.connection().await;
    let mut keys: Vec<String> = Vec::new();
    let mut iter: dlock_core::redis::AsyncIter<String> = con
        .scan_match(format!("dlock:{{{name}}}*"))
        .await
        .expect("SCAN");
    while let Some(key) = iter.next_item().await {
        keys.push(key.expect("SCAN item"));
    }
    keys.sort();
    keys
}

async fn locker(server: &RedisServer, dead_waiter: Duration) -> Locker {
    (Locker::builder().url(server.url()))
        .dead_waiter_timeout(dead_waiter)
        .build()
        .await
        .expect("connect")
}

#[tokio::test]
async fn waiters_get_the_lock_in_the_order_they_came_across_lockers() {
    let server = RedisServer::start();
    let mut lockers = Vec::new();
    for _ in 0..3 {
        lockers.push(locker(&server, Duration::from_secs(5)).await);
    }
    let name = unique_name("fair-order");
    let holder = (lockers[0].fair_lock(name.as_str()).await).expect("first");
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..12 {
        let (locker, own, order) = (lockers[i % 3].clone(), name.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let guard = (locker.fair_lock(own.as_str()))
                .wait(Duration::from_secs(20))
                .await
                .expect("fair lock");
            order.lock().unwrap().push(i);
            tokio::time::sleep(Duration::from_millis(5)).await;
            assert!(guard.release().await.is_released());
        }));
        until_queued(&lockers[0], &name, i as u64 + 1).await;
    }
    assert!(holder.release().await.is_released());
    for task in tasks {
        task.await.expect("task");
    }
    assert_eq!(*order.lock().unwrap(), (0..12).collect::<Vec<_>>());
    assert_eq!(
        keys_of(&server, &name).await,
        vec![format!("dlock:{{{name}}}:fence")],
        "only the fencing counter outlives the holds"
    );
}

#[tokio::test]
async fn a_release_wakes_only_the_head_of_the_line() {
    let server = RedisServer::start();
    // Waiters show they are alive every 10 s: within this test, an attempt is a wake-up.
    let a = locker(&server, Duration::from_secs(30)).await;
    let b = locker(&server, Duration::from_secs(30)).await;
    let name = unique_name("fair-head");
    // Loads the scripts, so that none is sent twice below.
    let warm_up = (a.fair_lock(format!("{name}-warm-up")).await).expect("warm-up");
    assert!(warm_up.release().await.is_released());
    let holder = (a.fair_lock(name.as_str()).await).expect("first");
    let mut tasks = Vec::new();
    for i in 0..6 {
        let (locker, own) = (if i % 2 == 0 { &a } else { &b }.clone(), name.clone());
        tasks.push(tokio::spawn(async move {
            let guard = (locker.fair_lock(own.as_str()).wait(Duration::from_secs(20)))
                .await
                .expect("fair lock");
            tokio::time::sleep(Duration::from_millis(20)).await;
            assert!(guard.release().await.is_released());
        }));
        until_queued(&a, &name, i + 1).await;
    }
    let before = server.info_commandstats();
    assert!(holder.release().await.is_released());
    for task in tasks {
        task.await.expect("task");
    }
    let after = server.info_commandstats();
    let calls = dlock_tests::script_calls(&after) - dlock_tests::script_calls(&before);
    // The holder's release, then for each waiter one attempt (its wake-up) and one release:
    // a waiter woken out of turn would attempt once more.
    assert_eq!(calls, 1 + 6 * 2, "script calls: {calls}");
}

#[tokio::test]
async fn waiters_that_give_up_leave_the_line_and_nothing_is_left_behind() {
    let server = RedisServer::start();
    let locker = locker(&server, Duration::from_secs(5)).await;
    let name = unique_name("fair-leave");
    let holder = (locker.fair_lock(name.as_str()).await).expect("first");
    let timing_out: Vec<_> = (0..3)
        .map(|_| {
            let (locker, name) = (locker.clone(), name.clone());
            tokio::spawn(async move {
                let res = (locker.fair_lock(name.as_str()))
                    .wait(Duration::from_millis(300))
                    .await;
                matches!(res, Err(LockError::Busy { .. }))
            })
        })
        .collect();
    let dropped = {
        let (locker, name) = (locker.clone(), name.clone());
        tokio::spawn(async move { locker.fair_lock(name.as_str()).wait(Duration::MAX).await })
    };
    until_queued(&locker, &name, 4).await;
    dropped.abort();
    for task in timing_out {
        assert!(task.await.expect("task"), "timed out");
    }
    until_queued(&locker, &name, 0).await;
    let lock_key = locker.key_of(name.as_str()).expect("key");
    assert_eq!(
        keys_of(&server, &name).await,
        vec![lock_key.clone(), format!("{lock_key}:fence")]
    );
    assert!(holder.release().await.is_released());
    assert_eq!(
        keys_of(&server, &name).await,
        vec![format!("{lock_key}:fence")]
    );
}

#[tokio::test]
async fn a_fair_lock_is_fenced_and_reentrant_in_its_scope() {
    let server = RedisServer::start();
    let locker = locker(&server, Duration::from_secs(5)).await;
    let name = unique_name("fair-reentry");
    let first = (locker.fair_lock(name.as_str()).await).expect("first");
    let token = first.fencing_token().await.unwrap();
    assert!(first.release().await.is_released());
    dlock_core::scope(async {
        let outer = (locker.fair_lock(name.as_str()).await).expect("outer");
        assert!(outer.fencing_token().await.unwrap() > token);
        let inner = (locker.fair_lock(name.as_str()).try_lock().await)
            .expect("inner")
            .expect("re-entered");
        assert!(inner.is_reentrant());
        assert_eq!(
            inner.fencing_token().await.unwrap(),
            outer.fencing_token().await.unwrap()
        );
        assert!(inner.release().await.is_released());
        assert!(outer.release().await.is_released());
    })
    .await;
}

#[tokio::test]
async fn the_memory_store_keeps_the_same_order() {
    let store = dlock_core::MemoryStore::new();
    let a = Locker::memory_with(store.clone());
    let b = Locker::memory_with(store);
    let name = "fair-memory";
    let holder = (a.fair_lock(name).await).expect("first");
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..8u64 {
        let (locker, order) = (if i % 2 == 0 { &a } else { &b }.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let guard = (locker.fair_lock(name).wait(Duration::from_secs(10)))
                .await
                .expect("fair lock");
            order.lock().unwrap().push(i);
            assert!(guard.release().await.is_released());
        }));
        until_queued(&a, name, i + 1).await;
    }
    assert!(holder.release().await.is_released());
    for task in tasks {
        task.await.expect("task");
    }
    assert_eq!(*order.lock().unwrap(), (0..8).collect::<Vec<_>>());
    assert_eq!(a.inspect(name).await.expect("inspect").queued_waiters, 0);
}

/// A `fair_waiter` process, killed on drop.
struct Waiter {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Waiter {
    fn spawn(url: &str, name: &str, hold: Duration, dead_waiter: Duration) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_fair_waiter"))
            .arg(url)
            .arg(name)
            .arg(hold.as_millis().to_string())
            .arg(dead_waiter.as_millis().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn fair_waiter");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Self { child, lines }
    }

    /// The fencing token it was granted, and when its line came.
    fn acquired(&self, within: Duration) -> (u64, std::time::Instant) {
        let line = self
            .lines
            .recv_timeout(within)
            .expect("a line from the waiter");
        let at = std::time::Instant::now();
        let token = line
            .strip_prefix("acquired token=")
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("not a grant: {line}"));
        (token, at)
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn waiters_in_other_processes_get_the_lock_in_the_order_they_came() {
    let server = RedisServer::start();
    let locker = locker(&server, Duration::from_secs(5)).await;
    let name = unique_name("fair-processes");
    let holder = (locker.fair_lock(name.as_str()).await).expect("first");
    let mut waiters = Vec::new();
    for i in 0..4 {
        let hold = Duration::from_millis(50);
        waiters.push(Waiter::spawn(
            &server.url(),
            &name,
            hold,
            Duration::from_secs(5),
        ));
        until_queued(&locker, &name, i + 1).await;
    }
    assert!(holder.release().await.is_released());
    let tokens: Vec<u64> = (waiters.iter())
        .map(|w| w.acquired(Duration::from_secs(10)).0)
        .collect();
    let mut sorted = tokens.clone();
    sorted.sort_unstable();
    assert_eq!(tokens, sorted, "grants out of the order the waiters came");
}

#[tokio::test]
async fn a_killed_waiter_holds_up_the_line_for_at_most_its_timeout_and_a_third() {
    const DEAD: Duration = Duration::from_millis(900);
    let server = RedisServer::start();
    let locker = locker(&server, DEAD).await;
    let name = unique_name("fair-dead");
    let holder = (locker.fair_lock(name.as_str()).await).expect("first");
    let mut dead = Waiter::spawn(&server.url(), &name, Duration::ZERO, DEAD);
    until_queued(&locker, &name, 1).await;
    let next = Waiter::spawn(&server.url(), &name, Duration::ZERO, DEAD);
    until_queued(&locker, &name, 2).await;
    dead.child.kill().expect("kill");
    let killed = std::time::Instant::now();
    assert!(holder.release().await.is_released());

    // The line waits for the dead head (it might have been alive) while its time runs: it
    // showed it was alive at most a third of the timeout before it was killed.
    let lingering = (locker.fair_lock(name.as_str()).try_lock().await).expect("try");
    assert!(lingering.is_none(), "a try jumped the line");
    let (_, at) = next.acquired(Duration::from_secs(5));
    let waited = at - killed;
    assert!(
        waited >= DEAD * 2 / 3 - Duration::from_millis(50),
        "the dead head was skipped after {waited:?}"
    );
    assert!(
        waited <= DEAD * 4 / 3 + Duration::from_millis(300),
        "the line was held up for {waited:?}"
    );
    drop(next);
    // The dead waiter's entry went with its time; the next one left the line with its grant.
    let mut con = server.connection().await;
    let lock_key = locker.key_of(name.as_str()).expect("key");
    let queued: i64 = con.zcard(format!("{lock_key}:queue")).await.expect("ZCARD");
    assert_eq!(queued, 0);
}

#[tokio::test]
async fn a_dead_waiters_keys_expire_with_it() {
    const DEAD: Duration = Duration::from_millis(300);
    let server = RedisServer::start();
    let locker = locker(&server, DEAD).await;
    let name = unique_name("fair-expire");
    let holder = (locker.fair_lock(name.as_str()).await).expect("first");
    let mut dead = Waiter::spawn(&server.url(), &name, Duration::ZERO, DEAD);
    until_queued(&locker, &name, 1).await;
    dead.child.kill().expect("kill");
    tokio::time::sleep(DEAD + Duration::from_millis(200)).await;
    let lock_key = locker.key_of(name.as_str()).expect("key");
    assert_eq!(
        keys_of(&server, &name).await,
        vec![lock_key.clone(), format!("{lock_key}:fence")],
        "the line's keys outlived its last waiter"
    );
    assert!(holder.release().await.is_released());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_attempt_fails_keeps_its_place() {
    let server = RedisServer::start();
    let holder = locker(&server, Duration::from_secs(5)).await;
    // The first waiter reaches Redis through a proxy that will cut it off for a moment; it
    // shows it is alive every half second, and its place lasts 1.5 s without an attempt.
    let line = dlock_tests::Proxy::start(server.addr()).await;
    let first = (Locker::builder().url(line.url()))
        .dead_waiter_timeout(Duration::from_millis(1_500))
        .build()
        .await
        .expect("connect");
    let second = locker(&server, Duration::from_secs(5)).await;
    let name = unique_name("fair-keeps-place");
    let held = (holder.fair_lock(name.as_str()).await).expect("hold");
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (who, locker) in [("first", first.clone()), ("second", second.clone())] {
        let (own, order) = (name.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let guard = (locker.fair_lock(own.as_str()))
                .wait(Duration::from_secs(20))
                .await
                .expect("fair lock");
            order.lock().unwrap().push(who);
            assert!(guard.release().await.is_released());
        }));
        until_queued(&holder, &name, tasks.len() as u64).await;
    }
    // Cut off for longer than a heartbeat, shorter than its place lasts: an attempt fails.
    line.cut();
    tokio::time::sleep(Duration::from_millis(600)).await;
    line.restore();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        holder
            .inspect(name.as_str())
            .await
            .expect("inspect")
            .queued_waiters,
        2,
        "a waiter left the line, or stood in it twice"
    );
    assert!(held.release().await.is_released());
    for task in tasks {
        task.await.expect("task");
    }
    assert_eq!(*order.lock().unwrap(), ["first", "second"]);
}
