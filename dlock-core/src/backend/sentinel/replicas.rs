//! How many replicas of a master the sentinels list as healthy: what a write waits for by
//! default on Sentinel (`ReplicaAck::up_to_listed`).

use redis::Value;

/// From `SENTINEL REPLICAS`' answer (one map of fields per replica): how many replicas the
/// sentinel does not hold down (`s_down`, `o_down`) and last saw in sync with the master
/// (`master-link-status ok`), `master` (`host:port`) itself left out.
///
/// Why these two, as the sentinels behave around a failover: the replica being promoted keeps
/// its last `ok` until the switch (its link status is read only while it reports itself a
/// replica), and is briefly `disconnected` when it drops its clients — so it is counted, and
/// the old master's writes in that window wait for it and fail. The old master, listed as a
/// replica of the new one at the switch, stays `err` until it has been turned into a replica
/// and synced (about fifteen seconds) — so it is not counted, and the new master's writes
/// don't wait for a replica that can't acknowledge them yet.
pub(super) fn healthy_replicas(answer: &Value, master: &str) -> u32 {
    let Value::Array(replicas) = answer else {
        return 0;
    };
    let healthy = replicas.iter().filter(|replica| {
        let up = field(replica, "flags")
            .is_some_and(|flags| !flags.split(',').any(|f| matches!(f, "s_down" | "o_down")));
        // Just after a switch, a sentinel can still list the promoted replica beside itself.
        let itself = field(replica, "name").is_some_and(|name| name == master);
        up && !itself && field(replica, "master-link-status").as_deref() == Some("ok")
    });
    u32::try_from(healthy.count()).unwrap_or(u32::MAX)
}

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

    fn replica(flags: &str, link: &str) -> Value {
        let text = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        Value::Array(vec![
            text("name"),
            text("127.0.0.1:7001"),
            text("flags"),
            text(flags),
            text("master-link-status"),
            text(link),
        ])
    }

    #[test]
    fn replicas_down_or_out_of_sync_are_not_counted() {
        let answer = Value::Array(vec![
            replica("slave", "ok"),
            replica("slave,disconnected", "ok"),
            replica("slave,s_down", "ok"),
            replica("slave", "err"),
        ]);
        assert_eq!(healthy_replicas(&answer, "127.0.0.1:7000"), 2);
        assert_eq!(healthy_replicas(&answer, "127.0.0.1:7001"), 0);
        assert_eq!(healthy_replicas(&Value::Array(vec![]), "127.0.0.1:7000"), 0);
    }
}
