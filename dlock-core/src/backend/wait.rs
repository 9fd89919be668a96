//! Waking waiters: a map of watched channels, and the one subscriber connection per `Locker`
//! that feeds it.
//!
//! Every waited lock name has one slot (a [`Notify`]) however many local waiters it has; the
//! Redis subscriber subscribes to a channel when its first watcher arrives and unsubscribes a
//! short while ([`LINGER`]) after the last one leaves, unless a new watcher came meanwhile: a
//! name waited on again soon, as two processes taking turns do, is not subscribed again. All
//! subscription changes go through one task, in order, so an unsubscribe can never overtake a
//! later subscribe.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::{mpsc, oneshot};

#[cfg(feature = "cluster")]
mod sharded;

mod slots;

pub(crate) use slots::{Granted, Slots, Watch};

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
    /// Whether its channels linger after their last watcher. Not on a Cluster: there each
    /// subscription is one more shard subscription to prove with an echo, and to subscribe
    /// again, one at a time, after every node's disconnection.
    linger: bool,
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
        // Not on a Cluster (see `linger`).
        let linger = match source {
            #[cfg(feature = "cluster")]
            SubscriberSource::Cluster(seeds, commands) => {
                tokio::spawn(sharded::run(
                    (seeds, commands),
                    slots.clone(),
                    rx,
                    healthy.clone(),
                    timeout,
                ));
                false
            }
            source => {
                tokio::spawn(run(source, slots.clone(), rx, healthy.clone(), timeout));
                true
            }
        };
        Self {
            slots,
            tx,
            healthy,
            timeout,
            linger,
        }
    }

    /// Whether the task still runs (it ends with the runtime it was spawned on).
    pub(crate) fn is_running(&self) -> bool {
        !self.tx.is_closed()
    }

    /// Registers a watcher and makes sure the channel is subscribed before returning — or gives
    /// up at `deadline` (or after the command timeout), leaving a watcher that polls.
    pub(crate) async fn watch(&self, channel: &str, deadline: tokio::time::Instant) -> Watch {
        let (mut watch, _first) = Watch::new(self.slots.clone(), channel, Some(self.tx.clone()));
        watch.linger = self.linger;
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
