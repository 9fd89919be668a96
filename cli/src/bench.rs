//! `dlock bench`: acquire and release cycles against the user's Redis — each task on a name of
//! its own, then every task on one name — with their latencies. It writes lock keys under the
//! prefix, on names of its own (`bench:` and a random suffix unless told), and deletes them at
//! the end; should it be killed, they expire within a minute.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use dlock_core::redis::{self, RedisResult};
use dlock_core::{LockError, Locker, ReleaseOutcome};
use tokio::time::Instant;

use crate::progress::{self, Ticker};
use crate::{Failure, Target};

/// How long the bench's fencing counters outlive their last use: long enough for the runs,
/// short enough that a bench killed before its clean-up leaves nothing for long.
const FENCE_TTL: Duration = Duration::from_secs(60);
/// The bench's lock keys expire this long after a bench killed while holding them.
const LEASE: Duration = Duration::from_secs(30);
/// How long a contended task waits beyond the run's end before the bench gives up.
const WAIT_SLACK: Duration = Duration::from_secs(30);
/// The bound on the clean-up's connection and each of its commands.
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(2);

/// What `dlock bench` was asked for.
#[derive(Debug)]
pub(crate) struct Options {
    /// How long each run lasts.
    pub(crate) duration: Duration,
    /// How many tasks cycle at once.
    pub(crate) tasks: usize,
    /// What the names start with, before the random suffix.
    pub(crate) name: String,
    /// Whether a live status line may be shown.
    pub(crate) progress: bool,
    /// Whether to say on stderr what the bench writes, before it starts.
    pub(crate) notice: bool,
}

/// Latency percentiles over a run's cycles (all zero without any).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Latencies {
    pub(crate) p50: Duration,
    pub(crate) p90: Duration,
    pub(crate) p99: Duration,
    pub(crate) max: Duration,
}

/// What one run measured.
#[derive(Debug)]
pub(crate) struct Run {
    /// `uncontended` or `contended`.
    pub(crate) label: &'static str,
    pub(crate) tasks: usize,
    /// How many names the tasks cycled on.
    pub(crate) names: usize,
    /// Completed acquire-and-release cycles.
    pub(crate) cycles: u64,
    /// From the start until the last task finished its last cycle.
    pub(crate) elapsed: Duration,
    /// From asking for the lock until holding it (waiting included).
    pub(crate) acquire: Latencies,
    /// From asking for the lock until it was released.
    pub(crate) cycle: Latencies,
}

impl Run {
    /// Cycles per second over the run.
    pub(crate) fn rate(&self) -> f64 {
        match self.elapsed.as_secs_f64() {
            0.0 => 0.0,
            secs => self.cycles as f64 / secs,
        }
    }
}

/// What `dlock bench` did.
#[derive(Debug)]
pub(crate) struct Report {
    /// The glob of the keys it wrote, as `dlock:{bench:1f3a9c2e:*}`.
    pub(crate) keys: String,
    /// How long each run was to last.
    pub(crate) duration: Duration,
    pub(crate) runs: Vec<Run>,
    /// Ctrl-C stopped it early.
    pub(crate) interrupted: bool,
    /// Keys its clean-up deleted.
    pub(crate) keys_removed: u64,
}

