//! Moving a slot to another master as `redis-cli --cluster reshard` does, in steps a test can stop
//! between: while a slot migrates, its old master answers `ASK` for the keys it no longer has;
//! once it has moved, `MOVED`.

use super::{ClusterNode, OK_WITHIN, RedisCluster};
use crate::admin::poll;

/// How long one `MIGRATE` may take, in milliseconds.
const MIGRATE_TIMEOUT_MS: u64 = 5000;

/// How many keys one `MIGRATE` moves when a migration finishes.
const BATCH: usize = 100;

/// A slot on its way from one master to another, from [`RedisCluster::begin_migration`] until
/// [`RedisCluster::finish_migration`].
#[derive(Debug, Clone)]
#[non_exhaustive]
#[must_use = "a slot left migrating answers ASK until `finish_migration`"]
pub struct SlotMigration {
    /// The slot.
    pub slot: u16,
    /// The master it leaves.
    pub from: ClusterNode,
    /// The master it goes to.
    pub to: ClusterNode,
}

impl RedisCluster {
    /// Starts moving `slot` from the master serving it to the master on port `to`:
    /// `CLUSTER SETSLOT <slot> IMPORTING` on the target, then `MIGRATING` on the source. Keys stay
    /// where they are until [`migrate_keys`](Self::migrate_keys) or
    /// [`finish_migration`](Self::finish_migration) moves them; the source answers `ASK` for a
    /// key of the slot it does not have, and new keys of the slot go to the target.
    pub fn begin_migration(&self, slot: u16, to: u16) -> SlotMigration {
        let topology = self.topology();
        let from = (topology.owner(slot).cloned())
            .unwrap_or_else(|| panic!("no master serves slot {slot}"));
        let to = (topology.by_port(to).filter(|n| n.is_master()).cloned())
            .unwrap_or_else(|| panic!("the node on port {to} is not a master"));
        assert_ne!(from.id, to.id, "slot {slot} is already on {}", to.port);
        self.set_slot(to.port, slot, "IMPORTING", &from.id);
        self.set_slot(from.port, slot, "MIGRATING", &to.id);
        SlotMigration { slot, from, to }
    }

    /// Moves `keys`, all of the migrating slot, to the target (`MIGRATE ... KEYS`); keys the
    /// source does not have are skipped.
    pub fn migrate_keys<K: AsRef<str>>(&self, migration: &SlotMigration, keys: &[K]) {
        if keys.is_empty() {
            return;
        }
        let mut cmd = redis::cmd("MIGRATE");
        cmd.arg("127.0.0.1")
            .arg(migration.to.port)
            .arg("")
            .arg(0)
            .arg(MIGRATE_TIMEOUT_MS)
            .arg("KEYS");
        for key in keys {
            cmd.arg(key.as_ref());
        }
        // OK, or NOKEY when none of them was there.
        let _: String = (self.admin)
            .query(migration.from.port, &cmd)
            .unwrap_or_else(|e| panic!("MIGRATE to {}: {e}", migration.to.port));
    }

    /// Moves every key left in the slot, then assigns the slot to the target (`CLUSTER SETSLOT
    /// <slot> NODE`, on the target first, then the source, then the other masters), and waits
    /// until every running node agrees and the cluster is ok. From then on the source answers
    /// `MOVED` for the slot.
    pub fn finish_migration(&self, migration: SlotMigration) {
        let SlotMigration { slot, from, to } = &migration;
        loop {
            let mut cmd = redis::cmd("CLUSTER");
            cmd.arg("GETKEYSINSLOT").arg(slot).arg(BATCH);
            let keys: Vec<String> = (self.admin)
                .query(from.port, &cmd)
                .unwrap_or_else(|e| panic!("CLUSTER GETKEYSINSLOT on {}: {e}", from.port));
            if keys.is_empty() {
                break;
            }
            self.migrate_keys(&migration, &keys);
        }
        self.set_slot(to.port, *slot, "NODE", &to.id);
        self.set_slot(from.port, *slot, "NODE", &to.id);
        for master in self.masters() {
            if master.id != from.id && master.id != to.id && self.is_up(master.port) {
                self.set_slot(master.port, *slot, "NODE", &to.id);
            }
        }
        poll(
            format!("every node sees slot {slot} on {}", to.port),
            OK_WITHIN,
            || {
                for port in self.ports().into_iter().filter(|p| self.is_up(*p)) {
                    let topology = self.cluster_nodes(port)?;
                    let owner = topology.owner(*slot).map(|n| n.port);
                    if owner != Some(to.port) || !topology.open_slots.is_empty() {
                        return Err(format!(
                            "node {port} sees slot {slot} on {owner:?}, open slots {:?}",
                            topology.open_slots
                        ));
                    }
                }
                Ok(())
            },
        );
        self.wait_ok();
    }

    /// [`begin_migration`](Self::begin_migration) then
    /// [`finish_migration`](Self::finish_migration): `slot` moves, with its keys, to the master on
    /// port `to`.
    pub fn migrate_slot(&self, slot: u16, to: u16) {
        self.finish_migration(self.begin_migration(slot, to));
    }

    fn set_slot(&self, port: u16, slot: u16, state: &str, id: &str) {
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("SETSLOT").arg(slot).arg(state).arg(id);
        let () = (self.admin)
            .query(port, &cmd)
            .unwrap_or_else(|e| panic!("CLUSTER SETSLOT {slot} {state} {id} on {port}: {e}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn a_migration_can_cross_threads() {
        assert_send_sync::<SlotMigration>();
        assert_send_sync::<RedisCluster>();
    }
}
