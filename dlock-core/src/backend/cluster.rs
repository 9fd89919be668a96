//! Redis Cluster: which slot a key lives in, and connecting to a cluster.

use std::time::Duration;

use redis::cluster::{ClusterClient, ClusterClientBuilder};

/// The number of hash slots of a Redis Cluster.
pub(crate) const SLOTS: u16 = 16384;

/// The hash slot of `key`: CRC16 (XMODEM) of its hash tag — the part between the first `{` and
/// the next `}` when that is not empty — or of the whole key, modulo 16384. Every key of one lock
/// shares the `{name}` tag, so one lock lives in one slot.
pub(crate) fn key_slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16(tagged.unwrap_or(key)) % SLOTS
}

/// CRC16-CCITT (XMODEM): polynomial 0x1021, initial value 0, no reflection.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// How to reach a cluster: its seed nodes' URLs and the connect timeout. The data connection
/// and the subscriber's (RESP3, for sharded pub/sub) are built from it.
#[derive(Debug, Clone)]
pub(crate) struct ClusterSeeds {
    pub(crate) urls: Vec<String>,
    pub(crate) connect_timeout: Duration,
}

impl ClusterSeeds {
    pub(crate) fn builder(&self) -> ClusterClientBuilder {
        ClusterClient::builder(self.urls.clone())
            .connection_timeout(self.connect_timeout)
            // Every call is bounded by dlock's command timeout; inside it the client follows
            // MOVED and ASK and retries while a failover settles.
            .retries(16)
            .min_retry_wait(10)
            .max_retry_wait(200)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_the_ones_redis_cluster_documents() {
        // From the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"foo{}{bar}"), key_slot(b"foo{}{bar}"));
        assert_ne!(key_slot(b"foo{}{bar}"), key_slot(b"bar"));
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
        assert_eq!(
            key_slot(b"dlock:{order:1}"),
            key_slot(b"dlock:{order:1}:fence")
        );
    }
}
