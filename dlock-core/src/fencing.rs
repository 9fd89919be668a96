//! The fencing token: the number that orders the holds of one name.

use std::fmt;

/// A number that strictly increases with every fresh acquisition of one lock name.
///
/// Hand it to the resource the lock protects and have the resource refuse writes carrying a
/// token lower than the highest it has seen (`UPDATE … WHERE fence < $token`). That is what keeps
/// a holder that was paused past its lease (GC, `SIGSTOP`, swap) from corrupting the resource:
/// a lease alone cannot.
///
/// A plain lock taken at its first attempt gets its token when its holder first asks for it
/// ([`LockGuard::fencing_token`](crate::LockGuard::fencing_token), one round trip, owner-checked): an uncontended acquisition
/// that never asks costs Redis no clock read and no counter write. Minted only while the hold is
/// held, it orders holds as a token minted at the grant would. A plain lock taken after a wait
/// (the name is contended: a round trip in its critical section would hold others up), fair
/// locks, writers, [`lock_all`] and hand-overs mint theirs with the grant; permits and read
/// locks have none (`0`).
///
/// [`lock_all`]: crate::Locker::lock_all
///
/// Tokens strictly increase per name on one Redis master (and in one memory store). On Redis they
/// are the server's clock in microseconds when minted (or the last token + 1: when the clock is
/// not past it, and when a lock passes between two holders of one [`Locker`](crate::Locker):
/// such hand-overs come more than a microsecond apart, so their tokens stay below the clock), so
/// they keep increasing when the last token is lost: after an idle counter
/// expired, and after a failover to a replica that had not received the latest grants. That
/// second case holds as long as the new master's clock is not behind the old master's by more
/// than the failover took (seconds, against the milliseconds NTP keeps clocks within). A
/// re-entered hold carries the token of the hold it re-entered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(u64);

impl FencingToken {
    /// Wraps a raw token (e.g. one read back from a database).
    pub const fn new(value: u64) -> Self {
        Self(value)
    }

    /// The raw value.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl From<FencingToken> for u64 {
    fn from(token: FencingToken) -> Self {
        token.0
    }
}
