//! Faults that hit the holder of a lock, with the holder in a process of its own (the `holder`
//! binary, see `dlock_tests::holder`) so that it is killed and stopped for real, and each
//! scenario's figure asserted and printed.
//!
//! Related scenarios elsewhere: `core.rs` has a paused *Redis* past the lease
//! (`a_paused_server_past_the_lease_makes_the_guard_lost`) and one in-process `Locker` across a
//! Redis restart (`redis_restart_reconnects_and_reports_the_loss_of_held_locks`); here the
//! *holder* is paused, killed and partitioned, and a restart hits several holder processes.

use std::time::{Duration, Instant, SystemTime};

use dlock_core::Locker;
use dlock_core::redis::AsyncCommands as _;
use dlock_tests::fenced;
use dlock_tests::holder::{HolderArgs, HolderLine, HolderProcess};
use dlock_tests::{Proxy, RedisServer, unique_name};

/// The holders' watchdog lease.
const LEASE: Duration = Duration::from_millis(900);
/// The watchdog's tick: a third of the lease.
const TICK: Duration = Duration::from_millis(300);
/// What a loss found by a renewal may take on top of the tick on a busy machine: the renewal's
/// round trip (the tick's period starts after the previous tick's round trip), the holder's
/// report through its pipe, and scheduling.
const REPORT_SLACK: Duration = Duration::from_millis(50);

fn spawn_holder(server: &RedisServer, name: &str, resource: Option<&str>) -> HolderProcess {
    HolderProcess::spawn(
        env!("CARGO_BIN_EXE_holder"),
        &HolderArgs {
            url: server.url(),
            name: name.to_owned(),
            lease: LEASE,
            resource: resource.map(str::to_owned),
        },
    )
}

/// Waits for the holder's `acquired` line; returns its fencing token.
async fn acquired(holder: &mut HolderProcess) -> u64 {
    let (_, token) = holder
        .expect("acquired", Duration::from_secs(10), |line| match line {
            HolderLine::Acquired { token } => Some(*token),
            _ => None,
        })
        .await;
    token
}

async fn locker(url: String) -> Locker {
    locker_leased(url, LEASE).await
}

async fn locker_leased(url: String, lease: Duration) -> Locker {
    Locker::builder()
        .url(url)
        .default_lease(dlock_core::Lease::watchdog(lease))
        .build()
        .await
        .expect("connect a Locker")
}

/// The partitioned holder's lease: its safety margin is the drift the guard takes off it (a
/// hundredth plus 2 ms: 32 ms here), and a shared CI machine can starve a timer for 10 ms.
const PARTITION_LEASE: Duration = Duration::from_secs(3);

