//! How late the machine wakes tasks: the part of a call's time that is the scheduler's, not
//! dlock's.
//!
//! A monitor task asks for a short sleep over and over and records how much later than asked it
//! woke. A call that overshoots its bound (e) is excused by as much lag as the monitor saw while
//! the call ran: on a loaded two-core machine a task can go unscheduled for hundreds of
//! milliseconds, and that says nothing about dlock's deadlines.
//!
//! The same monitor watches the machine's wall clock, which Redis expires keys by (the servers
//! run on this machine). A step of it (a virtual machine resumed, the time set) ends every lease
//! at once when it goes forward, and no lock on Redis survives that: the run records it as a
//! fault of its own (`FaultKind::ClockStep`) rather than as dlock's.

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::faults::{FaultKind, FaultRec, Reach};
use super::history::locked;

/// How often the monitor wakes.
const TICK: Duration = Duration::from_millis(5);

/// How far the wall clock may move apart from the monotonic one between two wake-ups before it
/// counts as stepped (a slewing clock moves a few microseconds a second).
const STEP: Duration = Duration::from_millis(20);

/// The lag samples of a run: (when the monitor woke, how late).
#[derive(Debug, Default)]
pub(crate) struct LagLog {
    samples: Mutex<Vec<(Instant, Duration)>>,
    /// Steps of the wall clock: between which two wake-ups, and by how much (forward or back).
    steps: Mutex<Vec<ClockStep>>,
}

/// A step of the machine's wall clock seen by the monitor.
#[derive(Debug, Clone, Copy)]
struct ClockStep {
    /// The wake-up before it, and the one that saw it.
    from: Instant,
    to: Instant,
    /// How far the wall clock went beyond the monotonic one (negative: back).
    by_ms: i128,
}

/// How far, in ms, the wall clock moved beyond the monotonic one, if that is a step: `elapsed`
/// on the monotonic clock, while the wall clock went forward (`Ok`) or back (`Err`) so much.
fn stepped(elapsed: Duration, walked: Result<Duration, Duration>) -> Option<i128> {
    let micros = |d: Duration| i128::try_from(d.as_micros()).unwrap_or(i128::MAX);
    let walked = match walked {
        Ok(d) => micros(d),
        Err(back) => -micros(back),
    };
    let by = walked - micros(elapsed);
    (by.unsigned_abs() > STEP.as_micros()).then_some(by / 1000)
}

/// The monotonic and the wall clock read together, or `None` if the thread was held up between
/// the reads (the two would then be apart by that much).
fn both_clocks() -> Option<(Instant, std::time::SystemTime)> {
    let before = Instant::now();
    let wall = std::time::SystemTime::now();
    let after = Instant::now();
    (after - before < Duration::from_millis(1)).then_some((before, wall))
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

    /// The wall clock's steps seen so far, each as a fault on every name (and said on stderr).
    pub(crate) fn clock_steps(&self) -> Vec<FaultRec> {
        (locked(&self.steps).iter())
            .map(|step| {
                eprintln!(
                    "checker: the machine's wall clock stepped {} ms (Redis expires keys by it); \
                     recorded as a fault on every name",
                    step.by_ms
                );
                FaultRec {
                    kind: FaultKind::ClockStep,
                    reach: Reach::ALL,
                    from: step.from,
                    to: step.to,
                }
            })
            .collect()
    }

    /// Samples until `stop` turns true. Not for a paused clock.
    pub(crate) async fn monitor(&self, mut stop: watch::Receiver<bool>) {
        let mut last = both_clocks();
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
            let Some((mono, wall)) = both_clocks() else {
                continue;
            };
            if let Some((mono_before, wall_before)) = last {
                let walked = wall.duration_since(wall_before).map_err(|e| e.duration());
                if let Some(by_ms) = stepped(mono - mono_before, walked) {
                    locked(&self.steps).push(ClockStep {
                        from: mono_before,
                        to: mono,
                        by_ms,
                    });
                }
            }
            last = Some((mono, wall));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wall_clock_that_keeps_pace_has_not_stepped() {
        let ms = Duration::from_millis;
        assert_eq!(stepped(ms(5), Ok(ms(5))), None);
        assert_eq!(
            stepped(ms(150), Ok(ms(150) + Duration::from_micros(30))),
            None
        );
        assert_eq!(stepped(ms(5), Ok(ms(20))), None);
    }

    #[test]
    fn a_wall_clock_that_jumps_forward_or_back_has_stepped() {
        let ms = Duration::from_millis;
        assert_eq!(stepped(ms(5), Ok(ms(21_405))), Some(21_400));
        assert_eq!(stepped(ms(5), Err(ms(995))), Some(-1_000));
        assert_eq!(stepped(ms(150), Ok(ms(5))), Some(-145));
    }
}