/// Runs the bench on `target` under `prefix`, and cleans up after it whatever happened.
pub(crate) async fn bench(
    target: &Target,
    prefix: &str,
    options: &Options,
) -> Result<Report, Failure> {
    let base = format!("{}{}", options.name, random_suffix());
    let uncontended: Vec<String> = (0..options.tasks).map(|i| format!("{base}:u{i}")).collect();
    let contended = format!("{base}:contended");
    // A bad name is the user's mistake, whether or not Redis can be reached.
    for name in uncontended.iter().chain([&contended]) {
        dlock_core::LockName::new(name).map_err(failure)?;
    }
    let locker = crate::builder(target, prefix)?
        .fence_ttl(Some(FENCE_TTL))
        .default_lease(dlock_core::Lease::watchdog(LEASE))
        .holder_label(format!("dlock-bench:{}", std::process::id()))
        .build()
        .await
        .map_err(|err| crate::connect_failure(target, err))?;
    let mut keys = Vec::new();
    for name in uncontended.iter().chain([&contended]) {
        let lock = locker.key_of(name.as_str()).map_err(failure)?;
        // A plain lock's keys: the lock itself and its fencing counter.
        keys.push(format!("{lock}:fence"));
        keys.push(lock);
    }
    let mut cleanup = Cleanup::open(target).await?;
    let keys_glob = format!("{prefix}{{{base}:*}}");
    if options.notice {
        eprintln!(
            "dlock bench: writes lock keys under {keys_glob} for 2 runs of {}, then deletes them",
            progress::seconds(options.duration)
        );
    }

    let stop = Arc::new(AtomicBool::new(false));
    let signals = tokio::spawn({
        let (stop, keys_glob) = (stop.clone(), keys_glob.clone());
        async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                stop.store(true, Ordering::Relaxed);
            }
            if tokio::signal::ctrl_c().await.is_ok() {
                eprintln!(
                    "\ndlock: interrupted twice: keys under {keys_glob} may be left; they \
                     expire within a minute"
                );
                std::process::exit(130);
            }
        }
    });
    let bench = Bench {
        locker: &locker,
        duration: options.duration,
        stop: &stop,
        progress: options.progress,
    };
    let mut runs = Vec::new();
    let measured = async {
        runs.push(bench.run("uncontended", 1, uncontended).await?);
        if !stop.load(Ordering::Relaxed) {
            let one = vec![contended; options.tasks];
            runs.push(bench.run("contended", 2, one).await?);
        }
        Ok::<(), Failure>(())
    }
    .await;
    let removed = cleanup.delete(&keys).await;
    signals.abort();
    if let Err(Failure(code, message)) = measured {
        let message = match &removed {
            Ok(_) => message,
            Err(err) => format!(
                "{message}; and the bench's keys {keys_glob} could not be deleted ({err}): they \
                 expire within a minute"
            ),
        };
        return Err(Failure(code, message));
    }
    let keys_removed = removed.map_err(|err| {
        Failure::new(
            1,
            format!(
                "could not delete the bench's keys {keys_glob}: {err}; they expire within a minute"
            ),
        )
    })?;
    // What a scan still finds would be a lock the bench took and did not release.
    let left = locker.list(&format!("{base}:*")).await.map_err(failure)?;
    if !left.is_empty() {
        return Err(Failure::new(
            1,
            format!("the bench left locks behind: {left:?}"),
        ));
    }
    Ok(Report {
        keys: keys_glob,
        duration: options.duration,
        runs,
        interrupted: stop.load(Ordering::Relaxed),
        keys_removed,
    })
}

/// What every run shares.
struct Bench<'a> {
    locker: &'a Locker,
    duration: Duration,
    stop: &'a Arc<AtomicBool>,
    progress: bool,
}

impl Bench<'_> {
    /// One task per entry of `names`, each cycling on its name until the run's end.
    async fn run(
        &self,
        label: &'static str,
        index: usize,
        names: Vec<String>,
    ) -> Result<Run, Failure> {
        let cycles = Arc::new(AtomicU64::new(0));
        let started = Instant::now();
        let deadline = started + self.duration;
        let duration = self.duration;
        let ticker = Ticker::start(self.progress, {
            let cycles = cycles.clone();
            move || {
                format!(
                    "dlock bench: {label} (run {index}/2)  {} / {}  {} cycles",
                    progress::seconds(started.elapsed().min(duration)),
                    progress::seconds(duration),
                    cycles.load(Ordering::Relaxed)
                )
            }
        });
        let (tasks, distinct) = (names.len(), {
            let mut unique = names.clone();
            unique.sort();
            unique.dedup();
            unique.len()
        });
        let handles: Vec<_> = (names.into_iter())
            .map(|name| {
                let task = Task {
                    locker: self.locker.clone(),
                    name,
                    deadline,
                    wait: self.duration + WAIT_SLACK,
                    stop: self.stop.clone(),
                    cycles: cycles.clone(),
                };
                tokio::spawn(task.cycle())
            })
            .collect();
        let (mut acquire, mut cycle) = (Vec::new(), Vec::new());
        let mut failed = None;
        for handle in handles {
            match handle.await {
                Ok(Ok(samples)) => {
                    acquire.extend(samples.acquire);
                    cycle.extend(samples.cycle);
                }
                Ok(Err(err)) => {
                    failed.get_or_insert(err);
                }
                Err(err) => {
                    self.stop.store(true, Ordering::Relaxed);
                    failed.get_or_insert(Failure::new(1, format!("a bench task failed: {err}")));
                }
            }
        }
        let elapsed = started.elapsed();
        drop(ticker);
        if let Some(failure) = failed {
            return Err(failure);
        }
        Ok(Run {
            label,
            tasks,
            names: distinct,
            cycles: cycles.load(Ordering::Relaxed),
            elapsed,
            acquire: latencies(acquire),
            cycle: latencies(cycle),
        })
    }
}

/// One task of a run.
struct Task {
    locker: Locker,
    name: String,
    deadline: Instant,
    wait: Duration,
    stop: Arc<AtomicBool>,
    cycles: Arc<AtomicU64>,
}

/// One task's latencies.
#[derive(Default)]
struct Samples {
    acquire: Vec<Duration>,
    cycle: Vec<Duration>,
}

