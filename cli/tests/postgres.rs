//! The `dlock` binary against PostgreSQL (`--url postgres://...`): `show` reads the sessions that
//! hold a name from `pg_locks`, `release --force` ends them, and `list` shows every advisory lock
//! held, with its session.

use std::time::Duration;

use dlock_core::Locker;
use dlock_tests::{PostgresServer, unique_name};

mod common;
use common::{errors, run, text};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_and_release_a_lock_held_on_postgres() {
    let server = PostgresServer::start();
    let url = server.url();
    let locker = Locker::connect(&url).await.expect("connect");
    let name = unique_name("cli-pg");
    let guard = locker.lock(name.as_str()).await.expect("lock");

    let out = run(&url, &["show", &name]).await;
    assert!(out.status.success(), "{}", errors(&out));
    let shown = text(&out);
    assert!(shown.contains("state            held"), "{shown}");
    assert!(shown.contains("pid "), "the holding session: {shown}");
    let out = run(&url, &["show", &name, "--json"]).await;
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(json["state"], "held", "{json}");

    // Nothing without --force; with it, the holding session is ended, and the guard learns it
    // at its next renewal.
    let out = run(&url, &["release", &name]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(!guard.is_lost());
    let out = run(&url, &["release", &name, "--force"]).await;
    assert!(out.status.success(), "{}", errors(&out));
    assert_eq!(text(&out).trim(), format!("released {name}"));
    tokio::time::timeout(Duration::from_secs(30), guard.lost())
        .await
        .expect("the guard learns its session was ended");
    let out = run(&url, &["show", &name, "--json"]).await;
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(json["state"], "free", "{json}");

    // PostgreSQL keeps a number for each lock, not its name: `list` shows every advisory lock
    // held, with its session, and takes no pattern.
    let held = locker.lock(name.as_str()).await.expect("lock again");
    let key = locker.advisory_key(name.as_str()).expect("a postgres key");
    let out = run(&url, &["list"]).await;
    assert!(out.status.success(), "{}", errors(&out));
    let listed = text(&out);
    let row = (listed.lines())
        .find(|l| l.contains(&key.to_string()))
        .unwrap_or_else(|| panic!("no row for {key}: {listed}"));
    assert!(row.contains("exclusive") && row.contains("dlock"), "{row}");
    let out = run(&url, &["list", "--json"]).await;
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let rows = json.as_array().expect("an array");
    assert!(
        rows.iter()
            .any(|r| r["key"] == key && r["mode"] == "exclusive"),
        "{json}"
    );
    let out = run(&url, &["list", "order:*"]).await;
    assert_eq!(out.status.code(), Some(2), "{}", errors(&out));
    assert!(
        errors(&out).contains("takes no pattern"),
        "{}",
        errors(&out)
    );
    assert!(held.release().await.is_released());
    let out = run(&url, &["list"]).await;
    assert_eq!(text(&out).trim(), "no advisory locks");
    let out = run(&url, &["check", "--duration", "1s"]).await;
    assert_eq!(out.status.code(), Some(2), "{}", errors(&out));
    assert!(
        errors(&out).contains("runs against Redis"),
        "{}",
        errors(&out)
    );
}
