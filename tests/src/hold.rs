//! A lock's key as Redis holds it, for the tests that look behind the library's back: one
//! string, its first word the owner token (or `#k:<owner>` kept after a release, `#r:<locker>`
//! kept for a `Locker` next in turn), then fields (` f<token>`, ` s<n>`, ` w<claim>`, ` l`).

use redis::AsyncCommands as _;
use redis::aio::ConnectionLike;

/// What a lock's key holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RawHold {
    /// The holder's owner token (`None` while the key is kept without an owner).
    pub owner: Option<String>,
    /// The hold's fencing token, once minted.
    pub token: Option<u64>,
    /// The last lease change's sequence number.
    pub seq: Option<u64>,
    /// The claim to the next turn: `<waiting since>:<ms>:<locker id>`, and for a head waiter's
    /// claim `:<server ms>:<grant window ms>:<fence TTL ms>:<attempt>:<hand-over token>` after it.
    pub claim: Option<String>,
    /// The owner whose release keeps the key taken (`at_least`).
    pub kept_after: Option<String>,
    /// The `Locker` the key is kept for after a release (its waiter's turn).
    pub kept_for: Option<String>,
    /// A waiter found the hold taken: its release wakes the waiters.
    pub waited_for: bool,
}

impl RawHold {
    /// The hand-over token a head waiter's claim offers to be granted the lock.
    pub fn claim_token(&self) -> Option<&str> {
        let claim = self.claim.as_deref()?;
        claim.splitn(8, ':').nth(7)
    }

    /// Parses a lock key's value; panics on a field it does not know.
    pub fn parse(value: &str) -> Self {
        Self::try_parse(value).unwrap_or_else(|err| panic!("{err}"))
    }

    /// Parses a lock key's value, or says what in it is not a lock's.
    pub fn try_parse(value: &str) -> Result<Self, String> {
        let mut words = value.split(' ');
        let first = words.next().unwrap_or_default();
        let mut hold = RawHold::default();
        if let Some(owner) = first.strip_prefix("#k:") {
            hold.kept_after = Some(owner.to_owned());
        } else if let Some(locker) = first.strip_prefix("#r:") {
            hold.kept_for = Some(locker.to_owned());
        } else {
            hold.owner = Some(first.to_owned());
        }
        for word in words {
            match word.split_at_checked(1) {
                Some(("f", token)) => hold.token = token.parse().ok(),
                Some(("s", seq)) => hold.seq = seq.parse().ok(),
                Some(("w", claim)) => hold.claim = Some(claim.to_owned()),
                Some(("l", "")) => hold.waited_for = true,
                _ => {
                    return Err(format!(
                        "unknown field {word:?} in the lock key's value {value:?}"
                    ));
                }
            }
        }
        Ok(hold)
    }

    /// The fencing token on `key`'s hold, if it holds a lock with one: `None` for anything else
    /// (gone, kept, not a lock, or no token minted yet).
    pub async fn token_on<C: ConnectionLike + Send + Sync>(
        con: &mut C,
        key: &str,
    ) -> redis::RedisResult<Option<u64>> {
        let value: Option<String> = match con.get(key).await {
            Ok(value) => value,
            Err(err) if err.code() == Some("WRONGTYPE") => None,
            Err(err) => return Err(err),
        };
        Ok(value
            .and_then(|v| Self::try_parse(&v).ok())
            .and_then(|h| h.token))
    }

    /// Reads `key`: `None` when it is gone.
    pub async fn read<C: ConnectionLike + Send + Sync>(
        con: &mut C,
        key: &str,
    ) -> redis::RedisResult<Option<RawHold>> {
        let value: Option<String> = con.get(key).await?;
        Ok(value.as_deref().map(RawHold::parse))
    }
}
