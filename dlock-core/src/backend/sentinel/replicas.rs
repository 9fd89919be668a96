//! How many replicas of a master the sentinels list as healthy: what a write waits for by
//! default on Sentinel (`ReplicaAck::up_to_listed`).

use redis::Value;

/// From `SENTINEL REPLICAS`' answer (one map of fields per replica): how many replicas the
/// sentinel does not hold down (`s_down`, `o_down`) and that it last saw in sync with the
/// master (`master-link-status ok`), or has chosen to promote (`promoted`), or reaches and last
/// heard call themselves a replica (`role-reported slave`, from an `INFO` it got, not the
/// default it starts with); `master` (`host:port`) itself left out.
///
/// Why these, as the sentinels behave around a failover (a sentinel reads a replica's `INFO`
/// every ten seconds, every second while its master fails over):
/// - The replica being promoted keeps its last `ok` until the switch (its link status is read
///   only while it reports itself a replica), and the sentinel leading the failover flags it
///   `promoted` — so it is counted, and the old master's writes in that window wait for it
///   and fail.
/// - The old master, listed as a replica of the new one at the switch, calls itself a master
///   and is `err` until it has been turned into a replica (ten seconds and more), or is
///   `disconnected` if it died — so it is not counted, and the new master's writes don't wait
///   for a replica that can't acknowledge them yet.
/// - A replica that calls itself one but whose link was down when last read — syncing again
///   (the old master once it follows), or cut off from its master — is counted: that `err` may
///   be ten seconds old, and a master whose replica is listed and up must not grant alone
///   because the replica was out of sync a moment ago.
pub(super) fn healthy_replicas(answer: &Value, master: &str) -> u32 {
    let Value::Array(replicas) = answer else {
        return 0;
    };
    let healthy = replicas.iter().filter(|replica| {
        let flags = field(replica, "flags").unwrap_or_default();
        let flag = |name: &str| flags.split(',').any(|f| f == name);
        let up = !flags.is_empty() && !flag("s_down") && !flag("o_down");
        // Just after a switch, a sentinel can still list the promoted replica beside itself.
        let itself = field(replica, "name").is_some_and(|name| name == master);
        let in_sync = field(replica, "master-link-status").as_deref() == Some("ok");
        // A role the sentinel never read is its default (`slave`), not the replica's word.
        let read_lately = field(replica, "info-refresh")
            .and_then(|ms| ms.parse::<u64>().ok())
            .is_some_and(|ms| ms < INFO_READ_WITHIN_MS);
        let says_replica = field(replica, "role-reported").as_deref() == Some("slave")
            && read_lately
            && !flag("disconnected");
        up && !itself && (in_sync || flag("promoted") || says_replica)
    });
    u32::try_from(healthy.count()).unwrap_or(u32::MAX)
}

/// How recent a sentinel's last `INFO` of a replica must be for the role it read to count: it
/// reads one every ten seconds while it reaches the replica.
const INFO_READ_WITHIN_MS: u64 = 30_000;

/// Field `name` of one replica's entry: a flat list of names and values (RESP2) or a map
/// (RESP3).
fn field(replica: &Value, name: &str) -> Option<String> {
    let is = |k: &Value| redis::from_redis_value::<String>(k.clone()).is_ok_and(|k| k == name);
    match replica {
        Value::Array(flat) => flat.chunks(2).find_map(|pair| match pair {
            [k, v] if is(k) => redis::from_redis_value(v.clone()).ok(),
            _ => None,
        }),
        Value::Map(pairs) => (pairs.iter())
            .find(|(k, _)| is(k))
            .and_then(|(_, v)| redis::from_redis_value(v.clone()).ok()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replica(flags: &str, role: &str, refreshed_ms: u64, link: &str) -> Value {
        let text = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        Value::Array(vec![
            text("name"),
            text("127.0.0.1:7001"),
            text("flags"),
            text(flags),
            text("info-refresh"),
            text(&refreshed_ms.to_string()),
            text("role-reported"),
            text(role),
            text("master-link-status"),
            text(link),
        ])
    }

    #[test]
    fn replicas_down_or_still_masters_out_of_sync_are_not_counted() {
        let answer = Value::Array(vec![
            replica("slave", "slave", 500, "ok"),
            replica("slave,disconnected", "slave", 500, "ok"),
            // Being promoted: it says master, its last link status was ok, or its sentinel
            // leads the failover.
            replica("slave", "master", 500, "ok"),
            replica("slave,promoted", "master", 500, "err"),
            // Syncing again, or cut off from the master.
            replica("slave", "slave", 9_000, "err"),
            replica("slave,s_down", "slave", 500, "ok"),
            // The old master, not yet turned into a replica, alive or dead; a role never read.
            replica("slave", "master", 500, "err"),
            replica("slave,disconnected", "slave", 500, "err"),
            replica("slave", "slave", 1_700_000_000_000, "err"),
        ]);
        assert_eq!(healthy_replicas(&answer, "127.0.0.1:7000"), 5);
        assert_eq!(healthy_replicas(&answer, "127.0.0.1:7001"), 0);
        assert_eq!(healthy_replicas(&Value::Array(vec![]), "127.0.0.1:7000"), 0);
    }
}
