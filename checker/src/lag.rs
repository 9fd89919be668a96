//! How late the machine wakes tasks: the part of a call's time that is the scheduler's, not
//! dlock's.
//!
//! A monitor task asks for a short sleep over and over and records how much later than asked it
//! woke. A call that overshoots its bound (e) is excused by as much lag as the monitor saw while
//! the call ran: on a loaded two-core machine a task can go unscheduled for hundreds of
//! milliseconds, and that says nothing about dlock's deadlines.

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::history::locked;

/// How often the monitor wakes.
const TICK: Duration = Duration::from_millis(5);

/// The lag samples of a run: (when the monitor woke, how late).
#[derive(Debug, Default)]
pub(crate) struct LagLog {
    samples: Mutex<Vec<(Instant, Duration)>>,
}

impl LagLog {
    /// The largest lag of a wake-up that fell in `[from, to]` (plus the tick after it, whose
    /// lateness may have begun inside).
    pub(crate) fn max_within(&self, from: Instant, to: Instant) -> Duration {
        locked(&self.samples)
            .iter()
            .filter(|(at, _)| *at >= from && *at <= to + TICK)
            .map(|(_, lag)| *lag)
            .max()
            .unwrap_or_default()
    }

    /// Samples until `stop` turns true. Not for a paused clock.
    pub(crate) async fn monitor(&self, mut stop: watch::Receiver<bool>) {
        loop {
            let asked = Instant::now() + TICK;
            tokio::select! {
                () = tokio::time::sleep_until(asked) => {}
                _ = stop.changed() => return,
            }
            let woke = Instant::now();
            let lag = woke.saturating_duration_since(asked);
            if lag > Duration::from_millis(1) {
                locked(&self.samples).push((woke, lag));
            }
        }
    }
}