/// The instant, on this process's monotonic clock, at which the clock of a Redis on this machine
/// read `micros` (microseconds since the Unix epoch, as `TIME` answers). Both are this machine's
/// clocks; they are tied together by one reading of each, close to `micros`.
fn instant_of_redis_micros(micros: u64) -> Instant {
    let (wall, now) = (SystemTime::now(), Instant::now());
    let wall_micros = wall
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("the clock is past 1970")
        .as_micros();
    let wall_micros = u64::try_from(wall_micros).expect("microseconds fit u64");
    if micros <= wall_micros {
        now - Duration::from_micros(wall_micros - micros)
    } else {
        now + Duration::from_micros(micros - wall_micros)
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1_000.0
}

/// Scenario 1: a holder process dies without releasing. The lock stays taken while its key
/// lives, and a rival waiting from before the death gets it within a lease and a tick of the
/// kill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holder_process_frees_its_lock_within_a_lease_and_a_tick() {
    let server = RedisServer::start();
    let name = unique_name("killed");
    let mut holder = spawn_holder(&server, &name, None);
    let token = acquired(&mut holder).await;
    let rival = locker(server.url()).await;
    let key = rival.key_of(name.as_str()).unwrap();
    // Past the first lease: the holder's watchdog is what keeps the lock now.
    tokio::time::sleep(LEASE + TICK).await;
    assert!(
        rival
            .lock(name.as_str())
            .try_lock()
            .await
            .unwrap()
            .is_none(),
        "the rival got a lock that a live holder renews"
    );
    let waiting = tokio::spawn({
        let (rival, name) = (rival.clone(), name.clone());
        async move {
            let guard = rival
                .lock(name.as_str())
                .wait(Duration::from_secs(10))
                .await;
            (Instant::now(), guard)
        }
    });
    // Let the rival settle into its wait.
    tokio::time::sleep(Duration::from_millis(50)).await;

    let killed_at = holder.sigkill();
    let mut con = server.connection().await;
    let pttl_sent = Instant::now();
    let pttl: i64 = con.pttl(&key).await.expect("PTTL");
    assert!(
        pttl > 0 && pttl <= LEASE.as_millis() as i64,
        "the killed holder's key should live on with at most a lease to go, PTTL {pttl}"
    );
    let (granted_at, guard) = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the rival was not granted the lock within 5 s of the kill")
        .expect("the rival's task panicked");
    let guard = guard.expect("the rival's wait failed");
    let waited = granted_at - killed_at;
    let key_expired = pttl_sent + Duration::from_millis(pttl as u64);
    eprintln!(
        "kill -> rival granted: {:.1} ms (lease {} ms + tick {} ms allowed); the dead holder's \
         key had {pttl} ms to live at the kill; granted {:.1} ms after it expired",
        ms(waited),
        LEASE.as_millis(),
        TICK.as_millis(),
        ms(granted_at.saturating_duration_since(key_expired)),
    );
    assert!(
        guard.fencing_token().await.unwrap().get() > token,
        "the rival's token {} is not above the dead holder's {token}",
        guard.fencing_token().await.unwrap()
    );
    assert!(
        granted_at >= key_expired,
        "the rival was granted {:.1} ms before the dead holder's key could expire",
        ms(key_expired - granted_at)
    );
    assert!(
        waited <= LEASE + TICK,
        "the rival waited {:.1} ms after the kill, more than a lease and a tick",
        ms(waited)
    );
    assert!(guard.release().await.is_released());
}

/// Scenario 2: a holder process stopped (`SIGSTOP`) past its lease while a rival takes the lock
/// and writes; resumed, the holder reports the loss and the resource refuses every write it
/// makes from then on: the rival's write stands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_holder_resumes_to_a_lost_lock_and_refused_writes() {
    let server = RedisServer::start();
    let name = unique_name("stopped");
    let resource = unique_name("resource");
    let mut holder = spawn_holder(&server, &name, Some(&resource));
    let old_token = acquired(&mut holder).await;
    holder
        .expect("accepted write", Duration::from_secs(5), |line| {
            matches!(line, HolderLine::Write { accepted: true, .. }).then_some(())
        })
        .await;

    let stopped_at = holder.sigstop();
    let rival = locker(server.url()).await;
    let guard = rival
        .lock(name.as_str())
        .wait(Duration::from_secs(5))
        .await
        .expect("the rival did not get the stopped holder's lock");
    let taken_after = stopped_at.elapsed();
    let new_token = guard.fencing_token().await.unwrap().get();
    assert!(
        new_token > old_token,
        "new token {new_token} is not above the stopped holder's {old_token}"
    );
    let mut con = server.connection().await;
    assert!(
        fenced::write(&mut con, &resource, new_token, "rival")
            .await
            .expect("the rival's write"),
        "the resource refused the new holder's write"
    );
    // Whatever the holder printed before it was stopped.
    while holder.next_line(Duration::from_millis(50)).await.is_some() {}

    let resumed_at = holder.sigcont();
    let mut accepted_after_resume = Vec::new();
    let mut refused_after_resume = 0;
    let (lost_at, via) = holder
        .expect_with(
            "lost",
            Duration::from_secs(3),
            |line| match line {
                HolderLine::Lost { via, .. } => Some(via.clone()),
                _ => None,
            },
            |_, line| match line {
                HolderLine::Write {
                    accepted: true,
                    seq,
                    ..
                } => accepted_after_resume.push(*seq),
                HolderLine::Write {
                    accepted: false, ..
                } => refused_after_resume += 1,
                _ => {}
            },
        )
        .await;
    let (_, after_loss_accepted) = holder
        .expect(
            "after-loss-write",
            Duration::from_secs(3),
            |line| match line {
                HolderLine::AfterLossWrite { accepted } => Some(*accepted),
                _ => None,
            },
        )
        .await;
    let (_, outcome) = holder
        .expect("released", Duration::from_secs(6), |line| match line {
            HolderLine::Released { outcome } => Some(outcome.clone()),
            _ => None,
        })
        .await;
    let status = holder.wait_exit(Duration::from_secs(3)).await;
    let learned = lost_at - resumed_at;
    eprintln!(
        "stop -> rival granted: {:.1} ms; resume -> holder reports the loss (via {via}): {:.1} ms; \
         writes after resume: {} accepted, {refused_after_resume} refused; release: {outcome}",
        ms(taken_after),
        ms(learned),
        accepted_after_resume.len(),
    );
    assert!(
        accepted_after_resume.is_empty(),
        "the resource accepted writes {accepted_after_resume:?} from the resumed holder"
    );
    assert!(
        !after_loss_accepted,
        "the resource accepted the holder's write after its loss"
    );
    assert_eq!(
        fenced::read(&mut con, &resource)
            .await
            .expect("read the resource"),
        Some((new_token, "rival".to_owned())),
        "the new holder's write did not stand"
    );
    assert!(
        learned <= TICK,
        "the resumed holder took {:.1} ms to report the loss, more than a tick",
        ms(learned)
    );
    assert_eq!(outcome, "TakenOver", "the resumed holder's release");
    assert!(status.success(), "the holder exited with {status}");
    assert!(guard.release().await.is_released());
}