impl Task {
    /// Acquires and releases its name until the deadline or a stop; a failure stops the others.
    async fn cycle(self) -> Result<Samples, Failure> {
        let mut samples = Samples::default();
        while !self.stop.load(Ordering::Relaxed) && Instant::now() < self.deadline {
            let started = Instant::now();
            let acquired = self.locker.lock(self.name.as_str()).wait(self.wait).await;
            let guard = match acquired {
                Ok(guard) => guard,
                Err(err) => return Err(self.fail(failure(err))),
            };
            let held = started.elapsed();
            match guard.release().await {
                ReleaseOutcome::Released => {}
                ReleaseOutcome::Unreachable(err) => return Err(self.fail(failure(err))),
                other => {
                    let message = format!("the lock on `{}` was lost: {other:?}", self.name);
                    return Err(self.fail(Failure::new(1, message)));
                }
            }
            samples.acquire.push(held);
            samples.cycle.push(started.elapsed());
            self.cycles.fetch_add(1, Ordering::Relaxed);
        }
        Ok(samples)
    }

    fn fail(&self, failure: Failure) -> Failure {
        self.stop.store(true, Ordering::Relaxed);
        failure
    }
}

/// A lock call's failure: a bad name or setting is the user's (2), anything else Redis's (1).
fn failure(err: LockError) -> Failure {
    let code = if err.is_invalid_name() || err.is_config() {
        2
    } else {
        1
    };
    Failure::new(code, err.to_string())
}

/// Nearest-rank percentiles of `samples`.
fn latencies(mut samples: Vec<Duration>) -> Latencies {
    samples.sort_unstable();
    let at = |percent: usize| {
        let rank = (samples.len() * percent).div_ceil(100).max(1);
        samples.get(rank - 1).copied().unwrap_or_default()
    };
    Latencies {
        p50: at(50),
        p90: at(90),
        p99: at(99),
        max: samples.last().copied().unwrap_or_default(),
    }
}

/// Eight hex digits that differ from run to run (std's hasher keys are random per process).
fn random_suffix() -> String {
    use std::hash::{BuildHasher as _, Hasher as _};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    if let Ok(now) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        hasher.write_u128(now.as_nanos());
    }
    format!("{:08x}", hasher.finish() >> 32)
}

/// A plain connection of its own for deleting the bench's keys (a `Locker` deletes only locks,
/// never their fencing counters). Opened before the runs, so a bench that could not clean up
/// does not start.
enum Cleanup {
    Server(redis::aio::MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl Cleanup {
    async fn open(target: &Target) -> Result<Self, Failure> {
        let opened = tokio::time::timeout(CLEANUP_TIMEOUT, async {
            match target {
                Target::Url(server) => {
                    let client = server.client()?;
                    Ok::<_, redis::RedisError>(Self::Server(
                        client.get_multiplexed_async_connection().await?,
                    ))
                }
                Target::Cluster(urls) => {
                    let client = redis::cluster::ClusterClient::builder(urls.clone())
                        .connection_timeout(CLEANUP_TIMEOUT)
                        .build()?;
                    Ok(Self::Cluster(client.get_async_connection().await?))
                }
                Target::Sentinel { urls, master } => {
                    let mut client = redis::sentinel::SentinelClient::build(
                        urls.clone(),
                        master.clone(),
                        None,
                        redis::sentinel::SentinelServerType::Master,
                    )?;
                    Ok(Self::Server(client.get_async_connection().await?))
                }
            }
        });
        match opened.await {
            Ok(Ok(cleanup)) => Ok(cleanup),
            Ok(Err(err)) => Err(Failure::new(
                1,
                format!("cannot connect for the clean-up: {err}"),
            )),
            Err(_) => Err(Failure::new(
                1,
                "cannot connect for the clean-up: timed out",
            )),
        }
    }

    /// Deletes `keys` two by two (a lock's keys share a slot), returning how many there were.
    async fn delete(&mut self, keys: &[String]) -> RedisResult<u64> {
        let mut removed = 0;
        for pair in keys.chunks(2) {
            let mut del = redis::cmd("DEL");
            del.arg(pair);
            let deleted = tokio::time::timeout(CLEANUP_TIMEOUT, async {
                match self {
                    Self::Server(conn) => del.query_async::<u64>(conn).await,
                    Self::Cluster(conn) => del.query_async::<u64>(conn).await,
                }
            });
            removed += match deleted.await {
                Ok(n) => n?,
                Err(_) => {
                    return Err(redis::RedisError::from(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "DEL timed out",
                    )));
                }
            };
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let ms = |n: u64| Duration::from_millis(n);
        let l = latencies((1..=100).rev().map(ms).collect());
        assert_eq!(
            (l.p50, l.p90, l.p99, l.max),
            (ms(50), ms(90), ms(99), ms(100))
        );
        let one = latencies(vec![ms(7)]);
        assert_eq!((one.p50, one.p99, one.max), (ms(7), ms(7), ms(7)));
        let none = latencies(Vec::new());
        assert_eq!(none.max, Duration::ZERO);
        assert_ne!(random_suffix(), random_suffix());
        assert_eq!(random_suffix().len(), 8);
    }
}
