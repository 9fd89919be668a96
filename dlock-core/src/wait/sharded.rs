//! The subscriber of a cluster `Locker`: sharded pub/sub (`SSUBSCRIBE`), so a wake-up goes only to
//! the shard that owns the lock's slot instead of being broadcast to every node.
//!
//! It runs over a RESP3 cluster connection whose pushes come back on a channel. redis-rs routes
//! each `SSUBSCRIBE` to the master of the channel's slot and subscribes again after a
//! reconnection or a slot move; a wake-up that may have been missed meanwhile (a node's
//! connection dropped) wakes every waiter to retry.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redis::{PushKind, Value};
use tokio::sync::mpsc;

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
                            PushKind::Disconnection => {
                                // A node's connection dropped: its wake-ups may be lost until
                                // redis-rs subscribes again. Every waiter retries now.
                                slots.wake_all();
                            }
                            _ => {}
                        }
                        None
                    }
                },
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
                }
                healthy.store(ok, Ordering::Release);
                let _ = ack.send(ok);
            }
            Some(SubCmd::Unsubscribe(channel)) if !slots.contains(&channel) => {
                let mut c = conn.clone();
                let _ = tokio::time::timeout(timeout, c.sunsubscribe(&channel)).await;
            }
            Some(SubCmd::Unsubscribe(_)) => {}
        }
    }
}
