//! The history checker on Redis's own distributed deployments, with failover faults: a 3+3
//! cluster and a sentinel set-up, each with writes counted once the master has them (the
//! default: overlaps that a lost grant causes are excused by the fault and counted) and with
//! replica acknowledgement (nothing that counted may be lost: no overlap is excused).
//!
//! Each test prints its seed and its figures (guards, overlaps, losses, time to the next grant
//! after each failover); `DLOCK_CHECKER_SEED` replays a seed, `DLOCK_CHECKER_OPS` sets the
//! number of operations.

use dlock_tests::checker::{Config, FaultFamily, run_cluster, run_sentinel};

/// Operations per run.
const OPS: usize = 1_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checker_cluster_failovers() {
    let (report, _) = run_cluster(Config::from_env(FaultFamily::Cluster, OPS), false).await;
    report.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checker_cluster_failovers_replica_acknowledged() {
    let (report, figures) = run_cluster(Config::from_env(FaultFamily::Cluster, OPS), true).await;
    report.assert_clean();
    assert_eq!(figures.overlaps, 0, "{figures}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checker_sentinel_failovers() {
    let (report, _) = run_sentinel(Config::from_env(FaultFamily::Sentinel, OPS), false).await;
    report.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checker_sentinel_failovers_replica_acknowledged() {
    let (report, figures) = run_sentinel(Config::from_env(FaultFamily::Sentinel, OPS), true).await;
    report.assert_clean();
    assert_eq!(figures.overlaps, 0, "{figures}");
}
