//! The history checker in CI: at least 20,000 operations with faults against Redis, split over
//! one test per fault family (nextest runs them in parallel processes), and 200,000 against the
//! memory backend on a paused clock, where a seed replays the same history; and 3,000 against
//! PostgreSQL, with the faults that end its sessions.
//!
//! What it found on its own in the core it was first run against, each now fixed with a
//! regression test of its own: `extend()` to a shorter lease leaving `valid_until` where it was
//! (a, c); re-entries that failed or were dropped half-way leaking a hold (c, d); `Duration::MAX`
//! waits and extensions panicking (e); a re-entry succeeding into a hold an external `DEL` had
//! removed (a); a fencing counter re-created without a TTL (d); a locker first used on a runtime
//! that is gone never renewing anything (f); one foreign value under a lock key stopping every
//! renewal of its locker (f, end-of-run probe); a subscription outliving its last waiter (d).
//!
//! One name of every run is a fair lock (`fair_lock`, with a short dead-waiter timeout): every
//! invariant covers it, and (a) also checks that it goes to waiters in the order they came. One
//! is a semaphore whose count the run changes as it goes (never more permits believed held than
//! a count in force allowed), and one a read-write lock whose writers re-enter as readers (never
//! a writer beside a reader).
//!
//! Each test prints its seed; `DLOCK_CHECKER_SEED=<n>` replays one (see `dlock_tests::checker`
//! for what replays and what does not), `DLOCK_CHECKER_OPS=<n>` sets the number of operations.

use dlock_tests::checker::{Config, FaultFamily, run_memory, run_postgres, run_redis};

/// Operations per Redis test (four tests).
const REDIS_OPS: usize = 5_000;
/// Operations of the memory test.
const MEMORY_OPS: usize = 200_000;

async fn redis(family: FaultFamily) {
    let config = Config::from_env(family, REDIS_OPS);
    let report = run_redis(config).await;
    report.assert_clean();
    // Every primitive of the run was held, so every check had something to look at.
    if config.ops >= REDIS_OPS {
        let shares = &report.shares;
        assert!(report.fair.guards > 0, "{}", report.summary());
        assert!(
            shares.permits > 0 && shares.reads > 0,
            "{}",
            report.summary()
        );
        assert!(shares.writes > 0, "{}", report.summary());
        // Releases granted the lock to waiters of other lockers, so that path was judged too.
        let grants = report
            .stats
            .grants
            .load(std::sync::atomic::Ordering::Relaxed);
        assert!(grants > 0, "{}", report.summary());
        // And handed it to waiters of their own locker.
        assert!(handed_over(&report) > 0, "{}", report.summary());
    }
}

