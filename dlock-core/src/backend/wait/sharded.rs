//! The subscriber of a cluster `Locker`: sharded pub/sub (`SSUBSCRIBE`), so a wake-up goes only to
//! the shard that owns the lock's slot instead of being broadcast to every node.
//!
//! It runs over a RESP3 cluster connection whose pushes come back on a channel. redis-rs routes
//! each `SSUBSCRIBE` to the master of the channel's slot. When a channel's slot leaves its node
//! (a migration, a failover, a master's death), the node drops the subscription (a `sunsubscribe`
//! push, or the connection goes) and redis-rs does not always subscribe again: so the channel is
//! marked unconfirmed (its waiters poll meanwhile), its waiters retry at once (a release may have
//! been missed), and it is subscribed again, on the slot's new master, with a backoff.
//!
//! A subscription can also land where the master's wake-ups don't reach, and no push says so:
//! redis-rs routes by a slot map that may still name a master just failed over, now a replica,
//! and a replica takes a shard subscription without a redirect, while the new master sends its
//! messages only to the replicas it has heard of. So each subscription is proved: an echo (see
//! [`Echoes`]) published by the slot's master must come back within [`ECHO_WITHIN`], or the
//! channel is treated as dropped (its waiters retry, and it is subscribed again).
//!
//! Subscribing a channel whose master is dead or hung takes up to the command timeout, so
//! subscriptions go out all at once and each is answered as it ends: one waiting on a hung
//! master holds up no other (a fair waiter stands in line only once its channel is subscribed).
//! Wake-ups don't wait for any of them: a task of their own reads the pushes and wakes waiters
//! as messages arrive.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use redis::{PushInfo, PushKind, Value};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::{MAX_BACKOFF, MIN_BACKOFF, Slots, SubCmd, refuse_for};
use crate::backend::cluster::{ClusterSeeds, LazyCluster};
use crate::protocol::ECHO;

/// How long a subscription's echo may take to come back before the subscription is taken for
/// lost. A release missed meanwhile wakes its waiters this late at worst.
const ECHO_WITHIN: Duration = Duration::from_millis(250);

pub(super) async fn run(
    (seeds, commands): (ClusterSeeds, LazyCluster),
    slots: Arc<Slots>,
    mut rx: mpsc::UnboundedReceiver<SubCmd>,
    healthy: Arc<super::Health>,
    timeout: Duration,
) {
    let mut backoff = MIN_BACKOFF;
    let mut pending: Option<SubCmd> = match rx.recv().await {
        Some(cmd) => Some(cmd),
        None => return,
    };
    let (conn, pushes) = loop {
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
    let mut pushes = read_pushes(pushes, slots.clone());
    let mut echoes = Echoes::new();
    // Subscriptions under way, all at once: one to a hung or dead master waits up to the
    // command timeout, and must not hold up the others (a waiter stands in line only once its
    // channel is subscribed).
    let mut under_way = UnderWay::new(&conn, timeout);
    // Channels watched before the connection came up (each alone: one slot per command).
    for channel in slots.channels() {
        under_way.subscribe(channel, None);
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
                        on_push(&push, &slots, &healthy, (&mut echoes, &mut lapsed));
                        None
                    }
                },
                Some(done) = futures_util::StreamExt::next(&mut under_way.calls),
                    if !under_way.calls.is_empty() =>
                {
                    under_way.ended(&done);
                    let watched = slots.contains(&done.channel);
                    match done.kind {
                        DoneKind::Subscribed { ok, ack, n } => {
                            if ok && watched {
                                slots.confirm(&done.channel);
                                lapsed.channels.remove(&done.channel);
                                echoes.send(&commands, &done.channel, timeout);
                            }
                            if let Some(ack) = ack {
                                // A waiter's subscription says whether the connection is up,
                                // unless one asked for later has said so already.
                                if under_way.latest_told(n) {
                                    healthy.store(ok, Ordering::Release);
                                }
                                let _ = ack.send(ok);
                            }
                            if !watched {
                                // Nobody watches it any more: its unsubscription was skipped
                                // while this was under way.
                                under_way.unsubscribe(done.channel);
                            }
                        }
                        DoneKind::SubscribedAgain { ok } => {
                            if !watched {
                                under_way.unsubscribe(done.channel);
                            } else if ok {
                                slots.confirm(&done.channel);
                                echoes.send(&commands, &done.channel, timeout);
                                // A release between the drop and now was published where
                                // nobody listened: its waiters try again now, and hear every
                                // release from here on.
                                slots.wake_with(&done.channel, None);
                            } else {
                                lapsed.failed(done.channel);
                            }
                            if lapsed.is_empty() && !under_way.subscribing_again() {
                                healthy.store(true, Ordering::Release);
                            }
                        }
                        DoneKind::Unsubscribed => {}
                    }
                    None
                }
                // An echo that did not come back: the subscription hears no wake-up from the
                // slot's master. Its waiters retry now (a release may have been missed), poll
                // meanwhile, and the channel is subscribed again.
                () = tokio::time::sleep_until(echoes.due()), if !echoes.is_empty() => {
                    // Echoes that came back while the loop was busy count as back in time.
                    while let Ok(push) = pushes.try_recv() {
                        on_push(&push, &slots, &healthy, (&mut echoes, &mut lapsed));
                    }
                    for channel in echoes.overdue() {
                        if slots.contains(&channel) {
                            tracing::debug!(
                                channel = %channel,
                                "dlock subscriber: a subscription's echo did not come back"
                            );
                            slots.unconfirm(&channel);
                            slots.wake_with(&channel, None);
                            lapsed.add(channel);
                        }
                    }
                    None
                }
                () = tokio::time::sleep_until(lapsed.retry_at), if !lapsed.is_empty() => {
                    for channel in std::mem::take(&mut lapsed.channels) {
                        if slots.contains(&channel) {
                            under_way.subscribe_again(channel);
                        }
                    }
                    None
                }
            },
        };
        match cmd {
            None => {}
            Some(SubCmd::Subscribe(channel, ack)) => under_way.subscribe(channel, Some(ack)),
            Some(SubCmd::Unsubscribe(channel)) if !slots.contains(&channel) => {
                lapsed.channels.remove(&channel);
                echoes.forget(&channel);
                // One under way is undone when it ends (see above).
                if !under_way.touches(&channel) {
                    under_way.unsubscribe(channel);
                }
            }
            Some(SubCmd::Unsubscribe(_)) => {}
        }
    }
}

