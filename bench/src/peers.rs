//! The libraries under test behind one small interface.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::{LockGuard, Locker, MasterGuard, MasterSet, Permit, ReleaseOutcome, ReplicaAck};
use redis::aio::MultiplexedConnection;

use crate::modes::{Endpoints, Mode};

/// A library, as configured for a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lib {
    /// dlock with the primitive it holds a name with.
    Dlock(Kind),
    /// dlock's plain lock in a scale-out mode, on that mode's own servers.
    Scaled(Mode),
    Raw,
    RslockDefault,
    Rslock2ms,
    /// The raw protocol changed in one place, to see what that place costs (run only when
    /// `--libs` names it).
    Probe(Probe),
    /// dlock's plain lock with its scripts sent by `EVALSHA`, as to a server or a user without
    /// Redis functions: what calling them as functions saves (run only when `--libs` names it).
    /// Its user, which may not use functions, is made on the plain server.
    DlockEvalsha,
}

/// A change to the raw protocol, each one a step of dlock's uncontended cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Probe {
    /// The `SET NX PX` inside a script of its own.
    ScriptedAcquire,
    /// The release does what dlock's does when nobody waits: the owner check and the delete,
    /// the released owner recorded beside the key, a `PUBLISH`.
    MarkedRelease,
    /// As [`Probe::MarkedRelease`] without the `PUBLISH`: what the wake-up alone costs.
    RecordedRelease,
    /// The lock as a hash (dlock's layout), taken without a script: `MULTI`, `HSETNX` of an
    /// owner field, `PEXPIRE .. NX`, `EXEC`; released as [`Probe::MarkedRelease`] does.
    HashAcquire,
}

/// Which dlock primitive holds the name: each one that excludes every other holder, so the
/// same workloads (and their mutual-exclusion checks) apply to all of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `Locker::lock`.
    Plain,
    /// `Locker::fair_lock`: FIFO across processes.
    Fair,
    /// `Locker::read_write_lock(..).write()`.
    Write,
    /// `Locker::semaphore(.., 1)`: one permit.
    Permit,
}

impl Lib {
    pub(crate) const ALL: [Lib; 19] = [
        Lib::Dlock(Kind::Plain),
        Lib::Raw,
        Lib::RslockDefault,
        Lib::Rslock2ms,
        Lib::Dlock(Kind::Fair),
        Lib::Dlock(Kind::Write),
        Lib::Dlock(Kind::Permit),
        Lib::Scaled(Mode::Cluster),
        Lib::Scaled(Mode::ClusterUnacked),
        Lib::Scaled(Mode::Sentinel),
        Lib::Scaled(Mode::SentinelUnacked),
        Lib::Scaled(Mode::Ack),
        Lib::Scaled(Mode::Majority),
        Lib::Scaled(Mode::Postgres),
        Lib::Probe(Probe::ScriptedAcquire),
        Lib::Probe(Probe::MarkedRelease),
        Lib::Probe(Probe::RecordedRelease),
        Lib::Probe(Probe::HashAcquire),
        Lib::DlockEvalsha,
    ];

    /// The scale-out mode, for the libraries that run on servers of their own.
    pub(crate) fn mode(self) -> Option<Mode> {
        match self {
            Lib::Scaled(mode) => Some(mode),
            _ => None,
        }
    }

