//! Waking waiters: a map of watched channels, and the one subscriber connection per `Locker`
//! that feeds it.
//!
//! Every waited lock name has one slot (a [`Notify`]) however many local waiters it has; the
//! Redis subscriber subscribes to a channel when its first watcher arrives and unsubscribes when
//! the last one leaves. All subscription changes go through one task, in order, so an
//! unsubscribe can never overtake a later subscribe.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::{Notify, mpsc, oneshot};

#[cfg(feature = "cluster")]
mod sharded;

/// The watched channels of one backend.
#[derive(Debug, Default)]
pub(crate) struct Slots {
    map: Mutex<HashMap<String, SlotEntry>>,
}

#[derive(Debug)]
struct SlotEntry {
    slot: Arc<Slot>,
    refs: usize,
}

#[derive(Debug, Default)]
pub(crate) struct Slot {
    notify: Notify,
    confirmed: AtomicBool,
    /// The last grant a wake-up announced on the channel (see [`Granted`]).
    granted: Mutex<Option<Granted>>,
}

/// A wake-up that says a release granted the lock to a head waiter's hand-over token (message
/// `g<attempt>:<ms>:<fencing token>:<token>`): the number of the attempt whose claim was
/// granted, the grant's lease, its fencing token, and the hand-over token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Granted {
    pub(crate) attempt: u64,
    pub(crate) lease: Duration,
    pub(crate) fence: u64,
    pub(crate) token: Box<str>,
}

impl Granted {
    /// The grant a wake-up message announces, if it announces one.
    fn parse(message: &[u8]) -> Option<Self> {
        let message = std::str::from_utf8(message.strip_prefix(b"g")?).ok()?;
        let mut parts = message.splitn(4, ':');
        let attempt = parts.next()?.parse().ok()?;
        let ms = parts.next()?.parse().ok()?;
        let fence = parts.next()?.parse().ok()?;
        let token = parts.next().filter(|t| !t.is_empty())?;
        Some(Self {
            attempt,
            lease: Duration::from_millis(ms),
            fence,
            token: token.into(),
        })
    }
}

impl Slots {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, SlotEntry>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds one watcher; returns the slot and whether it is the first.
    fn register(&self, channel: &str) -> (Arc<Slot>, bool) {
        let mut map = self.lock();
        match map.get_mut(channel) {
            Some(entry) => {
                entry.refs += 1;
                (entry.slot.clone(), false)
            }
            None => {
                let slot = Arc::new(Slot::default());
                map.insert(
                    channel.to_owned(),
                    SlotEntry {
                        slot: slot.clone(),
                        refs: 1,
                    },
                );
                (slot, true)
            }
        }
    }

    /// Removes one watcher; returns whether it was the last.
    fn unregister(&self, channel: &str) -> bool {
        let mut map = self.lock();
        if let Some(entry) = map.get_mut(channel) {
            entry.refs -= 1;
            if entry.refs == 0 {
                map.remove(channel);
                return true;
            }
        }
        false
    }

    fn contains(&self, channel: &str) -> bool {
        self.lock().contains_key(channel)
    }

    /// Wakes every watcher of `channel` with the wake-up `message` (a grant it announces is kept
    /// for the head waiter to take); returns how many watchers there were.
    pub(crate) fn wake_with(&self, channel: &str, message: Option<&[u8]>) -> usize {
        match self.lock().get(channel) {
            Some(entry) => {
                if let Some(granted) = message.and_then(Granted::parse) {
                    *entry.slot.granted.lock().unwrap_or_else(|e| e.into_inner()) = Some(granted);
                }
                entry.slot.notify.notify_waiters();
                entry.refs
            }
            None => 0,
        }
    }

    fn wake_all(&self) {
        for entry in self.lock().values() {
            entry.slot.notify.notify_waiters();
        }
    }

    fn channels(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }

    fn set_all_confirmed(&self, confirmed: bool) {
        for entry in self.lock().values() {
            entry.slot.confirmed.store(confirmed, Ordering::Release);
        }
    }

    fn confirm(&self, channel: &str) {
        if let Some(entry) = self.lock().get(channel) {
            entry.slot.confirmed.store(true, Ordering::Release);
        }
    }

