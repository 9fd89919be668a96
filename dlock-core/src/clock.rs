//! Deadlines on tokio's monotonic clock that never overflow.

use std::time::Duration;

use tokio::time::Instant;

/// About thirty years: the stand-in for "no deadline" (`Duration::MAX` and its neighbours).
const FAR: Duration = Duration::from_secs(30 * 365 * 24 * 3600);

/// `start + d`, or a deadline about thirty years away when that doesn't fit: `wait(Duration::MAX)`
/// waits for as long as it takes.
pub(crate) fn after(start: Instant, d: Duration) -> Instant {
    start.checked_add(d.min(FAR)).unwrap_or(start)
}