/// The subscriber's calls under way: subscriptions, subscriptions again after a drop, and
/// unsubscriptions, each bounded by the command timeout, all at once.
struct UnderWay {
    conn: redis::cluster_async::ClusterConnection,
    timeout: Duration,
    calls: futures_util::stream::FuturesUnordered<futures_util::future::BoxFuture<'static, Done>>,
    /// How many calls under way name each channel.
    channels: HashMap<String, usize>,
    /// How many of the calls are subscriptions again after a drop.
    again: usize,
    /// The number of the last subscription asked for, and of the latest whose answer was
    /// taken for the connection's health.
    asked: u64,
    told: u64,
}

/// A call of [`UnderWay`] that ended.
struct Done {
    channel: String,
    kind: DoneKind,
}

enum DoneKind {
    /// A first subscription, for a waiter (who gets `ack`) or for a channel watched before the
    /// connection came up.
    Subscribed {
        ok: bool,
        ack: Option<oneshot::Sender<bool>>,
        /// Its number, in the order subscriptions were asked for.
        n: u64,
    },
    /// A subscription again after the cluster dropped one (see [`subscribe_on_master`]).
    SubscribedAgain {
        ok: bool,
    },
    Unsubscribed,
}

impl UnderWay {
    fn new(conn: &redis::cluster_async::ClusterConnection, timeout: Duration) -> Self {
        Self {
            conn: conn.clone(),
            timeout,
            calls: futures_util::stream::FuturesUnordered::new(),
            channels: HashMap::new(),
            again: 0,
            asked: 0,
            told: 0,
        }
    }

    fn subscribe(&mut self, channel: String, ack: Option<oneshot::Sender<bool>>) {
        let (mut c, timeout) = (self.conn.clone(), self.timeout);
        self.asked += 1;
        let n = self.asked;
        self.start(channel, move |channel| async move {
            let ok = matches!(
                tokio::time::timeout(timeout, c.ssubscribe(&channel)).await,
                Ok(Ok(()))
            );
            let kind = DoneKind::Subscribed { ok, ack, n };
            Done { channel, kind }
        });
    }