    /// Says wake-ups on `channel` are not delivered until it is confirmed again: its waiters
    /// poll meanwhile.
    #[cfg(feature = "cluster")]
    fn unconfirm(&self, channel: &str) {
        if let Some(entry) = self.lock().get(channel) {
            entry.slot.confirmed.store(false, Ordering::Release);
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    /// How many watchers `channel` has.
    pub(crate) fn watchers(&self, channel: &str) -> usize {
        self.lock().get(channel).map_or(0, |e| e.refs)
    }
}

/// One watcher's registration; unregisters on drop.
#[derive(Debug)]
pub(crate) struct Watch {
    slots: Arc<Slots>,
    channel: String,
    slot: Arc<Slot>,
    /// Where to send the unsubscribe when this is the last watcher (Redis only).
    unsubscribe: Option<mpsc::UnboundedSender<SubCmd>>,
}

impl Watch {
    pub(crate) fn new(
        slots: Arc<Slots>,
        channel: &str,
        unsubscribe: Option<mpsc::UnboundedSender<SubCmd>>,
    ) -> (Self, bool) {
        let (slot, first) = slots.register(channel);
        (
            Self {
                slots,
                channel: channel.to_owned(),
                slot,
                unsubscribe,
            },
            first,
        )
    }

    /// A future that completes at the next wake-up; call `enable()` on it (pinned) before the
    /// attempt that it follows so a wake-up in between is not missed.
    pub(crate) fn notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.slot.notify.notified()
    }

    /// Whether wake-ups are delivered (the subscription is confirmed). When not, the waiter
    /// polls on a short timer instead.
    pub(crate) fn is_reliable(&self) -> bool {
        self.slot.confirmed.load(Ordering::Acquire)
    }

    /// Takes the last grant announced on the channel if it went to `token`.
    pub(crate) fn take_grant(&self, token: &str) -> Option<Granted> {
        let mut granted = self.slot.granted.lock().unwrap_or_else(|e| e.into_inner());
        match granted.as_ref() {
            Some(g) if *g.token == *token => granted.take(),
            _ => None,
        }
    }

    pub(crate) fn mark_confirmed(&self) {
        self.slot.confirmed.store(true, Ordering::Release);
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if let (true, Some(tx)) = (self.slots.unregister(&self.channel), &self.unsubscribe) {
            let _ = tx.send(SubCmd::Unsubscribe(std::mem::take(&mut self.channel)));
        }
    }
}

#[derive(Debug)]
pub(crate) enum SubCmd {
    Subscribe(String, oneshot::Sender<bool>),
    Unsubscribe(String),
}

/// The one subscriber connection of a Redis-backed `Locker`: a handle to the task that owns it.
#[derive(Debug, Clone)]
pub(crate) struct Subscriber {
    slots: Arc<Slots>,
    tx: mpsc::UnboundedSender<SubCmd>,
    healthy: Arc<Health>,
    timeout: Duration,
}

/// Whether a subscriber connection is up, counted in `dlock_subscribers_connected` while it is.
#[derive(Debug, Default)]
pub(crate) struct Health {
    up: AtomicBool,
}

impl Health {
    /// Whether the connection is up.
    pub(crate) fn load(&self, order: Ordering) -> bool {
        self.up.load(order)
    }

    /// The connection is up (`true`) or down; the gauge moves when that changes.
    pub(crate) fn store(&self, up: bool, order: Ordering) {
        if self.up.swap(up, order) != up {
            crate::metrics::subscriber_connected(up);
        }
    }
}

impl Drop for Health {
    fn drop(&mut self) {
        if *self.up.get_mut() {
            crate::metrics::subscriber_connected(false);
        }
    }
}

impl Subscriber {
    /// Starts the subscriber task on the current runtime (it connects lazily, on the first
    /// subscription) for the channels of `slots`.
    pub(crate) fn spawn(source: SubscriberSource, timeout: Duration, slots: Arc<Slots>) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let healthy = Arc::new(Health::default());
        // A new task knows of no subscription: every watcher polls until it resubscribes.
        slots.set_all_confirmed(false);
        match source {
            #[cfg(feature = "cluster")]
            SubscriberSource::Cluster(seeds, commands) => {
                tokio::spawn(sharded::run(
                    (seeds, commands),
                    slots.clone(),
                    rx,
                    healthy.clone(),
                    timeout,
                ));
            }
            source => {
                tokio::spawn(run(source, slots.clone(), rx, healthy.clone(), timeout));
            }
        }
        Self {
            slots,
            tx,
            healthy,
            timeout,
        }
    }