/// Scenario 3: a holder cut off from Redis (every packet held back by a stalled proxy) reports
/// the loss from its own validity deadline before a rival talking to Redis directly can be
/// granted the lock (once its key expires).
///
/// The holder runs in this process, on a runtime of its own on a thread of its own: its loss is
/// then an instant of this process's monotonic clock, with nothing between the loss and its
/// reading, and the rival's busy polling does not delay the holder's timers. The safety margin
/// is only the drift the guard takes off its lease (a hundredth of it plus 2 ms, 32 ms here),
/// less than what reading another process's output can add on a busy machine.
///
/// The grant is placed on the same clock by Redis itself: the server's clock when the rival's
/// key was set (its expiry less the lease), and the server runs on this machine. The instants
/// around the rival's call only bracket it: a call delayed on its way to Redis would make its
/// start far earlier than the grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_holder_gives_up_by_its_own_deadline_before_a_rival_is_granted() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.addr()).await;
    let rival = locker_leased(server.url(), PARTITION_LEASE).await;
    let name = unique_name("partitioned");
    let (held_tx, held_rx) = tokio::sync::oneshot::channel();
    let (lost_tx, lost_rx) = tokio::sync::oneshot::channel();
    let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
    let holder = std::thread::spawn({
        let (url, name) = (proxy.url(), name.clone());
        move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("the holder's runtime");
            runtime.block_on(async move {
                let holder = locker_leased(url, PARTITION_LEASE).await;
                let guard = holder.lock(name.as_str()).await.expect("the holder's lock");
                tokio::time::sleep(PARTITION_LEASE).await;
                assert!(!guard.is_lost(), "lost before the partition");
                let _ = held_tx.send(guard.fencing_token().await.unwrap());
                // This runtime runs nothing but the holder's Locker and this wait.
                guard.lost().await;
                let lost_at = Instant::now();
                let _ = lost_tx.send((lost_at, guard.valid_until().into_std(), guard.is_lost()));
                // Released once the test lets it (or went away).
                let _ = release_rx.await;
                guard.release().await
            })
        }
    });
    let holder_token = tokio::time::timeout(Duration::from_secs(10), held_rx)
        .await
        .expect("the holder did not take the lock within 10 s")
        .expect("the holder's thread panicked");

    proxy.stall();
    let stalled_at = Instant::now();
    // The rival tries as often as it can: it gets the lock the moment Redis lets it.
    let (grant_sent, grant_answered, rival_guard) = loop {
        let sent = Instant::now();
        if let Some(granted) = rival
            .lock(name.as_str())
            .try_lock()
            .await
            .expect("the rival's attempt")
        {
            break (sent, Instant::now(), granted);
        }
        assert!(
            stalled_at.elapsed() < PARTITION_LEASE + Duration::from_secs(5),
            "the rival was not granted the lock within a lease and 5 s of the partition"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    let (lost_at, valid_until, is_lost) = tokio::time::timeout(Duration::from_secs(1), lost_rx)
        .await
        .expect("the partitioned holder never reported the loss")
        .expect("the holder's thread panicked");
    // Redis's clock at the grant: the grant set the key to expire a lease later, so it was a
    // lease before the key's expiry — now (`TIME`) plus what is left (`PTTL`, whole ms: the
    // estimate is within a millisecond). Read at once, before any renewal moved the expiry.
    let granted_at = {
        let key = rival.key_of(name.as_str()).expect("a key");
        let mut con = server.connection().await;
        let ((secs, micros), pttl): ((u64, u64), u64) = redis::pipe()
            .cmd("TIME")
            .cmd("PTTL")
            .arg(&key)
            .query_async(&mut con)
            .await
            .expect("TIME and PTTL");
        let expiry = secs * 1_000_000 + micros + pttl * 1_000;
        let lease = u64::try_from(PARTITION_LEASE.as_micros()).expect("a lease in microseconds");
        instant_of_redis_micros(expiry - lease)
    };
    eprintln!(
        "partition -> holder reports the loss: {:.1} ms (its deadline: {:.1} ms); partition -> \
         rival granted: {:.1} ms; loss reported {:.1} ms before the grant",
        ms(lost_at - stalled_at),
        ms(valid_until.saturating_duration_since(stalled_at)),
        ms(granted_at - stalled_at),
        ms(granted_at.saturating_duration_since(lost_at)),
    );
    eprintln!(
        "the rival's granted call ran from {:.1} to {:.1} ms into the partition",
        ms(grant_sent - stalled_at),
        ms(grant_answered - stalled_at),
    );
    let slack = Duration::from_millis(2);
    assert!(
        granted_at + slack >= grant_sent && granted_at <= grant_answered + slack,
        "Redis's clock puts the grant {:+.1} ms from the start of the call that was granted, \
         {:+.1} ms from its answer: the two clocks disagree",
        ms(granted_at.saturating_duration_since(grant_sent))
            - ms(grant_sent.saturating_duration_since(granted_at)),
        ms(granted_at.saturating_duration_since(grant_answered))
            - ms(grant_answered.saturating_duration_since(granted_at)),
    );
    assert!(
        valid_until <= granted_at,
        "the holder's deadline ran {:.1} ms past the rival's grant",
        ms(valid_until - granted_at)
    );
    assert!(
        lost_at <= granted_at,
        "the holder reported the loss {:.1} ms after the rival was granted the lock (its deadline \
         was {:.1} ms before the grant)",
        ms(lost_at - granted_at),
        ms(granted_at.saturating_duration_since(valid_until))
    );
    assert!(
        lost_at - stalled_at <= PARTITION_LEASE,
        "the holder reported the loss {:.1} ms into the partition, more than a lease",
        ms(lost_at - stalled_at)
    );
    assert!(is_lost);
    assert!(rival_guard.fencing_token().await.unwrap() > holder_token);
    proxy.unstall();
    release_tx.send(()).expect("the holder's thread ended");
    let outcome = tokio::task::spawn_blocking(move || holder.join())
        .await
        .expect("join the holder's thread")
        .expect("the holder's thread panicked");
    assert!(
        !outcome.is_released(),
        "the partitioned holder's release claimed success: {outcome:?}"
    );
    assert!(rival_guard.release().await.is_released());
}

/// Scenario 4: Redis killed and restarted at once, empty, while five holder processes each hold
/// a lock. Each learns of the loss within a watchdog tick of Redis being back (its deadline is
/// still more than a tick away then: it learns from a renewal), none hangs, and the names can be
/// locked again, with higher fencing tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_holder_learns_of_a_redis_restart_within_a_tick() {
    restart_under_holders(Duration::ZERO).await;
}

