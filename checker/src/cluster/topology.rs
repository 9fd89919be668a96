//! What a cluster says about itself (`CLUSTER NODES`), and which slot a key hashes to.

use std::ops::RangeInclusive;

pub use dlock_core::protocol::slot::{SLOTS, key_slot};

/// One node as the cluster describes it (a line of `CLUSTER NODES`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClusterNode {
    /// The node's cluster id (40 hex characters).
    pub id: String,
    /// Its client port on 127.0.0.1.
    pub port: u16,
    /// For a replica, the id of the master it replicates; `None` for a master.
    pub master_id: Option<String>,
    /// The slots it serves, as ranges; empty for a replica, or a master that lost them.
    pub slots: Vec<RangeInclusive<u16>>,
    /// Whether the node that answered flags it as failing (`fail` or `fail?`).
    pub failing: bool,
}

impl ClusterNode {
    /// Whether it is a master.
    pub fn is_master(&self) -> bool {
        self.master_id.is_none()
    }

    /// Whether it serves `slot`.
    pub fn serves(&self, slot: u16) -> bool {
        self.slots.iter().any(|range| range.contains(&slot))
    }

    /// How many slots it serves.
    pub fn slot_count(&self) -> usize {
        self.slots.iter().map(|range| range.len()).sum()
    }

    /// `redis://127.0.0.1:PORT/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

/// One node's place in the cluster: id, master id, slots.
pub(crate) type Shape<'a> = (&'a str, Option<&'a str>, &'a [RangeInclusive<u16>]);

/// Every node one node knows, with the id of the one that answered.
#[derive(Debug, Clone)]
pub(crate) struct Topology {
    pub(crate) myself: String,
    pub(crate) nodes: Vec<ClusterNode>,
    /// Slots this node is moving out or in (`[slot->-id]`, `[slot-<-id]`).
    pub(crate) open_slots: Vec<u16>,
}

impl Topology {
    /// Parses the answer of `CLUSTER NODES`. Nodes still being introduced (`handshake`,
    /// `noaddr`) are left out: they have no id or address to agree on yet.
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        let mut myself = None;
        let mut nodes = Vec::new();
        let mut open_slots = Vec::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let bad = || format!("unexpected CLUSTER NODES line: {line:?}");
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [
                id,
                addr,
                flags,
                master,
                _ping,
                _pong,
                _epoch,
                _link,
                slots @ ..,
            ] = fields.as_slice()
            else {
                return Err(bad());
            };
            let flags: Vec<&str> = flags.split(',').collect();
            if flags.contains(&"handshake") || flags.contains(&"noaddr") {
                continue;
            }
            // 127.0.0.1:7000@17000 or, from 7.0 on, 127.0.0.1:7000@17000,hostname
            let port = addr
                .split('@')
                .next()
                .and_then(|a| a.rsplit(':').next())
                .and_then(|p| p.parse().ok())
                .ok_or_else(bad)?;
            let mut ranges = Vec::new();
            for slot in slots {
                if let Some(open) = slot.strip_prefix('[') {
                    // [slot->-id] or [slot-<-id]
                    let number = open.split('-').next().and_then(|n| n.parse().ok());
                    open_slots.push(number.ok_or_else(bad)?);
                    continue;
                }
                let (start, end) = slot.split_once('-').unwrap_or((slot, slot));
                let start: u16 = start.parse().map_err(|_| bad())?;
                let end: u16 = end.parse().map_err(|_| bad())?;
                ranges.push(start..=end);
            }
            if flags.contains(&"myself") {
                myself = Some((*id).to_owned());
            }
            let replica = flags.contains(&"slave") || flags.contains(&"replica");
            nodes.push(ClusterNode {
                id: (*id).to_owned(),
                port,
                master_id: (replica && *master != "-").then(|| (*master).to_owned()),
                slots: ranges,
                failing: flags.contains(&"fail") || flags.contains(&"fail?"),
            });
        }
        nodes.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(Self {
            myself: myself.ok_or("CLUSTER NODES has no `myself` line")?,
            nodes,
            open_slots,
        })
    }

    /// What every node must agree on: who replicates whom, who serves which slots.
    pub(crate) fn shape(&self) -> Vec<Shape<'_>> {
        self.nodes
            .iter()
            .map(|n| (n.id.as_str(), n.master_id.as_deref(), n.slots.as_slice()))
            .collect()
    }

    /// The master serving `slot`.
    pub(crate) fn owner(&self, slot: u16) -> Option<&ClusterNode> {
        self.nodes.iter().find(|n| n.is_master() && n.serves(slot))
    }

    /// The node with this id.
    pub(crate) fn by_id(&self, id: &str) -> Option<&ClusterNode> {
        self.nodes.iter().find(|n| n.id == id)
    }

    /// The node on this port.
    pub(crate) fn by_port(&self, port: u16) -> Option<&ClusterNode> {
        self.nodes.iter().find(|n| n.port == port)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODES: &str = "\
07c37dfeb235213a872192d90877d0cd55635b91 127.0.0.1:30004@31004,host replica e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 0 1426238317239 4 connected
67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1 127.0.0.1:30002@31002 master - 0 1426238316232 2 connected 5461-10922 [5461->-e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca]
292f8b365bb7edb5e285caf0b7e6ddc7265d2f4f 127.0.0.1:30003@31003 master - 0 1426238318243 3 connected 10923-16383
6ec23923021cf3ffec47632106199cb7f496ce01 127.0.0.1:30005@31005 slave 67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1 0 1426238316232 5 connected
824fe116063bc5fcf9f4ffd895bc17aee7731ac3 127.0.0.1:30006@31006 slave,fail 292f8b365bb7edb5e285caf0b7e6ddc7265d2f4f 0 1426238317741 6 disconnected
e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 127.0.0.1:30001@31001 myself,master - 0 0 1 connected 0-5000 5001 5002-5460
0000000000000000000000000000000000000000 :0@0 handshake - 0 0 0 connected
";

    #[test]
    fn cluster_nodes_is_parsed_into_roles_ports_and_slots() {
        let topology = Topology::parse(NODES).unwrap();
        assert_eq!(topology.myself, "e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca");
        assert_eq!(topology.nodes.len(), 6, "the handshake line is left out");
        let me = topology.by_port(30001).unwrap();
        assert!(me.is_master() && !me.failing);
        assert_eq!(me.slots, vec![0..=5000, 5001..=5001, 5002..=5460]);
        assert_eq!(me.slot_count(), 5461);
        assert_eq!(topology.owner(5001).unwrap().port, 30001);
        assert_eq!(topology.owner(5461).unwrap().port, 30002);
        let replica = topology.by_port(30004).unwrap();
        assert_eq!(
            replica.master_id.as_deref(),
            Some("e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca")
        );
        assert!(replica.slots.is_empty());
        assert!(topology.by_port(30006).unwrap().failing);
        assert_eq!(topology.open_slots, vec![5461]);
    }

    #[test]
    fn a_garbled_line_is_an_error_naming_it() {
        let err = Topology::parse("abc 127.0.0.1:1@2 master\n").unwrap_err();
        assert!(err.contains("abc 127.0.0.1:1@2 master"), "{err}");
    }
}