    /// Whether the task still runs (it ends with the runtime it was spawned on).
    pub(crate) fn is_running(&self) -> bool {
        !self.tx.is_closed()
    }

    /// Registers a watcher and makes sure the channel is subscribed before returning — or gives
    /// up at `deadline` (or after the command timeout), leaving a watcher that polls.
    pub(crate) async fn watch(&self, channel: &str, deadline: tokio::time::Instant) -> Watch {
        let (watch, _first) = Watch::new(self.slots.clone(), channel, Some(self.tx.clone()));
        if !watch.is_reliable() {
            let (ack_tx, ack_rx) = oneshot::channel();
            let sent = self
                .tx
                .send(SubCmd::Subscribe(channel.to_owned(), ack_tx))
                .is_ok();
            let until = deadline.min(tokio::time::Instant::now() + self.timeout);
            if sent && matches!(tokio::time::timeout_at(until, ack_rx).await, Ok(Ok(true))) {
                watch.mark_confirmed();
            }
        }
        watch
    }

    /// Whether the subscriber connection is up.
    pub(crate) fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Acquire)
    }
}

/// Where the subscriber connects: one server, or whichever master the sentinels report.
#[derive(Debug, Clone)]
pub(crate) enum SubscriberSource {
    Client(Box<redis::Client>),
    #[cfg(feature = "sentinel")]
    Sentinel(Arc<crate::backend::sentinel::SentinelMaster>),
    /// Sharded pub/sub over a cluster (see `sharded`).
    #[cfg(feature = "cluster")]
    /// The echoes that prove each subscription go out on the `Locker`'s command connection.
    Cluster(
        crate::backend::cluster::ClusterSeeds,
        crate::backend::cluster::LazyCluster,
    ),
}

impl SubscriberSource {
    pub(crate) fn client(client: redis::Client) -> Self {
        Self::Client(Box::new(client))
    }

    async fn connect(&self) -> redis::RedisResult<redis::aio::PubSub> {
        match self {
            Self::Client(client) => client.get_async_pubsub().await,
            #[cfg(feature = "sentinel")]
            Self::Sentinel(master) => master.subscriber_client().await?.get_async_pubsub().await,
            #[cfg(feature = "cluster")]
            Self::Cluster(..) => Err(redis::RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "a cluster subscribes through sharded pub/sub",
            ))),
        }
    }

    /// Tells when the master moved: the subscriber must move with it.
    fn moves(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        match self {
            Self::Client(_) => None,
            #[cfg(feature = "sentinel")]
            Self::Sentinel(master) => Some(master.moves()),
            #[cfg(feature = "cluster")]
            Self::Cluster(..) => None,
        }
    }
}

/// While there is no connection: refuses the pending subscription and every one asked for in
/// the next `backoff` (their watchers poll). False when the `Locker` is gone.
async fn refuse_for(
    rx: &mut mpsc::UnboundedReceiver<SubCmd>,
    pending: &mut Option<SubCmd>,
    backoff: Duration,
) -> bool {
    if let Some(SubCmd::Subscribe(_, ack)) = pending.take() {
        let _ = ack.send(false);
    }
    let sleep = tokio::time::sleep(backoff);
    tokio::pin!(sleep);
    loop {
        tokio::select! {
            () = &mut sleep => return true,
            cmd = rx.recv() => match cmd {
                None => return false,
                Some(SubCmd::Subscribe(_, ack)) => { let _ = ack.send(false); }
                Some(SubCmd::Unsubscribe(_)) => {}
            },
        }
    }
}

