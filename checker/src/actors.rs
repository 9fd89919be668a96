//! The lockers a run drives: over a URL, through the cutting proxy, over a bb8 pool, over one
//! multiplexed connection, with a tiny command timeout, built on a runtime that is gone; or
//! several over one memory store.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_core::{Locker, LockerBuilder, MemoryStore};

use super::history::locked;

/// One locker of the run, as the workers see it: a label, its settings, and the current
/// `Locker` (replaced when its connection can't come back, e.g. a multiplexed connection after
/// a restart) plus every one it ever was.
#[derive(Debug)]
pub(crate) struct Actor {
    pub(crate) label: String,
    /// The command timeout (zero for the memory backend: no commands).
    pub(crate) command_timeout: Duration,
    /// The locker's watchdog lease.
    pub(crate) watchdog_lease: Duration,
    /// Whether its commands are meant to time out (a tiny command timeout).
    pub(crate) tiny: bool,
    /// Whether its waiters poll, having no subscriber (a `Locker` over a cluster connection).
    pub(crate) polls: bool,
    /// Whether what it sends reaches the server late (a proxy delays it): a process farther
    /// away than the others, whose waiters join a fair line later than their calls say.
    pub(crate) far: bool,
    current: Mutex<Locker>,
    all: Mutex<Vec<Locker>>,
}

impl Actor {
    pub(crate) fn new(
        label: &str,
        command_timeout: Duration,
        watchdog_lease: Duration,
        l: Locker,
    ) -> Self {
        Self {
            label: label.to_owned(),
            command_timeout,
            watchdog_lease,
            tiny: false,
            far: false,
            polls: false,
            current: Mutex::new(l.clone()),
            all: Mutex::new(vec![l]),
        }
    }

    /// The current locker.
    pub(crate) fn locker(&self) -> Locker {
        locked(&self.current).clone()
    }

    /// Whether any locker it had ran layout 1's frozen scripts.
    pub(crate) fn ran_frozen_layout(&self) -> bool {
        self.locker().runs_frozen_layout()
            || locked(&self.all).iter().any(Locker::runs_frozen_layout)
    }

    /// Replaces the current locker (the old one stays on the list, for the final checks).
    pub(crate) fn replace(&self, l: Locker) {
        locked(&self.all).push(l.clone());
        *locked(&self.current) = l;
    }

    /// Every locker this actor ever was.
    pub(crate) fn generations(&self) -> Vec<Locker> {
        locked(&self.all).clone()
    }
}

/// The settings every Redis locker of a run shares.
#[derive(Debug, Clone)]
pub(crate) struct RedisSetup {
    pub(crate) url: String,
    pub(crate) proxy_url: String,
    /// A proxy that delays what is sent through it, for a locker farther away (none against a
    /// server the run does not own).
    pub(crate) far_url: Option<String>,
    pub(crate) prefix: String,
    pub(crate) watchdog_lease: Duration,
    pub(crate) command_timeout: Duration,
    pub(crate) tiny_timeout: Duration,
    pub(crate) fence_ttl: Option<Duration>,
    /// How long a fair lock's waiter keeps its place without an attempt.
    pub(crate) dead_waiter_timeout: Duration,
    /// Every other locker built runs layout 1's frozen scripts (see `Config::mixed_layouts`).
    pub(crate) mixed_layouts: bool,
    /// How many lockers were built so far.
    pub(crate) built: Arc<AtomicUsize>,
}

impl RedisSetup {
    fn builder(&self, command_timeout: Duration) -> LockerBuilder {
        let builder = Locker::builder()
            .prefix(self.prefix.clone())
            .default_lease(dlock_core::Lease::watchdog(self.watchdog_lease))
            .dead_waiter_timeout(self.dead_waiter_timeout)
            .fence_ttl(self.fence_ttl)
            .command_timeout(command_timeout)
            .connect_timeout(self.command_timeout.max(Duration::from_millis(200)));
        let nth = self.built.fetch_add(1, Ordering::Relaxed);
        let builder = builder.clock_apart(clock_apart(nth));
        with_layout(builder, self.mixed_layouts && nth.is_multiple_of(2))
    }

    fn client(&self) -> dlock_core::redis::Client {
        dlock_core::redis::Client::open(self.url.as_str()).expect("a valid redis url")
    }

