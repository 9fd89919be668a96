//! A lock's advisory key: the 64-bit number PostgreSQL locks for a name.
//!
//! PostgreSQL's advisory locks take a `bigint`. A name's key is the first 8 bytes of the SHA-256
//! of its lock key (the `Locker`'s prefix and the escaped name, `dlock:{order:42}`), read as a
//! big-endian signed number. So:
//!
//! - two names share a key only by a collision of 64-bit hashes: among a million names in use
//!   at once, a chance of about 1 in 36 million (n² / 2⁶⁵); two names that collide exclude each
//!   other (they wait for each other), they never share a hold;
//! - the prefix namespaces the keys as it namespaces Redis keys: `Locker`s with other prefixes
//!   never meet;
//! - other users of advisory locks in the same database meet dlock's keys only if they pick the
//!   same 64-bit numbers (applications usually pick small ones; a key from a hash is one of 2⁶⁴).
//!   The two-number form, `pg_advisory_lock(int, int)`, is a separate space and never meets them;
//! - a name made of untrusted values cannot be steered onto another name's key without finding
//!   a SHA-256 collision on 64 bits, some 2³² hashes of work, and that would only make two names
//!   wait for each other.

use sha2::{Digest, Sha256};

/// The advisory key of the lock whose lock key is `lock_key`.
pub(crate) fn advisory_key(lock_key: &str) -> i64 {
    let digest = Sha256::digest(lock_key.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(first)
}

#[cfg(test)]
mod tests {
    use super::advisory_key;

    #[test]
    fn a_name_has_one_key_and_names_apart_have_keys_apart() {
        // Pinned: a key must stay the same from one version to the next, or two versions of a
        // fleet would lock different keys for one name.
        assert_eq!(
            advisory_key("dlock:{order:42}"),
            advisory_key("dlock:{order:42}")
        );
        assert_eq!(advisory_key(""), -2_039_914_840_885_289_964);
        assert_ne!(advisory_key("dlock:{a}"), advisory_key("dlock:{b}"));
        assert_ne!(advisory_key("dlock:{a}"), advisory_key("other:{a}"));
    }
}
