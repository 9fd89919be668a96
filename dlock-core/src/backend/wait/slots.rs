//! The watched channels of one backend: a [`Slot`] per channel, shared by its watchers, and the
//! [`Watch`] each waiter holds. A channel's subscription is asked for when its first watcher
//! arrives; it goes a short while ([`LINGER`]) after the last one leaves, unless a new watcher
//! came meanwhile.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{Notify, mpsc};

use super::SubCmd;

/// How long a Redis subscription stays after its last watcher left: a name waited on again
/// within it needs no new `SUBSCRIBE` (and its waiter no round trip for one). Short: each
/// lingering subscription is one more channel the subscriber hears every wake-up of, and
/// subscribes again after a reconnection. Nothing counts it as a waiter: whether another
/// `Locker` waits for a name is read from its hold (`HANDOFF`), not from its subscribers.
pub(crate) const LINGER: Duration = Duration::from_millis(100);

/// At most this many subscriptions linger at once; past it, the last watcher to leave a channel
/// unsubscribes at once.
const MAX_LINGERING: usize = 256;

/// The watched channels of one backend.
#[derive(Debug, Default)]
pub(crate) struct Slots {
    map: Mutex<HashMap<String, SlotEntry>>,
    /// How many entries of `map` have no watcher (they linger).
    lingering: std::sync::atomic::AtomicUsize,
}

#[derive(Debug)]
struct SlotEntry {
    slot: Arc<Slot>,
    refs: usize,
    /// Since when it has had no watcher (it lingers), if it has none.
    idle_since: Option<tokio::time::Instant>,
}

/// What the departure of a watcher left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Left {
    /// Other watchers.
    Others,
    /// Nobody: the channel is gone from the map (its subscription goes now).
    Last,
    /// Nobody, and the channel lingers (see [`LINGER`]).
    Lingers,
}

#[derive(Debug, Default)]
pub(crate) struct Slot {
    notify: Notify,
    confirmed: AtomicBool,
    /// The last grant a wake-up announced on the channel (see [`Granted`]), until its head
    /// waiter takes it.
    granted: Mutex<Option<Granted>>,
    /// The channel's wake-ups so far.
    wakes: Mutex<Wakes>,
}

/// How many wake-ups a channel has had, and what the last one announced.
#[derive(Debug, Default)]
struct Wakes {
    count: u64,
    /// The grant the last wake-up announced: its fencing token and the hand-over token it
    /// went to (`None`: it announced none).
    last_grant: Option<(u64, Box<str>)>,
}

impl Slot {
    /// Counts a wake-up, which announced `granted` (if anything).
    fn woken(&self, granted: Option<&Granted>) {
        let mut wakes = self.wakes.lock().unwrap_or_else(|e| e.into_inner());
        wakes.count += 1;
        wakes.last_grant = granted.map(|g| (g.fence, g.token.clone()));
    }
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

    /// Adds one watcher; returns the slot and whether it is the first (a lingering channel
    /// comes back as it was, subscribed).
    fn register(&self, channel: &str) -> (Arc<Slot>, bool) {
        let mut map = self.lock();
        match map.get_mut(channel) {
            Some(entry) => {
                entry.refs += 1;
                if entry.idle_since.take().is_some() {
                    self.lingering.fetch_sub(1, Ordering::Relaxed);
                }
                (entry.slot.clone(), false)
            }
            None => {
                let slot = Arc::new(Slot::default());
                map.insert(
                    channel.to_owned(),
                    SlotEntry {
                        slot: slot.clone(),
                        refs: 1,
                        idle_since: None,
                    },
                );
                (slot, true)
            }
        }
    }

    /// Removes one watcher. The last one's channel lingers if `linger` and fewer than
    /// [`MAX_LINGERING`] do; otherwise it goes.
    fn unregister(&self, channel: &str, linger: bool) -> Left {
        let mut map = self.lock();
        let Some(entry) = map.get_mut(channel) else {
            return Left::Others;
        };
        entry.refs = entry.refs.saturating_sub(1);
        if entry.refs > 0 {
            return Left::Others;
        }
        if linger && self.lingering.load(Ordering::Relaxed) < MAX_LINGERING {
            if entry.idle_since.is_none() {
                self.lingering.fetch_add(1, Ordering::Relaxed);
            }
            entry.idle_since = Some(tokio::time::Instant::now());
            return Left::Lingers;
        }
        if map.remove(channel).is_some_and(|e| e.idle_since.is_some()) {
            self.lingering.fetch_sub(1, Ordering::Relaxed);
        }
        Left::Last
    }

    /// Removes `channel` if it has lingered, with no watcher, for [`LINGER`]; returns whether it
    /// did (its subscription is to go).
    fn end_linger(&self, channel: &str) -> bool {
        let mut map = self.lock();
        let idle = map.get(channel).and_then(|e| e.idle_since);
        if idle.is_none_or(|since| since.elapsed() < LINGER) {
            return false;
        }
        map.remove(channel);
        self.lingering.fetch_sub(1, Ordering::Relaxed);
        true
    }

    pub(super) fn contains(&self, channel: &str) -> bool {
        self.lock().contains_key(channel)
    }

    /// Whether wake-ups on `channel` are heard now: it is subscribed and confirmed, for a
    /// watcher or lingering after one.
    pub(crate) fn hears(&self, channel: &str) -> bool {
        (self.lock().get(channel)).is_some_and(|e| e.slot.confirmed.load(Ordering::Acquire))
    }