/// Locks the run's releases handed to a waiter of their own locker.
fn handed_over(report: &dlock_tests::checker::Report) -> u64 {
    report
        .stats
        .handed_over
        .load(std::sync::atomic::Ordering::Relaxed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checker_redis_pause_and_del() {
    redis(FaultFamily::PauseAndDel).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checker_redis_restart() {
    redis(FaultFamily::Restart).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checker_redis_proxy_cut() {
    redis(FaultFamily::ProxyCut).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checker_redis_mixed() {
    redis(FaultFamily::Mixed).await;
}

/// Operations of the PostgreSQL test.
const POSTGRES_OPS: usize = 3_000;

/// On PostgreSQL (its plain locks: the only kind it offers), with sessions killed, the server
/// paused and restarted, one client's connections cut and stalled. Every one of those frees the
/// sessions' locks at once: an overlap it reaches is excused and counted, as a Redis `DEL`'s is;
/// anything else that costs a hold, a lock left in `pg_locks` at the end or a call past its
/// bound is a violation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checker_postgres_sessions_ended() {
    let config = Config::from_env(FaultFamily::Postgres, POSTGRES_OPS);
    let report = run_postgres(config).await;
    report.assert_clean();
    if config.ops >= POSTGRES_OPS {
        assert!(report.guards > 0, "{}", report.summary());
        for fault in ["Del", "Pause", "Restart", "Cut"] {
            let injected = report
                .faults
                .iter()
                .any(|(k, n)| k.contains(fault) && *n > 0);
            assert!(injected, "no {fault} fault: {}", report.summary());
        }
        // The share checks had permits and reads to look at.
        let shares = &report.shares;
        assert!(shares.most_permits_at_once >= 2, "{}", report.summary());
        assert!(shares.most_reads_at_once >= 2, "{}", report.summary());
        assert!(shares.writes > 0, "{}", report.summary());
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn checker_memory_paused_clock() {
    let config = Config::from_env(FaultFamily::Memory, MEMORY_OPS);
    let report = run_memory(config).await;
    report.assert_clean();
    // The fair-order check had waiters to compare (a much shorter run may have none).
    if config.ops >= MEMORY_OPS {
        assert!(report.fair.contested > 0, "{}", report.summary());
        // The share checks had shared holds to look at.
        let shares = &report.shares;
        assert!(shares.most_permits_at_once >= 2, "{}", report.summary());
        assert!(shares.permit_sets > 0, "{}", report.summary());
        assert!(shares.most_reads_at_once >= 2, "{}", report.summary());
        assert!(shares.writes > 0, "{}", report.summary());
        assert!(shares.reads_in_write > 0, "{}", report.summary());
        // The store runs the very scripts, so releases grant the lock to waiters of other
        // lockers here too.
        let grants = report
            .stats
            .grants
            .load(std::sync::atomic::Ordering::Relaxed);
        assert!(grants > 0, "{}", report.summary());
        assert!(handed_over(&report) > 0, "{}", report.summary());
    }
}

/// Operations of each mixed-layout run.
const MIXED_LAYOUT_OPS: usize = 40_000;

/// A fleet in the middle of a rolling deploy, on a paused clock: every other locker runs layout
/// 1's frozen scripts (untagged tokens) beside this version's, on the same names, and every
/// invariant holds as it does for one version — among them, never two holders at once.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn checker_memory_mixed_layouts() {
    let mut config = Config::from_env(FaultFamily::Memory, MIXED_LAYOUT_OPS);
    config.mixed_layouts = true;
    let report = run_memory(config).await;
    report.assert_clean();
    if config.ops >= MIXED_LAYOUT_OPS {
        // Turns passed between the two versions' lockers too.
        let grants = report
            .stats
            .grants
            .load(std::sync::atomic::Ordering::Relaxed);
        assert!(grants > 0, "{}", report.summary());
        assert!(report.fair.contested > 0, "{}", report.summary());
    }
}

/// The same on a real server, with every fault (pauses, deletes, restarts, cut connections).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checker_redis_mixed_layouts() {
    let mut config = Config::from_env(FaultFamily::Mixed, REDIS_OPS / 2);
    config.mixed_layouts = true;
    run_redis(config).await.assert_clean();
}

/// Operations of each of the two runs of the replay test.
const REPLAY_OPS: usize = 10_000;

/// A seed on the memory store and a paused clock replays the very same history: the same events,
/// in the same order, at the same moments, with the same fencing tokens. A violation found there
/// can be run again as it happened, under a debugger or with more logging. Each run has a
/// runtime of its own, as a run of its own process would: a paused clock moves from timer to
/// timer, in whole milliseconds from the runtime's start.
#[test]
fn a_memory_seed_replays_the_same_history() {
    let config = Config::from_env(FaultFamily::Memory, REPLAY_OPS);
    let run = || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("a runtime");
        runtime.block_on(run_memory(config))
    };
    let (first, second) = (run(), run());
    // Printed, so that runs in two processes can be compared too.
    eprintln!("seed {}: {:?}", config.seed, first.digest);
    assert!(first.digest.events > 0, "{}", first.summary());
    assert_eq!(
        first.digest,
        second.digest,
        "two runs of seed {} differ\nfirst:  {}\nsecond: {}",
        config.seed,
        first.summary(),
        second.summary()
    );
}
