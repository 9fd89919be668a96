//! The subscriber of a cluster `Locker`: sharded pub/sub (`SSUBSCRIBE`), so a wake-up goes only to
//! the shard that owns the lock's slot instead of being broadcast to every node.
//!
//! It runs over a RESP3 cluster connection whose pushes come back on a channel. redis-rs routes
//! each `SSUBSCRIBE` to the master of the channel's slot. When a channel's slot leaves its node
//! (a migration, a failover, a master's death), the node drops the subscription (a `sunsubscribe`
//! push, or the connection goes) and redis-rs does not always subscribe again: so the channel is
//! marked unconfirmed (its waiters poll meanwhile), its waiters retry at once (a release may have
//! been missed), and it is subscribed again, on the slot's new master, with a backoff.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redis::{PushKind, Value};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{MAX_BACKOFF, MIN_BACKOFF, Slots, SubCmd, refuse_for};
use crate::backend::cluster::ClusterSeeds;

pub(super) async fn run(
    seeds: ClusterSeeds,
    slots: Arc<Slots>,
    mut rx: mpsc::UnboundedReceiver<SubCmd>,
    healthy: Arc<AtomicBool>,
    timeout: Duration,
) {
    let mut backoff = MIN_BACKOFF;
    let mut pending: Option<SubCmd> = match rx.recv().await {
        Some(cmd) => Some(cmd),
        None => return,
    };
    let (conn, mut pushes) = loop {
        let (tx, pushes) = mpsc::unbounded_channel();
        let connected = async {
            let client = (seeds.builder())
                .use_protocol(redis::ProtocolVersion::RESP3)
                .push_sender(tx)
                .build()?;
            client.get_async_connection().await
        };
        match tokio::time::timeout(timeout, connected).await {
            Ok(Ok(conn)) => break (conn, pushes),
            Ok(Err(err)) => {
                tracing::debug!(error = %err, "dlock subscriber could not connect to the cluster");
            }
            Err(_) => {}
        }
        if !refuse_for(&mut rx, &mut pending, backoff).await {
            return;
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    };
    // Channels watched before the connection came up (each alone: one slot per command).
    for channel in slots.channels() {
        let mut c = conn.clone();
        if matches!(
            tokio::time::timeout(timeout, c.ssubscribe(&channel)).await,
            Ok(Ok(()))
        ) {
            slots.confirm(&channel);
        }
    }
    healthy.store(true, Ordering::Release);
    slots.wake_all();
    tracing::debug!("dlock subscriber connected to the cluster");
    // Channels whose subscription the cluster dropped, to subscribe again at `retry_at`.
    let mut lapsed = Lapsed::default();
    loop {
        let cmd = match pending.take() {
            Some(cmd) => Some(cmd),
            None => tokio::select! {
                cmd = rx.recv() => match cmd {
                    None => return,
                    Some(cmd) => Some(cmd),
                },
                push = pushes.recv() => match push {
                    None => return,
                    Some(push) => {
                        match push.kind {
                            PushKind::SMessage => {
                                if let Some(Value::BulkString(channel)) = push.data.first() {
                                    let message = match push.data.get(1) {
                                        Some(Value::BulkString(message)) => Some(&message[..]),
                                        _ => None,
                                    };
                                    let _ = slots
                                        .wake_with(&String::from_utf8_lossy(channel), message);
                                }
                            }
                            // The node dropped a channel we still watch: its slot moved away.
                            PushKind::SUnsubscribe => {
                                if let Some(Value::BulkString(channel)) = push.data.first() {
                                    let channel = String::from_utf8_lossy(channel);
                                    if slots.contains(&channel) {
                                        slots.unconfirm(&channel);
                                        slots.wake_with(&channel, None);
                                        lapsed.add(channel.into_owned());
                                    }
                                }
                            }
                            PushKind::Disconnection => {
                                // A node's connection dropped: its wake-ups may be lost, and its
                                // channels' slots may have moved. Every waiter retries now, and
                                // every channel is subscribed again.
                                slots.set_all_confirmed(false);
                                healthy.store(false, Ordering::Release);
                                slots.wake_all();
                                for channel in slots.channels() {
                                    lapsed.add(channel);
                                }
                            }
                            _ => {}
                        }
                        None
                    }
                },
                () = tokio::time::sleep_until(lapsed.retry_at), if !lapsed.is_empty() => {
                    lapsed.resubscribe(&conn, &slots, timeout).await;
                    if lapsed.is_empty() {
                        healthy.store(true, Ordering::Release);
                    }
                    None
                }
            },
        };
        match cmd {
            None => {}
            Some(SubCmd::Subscribe(channel, ack)) => {
                let mut c = conn.clone();
                let ok = matches!(
                    tokio::time::timeout(timeout, c.ssubscribe(&channel)).await,
                    Ok(Ok(()))
                );
                if ok {
                    slots.confirm(&channel);
                    lapsed.channels.remove(&channel);
                }
                healthy.store(ok, Ordering::Release);
                let _ = ack.send(ok);
            }
            Some(SubCmd::Unsubscribe(channel)) if !slots.contains(&channel) => {
                lapsed.channels.remove(&channel);
                let mut c = conn.clone();
                let _ = tokio::time::timeout(timeout, c.sunsubscribe(&channel)).await;
            }
            Some(SubCmd::Unsubscribe(_)) => {}
        }
    }
}

/// Channels whose subscription the cluster dropped, and when to subscribe them again.
struct Lapsed {
    channels: BTreeSet<String>,
    retry_at: Instant,
    backoff: Duration,
}

impl Default for Lapsed {
    fn default() -> Self {
        Self {
            channels: BTreeSet::new(),
            retry_at: Instant::now(),
            backoff: MIN_BACKOFF,
        }
    }
}

impl Lapsed {
    fn is_empty(&self) -> bool {
        self.channels.is_empty()
    }

    /// Adds `channel`; the first one lapsed since all were subscribed again is retried soon.
    fn add(&mut self, channel: String) {
        if self.channels.is_empty() {
            self.backoff = MIN_BACKOFF;
            self.retry_at = Instant::now() + MIN_BACKOFF;
        }
        self.channels.insert(channel);
    }

    /// Subscribes every lapsed channel still watched again; those that fail are retried after a
    /// longer pause.
    async fn resubscribe(
        &mut self,
        conn: &redis::cluster_async::ClusterConnection,
        slots: &Slots,
        timeout: Duration,
    ) {
        let channels = std::mem::take(&mut self.channels);
        for channel in channels {
            if !slots.contains(&channel) {
                continue;
            }
            if subscribe_on_master(conn, &channel, timeout).await {
                slots.confirm(&channel);
                // A release between the drop and now was published where nobody listened:
                // its waiters try again now, and hear every release from here on.
                slots.wake_with(&channel, None);
            } else {
                self.channels.insert(channel);
            }
        }
        if self.channels.is_empty() {
            self.backoff = MIN_BACKOFF;
        } else {
            tracing::debug!(
                channels = self.channels.len(),
                "dlock subscriber: could not subscribe again yet"
            );
            self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
            self.retry_at = Instant::now() + self.backoff;
        }
    }
}

/// Subscribes `channel` again after its slot changed hands, on the slot's master.
///
/// redis-rs sends `SSUBSCRIBE` to the node its slot map names, and a replica takes a shard
/// subscription as well as a master does. After a failover the map still names the old master,
/// now a replica: the subscription lands there, and a release published on the new master
/// before it has heard of its new replica never reaches it — the waiter sleeps until the lease
/// runs out. A keyed read of the channel's slot goes first: only the slot's master answers it, a
/// replica answers `MOVED`, and redis-rs reads the slot map again before the subscription goes
/// out. The read names a key no lock uses (the channel's own name) and writes nothing.
async fn subscribe_on_master(
    conn: &redis::cluster_async::ClusterConnection,
    channel: &str,
    timeout: Duration,
) -> bool {
    let mut c = conn.clone();
    let mut read = redis::cmd("EXISTS");
    read.arg(channel);
    if !matches!(
        tokio::time::timeout(timeout, read.query_async::<i64>(&mut c)).await,
        Ok(Ok(_))
    ) {
        return false;
    }
    matches!(
        tokio::time::timeout(timeout, c.ssubscribe(channel)).await,
        Ok(Ok(()))
    )
}
