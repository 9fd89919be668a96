//! Owner tokens: the random name a hold goes by in Redis, fresh for every acquisition.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Where one `Locker`'s owner tokens come from: a count, a scrambling key and 64 random bits,
/// the last two drawn from the operating system when the `Locker` is built.
///
/// A token's first 64 bits are the count, scrambled with the key by a bijection (so no two
/// tokens of one `Locker` share them, and a token's short prefix still tells holds apart); its
/// last 64 are the `Locker`'s random bits, which set its tokens apart from every other
/// `Locker`'s, in this process or another. The draw is a system call, and a costly one: it is
/// made once per `Locker`, not per acquisition, and nothing else on the way to a token asks the
/// operating system anything. A process forked from this one builds its own `Locker`s (one
/// carried across the fork is not usable: its connections and tasks are the parent's), so it
/// draws its own bits. Should the system have no randomness to give, the process id and the
/// time stand in for it.
#[derive(Debug)]
pub(crate) struct Owners {
    key: u64,
    bits: u64,
    count: AtomicU64,
}

impl Owners {
    /// A fresh source, with bits of its own.
    pub(crate) fn draw() -> Self {
        let (key, bits) = draw_seed(std::process::id());
        Self {
            key,
            bits,
            count: AtomicU64::new(0),
        }
    }

    /// A fresh owner token: the layout's `tag` (see `protocol::layout`), 32 hex digits, then
    /// `@label` if the `Locker` has a holder label.
    pub(crate) fn next(&self, tag: &str, label: Option<&str>) -> Arc<str> {
        let n = self.count.fetch_add(1, Ordering::Relaxed);
        let mut hex = [0u8; 32];
        write_hex(&mut hex[..16], scramble(n ^ self.key));
        write_hex(&mut hex[16..], self.bits);
        let hex = std::str::from_utf8(&hex).unwrap_or_default();
        match label {
            Some(label) => Arc::from(format!("{tag}{hex}@{label}")),
            // On the stack, then one allocation: the usual case, once per acquisition.
            None if tag.len() <= 8 => {
                let mut token = [0u8; 40];
                token[..tag.len()].copy_from_slice(tag.as_bytes());
                token[tag.len()..tag.len() + 32].copy_from_slice(hex.as_bytes());
                Arc::from(std::str::from_utf8(&token[..tag.len() + 32]).unwrap_or_default())
            }
            None => Arc::from(format!("{tag}{hex}")),
        }
    }
}

/// 128 bits from the operating system, as a scrambling key and a process's own bits; the
/// process id and the time stand in should the system have no randomness to give.
fn draw_seed(pid: u32) -> (u64, u64) {
    let mut bytes = [0u8; 16];
    let value = match getrandom::fill(&mut bytes) {
        Ok(()) => u128::from_le_bytes(bytes),
        Err(_) => {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            (u128::from(pid) << 96) ^ nanos
        }
    };
    ((value >> 64) as u64, value as u64)
}

/// A bijection on 64-bit values that spreads neighbouring inputs far apart (the finaliser of
/// SplitMix64: each step, a xor-shift or a multiplication by an odd constant, is invertible).
fn scramble(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// `value` as 16 lowercase hex digits into `out`.
fn write_hex(out: &mut [u8], value: u64) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (i, byte) in out.iter_mut().enumerate().take(16) {
        let shift = 60 - 4 * i;
        *byte = DIGITS[((value >> shift) & 0xf) as usize];
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn owner_tokens_are_unique_hex_with_the_label_after_them() {
        let owners = Owners::draw();
        let tokens: HashSet<Arc<str>> = (0..10_000).map(|_| owners.next("", None)).collect();
        assert_eq!(tokens.len(), 10_000);
        assert!(tokens.iter().all(|t| {
            t.len() == 32
                && t.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        }));
        // The short prefix operators see tells holds apart.
        let prefixes: HashSet<&str> = tokens.iter().map(|t| &t[..8]).collect();
        assert!(
            prefixes.len() > 9_900,
            "{} distinct prefixes",
            prefixes.len()
        );
        let labelled = owners.next("", Some("host-1:42"));
        assert_eq!(labelled.len(), 32 + "@host-1:42".len());
        assert!(labelled.ends_with("@host-1:42"));
    }

    #[test]
    fn a_layouts_tag_comes_first() {
        let owners = Owners::draw();
        let tagged = owners.next("v2/", None);
        assert_eq!((tagged.len(), &tagged[..3]), (35, "v2/"));
        let labelled = owners.next("v2/", Some("host-1:42"));
        assert!(labelled.starts_with("v2/") && labelled.ends_with("@host-1:42"));
        assert_eq!(labelled.len(), 35 + "@host-1:42".len());
    }

    #[test]
    fn owner_tokens_made_on_many_threads_at_once_are_unique() {
        // Two `Locker`s' sources, each used by two threads at once.
        let sources = [Arc::new(Owners::draw()), Arc::new(Owners::draw())];
        let threads: Vec<_> = (0..4)
            .map(|i| {
                let owners = sources[i % 2].clone();
                std::thread::spawn(move || {
                    (0..5_000)
                        .map(|_| owners.next("", None))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut all = HashSet::new();
        for thread in threads {
            for token in thread.join().expect("thread") {
                assert!(all.insert(token), "a token was made twice");
            }
        }
        assert_eq!(all.len(), 20_000);
    }

    #[test]
    fn scrambling_is_a_bijection_on_neighbours() {
        let out: HashSet<u64> = (0..100_000u64).map(scramble).collect();
        assert_eq!(out.len(), 100_000);
        let mut hex = [0u8; 16];
        write_hex(&mut hex, 0x0123_4567_89ab_cdef);
        assert_eq!(&hex, b"0123456789abcdef");
    }
}
