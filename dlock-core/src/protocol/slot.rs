//! Which Redis Cluster hash slot a key lives in, as `CLUSTER KEYSLOT` computes it.

/// The number of hash slots of a Redis Cluster.
pub const SLOTS: u16 = 16384;

/// The hash slot of `key`: CRC16 (XMODEM) of its hash tag — the bytes between the first `{` and
/// the first `}` after it, when there are any — or of the whole key, modulo 16384. Every key of
/// one lock shares the `{name}` tag, so one lock lives in one slot.
pub fn key_slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16::State::<crc16::XMODEM>::calculate(tagged.unwrap_or(key)) % SLOTS
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crc(bytes: &[u8]) -> u16 {
        crc16::State::<crc16::XMODEM>::calculate(bytes)
    }

    #[test]
    fn the_crc_is_the_one_the_cluster_spec_gives() {
        // "123456789" is the check value of the Redis Cluster specification's CRC16.
        assert_eq!(crc(b"123456789"), 0x31C3);
    }

    #[test]
    fn a_hash_tag_decides_the_slot_when_it_is_not_empty() {
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"foo{bar}{zap}"), key_slot(b"bar"));
        assert_eq!(key_slot(b"foo{}{bar}"), crc(b"foo{}{bar}") % SLOTS);
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
        assert_eq!(key_slot(b"foo{bar"), crc(b"foo{bar") % SLOTS);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(
            key_slot(b"dlock:{order:1}"),
            key_slot(b"dlock:{order:1}:fence")
        );
    }
}