    /// Wakes every watcher of `channel` with the wake-up `message` (a grant it announces is kept
    /// for the head waiter to take); returns how many watchers there were.
    pub(crate) fn wake_with(&self, channel: &str, message: Option<&[u8]>) -> usize {
        match self.lock().get(channel) {
            Some(entry) => {
                let granted = message.and_then(Granted::parse);
                entry.slot.woken(granted.as_ref());
                if let Some(granted) = granted {
                    *entry.slot.granted.lock().unwrap_or_else(|e| e.into_inner()) = Some(granted);
                }
                entry.slot.notify.notify_waiters();
                entry.refs
            }
            None => 0,
        }
    }

    pub(crate) fn wake_all(&self) {
        for entry in self.lock().values() {
            entry.slot.woken(None);
            entry.slot.notify.notify_waiters();
        }
    }

    pub(super) fn channels(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }

    pub(crate) fn set_all_confirmed(&self, confirmed: bool) {
        for entry in self.lock().values() {
            entry.slot.confirmed.store(confirmed, Ordering::Release);
        }
    }

    pub(super) fn confirm(&self, channel: &str) {
        if let Some(entry) = self.lock().get(channel) {
            entry.slot.confirmed.store(true, Ordering::Release);
        }
    }

    /// Says wake-ups on `channel` are not delivered until it is confirmed again: its waiters
    /// poll meanwhile.
    #[cfg(feature = "cluster")]
    pub(super) fn unconfirm(&self, channel: &str) {
        if let Some(entry) = self.lock().get(channel) {
            entry.slot.confirmed.store(false, Ordering::Release);
        }
    }

    /// How many channels have watchers (lingering ones left out).
    pub(crate) fn len(&self) -> usize {
        self.lock().values().filter(|e| e.refs > 0).count()
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
    /// Whether its channel lingers after the last watcher (see [`LINGER`]).
    pub(super) linger: bool,
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
                linger: unsubscribe.is_some(),
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

    /// How many wake-ups the channel has had (see
    /// [`only_granted_elsewhere`](Self::only_granted_elsewhere)).
    pub(crate) fn wakes(&self) -> u64 {
        (self.slot.wakes.lock().unwrap_or_else(|e| e.into_inner())).count
    }

    /// Whether the one wake-up since the channel had `since` of them announced a grant of the
    /// lock to a token other than `own`, with a fencing token no later than `seen`: the token
    /// of the hold the waiter's last attempt found taken. That attempt ran on the granted hold
    /// or a later one (a name's tokens only rise), and claimed the turn after it there, so the
    /// wake-up tells the waiter nothing it did not know: an attempt now would find what that one
    /// found. As when a release of the waiter's own `Locker` granted the lock to another process
    /// just before the waiter's attempt, and the wake-up came back to its subscription after.
    pub(crate) fn only_granted_elsewhere(&self, since: u64, own: &str, seen: Option<u64>) -> bool {
        let wakes = self.slot.wakes.lock().unwrap_or_else(|e| e.into_inner());
        wakes.count == since + 1
            && (wakes.last_grant.as_ref())
                .is_some_and(|(fence, token)| **token != *own && seen.is_some_and(|s| *fence <= s))
    }

    pub(crate) fn mark_confirmed(&self) {
        self.slot.confirmed.store(true, Ordering::Release);
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        // Only a Redis subscription lingers (the memory store's channels count their watchers
        // exactly: its `PUBSUB NUMSUB`), and only with a runtime for its timer.
        let runtime = tokio::runtime::Handle::try_current().ok();
        let lingers = (self.unsubscribe.clone().filter(|_| self.linger)).zip(runtime);
        match self.slots.unregister(&self.channel, lingers.is_some()) {
            Left::Others => {}
            Left::Last => {
                if let Some(tx) = &self.unsubscribe {
                    let _ = tx.send(SubCmd::Unsubscribe(std::mem::take(&mut self.channel)));
                }
            }
            Left::Lingers => {
                let Some((tx, runtime)) = lingers else {
                    return;
                };
                let (slots, channel) = (self.slots.clone(), std::mem::take(&mut self.channel));
                runtime.spawn(async move {
                    tokio::time::sleep(LINGER).await;
                    // A watcher that came meanwhile keeps it (so may one that came and left
                    // again: its own timer ends the linger).
                    if slots.end_linger(&channel) {
                        let _ = tx.send(SubCmd::Unsubscribe(channel));
                    }
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_subscription_lingers_after_its_last_watcher_and_then_goes() {
        let slots = Arc::new(Slots::default());
        let (tx, mut rx) = mpsc::unbounded_channel();
        let (watch, first) = Watch::new(slots.clone(), "n:wake", Some(tx.clone()));
        assert!(first);
        watch.mark_confirmed();
        drop(watch);
        // Still heard, no longer watched, nothing sent yet.
        assert!(slots.hears("n:wake"));
        assert_eq!(slots.len(), 0);
        assert!(rx.try_recv().is_err());
        // A watcher that comes back meanwhile finds it subscribed.
        tokio::time::sleep(LINGER / 2).await;
        let (again, first) = Watch::new(slots.clone(), "n:wake", Some(tx.clone()));
        assert!(!first);
        assert!(again.is_reliable());
        drop(again);
        // The first timer finds it idle too briefly; the second ends it.
        tokio::time::sleep(LINGER / 2 + Duration::from_millis(1)).await;
        assert!(slots.hears("n:wake"));
        tokio::time::sleep(LINGER / 2).await;
        assert!(!slots.hears("n:wake"));
        assert!(matches!(rx.try_recv(), Ok(SubCmd::Unsubscribe(c)) if c == "n:wake"));
        // A memory store's channel (no subscriber) goes with its last watcher.
        let (local, _) = Watch::new(slots.clone(), "m:wake", None);
        local.mark_confirmed();
        drop(local);
        assert!(!slots.hears("m:wake"));
    }

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
