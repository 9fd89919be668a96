//! What dlock tells an operator, against a real `redis-server`: every metric described, typed
//! and recorded as `dlock_core::metrics` documents it; a name label only by opt-in; losses and
//! release anomalies at WARN, acquisitions and releases in INFO spans that record their
//! outcome; hidden names in none of them.
//!
//! The recorder and the subscriber are thread-local and the tests run on tokio's current-thread
//! runtime, so everything dlock spawns (the watchdog, connections) reports to them.

use std::time::Duration;

use dlock_core::redis::AsyncCommands as _;
use dlock_core::{LockName, Locker, ReleaseOutcome, metrics as dm};
use dlock_tests::capture::Capture;
use dlock_tests::{Proxy, RedisServer, unique_name};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::{CompositeKey, MetricKind};
use tracing::Level;

/// One recorded metric: kind, name, labels, unit, description, value.
#[derive(Debug)]
struct Seen {
    kind: MetricKind,
    name: String,
    labels: Vec<(String, String)>,
    unit: Option<metrics::Unit>,
    described: bool,
    value: DebugValue,
}

fn snapshot(snapshotter: &Snapshotter) -> Vec<Seen> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(
            |(key, unit, description, value): (CompositeKey, _, _, _)| Seen {
                kind: key.kind(),
                name: key.key().name().to_owned(),
                labels: key
                    .key()
                    .labels()
                    .map(|l| (l.key().to_owned(), l.value().to_owned()))
                    .collect(),
                unit,
                described: description.is_some(),
                value,
            },
        )
        .collect()
}

fn counter(seen: &[Seen], name: &str, labels: &[(&str, &str)]) -> u64 {
    seen.iter()
        .filter(|s| s.name == name)
        .filter(|s| {
            labels
                .iter()
                .all(|(k, v)| s.labels.iter().any(|(lk, lv)| lk == k && lv == v))
        })
        .map(|s| match s.value {
            DebugValue::Counter(n) => n,
            _ => panic!("{name} is not a counter"),
        })
        .sum()
}

