//! Clients whose clocks disagree with their Redis's, against a real server: each waiter's
//! `Locker` has its claims' clock set apart (`LockerBuilder::clock_apart`), as on a host whose
//! clock is off. What a client reads from its own clock only orders claims and says how old a
//! claim is; nothing it believes about a hold may depend on the clocks agreeing.

use std::time::{Duration, Instant};

use dlock_core::Locker;
use dlock_core::redis::AsyncCommands as _;
use dlock_tests::handover::offered_token;
use dlock_tests::hold::HoldValue;
use dlock_tests::{RedisServer, unique_name};

/// A release reads a head waiter's claim's age as the server's clock against the send time the
/// waiter wrote from its own. A waiter whose clock is 30 s behind makes every claim look old:
/// the release keeps the lock for the waiter's `Locker`, whose next attempt takes it with its
/// own lease. One 30 s ahead makes every claim look fresh: the release grants it the lock, for
/// twice its grant window. Either way the waiter has the lock at its turn, and believes it holds
/// it for no longer than Redis keeps it: the waiter counts a grant from its own send, before the
/// release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_passes_when_a_waiters_clock_is_apart_and_no_grant_outlasts_redis() {
    let server = RedisServer::start();
    let mut con = server.connection().await;
    let holder = Locker::connect(&server.url()).await.expect("connect");
    for (offset, granted) in [(-30_000, false), (30_000, true)] {
        let waiter = (Locker::builder().url(server.url()))
            .clock_apart(offset)
            .build()
            .await
            .expect("connect");
        let name = unique_name("clock-apart");
        let key = holder.key_of(name.as_str()).expect("key");
        let held = holder.lock(name.as_str()).await.expect("lock");
        let (got_tx, got_rx) = tokio::sync::oneshot::channel();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
        let waiting = tokio::spawn({
            let (waiter, name) = (waiter.clone(), name.clone());
            async move {
                let guard = (waiter.lock(name.as_str()))
                    .wait(Duration::from_secs(5))
                    .await
                    .expect("the waiter's turn");
                let _ = got_tx.send((guard.remaining(), Instant::now()));
                let _ = done_rx.await;
                guard.release().await
            }
        });
        offered_token(&mut con, &key).await;
        let released = Instant::now();
        assert!(held.release().await.is_released());
        let (remaining, at) = got_rx.await.expect("acquired");
        let pttl: i64 = con.pttl(&key).await.expect("PTTL");
        let pttl = Duration::from_millis(u64::try_from(pttl).expect("the waiter's hold expires"));
        // Redis's expiry stands still until the waiter extends its hold (a grace after the
        // grant, far longer than this): the waiter's belief at `at` ends by Redis's expiry.
        assert!(
            remaining <= pttl + at.elapsed() + Duration::from_millis(1),
            "waiter {offset} ms: the waiter believes {remaining:?} from {:?} after the release, \
             Redis keeps the hold {pttl:?} from {:?}",
            at - released,
            released.elapsed(),
        );
        // Granted: the grant's lease (twice a window of 2.5 s with the defaults), counted from
        // the claim's send. Kept: the waiter's own attempt, with its 30 s lease.
        if granted {
            assert!(
                remaining < Duration::from_secs(5),
                "waiter {offset} ms: {remaining:?}"
            );
        } else {
            assert!(
                remaining > Duration::from_secs(25),
                "waiter {offset} ms: {remaining:?}"
            );
        }
        let hold = HoldValue::read(&mut con, &key).await.expect("GET");
        assert!(
            hold.is_some_and(|h| h.token.is_some()),
            "waiter {offset} ms: the waiter's hold has no fencing token"
        );
        let _ = done_tx.send(());
        assert!(waiting.await.expect("waiter task").is_released());
    }
}