    fn subscribe_again(&mut self, channel: String) {
        let (c, timeout) = (self.conn.clone(), self.timeout);
        self.again += 1;
        self.start(channel, move |channel| async move {
            let ok = subscribe_on_master(&c, &channel, timeout).await;
            let kind = DoneKind::SubscribedAgain { ok };
            Done { channel, kind }
        });
    }

    fn unsubscribe(&mut self, channel: String) {
        let (mut c, timeout) = (self.conn.clone(), self.timeout);
        self.start(channel, move |channel| async move {
            let _ = tokio::time::timeout(timeout, c.sunsubscribe(&channel)).await;
            let kind = DoneKind::Unsubscribed;
            Done { channel, kind }
        });
    }

    /// Whether a call under way names `channel`.
    fn touches(&self, channel: &str) -> bool {
        self.channels.contains_key(channel)
    }

    /// Whether subscription `n` is the latest asked for to have ended yet: a slow one that
    /// fails after a later one succeeded says nothing of the connection now.
    fn latest_told(&mut self, n: u64) -> bool {
        if n < self.told {
            return false;
        }
        self.told = n;
        true
    }

    /// Whether a subscription again after a drop is under way.
    fn subscribing_again(&self) -> bool {
        self.again > 0
    }

    fn start<F>(&mut self, channel: String, call: impl FnOnce(String) -> F)
    where
        F: Future<Output = Done> + Send + 'static,
    {
        *self.channels.entry(channel.clone()).or_default() += 1;
        self.calls.push(Box::pin(call(channel)));
    }

    /// Books the end of `done`'s call.
    fn ended(&mut self, done: &Done) {
        if let Some(n) = self.channels.get_mut(&done.channel) {
            *n -= 1;
            if *n == 0 {
                self.channels.remove(&done.channel);
            }
        }
        if matches!(done.kind, DoneKind::SubscribedAgain { .. }) {
            self.again -= 1;
        }
    }
}

/// Reads the cluster's pushes as they arrive, in a task of its own: a wake-up wakes its waiters
/// at once, while the subscriber's loop may be waiting on a node (subscribing a channel whose
/// master is dead or hung takes up to the command timeout). Everything else (echoes, dropped
/// channels, lost connections) goes on to the loop, in order. Ends with the connection.
fn read_pushes(
    mut pushes: mpsc::UnboundedReceiver<PushInfo>,
    slots: Arc<Slots>,
) -> mpsc::UnboundedReceiver<PushInfo> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(push) = pushes.recv().await {
            if push.kind == PushKind::SMessage
                && let Some(Value::BulkString(channel)) = push.data.first()
            {
                let channel = String::from_utf8_lossy(channel);
                match push.data.get(1) {
                    // An echo (this subscriber's or another's) wakes nobody: the loop checks it.
                    Some(Value::BulkString(m)) if Echoes::is_echo(m) => {}
                    Some(Value::BulkString(m)) => {
                        slots.wake_with(&channel, Some(&m[..]));
                        continue;
                    }
                    _ => {
                        slots.wake_with(&channel, None);
                        continue;
                    }
                }
            }
            if tx.send(push).is_err() {
                return;
            }
        }
    });
    rx
}