/// The value of the gauge `name` with `labels` after every change `seen`: the debugging
/// recorder's snapshot takes a gauge's value and sets it back to zero, so the snapshots add up.
fn gauge(seen: &[Seen], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let values: Vec<f64> = (seen.iter())
        .filter(|s| s.name == name)
        .filter(|s| {
            labels
                .iter()
                .all(|(k, v)| s.labels.iter().any(|(lk, lv)| lk == k && lv == v))
        })
        .map(|s| match s.value {
            DebugValue::Gauge(v) => v.into_inner(),
            _ => panic!("{name} is not a gauge"),
        })
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

fn samples(seen: &[Seen], name: &str) -> usize {
    seen.iter()
        .filter(|s| s.name == name)
        .map(|s| match &s.value {
            DebugValue::Histogram(v) => v.len(),
            _ => panic!("{name} is not a histogram"),
        })
        .sum()
}

async fn eventually(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    while tokio::time::Instant::now() < deadline {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    cond()
}

#[tokio::test]
async fn every_metric_is_described_typed_recorded_and_documented() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    dm::describe();

    let mut server = RedisServer::start();
    let proxy = Proxy::start(server.addr()).await;
    let locker = Locker::builder()
        .url(server.url())
        .default_lease(dlock_core::Lease::watchdog(Duration::from_millis(300)))
        .build()
        .await
        .expect("locker");
    let rival = Locker::connect(&server.url()).await.expect("rival");
    let mut admin = server.connection().await;

    // Acquired, busy (try_lock), busy + timeout (a wait that runs out), released.
    let name = unique_name("metrics");
    let guard = locker.lock(name.as_str()).await.expect("free");
    assert!(
        rival
            .lock(name.as_str())
            .try_lock()
            .await
            .expect("answers")
            .is_none()
    );
    let timed_out = rival
        .lock(name.as_str())
        .wait(Duration::from_millis(50))
        .await
        .expect_err("busy");
    assert!(timed_out.is_busy());
    // A name held in a key layout this version does not speak (a later version's tag).
    let newer = unique_name("newer-layout");
    let key = locker.key_of(newer.as_str()).expect("key");
    let _: () = admin
        .pset_ex(&key, "v9/0123456789abcdef0123456789abcdef", 10_000)
        .await
        .expect("SET");
    let foreign = (locker
        .lock(newer.as_str())
        .wait(Duration::from_millis(50))
        .await)
        .expect_err("held by the newer version");
    assert!(foreign.is_busy(), "{foreign:?}");
    // Renewed by the watchdog (a tick every 100 ms).
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert!(guard.release().await.is_released());

    // Handed to a waiter of the same `Locker`, which hands it on to the next.
    let line = unique_name("line");
    let first = locker.lock(line.as_str()).await.expect("free");
    let mut waiters = Vec::new();
    for _ in 0..2 {
        let (locker, line) = (locker.clone(), line.clone());
        waiters.push(tokio::spawn(async move {
            let guard = locker
                .lock(line.as_str())
                .wait(Duration::from_secs(5))
                .await;
            guard.expect("handed over").release().await.is_released()
        }));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(first.release().await.is_released());
    for waiter in waiters {
        assert!(waiter.await.expect("task"));
    }

    // Lost because the key was deleted; the late release then finds it gone.
    let doomed = unique_name("doomed");
    let guard = locker.lock(doomed.as_str()).await.expect("free");
    let _: () = admin
        .del(locker.key_of(doomed.as_str()).expect("key"))
        .await
        .expect("DEL");
    tokio::time::timeout(Duration::from_secs(3), guard.lost())
        .await
        .expect("the loss is seen");
    assert!(!guard.release().await.is_released());

    // Renewals that can't reach Redis, and a release that can't either.
    let cut = Locker::builder()
        .url(proxy.url())
        .default_lease(dlock_core::Lease::watchdog(Duration::from_millis(300)))
        .command_timeout(Duration::from_millis(100))
        .build()
        .await
        .expect("proxied locker");
    let stranded = cut
        .lock(unique_name("stranded").as_str())
        .await
        .expect("free");
    // A hold with a fixed lease, so that it is not lost before its first ask for a token.
    let unfenced = cut
        .lock(unique_name("unfenced").as_str())
        .lease(Duration::from_secs(30))
        .await
        .expect("free");
    proxy.cut();
    // An acquisition, a first ask for a token and an inspection that can't reach Redis either.
    let unreachable = cut.lock(unique_name("unreachable").as_str()).await;
    assert!(unreachable.is_err_and(|e| e.is_backend()));
    assert!(
        unfenced
            .fencing_token()
            .await
            .is_err_and(|e| e.is_backend())
    );
    assert!(cut.inspect("anything").await.is_err_and(|e| e.is_backend()));
    let mut seen = Vec::new();
    assert!(
        eventually(Duration::from_secs(3), || {
            seen.extend(snapshot(&snapshotter));
            counter(&seen, dm::RENEW_ERRORS, &[]) > 0
        })
        .await,
        "no renewal error recorded"
    );
    assert!(matches!(
        stranded.release().await,
        ReleaseOutcome::Unreachable(_) | ReleaseOutcome::Expired
    ));
    server.kill();
    seen.extend(snapshot(&snapshotter));

    assert_eq!(counter(&seen, dm::ACQUIRED, &[]), 7);
    assert_eq!(counter(&seen, dm::HANDOVERS, &[]), 2);
    // The rival's try_lock and wait, and the wait on the newer version's hold.
    assert_eq!(counter(&seen, dm::BUSY, &[]), 3);
    assert_eq!(counter(&seen, dm::TIMEOUT, &[]), 2);
    assert_eq!(counter(&seen, dm::FOREIGN_LAYOUT, &[("kind", "lock")]), 1);
    assert_eq!(counter(&seen, dm::RELEASED, &[]), 4);
    assert!(counter(&seen, dm::RENEWED, &[]) >= 1);
    assert_eq!(counter(&seen, dm::LOST, &[("reason", "gone")]), 1);
    // The deleted lock's release finds it gone (`expired`); the stranded one's can't reach Redis
    // (`unreachable`) or finds its lease run out.
    assert!(counter(&seen, dm::RELEASE_FAILED, &[("outcome", "expired")]) >= 1);
    assert_eq!(counter(&seen, dm::RELEASE_FAILED, &[]), 2);
    assert!(samples(&seen, dm::WAIT_SECONDS) >= 3);
    assert!(samples(&seen, dm::HOLD_SECONDS) >= 3);
    for operation in ["acquire", "fence", "inspect"] {
        assert!(
            counter(&seen, dm::BACKEND_ERRORS, &[("operation", operation)]) >= 1,
            "{operation}"
        );
    }
    // Every hold let go but the unfenced one, and every waiter done.
    assert_eq!(gauge(&seen, dm::HELD, &[("kind", "lock")]), Some(1.0));
    assert_eq!(gauge(&seen, dm::WAITING, &[("kind", "lock")]), Some(0.0));
    assert!(gauge(&seen, dm::WATCHDOG_LAG_SECONDS, &[]).is_some_and(|lag| lag < 1.0));
    // Without the opt-in, no metric carries a name.
    assert!(
        seen.iter()
            .all(|s| s.labels.iter().all(|(k, _)| k != "name")),
        "{seen:#?}"
    );

    // Every metric: recorded, described, of the documented type and unit, and in the docs table.
    let docs = include_str!("../../dlock-core/src/metrics.rs");
    for metric in dm::ALL {
        let of: Vec<&Seen> = seen.iter().filter(|s| s.name == metric).collect();
        assert!(!of.is_empty(), "{metric} was never recorded");
        let row = docs
            .lines()
            .find(|l| l.starts_with(&format!("//! | `{metric}` |")))
            .unwrap_or_else(|| panic!("{metric} is missing from the table in metrics.rs"));
        let documented = if row.contains("| histogram |") {
            MetricKind::Histogram
        } else if row.contains("| counter |") {
            MetricKind::Counter
        } else if row.contains("| gauge |") {
            MetricKind::Gauge
        } else {
            panic!("{metric}: no type in {row}")
        };
        for s in of {
            assert!(s.described, "{metric} has no description");
            assert_eq!(s.kind, documented, "{metric}");
            let seconds = row.contains("| seconds |");
            assert_eq!(
                s.unit == Some(metrics::Unit::Seconds),
                seconds,
                "{metric}: unit {:?} against {row}",
                s.unit
            );
        }
    }
    let rows = docs
        .lines()
        .filter(|l| l.starts_with("//! | `dlock_"))
        .count();
    assert_eq!(
        rows,
        dm::ALL.len(),
        "the table lists a metric dlock doesn't record"
    );
}

/// Every acquisition, busy answer and release is labelled with the kind of hold: a plain
/// lock, a fair lock, a read-write lock's writer and reader, a semaphore's permit.
#[tokio::test]
async fn every_kind_is_counted_under_its_own_label() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let server = RedisServer::start();
    let locker = Locker::connect(&server.url()).await.expect("locker");
    let base = unique_name("kinds");
    let lock = locker.lock(format!("{base}:lock").as_str()).await.unwrap();
    assert!(
        (locker
            .lock(format!("{base}:lock").as_str())
            .try_lock()
            .await)
            .unwrap()
            .is_none()
    );
    assert!(lock.release().await.is_released());
    let fair = locker
        .fair_lock(format!("{base}:fair").as_str())
        .await
        .unwrap();
    assert!(fair.release().await.is_released());
    let rw = locker.read_write_lock(format!("{base}:rw").as_str());
    let write = rw.write().await.unwrap();
    assert!(write.release().await.is_released());
    let read = rw.read().await.unwrap();
    assert!(read.release().await.is_released());
    let permit = (locker
        .semaphore(format!("{base}:sem").as_str(), 2)
        .acquire())
    .await
    .unwrap();
    assert!(permit.release().await.is_released());
    let seen = snapshot(&snapshotter);
    for kind in ["lock", "fair", "write", "read", "permit"] {
        assert_eq!(counter(&seen, dm::ACQUIRED, &[("kind", kind)]), 1, "{kind}");
        assert_eq!(counter(&seen, dm::RELEASED, &[("kind", kind)]), 1, "{kind}");
        assert_eq!(samples(&seen, dm::HOLD_SECONDS), 5);
    }
    assert_eq!(counter(&seen, dm::BUSY, &[("kind", "lock")]), 1);
}

#[dlock_core::distributed_lock(key = "order:<user_id>", locker = locker)]
async fn place_order(locker: &Locker, user_id: u64) -> Result<u64, dlock_core::LockError> {
    Ok(user_id)
}

/// A `#[distributed_lock]` name carries its key template: its metrics are labelled
/// `key="order:<user_id>"`, one series for every user, where a `name` label would make one per
/// user.
#[tokio::test]
async fn a_macro_lock_is_labelled_with_its_key_template() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let server = RedisServer::start();
    let locker = Locker::connect(&server.url()).await.expect("locker");
    for user in 1..=3 {
        assert_eq!(place_order(&locker, user).await.expect("locked"), user);
    }
    let seen = snapshot(&snapshotter);
    let template = ("key", "order:<user_id>");
    assert_eq!(
        counter(&seen, dm::ACQUIRED, &[template, ("kind", "lock")]),
        3
    );
    assert_eq!(counter(&seen, dm::RELEASED, &[template]), 3);
    assert_eq!(samples(&seen, dm::WAIT_SECONDS), 3);
    let keyed: Vec<&Seen> = seen.iter().filter(|s| s.name == dm::ACQUIRED).collect();
    assert_eq!(keyed.len(), 1, "one series for every user: {keyed:#?}");
    assert!(
        seen.iter()
            .all(|s| s.labels.iter().all(|(k, _)| k != "name")),
        "{seen:#?}"
    );
}