/// Scenario 4 with Redis down for longer than a tick, so that every holder's renewal fails
/// during the outage: each still learns of the loss within a tick of Redis being back (or
/// before, from its deadline), and none hangs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_holder_learns_of_a_redis_outage_longer_than_a_tick_within_a_tick() {
    restart_under_holders(TICK + Duration::from_millis(100)).await;
}

/// Five holder processes hold a lock each; Redis is killed, stays down for `down`, and comes back
/// empty. Asserts that each holder reports the loss within a tick of Redis being back, exits,
/// and that every name can be locked again with a higher token.
async fn restart_under_holders(down: Duration) {
    const HOLDERS: usize = 5;
    let mut server = RedisServer::start();
    let names: Vec<String> = (0..HOLDERS).map(|_| unique_name("restarted")).collect();
    let mut holders: Vec<HolderProcess> = names
        .iter()
        .map(|name| spawn_holder(&server, name, None))
        .collect();
    let mut tokens = Vec::new();
    for holder in &mut holders {
        tokens.push(acquired(holder).await);
    }
    // A few renewals, so that the holders are in their steady state; half a tick more, so that
    // the kill does not fall on the ticks of holders that started together.
    tokio::time::sleep(LEASE + TICK / 2).await;

    let killed_at = Instant::now();
    server.kill();
    tokio::time::sleep(down).await;
    server.restart();
    let up_at = Instant::now();
    let mut figures = Vec::new();
    for holder in &mut holders {
        let (lost_at, via) = holder
            .expect("lost", LEASE + Duration::from_secs(2), |line| match line {
                HolderLine::Lost { via, .. } => Some(via.clone()),
                _ => None,
            })
            .await;
        figures.push((lost_at, via));
    }
    for holder in &mut holders {
        holder
            .expect("released", Duration::from_secs(6), |line| {
                matches!(line, HolderLine::Released { .. }).then_some(())
            })
            .await;
        let status = holder.wait_exit(Duration::from_secs(3)).await;
        assert!(status.success(), "a holder exited with {status}");
    }
    let shown: Vec<String> = figures
        .iter()
        .map(|(at, via)| {
            if *at >= up_at {
                format!("+{:.1} ms ({via})", ms(*at - up_at))
            } else {
                format!("-{:.1} ms ({via})", ms(up_at - *at))
            }
        })
        .collect();
    eprintln!(
        "redis down for {:.1} ms; each holder's loss after redis was back: {}",
        ms(up_at - killed_at),
        shown.join(", ")
    );
    for (i, (at, via)) in figures.iter().enumerate() {
        let after = at.saturating_duration_since(up_at);
        assert!(
            after <= TICK + REPORT_SLACK,
            "holder {i} reported the loss {:.1} ms (via {via}) after redis was back, more than a \
             tick (and {} ms of slack); its output:\n{}",
            ms(after),
            REPORT_SLACK.as_millis(),
            holders[i].seen().join("\n")
        );
    }

    let fresh = locker(server.url()).await;
    for (name, old) in names.iter().zip(&tokens) {
        let guard = fresh
            .lock(name.as_str())
            .try_lock()
            .await
            .expect("lock after the restart")
            .unwrap_or_else(|| panic!("{name} is still taken after the restart"));
        assert!(
            guard.fencing_token().await.unwrap().get() > *old,
            "{name}: token {} after the restart is not above {old}",
            guard.fencing_token().await.unwrap()
        );
        assert!(guard.release().await.is_released());
    }
}
