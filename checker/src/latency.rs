//! What a run's calls took and how many holds were lost, read from its history: the figures
//! `dlock check` reports beside the invariants.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use super::history::{AcquireKind, EventKind, History, Outcome, locked, ms};

/// How long one kind of call took: how many, the median, the 99th percentile and the longest.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Spread {
    /// How many calls.
    pub count: usize,
    /// The median.
    pub p50: Duration,
    /// The 99th percentile (nearest rank).
    pub p99: Duration,
    /// The longest.
    pub max: Duration,
}

impl Spread {
    /// The spread of `took` (sorted here).
    pub fn of(mut took: Vec<Duration>) -> Self {
        took.sort_unstable();
        let rank = |q: f64| {
            let i = (q * took.len() as f64).ceil() as usize;
            took.get(i.saturating_sub(1)).copied().unwrap_or_default()
        };
        Self {
            count: took.len(),
            p50: rank(0.50),
            p99: rank(0.99),
            max: took.last().copied().unwrap_or_default(),
        }
    }
}

impl fmt::Display for Spread {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.count == 0 {
            return f.write_str("none");
        }
        write!(
            f,
            "{} calls, p50 {} p99 {} max {}",
            self.count,
            ms(self.p50),
            ms(self.p99),
            ms(self.max)
        )
    }
}

/// The run's latencies and losses.
#[derive(Debug, Clone, Copy, Default)]
pub struct Latencies {
    /// `try_lock` calls that answered (taken or busy): one round trip each.
    pub try_lock: Spread,
    /// Waiting acquisitions that were granted, from the call to the guard: contention included.
    pub granted_wait: Spread,
    /// Releases that released.
    pub release: Spread,
    /// Guards that learnt of a loss while they were still held (faults included).
    pub losses: usize,
}

impl fmt::Display for Latencies {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "try_lock {}; granted waits {}; releases {}; {} holds lost",
            self.try_lock, self.granted_wait, self.release, self.losses
        )
    }
}

impl Latencies {
    /// Reads them from a finished history.
    pub fn of(history: &History) -> Self {
        let (mut try_lock, mut waits, mut releases) = (Vec::new(), Vec::new(), Vec::new());
        // Each return answers the call with its id.
        let mut calls: HashMap<u32, (Instant, AcquireKind)> = HashMap::new();
        let mut release_calls: HashMap<u32, Instant> = HashMap::new();
        for e in history.events() {
            match e.kind {
                EventKind::AcquireCall { kind, .. } => {
                    calls.insert(e.call, (e.at, kind));
                }
                EventKind::Acquired { .. } | EventKind::Busy => {
                    let Some((at, kind)) = calls.remove(&e.call) else {
                        continue;
                    };
                    let took = e.at.saturating_duration_since(at);
                    match (kind, e.kind) {
                        (AcquireKind::TryLock, _) => try_lock.push(took),
                        (AcquireKind::Lock, EventKind::Acquired { .. }) => waits.push(took),
                        _ => {}
                    }
                }
                EventKind::AcquireFailed(_) | EventKind::AcquireDropped => {
                    calls.remove(&e.call);
                }
                EventKind::ReleaseCall { guard } => {
                    release_calls.insert(guard, e.at);
                }
                EventKind::ReleaseDone { guard, outcome } => {
                    if let Some(at) = release_calls.remove(&guard)
                        && outcome == Outcome::Released
                    {
                        releases.push(e.at.saturating_duration_since(at));
                    }
                }
                _ => {}
            }
        }
        let losses = (history.guards().iter())
            .filter(|g| {
                g.lost_at
                    .get()
                    .is_some_and(|lost| locked(&g.end).is_none_or(|end| *lost < end.at))
            })
            .count();
        Self {
            try_lock: Spread::of(try_lock),
            granted_wait: Spread::of(waits),
            release: Spread::of(releases),
            losses,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let took = (1..=100).map(Duration::from_millis).collect();
        let s = Spread::of(took);
        assert_eq!(s.count, 100);
        assert_eq!(s.p50, Duration::from_millis(50));
        assert_eq!(s.p99, Duration::from_millis(99));
        assert_eq!(s.max, Duration::from_millis(100));
        assert_eq!(Spread::of(Vec::new()), Spread::default());
        let one = Spread::of(vec![Duration::from_millis(7)]);
        assert_eq!((one.p50, one.p99, one.max), (one.max, one.max, one.max));
    }
}
