//! The hold codec in Rust: what a lock's key holds, read and written as the scripts' `hold.lua`
//! does. The scripts change holds; this reads them for the tests that look behind the library's
//! back and for operators' tools, and writes them only to build test states.
//!
//! A lock's key holds one string. Its first word is the owner token (which starts with its
//! layout's tag: see [`layout`](super::layout)), or `#k:<owner>` (kept taken
//! after that owner's release, `at_least`), or `#r:<locker id>` (kept for the `Locker` next in
//! turn). Then fields, each one word after a space: ` f<token>` the fencing token (once minted),
//! ` s<n>` the sequence number of the last lease change, ` w<claim>` a claim to the next turn
//! (see [`ClaimValue`]), ` l` a waiter found the hold taken (` l<locker id>` while only that
//! `Locker`'s waiters did).

use std::fmt;

use redis::AsyncCommands as _;
use redis::aio::ConnectionLike;

/// The first word of a key kept taken after its owner's release.
const KEPT_AFTER: &str = "#k:";
/// The first word of a key kept for the `Locker` next in turn.
const KEPT_FOR: &str = "#r:";

/// What a lock's key holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HoldValue {
    /// The holder's owner token (`None` while the key is kept without an owner).
    pub owner: Option<String>,
    /// The hold's fencing token, once minted.
    pub token: Option<u64>,
    /// The last lease change's sequence number.
    pub seq: Option<u64>,
    /// The claim to the next turn, as the key holds it (see [`ClaimValue`]).
    pub claim: Option<String>,
    /// The owner whose release keeps the key taken (`at_least`).
    pub kept_after: Option<String>,
    /// The `Locker` the key is kept for after a release (its waiter's turn).
    pub kept_for: Option<String>,
    /// A waiter found the hold taken: its release wakes the waiters.
    pub waited_for: bool,
    /// The one `Locker` whose waiters alone found the hold taken (`None` when several did, or
    /// it is not waited for).
    pub waited_by: Option<String>,
}

/// A claim to the next turn: `<since>:<ms>:<locker id>`, and for a head waiter's claim
/// `:<sent ms>:<grant window ms>:<fence TTL ms>:<attempt>:<hand-over token>` after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimValue {
    /// Since when the claimant waits (wall-clock ms): the earlier claim wins.
    pub since: u64,
    /// How long a release keeps the lock for the claimant's `Locker`, ms.
    pub ms: u64,
    /// The claimant's `Locker`.
    pub locker: String,
    /// A head waiter's offer to be granted the lock by the release.
    pub grant: Option<GrantValue>,
}

/// The part of a head waiter's claim that lets a release grant it the lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantValue {
    /// When the claim's attempt was sent, on the clock that orders claims (wall-clock ms).
    pub at: u64,
    /// How old the claim may be when granted, ms; a grant lasts twice this.
    pub window: u64,
    /// The fence TTL of the grant's token, ms (`0`: none).
    pub fence_ttl: u64,
    /// The number of the attempt that made the claim.
    pub attempt: u64,
    /// The hand-over token the lock is granted to.
    pub token: String,
}

impl HoldValue {
    /// Parses a lock key's value; panics on a field it does not know (for tests).
    pub fn parse(value: &str) -> Self {
        Self::try_parse(value).unwrap_or_else(|err| panic!("{err}"))
    }

    /// Parses a lock key's value, or says what in it is not a lock's.
    pub fn try_parse(value: &str) -> Result<Self, String> {
        let mut words = value.split(' ');
        let first = words.next().unwrap_or_default();
        let mut hold = HoldValue::default();
        if let Some(owner) = first.strip_prefix(KEPT_AFTER) {
            hold.kept_after = Some(owner.to_owned());
        } else if let Some(locker) = first.strip_prefix(KEPT_FOR) {
            hold.kept_for = Some(locker.to_owned());
        } else {
            hold.owner = Some(first.to_owned());
        }
        let bad = |word: &str| format!("unknown field {word:?} in the lock key's value {value:?}");
        for word in words {
            match word.split_at_checked(1) {
                Some(("f", token)) => hold.token = Some(token.parse().map_err(|_| bad(word))?),
                Some(("s", seq)) => hold.seq = Some(seq.parse().map_err(|_| bad(word))?),
                Some(("w", claim)) => hold.claim = Some(claim.to_owned()),
                Some(("l", "")) => hold.waited_for = true,
                Some(("l", locker)) if is_token(locker) => {
                    hold.waited_for = true;
                    hold.waited_by = Some(locker.to_owned());
                }
                _ => return Err(bad(word)),
            }
        }
        Ok(hold)
    }

    /// The claim to the next turn, read (`None` without one, or when it is not a claim).
    pub fn claim_value(&self) -> Option<ClaimValue> {
        ClaimValue::parse(self.claim.as_deref()?)
    }