#[tokio::test]
async fn the_name_label_is_opt_in_and_never_shows_a_hidden_name() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let server = RedisServer::start();
    let labelled = Locker::builder()
        .url(server.url())
        .metrics_name_label(true)
        .build()
        .await
        .expect("locker");
    let shown = unique_name("shown");
    let secret = unique_name("secret-user-42");
    let guard = labelled.lock(shown.as_str()).await.expect("free");
    assert!(guard.release().await.is_released());
    let guard = labelled
        .lock(secret.as_str())
        .hide_name(true)
        .await
        .expect("free");
    assert!(guard.release().await.is_released());
    let seen = snapshot(&snapshotter);
    assert_eq!(counter(&seen, dm::ACQUIRED, &[("name", shown.as_str())]), 1);
    assert_eq!(counter(&seen, dm::RELEASED, &[("name", shown.as_str())]), 1);
    assert_eq!(counter(&seen, dm::ACQUIRED, &[]), 2);
    assert!(
        seen.iter()
            .flat_map(|s| &s.labels)
            .all(|(_, v)| !v.contains("secret")),
        "{seen:#?}"
    );
}

#[tokio::test]
async fn losses_warn_acquisitions_are_info_spans_and_hidden_names_stay_out() {
    let logs = Capture::default();
    let _default = tracing::subscriber::set_default(logs.clone());
    let server = RedisServer::start();
    let mut admin = server.connection().await;
    let locker = Locker::builder()
        .url(server.url())
        .default_lease(dlock_core::Lease::watchdog(Duration::from_millis(300)))
        .build()
        .await
        .expect("locker");

    let shown = unique_name("shown");
    let guard = locker.lock(shown.as_str()).await.expect("free");
    let token = guard.fencing_token().await.expect("a token").get();
    assert!(guard.release().await.is_released());
    // INFO by default, with the outcome, the wait and the token on the span itself.
    let acquire = logs.spans("dlock.acquire");
    let acquire = acquire.first().expect("an acquire span");
    assert_eq!(acquire.level, Level::INFO);
    assert_eq!(acquire.fields.get("name"), Some(&shown));
    assert_eq!(acquire.fields.get("kind").map(String::as_str), Some("lock"));
    assert_eq!(
        acquire.fields.get("outcome").map(String::as_str),
        Some("acquired")
    );
    assert!(
        acquire.fields.contains_key("wait_ms"),
        "{:?}",
        acquire.fields
    );
    let release = logs.spans("dlock.release");
    let release = release.first().expect("a release span");
    assert_eq!(release.level, Level::INFO);
    assert_eq!(
        release.fields.get("outcome").map(String::as_str),
        Some("released")
    );
    assert_eq!(
        release.fields.get("fencing_token"),
        Some(&token.to_string())
    );
    assert!(
        release.fields.contains_key("held_ms"),
        "{:?}",
        release.fields
    );
    // A busy try: its outcome says so; and the level is the builder's to choose.
    let quiet = Locker::builder()
        .url(server.url())
        .span_level(Level::DEBUG)
        .build()
        .await
        .expect("locker");
    let held = locker.lock(shown.as_str()).await.expect("free");
    assert!(
        quiet
            .lock(shown.as_str())
            .try_lock()
            .await
            .expect("answers")
            .is_none()
    );
    let busy = logs.spans("dlock.acquire");
    let busy = busy.last().expect("the busy try's span");
    assert_eq!(busy.level, Level::DEBUG);
    assert_eq!(busy.fields.get("outcome").map(String::as_str), Some("busy"));
    assert!(held.release().await.is_released());
    assert!(
        logs.events_saying("acquired")
            .iter()
            .all(|e| e.level == Level::DEBUG)
    );

    // A hidden name, lost (deleted) and then released late: WARN twice, the name in neither.
    let secret = unique_name("secret-user-42");
    let name = LockName::new(&secret).expect("valid").hidden(true);
    let guard = locker.lock(name).await.expect("free");
    let busy = locker
        .lock(LockName::new(&secret).expect("valid").hidden(true))
        .try_lock()
        .await
        .expect("answers");
    assert!(busy.is_none());
    let _: () = admin
        .del(locker.key_of(secret.as_str()).expect("key"))
        .await
        .expect("DEL");
    tokio::time::timeout(Duration::from_secs(3), guard.lost())
        .await
        .expect("the loss is seen");
    let outcome = guard.release().await;
    assert!(!outcome.is_released());
    let lost = logs.events_saying("lost while held");
    assert_eq!(lost.len(), 1, "{}", logs.text());
    assert_eq!(lost[0].level, Level::WARN);
    assert_eq!(
        lost[0].fields.get("name").map(String::as_str),
        Some("<hidden>")
    );
    let late = logs.events_saying("no longer held");
    assert_eq!(late.len(), 1, "{}", logs.text());
    assert_eq!(late[0].level, Level::WARN);

    // A Locker that hides every name; its errors still name the lock for the caller.
    let quiet = Locker::builder()
        .url(server.url())
        .hide_names(true)
        .build()
        .await
        .expect("quiet locker");
    let held = quiet.lock(secret.as_str()).await.expect("free");
    let err = quiet
        .lock(secret.as_str())
        .wait(Duration::from_millis(30))
        .await
        .expect_err("busy");
    assert!(err.to_string().contains(&secret), "{err}");
    assert!(held.release().await.is_released());

    let everything = logs.text();
    assert!(
        !everything.contains("secret-user-42"),
        "a hidden name was logged: {everything}"
    );
    assert!(everything.contains("<hidden>"));
}
