//! The libraries under test behind one small interface.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::{LockGuard, Locker};
use redis::aio::MultiplexedConnection;

/// A library, as configured for a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lib {
    Dlock,
    Raw,
    RslockDefault,
    Rslock2ms,
}

impl Lib {
    pub(crate) const ALL: [Lib; 4] = [Lib::Dlock, Lib::Raw, Lib::RslockDefault, Lib::Rslock2ms];

    pub(crate) fn label(self) -> &'static str {
        match self {
            Lib::Dlock => "dlock",
            Lib::Raw => "raw",
            Lib::RslockDefault => "rslock",
            Lib::Rslock2ms => "rslock-2ms",
        }
    }
}

/// One client of a library (one `Locker`, one connection, one lock manager).
#[derive(Clone)]
pub(crate) enum Client {
    Dlock(Locker),
    Raw(Raw),
    Rslock(Arc<rslock::LockManager>),
}

/// A held lock.
pub(crate) enum Held {
    Dlock(LockGuard),
    Raw { key: String, token: String },
    Rslock(rslock::Lock),
}

/// The minimal correct protocol: `SET NX PX`, compare-and-delete by script, 1 ms between tries.
#[derive(Clone)]
pub(crate) struct Raw {
    con: MultiplexedConnection,
    release: Arc<redis::Script>,
}

const RAW_RELEASE: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"#;

impl Client {
    pub(crate) async fn new(lib: Lib, url: &str) -> Client {
        match lib {
            Lib::Dlock => Client::Dlock(Locker::connect(url).await.expect("dlock connects")),
            Lib::Raw => {
                let con = redis::Client::open(url)
                    .expect("url")
                    .get_multiplexed_async_connection()
                    .await
                    .expect("raw connects");
                Client::Raw(Raw {
                    con,
                    release: Arc::new(redis::Script::new(RAW_RELEASE)),
                })
            }
            Lib::RslockDefault => Client::Rslock(Arc::new(rslock::LockManager::new(vec![url]))),
            Lib::Rslock2ms => {
                let mut manager = rslock::LockManager::new(vec![url]);
                manager.set_retry(3, Duration::from_millis(2));
                Client::Rslock(Arc::new(manager))
            }
        }
    }

    /// Acquires `name`, waiting as long as it takes.
    pub(crate) async fn acquire(&self, name: &str) -> Held {
        match self {
            Client::Dlock(locker) => Held::Dlock(
                locker
                    .lock(name)
                    .wait(Duration::from_secs(3600))
                    .await
                    .expect("dlock acquires"),
            ),
            Client::Raw(raw) => {
                let token = format!("{:032x}", rand_u128());
                let key = format!("raw:{name}");
                let mut con = raw.con.clone();
                loop {
                    let set: Option<String> = redis::cmd("SET")
                        .arg(&key)
                        .arg(&token)
                        .arg("NX")
                        .arg("PX")
                        .arg(30_000)
                        .query_async(&mut con)
                        .await
                        .expect("SET");
                    if set.is_some() {
                        return Held::Raw { key, token };
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
            Client::Rslock(manager) => Held::Rslock(
                manager
                    .acquire_no_guard(format!("rslock:{name}").as_bytes(), Duration::from_secs(30))
                    .await
                    .expect("rslock acquires"),
            ),
        }
    }

    /// Releases `held`.
    pub(crate) async fn release(&self, held: Held) {
        match (self, held) {
            (Client::Dlock(_), Held::Dlock(guard)) => {
                let outcome = guard.release().await;
                assert!(outcome.is_released(), "dlock release: {outcome:?}");
            }
            (Client::Raw(raw), Held::Raw { key, token }) => {
                let mut con = raw.con.clone();
                let deleted: i64 = raw
                    .release
                    .key(&key)
                    .arg(&token)
                    .invoke_async(&mut con)
                    .await
                    .expect("raw release");
                assert_eq!(deleted, 1, "raw release found another owner");
            }
            (Client::Rslock(manager), Held::Rslock(lock)) => manager.unlock(&lock).await,
            _ => unreachable!("a lock released through another library"),
        }
    }
}

/// A random token without pulling in a RNG crate: the std hasher's random keys.
pub(crate) fn rand_u128() -> u128 {
    use std::hash::{BuildHasher, Hasher};
    let a = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(a);
    (u128::from(a) << 64) | u128::from(h.finish())
}