    pub(crate) fn label(self) -> &'static str {
        match self {
            Lib::Dlock(Kind::Plain) => "dlock",
            Lib::Dlock(Kind::Fair) => "dlock-fair",
            Lib::Dlock(Kind::Write) => "dlock-write",
            Lib::Dlock(Kind::Permit) => "dlock-permit",
            Lib::Scaled(Mode::Cluster) => "dlock-cluster",
            Lib::Scaled(Mode::ClusterUnacked) => "dlock-cluster-unacked",
            Lib::Scaled(Mode::Sentinel) => "dlock-sentinel",
            Lib::Scaled(Mode::SentinelUnacked) => "dlock-sentinel-unacked",
            Lib::Scaled(Mode::Ack) => "dlock-ack",
            Lib::Scaled(Mode::Majority) => "dlock-majority",
            Lib::Scaled(Mode::Postgres) => "dlock-postgres",
            Lib::Raw => "raw",
            Lib::RslockDefault => "rslock",
            Lib::Rslock2ms => "rslock-2ms",
            Lib::Probe(Probe::ScriptedAcquire) => "raw-scripted-acquire",
            Lib::Probe(Probe::MarkedRelease) => "raw-marked-release",
            Lib::Probe(Probe::RecordedRelease) => "raw-recorded-release",
            Lib::Probe(Probe::HashAcquire) => "raw-hash-acquire",
            Lib::DlockEvalsha => "dlock-evalsha",
        }
    }

    /// Whether a run includes it without `--libs` naming it.
    pub(crate) fn by_default(self) -> bool {
        !matches!(self, Lib::Probe(_) | Lib::DlockEvalsha)
    }
}

/// One client of a library (one `Locker`, one connection, one lock manager).
#[derive(Clone)]
pub(crate) enum Client {
    Dlock(Locker, Kind),
    Masters(MasterSet),
    Raw(Raw),
    Rslock(Arc<rslock::LockManager>),
}

/// A held lock.
pub(crate) enum Held {
    Dlock(LockGuard),
    Permit(Permit),
    Masters(MasterGuard),
    Raw { key: String, token: String },
    Rslock(rslock::Lock),
}

impl Held {
    /// The fencing token, for the libraries and primitives that give one. A plain dlock lock's
    /// is minted by Redis at this first ask: one round trip, and an error if the hold is lost or
    /// Redis can't be asked.
    pub(crate) async fn fence(&self) -> Result<Option<u64>, String> {
        match self {
            Held::Dlock(guard) => match guard.fencing_token().await {
                Ok(token) => Ok(Some(token.get())),
                Err(e) => Err(e.to_string()),
            },
            // A majority's tokens rise per master, and no one master is in every hold.
            Held::Permit(_) | Held::Masters(_) | Held::Raw { .. } | Held::Rslock(_) => Ok(None),
        }
    }
}

/// The minimal correct protocol: `SET NX PX`, compare-and-delete by script, 1 ms between tries
/// (or a probe's change to it).
#[derive(Clone)]
pub(crate) struct Raw {
    con: MultiplexedConnection,
    acquire: RawAcquire,
    release: Arc<redis::Script>,
    /// The release records the released owner (its script takes two more keys).
    marks: bool,
}

/// How the raw protocol (or a probe) takes the lock.
#[derive(Clone)]
enum RawAcquire {
    /// `SET NX PX`.
    Set,
    /// A script (`KEYS[1]` lock; `ARGV[1]` token, `ARGV[2]` lease ms; returns 1 if taken).
    Script(Arc<redis::Script>),
    /// A hash's owner field, in a transaction (see [`Probe::HashAcquire`]).
    Hash,
}

const RAW_RELEASE: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"#;

/// [`Probe::ScriptedAcquire`]'s acquire: `KEYS[1]` lock; `ARGV[1]` token, `ARGV[2]` lease ms.
const SCRIPTED_ACQUIRE: &str = r#"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return 1
end
return 0
"#;

/// [`Probe::MarkedRelease`]'s release: `KEYS[1]` lock, `KEYS[2]` where the released owner is
/// recorded, `KEYS[3]` the wake-up channel; `ARGV[1]` token.
const MARKED_RELEASE: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[2], 'r', ARGV[1])
  redis.call('PUBLISH', KEYS[3], '1')
  return 1
end
return 0
"#;

/// [`Probe::RecordedRelease`]'s release: as [`MARKED_RELEASE`], without the wake-up (`KEYS[3]`
/// unused).
const RECORDED_RELEASE: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[2], 'r', ARGV[1])
  return 1
end
return 0
"#;

/// [`Probe::HashAcquire`]'s release: as [`MARKED_RELEASE`], the owner in the hash's `o` field.
const HASH_RELEASE: &str = r#"
if redis.call('HGET', KEYS[1], 'o') == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[2], 'r', ARGV[1])
  redis.call('PUBLISH', KEYS[3], '1')
  return 1