/// Resolves when the master moves (never without a sentinel).
async fn moved(moves: &mut Option<tokio::sync::watch::Receiver<u64>>) {
    match moves {
        Some(rx) => {
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending().await,
    }
}

const MIN_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

async fn run(
    source: SubscriberSource,
    slots: Arc<Slots>,
    mut rx: mpsc::UnboundedReceiver<SubCmd>,
    healthy: Arc<Health>,
    timeout: Duration,
) {
    let mut backoff = MIN_BACKOFF;
    // Connect only once somebody waits.
    let mut pending: Option<SubCmd> = match rx.recv().await {
        Some(cmd) => Some(cmd),
        None => return,
    };
    let mut moves = source.moves();
    'connect: loop {
        if let Some(rx) = moves.as_mut() {
            rx.mark_unchanged();
        }
        let pubsub = match tokio::time::timeout(timeout, source.connect()).await {
            Ok(Ok(pubsub)) => Some(pubsub),
            Ok(Err(err)) => {
                tracing::debug!(error = %err, "dlock subscriber could not connect");
                None
            }
            Err(_) => None,
        };
        let Some(pubsub) = pubsub else {
            healthy.store(false, Ordering::Release);
            slots.set_all_confirmed(false);
            slots.wake_all();
            if !refuse_for(&mut rx, &mut pending, backoff).await {
                return;
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
            continue 'connect;
        };
        backoff = MIN_BACKOFF;
        let (mut sink, mut stream) = pubsub.split();
        let channels = slots.channels();
        if !channels.is_empty() {
            let resubscribed = tokio::time::timeout(timeout, sink.subscribe(&channels)).await;
            if !matches!(resubscribed, Ok(Ok(()))) {
                continue 'connect;
            }
        }
        slots.set_all_confirmed(true);
        healthy.store(true, Ordering::Release);
        // Wake-ups may have been missed while disconnected: let every waiter retry.
        slots.wake_all();
        tracing::debug!(channels = channels.len(), "dlock subscriber connected");
        loop {
            let cmd = match pending.take() {
                Some(cmd) => Some(cmd),
                None => tokio::select! {
                    cmd = rx.recv() => match cmd {
                        None => return,
                        Some(cmd) => Some(cmd),
                    },
                    () = moved(&mut moves) => {
                        tracing::debug!("dlock subscriber follows the master");
                        healthy.store(false, Ordering::Release);
                        slots.set_all_confirmed(false);
                        slots.wake_all();
                        continue 'connect;
                    }
                    msg = stream.next() => match msg {
                        Some(msg) => {
                            let _ = slots.wake_with(
                                msg.get_channel_name(),
                                Some(msg.get_payload_bytes()),
                            );
                            None
                        }
                        None => {
                            tracing::debug!("dlock subscriber disconnected");
                            healthy.store(false, Ordering::Release);
                            slots.set_all_confirmed(false);
                            slots.wake_all();
                            continue 'connect;
                        }
                    },
                },
            };
            match cmd {
                None => {}
                Some(SubCmd::Subscribe(channel, ack)) => {
                    let ok = matches!(
                        tokio::time::timeout(timeout, sink.subscribe(&channel)).await,
                        Ok(Ok(()))
                    );
                    if ok {
                        slots.confirm(&channel);
                    }
                    let _ = ack.send(ok);
                    if !ok {
                        healthy.store(false, Ordering::Release);
                        continue 'connect;
                    }
                }
                Some(SubCmd::Unsubscribe(channel)) if !slots.contains(&channel) => {
                    let done = tokio::time::timeout(timeout, sink.unsubscribe(&channel)).await;
                    if !matches!(done, Ok(Ok(()))) {
                        continue 'connect;
                    }
                }
                Some(SubCmd::Unsubscribe(_)) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grant_is_read_from_its_wake_up_and_nothing_else_is() {
        assert_eq!(
            Granted::parse(b"g12:2005:1764130000123456:ab12@api:v2"),
            Some(Granted {
                attempt: 12,
                lease: Duration::from_millis(2005),
                fence: 1_764_130_000_123_456,
                // A holder label may hold colons: the token is the rest.
                token: "ab12@api:v2".into(),
            })
        );
        for other in [
            &b"1"[..],
            b"",
            b"g",
            b"g1:2:3:",
            b"g1:2:x:t",
            b"gx:2:3:t",
            b"h1:2:3:t",
        ] {
            assert_eq!(Granted::parse(other), None, "{other:?}");
        }
    }
}
