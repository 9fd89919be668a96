//! `dlock check` end to end, as a spawned process against a real `redis-server`: a healthy
//! server passes and keeps no key of the check's, faults of its own are survived, a server that
//! loses locks behind dlock's back is caught (exit code 3), bad targets are clear errors.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use dlock_core::redis::AsyncCommands as _;
use dlock_tests::{RedisServer, free_port};
use serde_json::Value;

mod common;
use common::{dlock, errors, run, text};

/// Every key on the server.
async fn keys(server: &RedisServer) -> Vec<String> {
    let mut con = server.connection().await;
    let mut iter = con.scan::<String>().await.expect("SCAN");
    let mut keys = Vec::new();
    while let Some(key) = futures_util::StreamExt::next(&mut iter).await {
        keys.push(key.expect("a SCAN reply"));
    }
    keys
}

fn json(out: &std::process::Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "JSON on stdout ({e}): {}\nstderr: {}",
            text(out),
            errors(out)
        )
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_server_passes_and_keeps_no_key() {
    let server = RedisServer::start();
    let mut con = server.connection().await;
    // Someone else's key under the same prefix, and one outside it: both stay.
    let _: () = con.set("dlock:{theirs}", "x").await.expect("SET");
    let _: () = con.set("other", "y").await.expect("SET");

    let out = run(&server.url(), &["check", "--duration", "3s", "--json"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", errors(&out));
    let report = json(&out);
    assert_eq!(report["ok"], true, "{report}");
    assert_eq!(report["violations"], Value::Array(Vec::new()), "{report}");
    assert!(report["sessions"].as_u64().unwrap_or(0) > 50, "{report}");
    assert!(report["granted"].as_u64().unwrap_or(0) > 10, "{report}");
    assert_eq!(
        report["faults"],
        serde_json::json!({}),
        "no fault without --faults"
    );
    for kind in ["try_lock", "release"] {
        let spread = &report["latency"][kind];
        assert!(
            spread["count"].as_u64().unwrap_or(0) > 0,
            "{kind}: {report}"
        );
        let (p50, max) = (spread["p50_ms"].as_f64(), spread["max_ms"].as_f64());
        assert!(
            p50.is_some_and(|p| p > 0.0) && max >= p50,
            "{kind}: {report}"
        );
    }

    let mut left = keys(&server).await;
    left.sort();
    assert_eq!(
        left,
        ["dlock:{theirs}", "other"],
        "only the check's keys go"
    );

    // The text report says the same, and replays its seed.
    let seed = report["seed"].as_u64().expect("a seed").to_string();
    let out = run(
        &server.url(),
        &["check", "--duration", "1s", "--seed", &seed],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", errors(&out));
    let printed = text(&out);
    for line in [
        "overlaps:             none",
        "leaks:                none",
        "verdict:              OK, no violation",
        &format!("seed {seed} "),
    ] {
        assert!(printed.contains(line), "{line:?} in:\n{printed}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_touch_only_the_checks_own_keys_and_connections() {
    let server = RedisServer::start();
    let mut con = server.connection().await;
    let _: () = con.set("dlock:{theirs}", "x").await.expect("SET");
    let out = run(
        &server.url(),
        &["check", "--duration", "3s", "--faults", "--json"],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", errors(&out));
    let report = json(&out);
    assert_eq!(report["ok"], true, "{report}");
    let faults = report["faults"].as_object().expect("faults by kind");
    assert!(!faults.is_empty(), "{report}");
    for kind in faults.keys() {
        assert!(
            ["Cut", "Stall", "StallReplies", "Del", "Clobber"].contains(&kind.as_str()),
            "{kind}: only faults on its own keys and connections"
        );
    }
    assert_eq!(keys(&server).await, ["dlock:{theirs}"]);
}

/// A server that drops lock keys behind dlock's back (as an eviction policy or a restart
/// without persistence would) fails the check with overlaps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_loses_locks_fails_the_check() {
    let server = RedisServer::start();
    let stop = Arc::new(AtomicBool::new(false));
    let deleted = Arc::new(AtomicU64::new(0));
    let eraser = tokio::spawn({
        let (mut con, stop, deleted) = (server.connection().await, stop.clone(), deleted.clone());
        async move {
            while !stop.load(Ordering::Relaxed) {
                let found: Vec<String> = {
                    let mut iter = con
                        .scan_match::<_, String>("dlock:check-*:{hot*}")
                        .await
                        .expect("SCAN");
                    let mut found = Vec::new();
                    while let Some(key) = futures_util::StreamExt::next(&mut iter).await {
                        found.push(key.expect("a SCAN reply"));
                    }
                    found
                };
                if !found.is_empty() {
                    let n: u64 = con.del(&found).await.expect("DEL");
                    deleted.fetch_add(n, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    });
    let out = run(&server.url(), &["check", "--duration", "3s", "--json"]).await;
    stop.store(true, Ordering::Relaxed);
    eraser.await.expect("the eraser");
    assert!(
        deleted.load(Ordering::Relaxed) > 0,
        "the eraser deleted locks"
    );
    assert_eq!(out.status.code(), Some(3), "{}", errors(&out));
    assert!(errors(&out).contains("the check found violations"));
    let report = json(&out);
    assert_eq!(report["ok"], false, "{report}");
    let overlaps = report["violations_by_category"]["overlaps"].as_u64();
    assert!(overlaps.is_some_and(|n| n > 0), "{report}");
    assert!(
        (report["violations"].as_array().expect("violations").iter())
            .any(|v| v["invariant"] == "MutualExclusion" && v["category"] == "overlaps"),
        "{report}"
    );
}

#[test]
fn bad_targets_are_clear_errors() {
    let out = dlock("not a url", &["check", "--duration", "1s"]);
    assert_eq!(out.status.code(), Some(2), "{}", errors(&out));
    assert!(
        errors(&out).starts_with("dlock: bad URL"),
        "{}",
        errors(&out)
    );

    let nobody = format!("redis://127.0.0.1:{}/", free_port());
    let out = dlock(&nobody, &["check", "--duration", "1s"]);
    assert_eq!(out.status.code(), Some(1), "{}", errors(&out));
    assert!(
        errors(&out).starts_with("dlock: cannot reach Redis"),
        "{}",
        errors(&out)
    );

    let out = dlock(
        "redis+unix:///tmp/nothing.sock",
        &["check", "--duration", "1s"],
    );
    assert_eq!(out.status.code(), Some(2), "{}", errors(&out));
    assert!(errors(&out).contains("TCP server"), "{}", errors(&out));

    let out = dlock(
        "redis://127.0.0.1:1/",
        &["--cluster", "redis://127.0.0.1:1/", "check"],
    );
    assert_eq!(out.status.code(), Some(2), "{}", errors(&out));

    // A prefix dlock refuses, on a server that answers.
    let server = RedisServer::start();
    let out = dlock(
        &server.url(),
        &["--prefix", "a{b", "check", "--duration", "1s"],
    );
    assert_eq!(out.status.code(), Some(2), "{}", errors(&out));
    assert!(errors(&out).contains("prefix"), "{}", errors(&out));
    assert!(!errors(&out).contains("panicked"), "{}", errors(&out));

    let out = dlock("redis://127.0.0.1:1/", &["check", "--duration", "0s"]);
    assert_eq!(out.status.code(), Some(2), "{}", errors(&out));
}
