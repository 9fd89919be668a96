//! Turns across processes, counted: two tasks of a near `Locker` and one of a far one take a
//! name in turn for a while; how often each got it, and the longest wait.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dlock_core::Locker;

/// What [`contend`] saw.
#[derive(Debug)]
pub struct Shares {
    /// Acquisitions per task: the near `Locker`'s two, then the far one's.
    pub counts: Vec<u64>,
    /// The longest wait, ms.
    pub longest_ms: u64,
}

impl Shares {
    /// The far task's acquisitions against a third of all: 1.0 is its fair share.
    pub fn far_share(&self) -> f64 {
        let total: u64 = self.counts.iter().sum();
        let fair = total as f64 / self.counts.len() as f64;
        self.counts.last().map_or(0.0, |far| *far as f64 / fair)
    }
}

/// Runs two tasks on `near` and one on `far` for `length`, each calling `take_and_release`
/// over and over: it acquires the name, holds it a moment, releases it, and answers how long
/// the acquisition waited.
///
/// # Panics
///
/// If a task panics.
pub async fn contend<F, Fut>(
    near: &Locker,
    far: &Locker,
    length: Duration,
    take_and_release: F,
) -> Shares
where
    F: Fn(Locker) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Duration> + Send + 'static,
{
    let end = Instant::now() + length;
    let counts: Vec<Arc<AtomicU64>> = (0..3).map(|_| Arc::default()).collect();
    let longest = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for (i, count) in counts.iter().enumerate() {
        let locker = if i < 2 { near.clone() } else { far.clone() };
        let (count, longest, take) = (count.clone(), longest.clone(), take_and_release.clone());
        tasks.push(tokio::spawn(async move {
            while Instant::now() < end {
                let waited = take(locker.clone()).await;
                let waited = u64::try_from(waited.as_millis()).unwrap_or(u64::MAX);
                longest.fetch_max(waited, Ordering::Relaxed);
                count.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for task in tasks {
        task.await.expect("task");
    }
    Shares {
        counts: counts.iter().map(|c| c.load(Ordering::Relaxed)).collect(),
        longest_ms: longest.load(Ordering::Relaxed),
    }
}
