//! How long this `Locker`'s holds have lasted lately: what a busy answer's `retry_after` is
//! bounded by, so that a client told to retry is told when the lock is likely free, not when
//! the holder's 30 s watchdog lease would run out.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A moving average of hold times (each new hold counts for an eighth), in µs; 0 while no
/// hold has ended.
#[derive(Debug, Default)]
pub(crate) struct HoldTimes {
    average_us: AtomicU64,
}

impl HoldTimes {
    /// Counts a hold that lasted `held`.
    pub(crate) fn record(&self, held: Duration) {
        let us = u64::try_from(held.as_micros()).unwrap_or(u64::MAX).max(1);
        // A lost update under a race only drops one sample of an estimate.
        let before = self.average_us.load(Ordering::Relaxed);
        let after = if before == 0 {
            us
        } else {
            before - before / 8 + us / 8
        };
        self.average_us.store(after.max(1), Ordering::Relaxed);
    }

    /// The usual hold time lately (`None`: no hold has ended yet).
    pub(crate) fn typical(&self) -> Option<Duration> {
        match self.average_us.load(Ordering::Relaxed) {
            0 => None,
            us => Some(Duration::from_micros(us)),
        }
    }

    /// When a retry is likely to find the lock free, after an answer that the holder has
    /// `pttl` left: see [`retry_after`].
    pub(crate) fn retry_after(&self, pttl: Option<Duration>) -> Option<Duration> {
        retry_after(pttl, self.typical())
    }
}

/// When a retry is likely to find the lock free: the holder's remaining lease `pttl`, or the
/// `typical` hold time when that is shorter (a watchdog lease is renewed long before its end,
/// so its PTTL says little).
pub(crate) fn retry_after(pttl: Option<Duration>, typical: Option<Duration>) -> Option<Duration> {
    match (pttl, typical) {
        (Some(pttl), Some(typical)) => Some(pttl.min(typical)),
        (pttl, typical) => pttl.or(typical),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_usual_hold_time_bounds_the_retry() {
        let times = HoldTimes::default();
        let ms = Duration::from_millis;
        assert_eq!(times.retry_after(Some(ms(25_000))), Some(ms(25_000)));
        assert_eq!(times.retry_after(None), None);
        for _ in 0..50 {
            times.record(ms(4));
        }
        assert_eq!(times.typical(), Some(ms(4)));
        assert_eq!(times.retry_after(Some(ms(25_000))), Some(ms(4)));
        assert_eq!(times.retry_after(Some(ms(1))), Some(ms(1)));
        assert_eq!(times.retry_after(None), Some(ms(4)));
        // One long hold moves it by an eighth of the difference.
        times.record(ms(804));
        assert_eq!(times.typical(), Some(ms(104)));
    }
}
