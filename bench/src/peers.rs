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

impl Held {
    /// The fencing token, for the libraries that give one.
    pub(crate) fn fence(&self) -> Option<u64> {
        match self {
            Held::Dlock(guard) => Some(guard.fencing_token().get()),
            Held::Raw { .. } | Held::Rslock(_) => None,
        }
    }
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

/// How long any one acquisition may wait before it counts as an error.
const ACQUIRE_BOUND: Duration = Duration::from_secs(60);

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

    /// Acquires `name`, waiting as long as it takes (up to a minute, then it is an error).
    pub(crate) async fn acquire(&self, name: &str) -> Result<Held, String> {
        match self {
            Client::Dlock(locker) => locker
                .lock(name)
                .wait(ACQUIRE_BOUND)
                .await
                .map(Held::Dlock)
                .map_err(|e| format!("dlock acquire: {e}")),
            Client::Raw(raw) => {
                let token = format!("{:032x}", rand_u128());
                let key = format!("raw:{name}");
                let mut con = raw.con.clone();
                let deadline = tokio::time::Instant::now() + ACQUIRE_BOUND;
                loop {
                    let set: Option<String> = redis::cmd("SET")
                        .arg(&key)
                        .arg(&token)
                        .arg("NX")
                        .arg("PX")
                        .arg(30_000)
                        .query_async(&mut con)
                        .await
                        .map_err(|e| format!("raw SET: {e}"))?;
                    if set.is_some() {
                        return Ok(Held::Raw { key, token });
                    }
                    if tokio::time::Instant::now() >= deadline {
                        return Err("raw acquire: timed out".to_owned());
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
            Client::Rslock(manager) => {
                let resource = format!("rslock:{name}");
                let acquiring =
                    manager.acquire_no_guard(resource.as_bytes(), Duration::from_secs(30));
                match tokio::time::timeout(ACQUIRE_BOUND, acquiring).await {
                    Ok(Ok(lock)) => Ok(Held::Rslock(lock)),
                    Ok(Err(e)) => Err(format!("rslock acquire: {e:?}")),
                    Err(_) => Err("rslock acquire: timed out".to_owned()),
                }
            }
        }
    }

    /// Releases `held`; an error if the library says the lock was no longer ours.
    pub(crate) async fn release(&self, held: Held) -> Result<(), String> {
        match (self, held) {
            (Client::Dlock(_), Held::Dlock(guard)) => {
                let outcome = guard.release().await;
                if outcome.is_released() {
                    Ok(())
                } else {
                    Err(format!("dlock release: {outcome:?}"))
                }
            }
            (Client::Raw(raw), Held::Raw { key, token }) => {
                let mut con = raw.con.clone();
                let deleted: i64 = raw
                    .release
                    .key(&key)
                    .arg(&token)
                    .invoke_async(&mut con)
                    .await
                    .map_err(|e| format!("raw release: {e}"))?;
                if deleted == 1 {
                    Ok(())
                } else {
                    Err("raw release: the lock had another owner".to_owned())
                }
            }
            // rslock's unlock is best effort and says nothing.
            (Client::Rslock(manager), Held::Rslock(lock)) => {
                manager.unlock(&lock).await;
                Ok(())
            }
            _ => Err("a lock released through another library".to_owned()),
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
