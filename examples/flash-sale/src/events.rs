//! The event stream (`GET /api/events`): the catalog, and a user's cart and orders, pushed when
//! they change — whichever instance changed them.
//!
//! One task per instance watches the database with a cheap query every [`POLL_INTERVAL`]
//! (counts and stock sums of the catalog; the versions of the users someone listens for) and
//! tells every subscriber of the instance through a `watch` (the catalog) and a `broadcast`
//! (which users changed). Subscribers don't poll. The same task writes the instance's request
//! counters.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::Stream;
use serde::{Deserialize, Serialize};
use sqlx::{AnyPool, Row as _};
use tokio::sync::{broadcast, watch};

use crate::model::{Sku, Voucher};
use crate::{App, AppError, Counters};

/// How often each instance looks for changes.
pub const POLL_INTERVAL: Duration = Duration::from_millis(300);

/// How often an idle stream sends a keep-alive comment.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// The data of `event: catalog`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Catalog {
    /// Every voucher.
    pub vouchers: Vec<Voucher>,
    /// Every SKU.
    pub skus: Vec<Sku>,
}

/// Which of a user's things changed.
#[derive(Debug, Clone, Copy)]
struct UserChange {
    user: i64,
    cart: bool,
    orders: bool,
}

/// The instance's change watcher, shared by its subscribers.
#[derive(Debug, Clone)]
pub(crate) struct Events {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    catalog: watch::Sender<u64>,
    users: broadcast::Sender<UserChange>,
    /// Users someone listens for, with how many listen.
    watched: Mutex<HashMap<i64, usize>>,
}

impl Shared {
    fn watched(&self) -> std::sync::MutexGuard<'_, HashMap<i64, usize>> {
        self.watched.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One subscriber's interest in a user; withdrawn on drop.
struct Listening {
    shared: Arc<Shared>,
    user: i64,
}

impl Drop for Listening {
    fn drop(&mut self) {
        let mut watched = self.shared.watched();
        if let Some(n) = watched.get_mut(&self.user) {
            *n -= 1;
            if *n == 0 {
                watched.remove(&self.user);
            }
        }
    }
}

impl Events {
    /// Starts the instance's watcher on the current runtime; it ends once every clone of the
    /// returned value is gone.
    pub(crate) fn start(db: AnyPool, counters: Arc<Counters>) -> Self {
        let (catalog, _) = watch::channel(0);
        let (users, _) = broadcast::channel(1024);
        let shared = Arc::new(Shared {
            catalog,
            users,
            watched: Mutex::new(HashMap::new()),
        });
        tokio::spawn(watch_database(db, counters, Arc::downgrade(&shared)));
        Self { shared }
    }

