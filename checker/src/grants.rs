//! The grants releases make to waiters of other lockers, counted on a subscriber of the
//! checker's own, so a run can show that the path was taken (and judged).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use dlock_core::redis;
use tokio::sync::watch;

use super::ops::Ctx;

/// Counts the releases that granted the lock to a waiter (their wake-up on a channel matching
/// `pattern` says `g<attempt>:<ms>:<token>`) until `stop`, reconnecting after server faults.
pub(super) async fn count(
    client: redis::Client,
    pattern: String,
    ctx: Arc<Ctx>,
    mut stop: watch::Receiver<bool>,
) {
    use futures_util::StreamExt as _;
    while !*stop.borrow() {
        let subscribed = async {
            let mut pubsub = client.get_async_pubsub().await.ok()?;
            pubsub.psubscribe(&pattern).await.ok()?;
            Some(pubsub)
        };
        let Ok(Some(mut pubsub)) = tokio::time::timeout(Duration::from_secs(1), subscribed).await
        else {
            tokio::select! {
                _ = stop.changed() => return,
                () = tokio::time::sleep(Duration::from_millis(50)) => continue,
            }
        };
        let mut messages = pubsub.on_message();
        loop {
            tokio::select! {
                _ = stop.changed() => return,
                message = messages.next() => match message {
                    Some(m) if m.get_payload_bytes().starts_with(b"g") => {
                        ctx.stats.grants.fetch_add(1, Ordering::Relaxed);
                    }
                    Some(_) => {}
                    None => break,
                },
            }
        }
    }
}