    /// A locker over one fresh multiplexed connection (it never reconnects by itself).
    pub(crate) async fn multiplexed(&self) -> Result<Locker, String> {
        let conn = self
            .client()
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| format!("multiplexed connection: {e}"))?;
        self.builder(self.command_timeout)
            .multiplexed(conn)
            .subscriber(self.client())
            .build()
            .await
            .map_err(|e| format!("multiplexed locker: {e}"))
    }

    /// A locker built (and used once: a watchdog lock, a wait on it) inside a temporary runtime
    /// on its own thread; the runtime is gone before the locker is handed back.
    fn second_runtime(&self, warm_up_name: &str) -> Locker {
        let setup = self.clone();
        let name = warm_up_name.to_owned();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a temporary runtime");
            let locker = rt.block_on(async {
                let locker = setup
                    .builder(setup.command_timeout)
                    .url(setup.url.clone())
                    .build()
                    .await
                    .expect("the second-runtime locker connects");
                let held = locker
                    .lock(name.as_str())
                    .await
                    .expect("the warm-up lock is free");
                let waited = locker
                    .lock(name.as_str())
                    .wait(Duration::from_millis(20))
                    .await;
                assert!(
                    waited.as_ref().is_err_and(dlock_core::LockError::is_busy),
                    "the warm-up wait times out: {waited:?}"
                );
                assert!(held.release().await.is_released());
                locker
            });
            drop(rt);
            locker
        })
        .join()
        .expect("the second-runtime thread")
    }

    /// Every Redis actor.
    pub(crate) async fn actors(&self, warm_up_name: &str) -> Vec<Actor> {
        let ct = self.command_timeout;
        let lease = self.watchdog_lease;
        let url = self
            .builder(ct)
            .url(self.url.clone())
            .build()
            .await
            .expect("the url locker connects");
        let proxied = self
            .builder(ct)
            .url(self.proxy_url.clone())
            .build()
            .await
            .expect("the proxied locker connects");
        let manager = bb8_redis::RedisConnectionManager::new(self.url.as_str())
            .expect("a bb8 connection manager");
        let pool = bb8::Pool::builder()
            .max_size(8)
            .connection_timeout(ct.max(Duration::from_millis(200)))
            .build(manager)
            .await
            .expect("a bb8 pool");
        let pooled = self
            .builder(ct)
            .bb8_pool(pool)
            .subscriber(self.client())
            .build()
            .await
            .expect("the pooled locker");
        let deadpool = deadpool_redis::Config::from_url(self.url.as_str())
            .builder()
            .expect("a deadpool config")
            .max_size(8)
            .wait_timeout(Some(ct.max(Duration::from_millis(200))))
            .runtime(deadpool_redis::Runtime::Tokio1)
            .build()
            .expect("a deadpool pool");
        let deadpooled = self
            .builder(ct)
            .deadpool(deadpool)
            .subscriber(self.client())
            .build()
            .await
            .expect("the deadpool locker");
        // The application's own connection manager, as an axum state would hold it.
        let app_manager = dlock_core::redis::aio::ConnectionManager::new(self.client())
            .await
            .expect("an application connection manager");
        let managed = self
            .builder(ct)
            .connection_manager(app_manager)
            .subscriber(self.client())
            .build()
            .await
            .expect("the connection-manager locker");
        // Built without connecting: its first command opens the connection, under whatever fault
        // the plan has injected by then.
        let lazy = self
            .builder(ct)
            .url(self.url.clone())
            .connect_lazily(true)
            .build()
            .await
            .expect("the lazy locker builds");
        let multiplexed = self.multiplexed().await.expect("the multiplexed locker");
        let tiny = self
            .builder(self.tiny_timeout)
            .url(self.url.clone())
            .build()
            .await
            .expect("the tiny-timeout locker connects");
        let second = self.second_runtime(warm_up_name);
        let mut tiny = Actor::new("tiny-timeout", self.tiny_timeout, lease, tiny);
        tiny.tiny = true;
        let mut far = None;
        if let Some(url) = &self.far_url {
            let l =
                (self.builder(ct).url(url.clone()).build().await).expect("the far locker connects");
            let mut actor = Actor::new("far", ct, lease, l);
            actor.far = true;
            far = Some(actor);
        }
        let mut actors = vec![
            Actor::new("url", ct, lease, url),
            Actor::new("proxy", ct, lease, proxied),
            Actor::new("bb8-pool", ct, lease, pooled),
            Actor::new("multiplexed", ct, lease, multiplexed),
            tiny,
            Actor::new("2nd-runtime", ct, lease, second),
            Actor::new("deadpool", ct, lease, deadpooled),
            Actor::new("app-manager", ct, lease, managed),
            Actor::new("lazy", ct, lease, lazy),
        ];
        actors.extend(far);
        actors
    }
}

/// How far the `nth` locker of a run has the clock of its claims to the next turn set apart
/// from the machine's, ms (`LockerBuilder::clock_apart`), as on hosts whose clocks disagree:
/// most agree, one is a little ahead and one a little behind, and two are seconds off either
/// way. A release reads a claim's age against the locker's clock: the claims of one far behind
/// always look old (the lock is kept for it, and its next attempt takes it), those of one far
/// ahead always fresh (granted). Neither may change what any locker believes it holds.
pub(crate) fn clock_apart(nth: usize) -> i64 {
    const APART_MS: [i64; 6] = [0, 20, -20, 5_000, 0, -5_000];
    APART_MS[nth % APART_MS.len()]
}

/// `builder`, on layout 1's frozen scripts if `layout_1`.
fn with_layout(builder: LockerBuilder, layout_1: bool) -> LockerBuilder {
    match layout_1 {
        true => builder.frozen_layout(crate::layouts::layout_1()),
        false => builder,
    }
}

/// The index of the multiplexed actor in [`RedisSetup::actors`].
pub(crate) const MULTIPLEXED: usize = 3;

/// `count` lockers over clones of one memory store, with this watchdog lease and dead-waiter
/// timeout.
pub(crate) async fn memory_actors(
    store: &MemoryStore,
    prefix: &str,
    (watchdog_lease, dead_waiter_timeout): (Duration, Duration),
    count: u8,
    mixed_layouts: bool,
) -> Vec<Actor> {
    let mut actors = Vec::new();
    for i in 0..count {
        let builder = Locker::builder()
            .memory(store.clone())
            .prefix(prefix)
            .default_lease(dlock_core::Lease::watchdog(watchdog_lease))
            .dead_waiter_timeout(dead_waiter_timeout)
            .clock_apart(clock_apart(usize::from(i)));
        let l = with_layout(builder, mixed_layouts && i.is_multiple_of(2))
            .build()
            .await
            .expect("a memory locker");
        actors.push(Actor::new(
            &format!("memory-{i}"),
            Duration::ZERO,
            watchdog_lease,
            l,
        ));
    }
    actors
}
