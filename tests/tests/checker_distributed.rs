//! The history checker on Redis's own distributed deployments, with failover faults: a 3+3
//! cluster and a sentinel set-up, each with writes counted once the master has them (the
//! default: overlaps that a lost grant causes are excused by the fault and counted) and with
//! replica acknowledgement (nothing that counted may be lost: no overlap is excused).
//!
//! Faults are dealt in turn from a shuffled deck of every kind the deployment injects (on the
//! cluster: `DEL`s, coordinated failovers, masters killed, replicas paused, one client cut from
//! every node or from one, slots migrating with their keys; with Sentinel: `DEL`s, failovers,
//! failovers with a sentinel mute, the master killed, the replica paused, one client cut), and
//! each run lasts long enough for two or three of each.
//!
//! Independent masters under majority sets (`MasterSet`) have a run of their own: a master hung,
//! a master killed (back empty once its leases ran out), one client stalled or cut from one
//! master; beside mutual exclusion it bounds what a hung master may cost an acquisition.
//!
//! Each test prints its seed and its figures (guards, overlaps, losses, time to the next grant
//! after each failover); `DLOCK_CHECKER_SEED` replays a seed, `DLOCK_CHECKER_SECS` sets the
//! length of a run in seconds (a soak).

use std::time::Duration;

use dlock_tests::checker::{Config, FaultFamily, SECS_ENV, run_cluster, run_masters, run_sentinel};

/// The length of a run, unless `DLOCK_CHECKER_SECS` says otherwise: a cluster's faults take a
/// few seconds each, a sentinel set-up's failovers about ten (the old master follows the new one
/// only then).
const CLUSTER_RUN: Duration = Duration::from_secs(40);
const SENTINEL_RUN: Duration = Duration::from_secs(60);
/// Independent masters under majority sets: each fault takes a second or two (a killed master
/// stays down past the longest lease).
const MASTERS_RUN: Duration = Duration::from_secs(40);

fn config(family: FaultFamily, default: Duration) -> Config {
    let secs = std::env::var(SECS_ENV).ok();
    let secs = secs.map(|s| {
        s.trim()
            .parse::<u64>()
            .expect("DLOCK_CHECKER_SECS is seconds")
    });
    Config {
        duration: Some(secs.map_or(default, Duration::from_secs)),
        mixed_layouts: false,
        ..Config::from_env(family, 0)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checker_cluster_failovers() {
    let (report, _) = run_cluster(config(FaultFamily::Cluster, CLUSTER_RUN), false).await;
    report.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checker_cluster_failovers_replica_acknowledged() {
    let (report, figures) = run_cluster(config(FaultFamily::Cluster, CLUSTER_RUN), true).await;
    report.assert_clean();
    assert_eq!(figures.overlaps, 0, "{figures}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checker_sentinel_failovers() {
    let (report, _) = run_sentinel(config(FaultFamily::Sentinel, SENTINEL_RUN), false).await;
    report.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checker_sentinel_failovers_replica_acknowledged() {
    let (report, figures) = run_sentinel(config(FaultFamily::Sentinel, SENTINEL_RUN), true).await;
    report.assert_clean();
    assert_eq!(figures.overlaps, 0, "{figures}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checker_master_set_hung_and_killed_masters() {
    let report = run_masters(config(FaultFamily::Masters, MASTERS_RUN)).await;
    report.assert_clean();
    assert!(
        report.figures.granted_while_hung > 0,
        "no grant while a master hung: the budget bound was not exercised ({})",
        report.figures
    );
}