/// What the subscriber's loop does with a push [`read_pushes`] passed on.
fn on_push(
    push: &PushInfo,
    slots: &Slots,
    healthy: &super::Health,
    (echoes, lapsed): (&mut Echoes, &mut Lapsed),
) {
    let channel = match push.data.first() {
        Some(Value::BulkString(channel)) => String::from_utf8_lossy(channel),
        _ => std::borrow::Cow::Borrowed(""),
    };
    match push.kind {
        PushKind::SMessage => {
            if let Some(Value::BulkString(m)) = push.data.get(1) {
                echoes.heard(&channel, m);
            }
        }
        // The node dropped a channel we still watch: its slot moved away.
        PushKind::SUnsubscribe => {
            echoes.forget(&channel);
            if slots.contains(&channel) {
                slots.unconfirm(&channel);
                slots.wake_with(&channel, None);
                lapsed.add(channel.into_owned());
            }
        }
        PushKind::Disconnection => {
            // A node's connection dropped: its wake-ups may be lost, and its channels' slots may
            // have moved. Every waiter retries now, and every channel is subscribed again.
            slots.set_all_confirmed(false);
            healthy.store(false, Ordering::Release);
            slots.wake_all();
            echoes.forget_all();
            for channel in slots.channels() {
                lapsed.add(channel);
            }
        }
        _ => {}
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

    /// A subscription again of `channel` failed: it is tried again after a pause, longer for
    /// each round that fails.
    fn failed(&mut self, channel: String) {
        if self.channels.is_empty() {
            tracing::debug!("dlock subscriber: could not subscribe again yet");
            self.retry_at = Instant::now() + self.backoff;
            self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
        }
        self.channels.insert(channel);
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

/// The echoes sent to prove subscriptions, one per channel, and when each is due back.
///
/// An echo is a message `e<subscriber>:<n>` that the subscriber publishes on a channel it just
/// subscribed to, through [`ECHO`]: a keyed script, which only the master of the channel's slot
/// runs (a replica answers `MOVED`, and redis-rs sends it on to the master). The master sends it
/// to the same subscribers its releases' wake-ups go to; so when it comes back, the subscription
/// hears those wake-ups, wherever it landed. Other subscribers of the channel hear it too and
/// take it for nothing: no waiter wakes on an echo.
struct Echoes {
    /// This subscriber's mark in its echoes, drawn at random: another's echo is not its own.
    me: u64,
    sent: u64,
    /// By channel: the echo's number and when it is due back.
    pending: HashMap<String, (u64, Instant)>,
}

impl Echoes {
    fn new() -> Self {
        let mut b = [0u8; 8];
        // Without the system's randomness, the time: marks only tell this subscriber's echoes
        // from the others'.
        let me = match getrandom::fill(&mut b) {
            Ok(()) => u64::from_le_bytes(b),
            Err(_) => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64),
        };
        Self {
            me,
            sent: 0,
            pending: HashMap::new(),
        }
    }

    /// Whether a message on a channel is an echo (a wake-up is `1` or a grant, `g…`).
    fn is_echo(message: &[u8]) -> bool {
        message.first() == Some(&b'e')
    }

    fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Publishes an echo on `channel` (in the background: the subscriber goes on reading its
    /// pushes meanwhile) and expects it back within [`ECHO_WITHIN`]. An echo that could not be
    /// sent does not come back either.
    ///
    /// It goes out on the `Locker`'s command connection, not the subscriber's: the route does
    /// not matter (only the slot's master runs it), and that connection is replaced when it
    /// keeps failing, as a connection that sent to a master that died may (see `LazyCluster`).
    /// The subscriber's connection sends no keyed write, as before.
    fn send(&mut self, commands: &LazyCluster, channel: &str, timeout: Duration) {
        self.sent += 1;
        let n = self.sent;
        self.pending
            .insert(channel.to_owned(), (n, Instant::now() + ECHO_WITHIN));
        let message = format!("e{:x}:{n}", self.me);
        let mut call = redis::cmd("EVAL");
        call.arg(ECHO.text()).arg(1).arg(channel).arg(message);
        let mut c = commands.clone();
        tokio::spawn(async move {
            let sent = tokio::time::timeout(timeout, call.query_async::<i64>(&mut c)).await;
            if !matches!(sent, Ok(Ok(_))) {
                tracing::debug!("dlock subscriber: a subscription's echo could not be sent");
            }
        });
    }

    /// An echo came back on `channel`: if it is the one expected, the subscription is proved.
    fn heard(&mut self, channel: &str, message: &[u8]) {
        let Some(&(n, _)) = self.pending.get(channel) else {
            return;
        };
        if message == format!("e{:x}:{n}", self.me).as_bytes() {
            self.pending.remove(channel);
        }
    }

    /// No echo is expected on `channel` any more: it was dropped, or nobody watches it.
    fn forget(&mut self, channel: &str) {
        self.pending.remove(channel);
    }

    fn forget_all(&mut self) {
        self.pending.clear();
    }

    /// When the next echo is due back.
    fn due(&self) -> Instant {
        (self.pending.values().map(|(_, at)| *at).min()).unwrap_or_else(Instant::now)
    }

    /// The channels whose echo is overdue; they are no longer expected.
    fn overdue(&mut self) -> Vec<String> {
        let now = Instant::now();
        let late: Vec<String> = (self.pending.iter())
            .filter(|(_, (_, at))| *at <= now)
            .map(|(channel, _)| channel.clone())
            .collect();
        for channel in &late {
            self.pending.remove(channel);
        }
        late
    }
}
