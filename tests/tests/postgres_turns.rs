//! Turns across processes on PostgreSQL: a waiter that finds a plain lock taken claims the next
//! turn for its `Locker`, so a process farther from the server is not beaten to the lock after
//! every release by a nearer one (claims: `backend/postgres/turns.rs`).

use std::time::Duration;

use tokio::time::Instant;

use dlock_core::Locker;
use dlock_tests::{PostgresServer, Proxy, unique_name};

/// What the far `Locker`'s proxy holds each message back for.
const FAR: Duration = Duration::from_millis(40);

async fn locker(url: &str) -> Locker {
    Locker::connect(url).await.expect("a postgres Locker")
}

/// A near `Locker` and a far one (its messages held back [`FAR`] each way, by a proxy).
async fn near_and_far(pg: &PostgresServer) -> (Locker, Locker, Proxy) {
    let proxy = Proxy::start_delayed(pg.addr(), FAR).await;
    let far = locker(&PostgresServer::url_at(proxy.port())).await;
    (locker(&pg.url()).await, far, proxy)
}

/// Waits until a waiter's claim to the next turn is in the table (its first attempt, through
/// the far proxy, opens a session: some round trips of 2 × FAR each).
async fn claimed(pg: &PostgresServer) {
    let until = Instant::now() + Duration::from_secs(10);
    let live = "SELECT count(*) FROM dlock_turns WHERE until > clock_timestamp()";
    while pg.query_i64(live).await != [1] {
        assert!(Instant::now() < until, "no claim within 10 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A far waiter that found the lock taken is next: a nearer process that asks right after the
/// release, well before the far waiter's attempt arrives, finds it is not its turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_far_waiter_that_claimed_the_next_turn_gets_it_before_a_nearer_process() {
    let pg = PostgresServer::start();
    let (near, far, _proxy) = near_and_far(&pg).await;
    let holder = locker(&pg.url()).await;
    let name = unique_name("pg-turn");
    let held = holder.lock(name.as_str()).await.expect("free");
    let waiting = {
        let (far, name) = (far.clone(), name.clone());
        tokio::spawn(async move { far.lock(name.as_str()).wait(Duration::from_secs(10)).await })
    };
    claimed(&pg).await;
    assert!(held.release().await.is_released());
    let nearer = near.lock(name.as_str()).try_lock().await.expect("try");
    assert!(
        nearer.is_none(),
        "a nearer process took the far waiter's turn"
    );
    let got = waiting.await.expect("the far waiter").expect("its turn");
    // Its claim went with the lock: the next turn is anyone's again.
    assert!(got.release().await.is_released());
    let next = (near.lock(name.as_str()).wait(Duration::from_secs(2)).await).expect("free");
    assert!(next.release().await.is_released());
}

/// A claimant that gives up takes its claim back: the lock is anyone's at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claimant_that_gives_up_leaves_the_turn_to_others_at_once() {
    let pg = PostgresServer::start();
    let (near, far, _proxy) = near_and_far(&pg).await;
    let name = unique_name("pg-turn-gave-up");
    let held = near.lock(name.as_str()).await.expect("free");
    let waiting = {
        let (far, name) = (far.clone(), name.clone());
        tokio::spawn(async move { far.lock(name.as_str()).wait(Duration::from_secs(2)).await })
    };
    claimed(&pg).await;
    let gave_up = waiting.await.expect("the far waiter");
    assert!(gave_up.is_err(), "{gave_up:?}");
    assert!(held.release().await.is_released());
    let other = locker(&pg.url()).await;
    let again = other.lock(name.as_str()).try_lock().await.expect("try");
    assert!(again.is_some(), "the claim of a waiter that gave up stayed");
}

/// A claimant that stops attempting without giving up — its process gone — holds the name a
/// claim's life (a second) at most.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_claimant_went_silent_lapses_within_a_second() {
    let pg = PostgresServer::start();
    let (near, far, proxy) = near_and_far(&pg).await;
    let name = unique_name("pg-turn-silent");
    let held = near.lock(name.as_str()).await.expect("free");
    let waiting = {
        let (far, name) = (far.clone(), name.clone());
        tokio::spawn(async move { far.lock(name.as_str()).wait(Duration::from_secs(30)).await })
    };
    claimed(&pg).await;
    // The far process falls silent: nothing of its reaches the server any more.
    proxy.stall();
    assert!(held.release().await.is_released());
    let released = Instant::now();
    let other = locker(&pg.url()).await;
    let next = (other.lock(name.as_str()).wait(Duration::from_secs(5)).await).expect("free");
    let after = released.elapsed();
    assert!(
        after < Duration::from_millis(1_500),
        "the name waited {after:?} for a silent claimant"
    );
    assert!(next.release().await.is_released());
    waiting.abort();
    proxy.unstall();
}

/// Three `Locker`s, one a little farther away, two tasks each, on one name: each gets a fair
/// share, and the lock goes from one to the next without stalls. (A waiter kept out by a later
/// waiter's claim replaces it with its own, which makes the turn its own; when it slept out the
/// claim it had replaced instead, every hand-over waited a claim's life, a second: some ten
/// acquisitions in two seconds instead of some two hundred.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_lockers_take_turns_without_stalls() {
    let pg = PostgresServer::start();
    let proxy = Proxy::start_delayed(pg.addr(), Duration::from_millis(1)).await;
    let urls = [pg.url(), pg.url(), PostgresServer::url_at(proxy.port())];
    let name = unique_name("pg-turns-three");
    let mut tasks = Vec::new();
    for (i, url) in urls.iter().enumerate() {
        let l = locker(url).await;
        for _ in 0..2 {
            let (l, name) = (l.clone(), name.clone());
            tasks.push(tokio::spawn(async move {
                let end = Instant::now() + Duration::from_secs(2);
                let mut n = 0u32;
                while Instant::now() < end {
                    let g =
                        (l.lock(name.as_str()).wait(Duration::from_secs(5)).await).expect("lock");
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    assert!(g.release().await.is_released());
                    n += 1;
                }
                (i, n)
            }));
        }
    }
    let mut per_locker = [0u32; 3];
    for t in tasks {
        let (i, n) = t.await.expect("a task");
        per_locker[i] += n;
    }
    let total: u32 = per_locker.iter().sum();
    assert!(total >= 60, "{total} acquisitions in 2 s: {per_locker:?}");
    for n in per_locker {
        assert!(
            f64::from(n) >= 0.3 * f64::from(total) / 3.0,
            "a locker's share: {per_locker:?}"
        );
    }
}