end
return 0
"#;

/// How long any one acquisition may wait before it counts as an error.
const ACQUIRE_BOUND: Duration = Duration::from_secs(60);

impl Client {
    pub(crate) async fn new(lib: Lib, at: &Endpoints) -> Client {
        let url = at.url.as_str();
        match lib {
            Lib::Dlock(kind) => {
                // Each primitive under its own prefix: no key of one is ever read by another.
                let prefix = match kind {
                    Kind::Plain => "dlock:",
                    Kind::Fair => "dlock-fair:",
                    Kind::Write => "dlock-write:",
                    Kind::Permit => "dlock-permit:",
                };
                let locker = Locker::builder()
                    .url(url)
                    .prefix(prefix)
                    .build()
                    .await
                    .expect("dlock connects");
                Client::Dlock(locker, kind)
            }
            Lib::DlockEvalsha => {
                let locker = Locker::builder()
                    .url(without_functions(url).await)
                    .prefix("dlock-evalsha:")
                    .build()
                    .await
                    .expect("dlock connects");
                Client::Dlock(locker, Kind::Plain)
            }
            Lib::Scaled(Mode::Majority) => {
                let mut lockers = Vec::new();
                for url in &at.masters {
                    lockers.push(connect(Locker::builder().url(url)).await);
                }
                Client::Masters(MasterSet::majority(lockers).expect("a majority of three"))
            }
            Lib::Scaled(mode) => {
                let builder = match mode {
                    Mode::Cluster => Locker::builder().cluster(at.cluster_seeds.clone()),
                    Mode::ClusterUnacked => (Locker::builder().cluster(at.cluster_seeds.clone()))
                        .replica_ack(ReplicaAck::none()),
                    Mode::Sentinel => {
                        Locker::builder().sentinel(at.sentinels.clone(), at.sentinel_master.clone())
                    }
                    Mode::SentinelUnacked => (Locker::builder())
                        .sentinel(at.sentinels.clone(), at.sentinel_master.clone())
                        .replica_ack(ReplicaAck::none()),
                    Mode::Ack => Locker::builder()
                        .url(&at.ack_master)
                        .replica_ack(ReplicaAck::new(1, Duration::from_secs(1))),
                    Mode::Postgres => Locker::builder().postgres_url(&at.postgres),
                    Mode::Majority => unreachable!("built above"),
                };
                Client::Dlock(connect(builder).await, Kind::Plain)
            }
            Lib::Raw | Lib::Probe(_) => {
                let con = redis::Client::open(url)
                    .expect("url")
                    .get_multiplexed_async_connection()
                    .await
                    .expect("raw connects");
                let script = |lua| Arc::new(redis::Script::new(lua));
                let (acquire, release) = match lib {
                    Lib::Probe(Probe::ScriptedAcquire) => {
                        (RawAcquire::Script(script(SCRIPTED_ACQUIRE)), RAW_RELEASE)
                    }
                    Lib::Probe(Probe::MarkedRelease) => (RawAcquire::Set, MARKED_RELEASE),
                    Lib::Probe(Probe::RecordedRelease) => (RawAcquire::Set, RECORDED_RELEASE),
                    Lib::Probe(Probe::HashAcquire) => (RawAcquire::Hash, HASH_RELEASE),
                    _ => (RawAcquire::Set, RAW_RELEASE),
                };
                Client::Raw(Raw {
                    con,
                    acquire,
                    marks: release != RAW_RELEASE,
                    release: script(release),
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
        self.acquire_within(name, ACQUIRE_BOUND).await
    }

    /// Acquires `name`, waiting up to `bound` (then it is an error).
    pub(crate) async fn acquire_within(&self, name: &str, bound: Duration) -> Result<Held, String> {
        match self {
            Client::Dlock(locker, kind) => match kind {
                Kind::Plain => locker.lock(name).wait(bound).await.map(Held::Dlock),
                Kind::Fair => locker.fair_lock(name).wait(bound).await.map(Held::Dlock),
                Kind::Write => locker
                    .read_write_lock(name)
                    .write()
                    .wait(bound)
                    .await
                    .map(|g| Held::Dlock(g.into_lock_guard())),
                Kind::Permit => locker
                    .semaphore(name, 1)
                    .acquire()
                    .wait(bound)
                    .await
                    .map(Held::Permit),
            }
            .map_err(|e| format!("dlock acquire: {e}")),
            Client::Masters(set) => (set.lock(name).wait(bound).await)
                .map(Held::Masters)
                .map_err(|e| format!("dlock acquire: {e}")),
            Client::Raw(raw) => {
                let token = format!("{:032x}", rand_u128());
                let key = format!("raw:{name}");
                let mut con = raw.con.clone();
                let deadline = tokio::time::Instant::now() + bound;
                loop {
                    let set = match &raw.acquire {
                        RawAcquire::Set => redis::cmd("SET")
                            .arg(&key)
                            .arg(&token)
                            .arg("NX")
                            .arg("PX")
                            .arg(30_000)
                            .query_async::<Option<String>>(&mut con)
                            .await
                            .map(|set| set.is_some()),
                        RawAcquire::Script(script) => script
                            .key(&key)
                            .arg(&token)
                            .arg(30_000)
                            .invoke_async::<i64>(&mut con)
                            .await
                            .map(|set| set == 1),
                        RawAcquire::Hash => redis::pipe()
                            .atomic()
                            .cmd("HSETNX")
                            .arg(&key)
                            .arg("o")
                            .arg(&token)
                            .cmd("PEXPIRE")
                            .arg(&key)
                            .arg(30_000)
                            .arg("NX")
                            .ignore()
                            .query_async::<(i64,)>(&mut con)
                            .await
                            .map(|(set,)| set == 1),
                    }
                    .map_err(|e| format!("raw SET: {e}"))?;
                    if set {
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
                match tokio::time::timeout(bound, acquiring).await {
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
            (Client::Dlock(..), Held::Dlock(guard)) => released(guard.release().await),
            (Client::Dlock(..), Held::Permit(permit)) => released(permit.release().await),
            (Client::Masters(_), Held::Masters(guard)) => released(guard.release().await),
            (Client::Raw(raw), Held::Raw { key, token }) => {
                let mut con = raw.con.clone();
                let mut release = raw.release.key(&key);
                if raw.marks {
                    release
                        .key(format!("{key}:fence"))
                        .key(format!("{key}:wake"));
                }
                let deleted: i64 = release
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

/// A `Locker` built, or the run ends: a bench can't go on without its peer.
/// `url` as a user that may do anything but call or load Redis functions (made on that server
/// first): a `Locker` on it sends its scripts by `EVALSHA`.
async fn without_functions(url: &str) -> String {
    const USER: &str = "dlock-bench-evalsha";
    const PASSWORD: &str = "dlock-bench-evalsha";
    let mut con = redis::Client::open(url)
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connects");
    redis::cmd("ACL")
        .arg("SETUSER")
        .arg(USER)
        .arg("on")
        .arg(format!(">{PASSWORD}"))
        .arg("~*")
        .arg("&*")
        .arg("+@all")
        .arg("-fcall")
        .arg("-function")
        .query_async::<()>(&mut con)
        .await
        .expect("ACL SETUSER");
    match url.split_once("://") {
        Some((scheme, rest)) => {
            // Any user the URL had is replaced.
            let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
            format!("{scheme}://{USER}:{PASSWORD}@{host}")
        }
        None => panic!("a URL without a scheme: {url}"),
    }
}

async fn connect(builder: dlock_core::LockerBuilder) -> Locker {
    builder.build().await.expect("dlock connects")
}

/// A dlock release outcome as the workloads see it.
fn released(outcome: ReleaseOutcome) -> Result<(), String> {
    if outcome.is_released() {
        Ok(())
    } else {
        Err(format!("dlock release: {outcome:?}"))
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