    fn listen(&self, user: i64) -> Listening {
        *self.shared.watched().entry(user).or_default() += 1;
        Listening {
            shared: self.shared.clone(),
            user,
        }
    }
}

/// The catalog's fingerprint: counts and stock sums change with every order, checkout and
/// creation.
async fn fingerprint(db: &AnyPool) -> Result<[i64; 4], sqlx::Error> {
    let row = sqlx::query(
        "SELECT (SELECT COUNT(*) FROM vouchers) AS vouchers,
                (SELECT CAST(COALESCE(SUM(stock), 0) AS BIGINT) FROM vouchers) AS voucher_stock,
                (SELECT COUNT(*) FROM skus) AS skus,
                (SELECT CAST(COALESCE(SUM(stock), 0) AS BIGINT) FROM skus) AS sku_stock",
    )
    .fetch_one(db)
    .await?;
    Ok([
        row.try_get("vouchers")?,
        row.try_get("voucher_stock")?,
        row.try_get("skus")?,
        row.try_get("sku_stock")?,
    ])
}

/// The versions of `users`' carts and orders.
async fn versions(db: &AnyPool, users: &[i64]) -> Result<HashMap<i64, (i64, i64)>, sqlx::Error> {
    let mut out = HashMap::new();
    for chunk in users.chunks(500) {
        let placeholders: Vec<String> = (1..=chunk.len()).map(|i| format!("${i}")).collect();
        let sql = format!(
            "SELECT id, cart_version, orders_version FROM users WHERE id IN ({})",
            placeholders.join(", ")
        );
        let mut query = sqlx::query(&sql);
        for user in chunk {
            query = query.bind(*user);
        }
        for row in query.fetch_all(db).await? {
            out.insert(
                row.try_get("id")?,
                (row.try_get("cart_version")?, row.try_get("orders_version")?),
            );
        }
    }
    Ok(out)
}

async fn watch_database(db: AnyPool, counters: Arc<Counters>, shared: Weak<Shared>) {
    let mut ticker = tokio::time::interval(POLL_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_catalog = None;
    let mut last_users: HashMap<i64, (i64, i64)> = HashMap::new();
    let mut failing = false;
    loop {
        ticker.tick().await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let watched: Vec<i64> = shared.watched().keys().copied().collect();
        let round = async {
            counters.flush(&db).await?;
            let catalog = fingerprint(&db).await?;
            let users = if watched.is_empty() {
                HashMap::new()
            } else {
                versions(&db, &watched).await?
            };
            Ok::<_, sqlx::Error>((catalog, users))
        };
        match round.await {
            Ok((catalog, users)) => {
                if failing {
                    tracing::info!("change watcher: the database answers again");
                    failing = false;
                }
                if last_catalog != Some(catalog) {
                    last_catalog = Some(catalog);
                    shared.catalog.send_modify(|n| *n = n.wrapping_add(1));
                }
                for (user, now) in &users {
                    // A user seen for the first time counts as changed: its subscriber may
                    // have read it just before the change that this round sees.
                    let before = last_users.get(user).copied();
                    let change = UserChange {
                        user: *user,
                        cart: before.is_none_or(|b| b.0 != now.0),
                        orders: before.is_none_or(|b| b.1 != now.1),
                    };
                    if change.cart || change.orders {
                        let _ = shared.users.send(change);
                    }
                }
                last_users = users;
            }
            Err(err) => {
                if !failing {
                    tracing::warn!(error = %err, "change watcher: the database failed");
                    failing = true;
                }
            }
        }
    }
}

/// What one subscriber gets.
struct Subscriber {
    app: App,
    user: Option<i64>,
    catalog: watch::Receiver<u64>,
    users: broadcast::Receiver<UserChange>,
    queue: VecDeque<Event>,
    _listening: Option<Listening>,
}

fn event<T: Serialize>(name: &str, data: &T) -> Option<Event> {
    match Event::default().event(name).json_data(data) {
        Ok(event) => Some(event),
        Err(err) => {
            tracing::error!(error = %err, name, "event not serialized");
            None
        }
    }
}

impl Subscriber {
    async fn push_catalog(&mut self) -> Result<(), AppError> {
        let catalog = Catalog {
            vouchers: self.app.vouchers().await?,
            skus: self.app.skus().await?,
        };
        self.queue.extend(event("catalog", &catalog));
        Ok(())
    }

    async fn push_user(&mut self, cart: bool, orders: bool) -> Result<(), AppError> {
        let Some(user) = self.user else {
            return Ok(());
        };
        if cart {
            let cart = self.app.cart(user).await?;
            self.queue.extend(event("cart", &cart));
        }
        if orders {
            let orders = self.app.orders_of(user).await?;
            self.queue.extend(event("orders", &orders));
        }
        Ok(())
    }

    /// Waits for the next change and queues its events; `false` when the instance is going
    /// away.
    async fn next_change(&mut self) -> bool {
        let pushed = tokio::select! {
            changed = self.catalog.changed() => {
                if changed.is_err() {
                    return false;
                }
                self.catalog.borrow_and_update();
                self.push_catalog().await
            }
            change = self.users.recv(), if self.user.is_some() => match change {
                Ok(change) if Some(change.user) == self.user => {
                    self.push_user(change.cart, change.orders).await
                }
                Ok(_) => Ok(()),
                // Missed some: send both.
                Err(broadcast::error::RecvError::Lagged(_)) => self.push_user(true, true).await,
                Err(broadcast::error::RecvError::Closed) => return false,
            },
        };
        if let Err(err) = pushed {
            // Logged by the error's rendering; the next change tries again.
            let _ = axum::response::IntoResponse::into_response(err);
        }
        true
    }
}

/// The stream for `user` (or the catalog only): the current state first, then every change.
pub(crate) async fn stream(
    app: App,
    user: Option<i64>,
    ends: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, AppError> {
    if let Some(user) = user {
        app.user(user).await?;
    }
    let shared = app.events.shared.clone();
    let mut catalog = shared.catalog.subscribe();
    catalog.borrow_and_update();
    let mut subscriber = Subscriber {
        users: shared.users.subscribe(),
        _listening: user.map(|user| app.events.listen(user)),
        app,
        user,
        catalog,
        queue: VecDeque::new(),
    };
    // The state now, read after subscribing: a change from here on is sent again.
    subscriber.push_catalog().await?;
    subscriber.push_user(true, true).await?;
    let stream = futures_util::stream::unfold(subscriber, |mut sub| async move {
        loop {
            if let Some(event) = sub.queue.pop_front() {
                return Some((Ok(event), sub));
            }
            if !sub.next_change().await {
                return None;
            }
        }
    });
    let stream = futures_util::StreamExt::take_until(stream, ends);
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(KEEP_ALIVE)))
}
