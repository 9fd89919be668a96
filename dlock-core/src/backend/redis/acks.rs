//! Replica acknowledgement of lock writes: how many replicas a write waits for (the
//! `Locker`'s [`ReplicaAck`], shrunk to the replicas the deployment lists for the write's
//! master), and whether the acknowledgement it got counts.

use std::future::Future;

use super::RedisBackend;
use crate::error::BackendError;
use crate::replication::ReplicaAck;

/// How a write was acknowledged: by how many replicas, and what it waited for (`None`: it did
/// not wait).
pub(crate) type Acked = Option<(u32, ReplicaAck)>;

impl RedisBackend {
    /// The acknowledgement a write to `key` waits for, if any: the `Locker`'s, shrunk to the
    /// healthy replicas the deployment lists for the key's master when it waits
    /// [up to those](ReplicaAck::up_to_listed). A list known to be out of date (a command
    /// failed, or a new master was connected to) is read again first, within a short bound.
    pub(super) async fn ack_for(&self, key: &str) -> Option<ReplicaAck> {
        let ack = self.ack?;
        if !ack.is_up_to_listed() {
            return Some(ack);
        }
        let listed = match self.listed_replicas(key) {
            Ok(listed) => listed,
            // Boxed, its type erased: rare, and its future is large and deep, where every
            // call's is kept small.
            Err(()) => {
                let again: std::pin::Pin<Box<dyn Future<Output = Option<u32>> + Send + '_>> =
                    Box::pin(self.listed_replicas_again(key));
                again.await
            }
        };
        ack.for_listed(listed)
    }

    /// How many healthy replicas the deployment lists for `key`'s master (`None`: no list, or
    /// not known yet), or `Err` when the list must be read again first.
    fn listed_replicas(&self, key: &str) -> Result<Option<u32>, ()> {
        match &self.conn {
            #[cfg(feature = "cluster")]
            super::RedisConn::Cluster(_) => match self.masters.as_ref() {
                Some(masters) => masters.listed_replicas(cluster_slot(key)),
                None => Ok(None),
            },
            #[cfg(feature = "sentinel")]
            super::RedisConn::Sentinel(c) => c.listed_replicas().map(Some).ok_or(()),
            _ => {
                let _ = key;
                Ok(None)
            }
        }
    }

    /// [`listed_replicas`](Self::listed_replicas) after reading the list again: a cluster's
    /// slot map (within a quarter of the command timeout), or the sentinels' list for the
    /// master the next command goes to (connected first if it is not).
    async fn listed_replicas_again(&self, key: &str) -> Option<u32> {
        match &self.conn {
            #[cfg(feature = "cluster")]
            super::RedisConn::Cluster(_) => {
                let masters = self.masters.as_ref()?;
                masters.refresh_if_old(self.timeout / 4).await;
                // Still not trusted (no node answered, the cluster is failing, or a read under
                // way took too long): not known.
                masters.listed_replicas(cluster_slot(key)).ok().flatten()
            }
            #[cfg(feature = "sentinel")]
            super::RedisConn::Sentinel(c) => c.listed_replicas_now().await,
            _ => {
                let _ = key;
                None
            }
        }
    }

    /// Whether a write counts, acknowledged as `acked` says (`None`: it did not wait). One
    /// that fell short of a wait [up to the listed replicas](ReplicaAck::up_to_listed) has the
    /// list read again: a replica may have gone (failed over, say) since it was read.
    pub(super) fn acknowledged(&self, acked: Acked) -> Result<(), BackendError> {
        match acked {
            Some((n, ack)) if n < ack.replicas() => {
                if ack.is_up_to_listed() {
                    self.relist_soon();
                }
                Err(BackendError::not_replicated(
                    n,
                    ack.replicas(),
                    ack.timeout(),
                ))
            }
            _ => Ok(()),
        }
    }

    /// Has the replicas the deployment lists read again, in the background.
    pub(super) fn relist_soon(&self) {
        match &self.conn {
            #[cfg(feature = "cluster")]
            super::RedisConn::Cluster(_) => {
                if let Some(masters) = &self.masters {
                    masters.mark_stale();
                }
            }
            #[cfg(feature = "sentinel")]
            super::RedisConn::Sentinel(c) => c.relist_soon(),
            _ => {}
        }
    }
}

/// The cluster slot of `key`.
#[cfg(feature = "cluster")]
fn cluster_slot(key: &str) -> u16 {
    crate::backend::cluster::key_slot(key.as_bytes())
}
