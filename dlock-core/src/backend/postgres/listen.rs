//! Wake-ups on PostgreSQL: one connection per `Locker` that `LISTEN`s on dlock's channel, and
//! feeds every notification to the waiters of the name it carries.
//!
//! A release notifies the channel [`CHANNEL`] with the name's wake-up channel as the payload;
//! every listening `Locker` receives it, and wakes the name's waiters if it has any. One
//! channel for every name: a `LISTEN` per name would be a round trip per first waiter, and a
//! notification costs a listener that has nobody waiting one map lookup.
//!
//! While the listener is down (before it first connects, after its connection drops) its
//! channels are unconfirmed, so waiters poll; once it is back, every waiter is woken to attempt
//! again: a release notified in between was not heard.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};

use crate::backend::wait::Slots;

/// The channel releases notify and listeners listen on.
pub(crate) const CHANNEL: &str = "dlock_released";

/// Between attempts to connect the listener again.
const BACKOFF: Duration = Duration::from_millis(100);

/// The listener task's state, shared with its backend; the task ends when this goes.
#[derive(Debug, Default)]
pub(crate) struct Listening {
    /// Whether the listener is connected and listening now.
    up: AtomicBool,
    /// The task, once started (with the first wait).
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Drop for Listening {
    fn drop(&mut self) {
        if let Some(task) = self.task.get_mut().ok().and_then(Option::take) {
            task.abort();
        }
    }
}

impl Listening {
    /// Whether the listener is connected and listening.
    pub(crate) fn is_up(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    /// Starts the task on the current runtime, once: it connects with `options` and wakes the
    /// waiters of `slots` until the backend that owns `this` is gone.
    /// A task whose runtime shut down is started again on the current one.
    pub(crate) fn start(this: &Arc<Self>, options: &PgConnectOptions, slots: &Arc<Slots>) {
        let mut task = this.task.lock().unwrap_or_else(|e| e.into_inner());
        if task.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        *task = Some(runtime.spawn(run(
            Arc::downgrade(this),
            options.clone(),
            Arc::downgrade(slots),
        )));
    }
}

/// Listens until the backend is dropped (its `Listening` and `Slots` go with it).
async fn run(state: Weak<Listening>, options: PgConnectOptions, slots: Weak<Slots>) {
    // A pool of one connection, which `PgListener` uses to connect again after a drop.
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .min_connections(0)
        .idle_timeout(None)
        .max_lifetime(None)
        .connect_lazy_with(options);
    loop {
        let Some(state_now) = state.upgrade() else {
            return;
        };
        drop(state_now);
        let listener = async {
            let mut listener = PgListener::connect_with(&pool).await?;
            listener.ignore_pool_close_event(true);
            listener.listen(CHANNEL).await?;
            Ok::<_, sqlx::Error>(listener)
        };
        let mut listener = match listener.await {
            Ok(listener) => listener,
            Err(err) => {
                tracing::debug!(error = %err, "dlock: the postgres listener cannot connect");
                tokio::time::sleep(BACKOFF).await;
                continue;
            }
        };
        // Listening: whatever was released before went unheard, so every waiter attempts.
        if !set_up(&state, &slots, true) {
            return;
        }
        loop {
            match listener.try_recv().await {
                Ok(Some(notification)) => {
                    let Some(slots) = slots.upgrade() else {
                        return;
                    };
                    slots.wake_with(notification.payload(), None);
                }
                // The connection dropped and was made again, listening as before: what was
                // notified meanwhile went unheard.
                Ok(None) => {
                    if !set_up(&state, &slots, true) {
                        return;
                    }
                }
                Err(err) => {
                    tracing::debug!(error = %err, "dlock: the postgres listener failed");
                    if !set_up(&state, &slots, false) {
                        return;
                    }
                    break;
                }
            }
        }
        tokio::time::sleep(BACKOFF).await;
    }
}

/// Says whether the listener is `up`, confirms (or not) every channel, and wakes every waiter;
/// `false` once the backend is gone.
fn set_up(state: &Weak<Listening>, slots: &Weak<Slots>, up: bool) -> bool {
    let (Some(state), Some(slots)) = (state.upgrade(), slots.upgrade()) else {
        return false;
    };
    state.up.store(up, Ordering::Release);
    slots.set_all_confirmed(up);
    slots.wake_all();
    true
}
