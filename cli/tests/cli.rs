//! The `dlock` binary end to end, as a spawned process against a real `redis-server`: output
//! and exit codes.

use std::process::{Command, Output};
use std::time::Duration;

use dlock_core::Locker;
use dlock_tests::{RedisServer, free_port, unique_name};

fn dlock(url: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dlock"))
        .args(args)
        .env("REDIS_URL", url)
        .output()
        .expect("run dlock")
}

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn errors(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Runs a blocking child process without stalling the test's runtime.
async fn run(url: &str, args: &[&str]) -> Output {
    let (url, args) = (
        url.to_owned(),
        args.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
    );
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        dlock(&url, &args)
    })
    .await
    .expect("the dlock process")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_show_and_release_a_held_lock() {
    let server = RedisServer::start();
    let url = server.url();
    let locker = Locker::builder()
        .url(&url)
        .holder_label("web-3:4711")
        .build()
        .await
        .expect("connect");
    let base = unique_name("cli");
    let (a, b) = (format!("{base}:order:1"), format!("{base}:cart:1"));
    let guard = locker.lock(a.as_str()).await.expect("lock a");
    let other = locker.lock(b.as_str()).await.expect("lock b");

    let out = run(&url, &["list", &format!("{base}:order:*")]).await;
    assert!(out.status.success(), "{}", errors(&out));
    let listed = text(&out);
    assert!(listed.contains(&a) && !listed.contains(&b), "{listed}");
    assert!(
        listed.contains("held by") && listed.contains("(web-3:4711)"),
        "{listed}"
    );

    let out = run(&url, &["show", &a]).await;
    assert!(out.status.success(), "{}", errors(&out));
    let shown = text(&out);
    assert!(shown.contains("state            held"), "{shown}");
    assert!(
        shown.contains(&guard.fencing_token().to_string()),
        "{shown}"
    );

    let out = run(&url, &["show", &a, "--json"]).await;
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(json["state"], "held");
    assert_eq!(json["holders"][0]["label"], "web-3:4711");
    assert_eq!(json["fencing_token"], guard.fencing_token().get());

    // Without --force, nothing happens.
    let out = run(&url, &["release", &a]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(errors(&out).contains("--force"), "{}", errors(&out));
    assert!(!guard.is_lost());

    let out = run(&url, &["release", &a, "--force"]).await;
    assert!(out.status.success(), "{}", errors(&out));
    assert_eq!(text(&out).trim(), format!("released {a}"));
    let free = locker.inspect(a.as_str()).await.expect("inspect");
    assert!(!free.is_taken());
    let out = run(&url, &["release", &a, "--force", "--json"]).await;
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(json["released"], false);
    drop((guard, other));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_prints_each_change() {
    let server = RedisServer::start();
    let url = server.url();
    let locker = Locker::connect(&url).await.expect("connect");
    let name = unique_name("cli-watch");
    let watcher = tokio::task::spawn_blocking({
        let (url, name) = (url.clone(), name.clone());
        move || {
            dlock(
                &url,
                &["watch", &name, "--interval", "20ms", "--changes", "3"],
            )
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let guard = locker.lock(name.as_str()).await.expect("lock");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(guard.release().await.is_released());
    let out = tokio::time::timeout(Duration::from_secs(10), watcher)
        .await
        .expect("watch stops after three changes")
        .expect("the dlock process");
    assert!(out.status.success(), "{}", errors(&out));
    let lines: Vec<String> = text(&out).lines().map(str::to_owned).collect();
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert!(lines[0].ends_with("free, waiting 0"), "{lines:?}");
    assert!(lines[1].contains("held by"), "{lines:?}");
    assert!(lines[2].ends_with("free, waiting 0"), "{lines:?}");
}

#[test]
fn bad_urls_and_unreachable_servers_are_clear_errors() {
    let out = dlock("not a url", &["list"]);
    assert_eq!(out.status.code(), Some(2), "{}", errors(&out));
    assert!(errors(&out).starts_with("dlock: "), "{}", errors(&out));

    let nobody = format!("redis://127.0.0.1:{}/", free_port());
    let out = dlock(&nobody, &["show", "x"]);
    assert_eq!(out.status.code(), Some(1), "{}", errors(&out));
    assert!(errors(&out).starts_with("dlock: "), "{}", errors(&out));

    let out = dlock(&nobody, &["show", "bad{name}"]);
    assert_ne!(out.status.code(), Some(0));
}

#[test]
fn completions_are_printed_for_each_shell() {
    for shell in ["bash", "zsh", "fish"] {
        let out = dlock("redis://127.0.0.1:1/", &["completions", shell]);
        assert!(out.status.success(), "{shell}: {}", errors(&out));
        assert!(text(&out).contains("dlock"), "{shell}");
    }
}