    /// The hand-over token a head waiter's claim offers to be granted the lock.
    pub fn claim_token(&self) -> Option<String> {
        Some(self.claim_value()?.grant?.token)
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

    /// Reads `key`: `None` when it is gone; panics on a value that is not a lock's (for tests).
    pub async fn read<C: ConnectionLike + Send + Sync>(
        con: &mut C,
        key: &str,
    ) -> redis::RedisResult<Option<HoldValue>> {
        let value: Option<String> = con.get(key).await?;
        Ok(value.as_deref().map(HoldValue::parse))
    }
}

/// The value as a key would hold it, its fields in one order (scripts append fields where they
/// change them; a reader takes them in any order).
impl fmt::Display for HoldValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.owner, &self.kept_after, &self.kept_for) {
            (Some(owner), _, _) => f.write_str(owner)?,
            (None, Some(owner), _) => write!(f, "{KEPT_AFTER}{owner}")?,
            (None, None, Some(locker)) => write!(f, "{KEPT_FOR}{locker}")?,
            (None, None, None) => {}
        }
        if let Some(claim) = &self.claim {
            write!(f, " w{claim}")?;
        }
        if let Some(token) = self.token {
            write!(f, " f{token}")?;
        }
        if let Some(seq) = self.seq {
            write!(f, " s{seq}")?;
        }
        if self.waited_for {
            write!(f, " l{}", self.waited_by.as_deref().unwrap_or_default())?;
        }
        Ok(())
    }
}

impl ClaimValue {
    /// Reads a claim as the ` w` field holds it; `None` when it is not one.
    pub fn parse(claim: &str) -> Option<Self> {
        let mut parts = claim.splitn(8, ':');
        let mut number = || parts.next()?.parse::<u64>().ok();
        let (since, ms) = (number()?, number()?);
        let locker = (parts.next())
            .filter(|l| is_token(l) && super::layout::speaks(l))?
            .to_owned();
        let mut rest = || parts.next();
        let grant = match rest() {
            None => None,
            Some(at) => {
                let number = |s: Option<&str>| s?.parse::<u64>().ok();
                Some(GrantValue {
                    at: number(Some(at))?,
                    window: number(rest())?,
                    fence_ttl: number(rest())?,
                    attempt: number(rest())?,
                    token: rest().filter(|t| !t.is_empty())?.to_owned(),
                })
            }
        };
        Some(Self {
            since,
            ms,
            locker,
            grant,
        })
    }
}

impl fmt::Display for ClaimValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.since, self.ms, self.locker)?;
        if let Some(g) = &self.grant {
            let (at, window, ttl, n, token) = (g.at, g.window, g.fence_ttl, g.attempt, &g.token);
            write!(f, ":{at}:{window}:{ttl}:{n}:{token}")?;
        }
        Ok(())
    }
}

/// What a `Locker`'s id in a claim may be: hex digits after an optional layout tag (`v2/`).
fn is_token(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'/')
}

#[cfg(test)]
mod tests {
    use super::{ClaimValue, HoldValue};

    #[test]
    fn values_read_back_as_written() {
        for value in [
            "0123456789abcdef0123456789abcdef",
            "0123456789abcdef0123456789abcdef@worker-1 f1764000000000001 s3 l",
            "ab12 w1764000000000:300:00ff f17 l",
            "ab12 w1764000000000:300:00ff:1764000000100:40:60000:7:cd34 l",
            "ab12 f17 lv2/00ff",
            "#k:ab12",
            "#r:00ff w1764000000001:300:11ee",
        ] {
            let hold = HoldValue::parse(value);
            assert_eq!(hold.to_string(), value);
        }
    }

    #[test]
    fn a_head_waiters_claim_carries_its_grant() {
        let hold = HoldValue::parse("ab12 w5:300:00ff:6:40:0:7:cd34");
        let claim = hold.claim_value().expect("a claim");
        assert_eq!(
            (claim.since, claim.ms, claim.locker.as_str()),
            (5, 300, "00ff")
        );
        let grant = claim.grant.expect("a grant");
        assert_eq!(
            (grant.at, grant.window, grant.fence_ttl, grant.attempt),
            (6, 40, 0, 7)
        );
        assert_eq!(hold.claim_token().as_deref(), Some("cd34"));
        assert_eq!(ClaimValue::parse("5:300:00ff").and_then(|c| c.grant), None);
    }

    #[test]
    fn what_is_not_a_hold_is_named() {
        assert!(HoldValue::try_parse("ab12 x1").is_err());
        assert!(HoldValue::try_parse("ab12 fz").is_err());
        assert_eq!(ClaimValue::parse("5:300:not-hex"), None);
        // A claim of a layout this version speaks is read; another layout's is not a claim.
        assert!(ClaimValue::parse("5:300:v2/00ff").is_some());
        assert_eq!(ClaimValue::parse("5:300:v3/00ff"), None);
    }
}
