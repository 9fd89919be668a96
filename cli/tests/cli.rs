//! The `dlock` binary end to end, as a spawned process against a real `redis-server` (and a
//! real cluster): output and exit codes.

use std::time::Duration;

use dlock_core::Locker;
use dlock_core::redis;
use dlock_tests::cluster::key_slot;
use dlock_tests::{RedisCluster, RedisSentinel, RedisServer, free_port, unique_name};
use serde_json::Value;
use std::process::Command;

mod common;
use common::{dlock, errors, run, text};

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
    // Minted at the first ask: asked before `show`, so Redis has it to show.
    let token = guard.fencing_token().await.expect("a fencing token");
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
        shown.contains(&format!("fencing token    {token}")),
        "{shown}"
    );

    let out = run(&url, &["show", &a, "--json"]).await;
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(json["state"], "held");
    assert_eq!(json["holders"][0]["label"], "web-3:4711");
    assert_eq!(json["fencing_token"], token.get());
    assert_eq!(json["queued_waiters"], 0);

    // A fair lock's line is shown.
    let fair = format!("{base}:fair");
    let holder = locker.fair_lock(fair.as_str()).await.expect("fair");
    let waiter = tokio::spawn({
        let (locker, fair) = (locker.clone(), fair.clone());
        async move {
            locker
                .fair_lock(fair.as_str())
                .wait(Duration::from_secs(10))
                .await
        }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while locker
        .inspect(fair.as_str())
        .await
        .expect("inspect")
        .queued_waiters
        != 1
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the waiter never stood in line"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let out = run(&url, &["show", &fair]).await;
    assert!(text(&out).contains("in line (fair)   1"), "{}", text(&out));
    assert!(holder.release().await.is_released());
    let next = waiter.await.expect("task").expect("the waiter's turn");
    assert!(next.release().await.is_released());

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

/// Every key of the server matching `pattern`, read with `SCAN`.
async fn scan(server: &RedisServer, pattern: &str) -> Vec<String> {
    let mut con = server.connection().await;
    let (mut cursor, mut keys) = (0u64, Vec::new());
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut con)
            .await
            .expect("SCAN");
        keys.extend(batch);
        cursor = next;
        if cursor == 0 {
            return keys;
        }
    }
}

/// Checks one run of `dlock bench --json`.
fn check_run(run: &Value, label: &str, tasks: u64, names: u64) {
    assert_eq!(run["run"], label, "{run}");
    assert_eq!(run["tasks"], tasks, "{run}");
    assert_eq!(run["names"], names, "{run}");
    let cycles = run["cycles"].as_u64().expect("cycles");
    assert!(cycles > 0, "{run}");
    assert!(
        run["cycles_per_sec"].as_f64().expect("cycles/s") > 0.0,
        "{run}"
    );
    assert!(run["elapsed_ms"].as_u64().expect("elapsed") >= 900, "{run}");
    for latency in ["acquire_us", "cycle_us"] {
        let at = |p: &str| {
            run[latency][p]
                .as_u64()
                .unwrap_or_else(|| panic!("{latency}.{p}"))
        };
        assert!(at("p50") <= at("p90"), "{run}");
        assert!(at("p90") <= at("p99"), "{run}");
        assert!(at("p99") <= at("max"), "{run}");
    }
    let (acquire, cycle) = (&run["acquire_us"]["p50"], &run["cycle_us"]["p50"]);
    assert!(acquire.as_u64() <= cycle.as_u64(), "{run}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_measures_both_runs_and_leaves_no_key() {
    let server = RedisServer::start();
    let url = server.url();
    let out = run(
        &url,
        &["bench", "--duration", "1s", "--tasks", "3", "--json"],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", errors(&out));
    // No live line and no notice: stderr is not a terminal, and the output is JSON.
    assert_eq!(errors(&out), "");
    let json: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(json["duration_ms"], 1000);
    assert_eq!(json["interrupted"], false);
    let keys = json["keys"].as_str().expect("keys");
    assert!(
        keys.starts_with("dlock:{bench:") && keys.ends_with(":*}"),
        "{keys}"
    );
    // The contended name's fencing counter (its holders that took it after a wait got their
    // tokens with the grant; uncontended holds that never ask mint none); the locks themselves
    // were released.
    assert!(
        json["keys_removed"].as_u64().expect("keys_removed") >= 1,
        "{json}"
    );
    let runs = json["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 2, "{json}");
    check_run(&runs[0], "uncontended", 3, 3);
    check_run(&runs[1], "contended", 3, 1);
    assert_eq!(scan(&server, "*").await, Vec::<String>::new());

    // In text, a table and, on stderr, what it writes; a prefix and a name prefix of one's own.
    let out = run(
        &url,
        &[
            "--prefix",
            "app:",
            "bench",
            "--duration",
            "300ms",
            "--name",
            "lt-",
        ],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", errors(&out));
    let notice = errors(&out);
    assert!(
        notice.starts_with("dlock bench: writes lock keys under app:{lt-")
            && !notice.contains('\r'),
        "{notice}"
    );
    let table = text(&out);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 4, "{table}");
    assert!(
        lines[0].starts_with("run ") && lines[0].contains("acquire ms p50"),
        "{table}"
    );
    assert!(lines[1].starts_with("uncontended "), "{table}");
    assert!(lines[2].starts_with("contended "), "{table}");
    assert!(
        lines[3].starts_with("deleted ") && lines[3].contains("app:{lt-"),
        "{table}"
    );
    assert_eq!(scan(&server, "*").await, Vec::<String>::new());
}

#[test]
fn bench_errors_are_clear() {
    let nobody = format!("redis://127.0.0.1:{}/", free_port());
    let out = dlock(&nobody, &["bench", "--duration", "1s"]);
    assert_eq!(out.status.code(), Some(1), "{}", errors(&out));
    assert!(
        errors(&out).starts_with("dlock: cannot reach the server (--url, DLOCK_URL): "),
        "{}",
        errors(&out)
    );
    assert_eq!(text(&out), "");

    for bad in [["--duration", "5x"], ["--duration", "0s"], ["--tasks", "0"]] {
        let out = dlock(&nobody, &["bench", bad[0], bad[1]]);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {}", errors(&out));
        assert!(errors(&out).contains(bad[0]), "{}", errors(&out));
    }
    let out = dlock(&nobody, &["bench", "--name", "bad{name}"]);
    assert_eq!(out.status.code(), Some(2), "{}", errors(&out));
    assert!(
        errors(&out).contains("invalid lock name"),
        "{}",
        errors(&out)
    );

    let out = dlock(&nobody, &["--cluster", &nobody, "--url", &nobody, "list"]);
    assert_eq!(out.status.code(), Some(2), "{}", errors(&out));
    assert!(
        errors(&out).contains("give one of them"),
        "{}",
        errors(&out)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_write_locks_and_semaphores_are_listed_shown_and_released() {
    let server = RedisServer::start();
    let url = server.url();
    let locker = Locker::builder()
        .url(&url)
        .holder_label("batch-1")
        .build()
        .await
        .expect("connect");
    let base = unique_name("cli-kinds");
    let (rw, sem) = (format!("{base}:rw"), format!("{base}:sem"));
    let writer = locker
        .read_write_lock(rw.as_str())
        .write()
        .await
        .expect("write");
    let semaphore = locker.semaphore(sem.as_str(), 4);
    semaphore.set_permits(4).await.expect("set permits");
    let permits = [
        semaphore.acquire().await.expect("permit"),
        semaphore.acquire().await.expect("permit"),
    ];

    let out = run(&url, &["list", &format!("{base}:*")]).await;
    assert!(out.status.success(), "{}", errors(&out));
    let listed = text(&out);
    let lines: Vec<&str> = listed.lines().collect();
    assert_eq!(lines.len(), 2, "{listed}");
    assert!(
        lines[0].starts_with(&rw) && lines[0].contains("writer "),
        "{listed}"
    );
    assert!(lines[0].contains("(batch-1)"), "{listed}");
    assert!(
        lines[1].starts_with(&sem) && lines[1].ends_with("permits 2 of 4"),
        "{listed}"
    );

    let out = run(&url, &["show", &sem]).await;
    assert!(text(&out).contains("permits taken    2"), "{}", text(&out));
    assert!(text(&out).contains("permit limit     4"), "{}", text(&out));
    let out = run(&url, &["show", &rw, "--json"]).await;
    let json: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(json["writer"]["label"], "batch-1", "{json}");
    assert_eq!(json["readers"], 0);
    assert!(json["writer_ttl_ms"].as_u64().is_some(), "{json}");

    for name in [&rw, &sem] {
        let out = run(&url, &["release", name, "--force"]).await;
        assert_eq!(
            text(&out).trim(),
            format!("released {name}"),
            "{}",
            errors(&out)
        );
    }
    let out = run(&url, &["list", &format!("{base}:*")]).await;
    assert_eq!(text(&out).trim(), "no locks");
    drop((writer, permits));
}

#[test]
fn durations_are_written_as_people_write_them() {
    let nobody = format!("redis://127.0.0.1:{}/", free_port());
    // Accepted: the run gets as far as connecting.
    for good in ["1m", "1m 30s", "250ms", "2s"] {
        let out = dlock(&nobody, &["bench", "--duration", good]);
        assert_eq!(out.status.code(), Some(1), "{good}: {}", errors(&out));
        assert!(errors(&out).contains("cannot reach"), "{}", errors(&out));
    }
    for bad in ["5", "5x", "1 parsec", "0s"] {
        let out = dlock(&nobody, &["bench", "--duration", bad]);
        assert_eq!(out.status.code(), Some(2), "{bad}: {}", errors(&out));
        assert!(errors(&out).contains("--duration"), "{}", errors(&out));
    }
}

#[test]
fn dlock_variables_configure_the_cli_as_an_application() {
    let nobody = format!("redis://127.0.0.1:{}/", free_port());
    let out = Command::new(env!("CARGO_BIN_EXE_dlock"))
        .args(["show", "x"])
        .env("DLOCK_URL", &nobody)
        .env("DLOCK_COMMAND_TIMEOUT", "soon")
        .output()
        .expect("run dlock");
    assert_eq!(out.status.code(), Some(2), "{}", errors(&out));
    assert!(
        errors(&out).contains("DLOCK_COMMAND_TIMEOUT: `soon` is not a duration"),
        "{}",
        errors(&out)
    );
}

#[test]
fn help_lists_the_exit_codes() {
    let out = dlock("redis://127.0.0.1:1/", &["--help"]);
    assert!(out.status.success(), "{}", errors(&out));
    let help = text(&out);
    for line in [
        "Exit codes:",
        "0    done",
        "1    Redis",
        "2    a bad",
        "3    ",
        "130  ",
    ] {
        assert!(help.contains(line), "{line:?} in {help}");
    }
}

#[test]
fn errors_are_json_under_json() {
    let nobody = format!("redis://127.0.0.1:{}/", free_port());
    let json_error = |out: &std::process::Output| -> Value {
        assert_eq!(text(out), "", "nothing on standard output");
        serde_json::from_str(errors(out).trim()).expect("one JSON object on standard error")
    };
    // Redis out of reach.
    let out = dlock(&nobody, &["--json", "show", "x"]);
    assert_eq!(out.status.code(), Some(1));
    let error = json_error(&out);
    assert_eq!(error["exit_code"], 1);
    assert!(
        error["error"].as_str().unwrap().contains("cannot reach"),
        "{error}"
    );
    // A value clap refuses, and one dlock refuses.
    let out = dlock(&nobody, &["bench", "--duration", "5x", "--json"]);
    assert_eq!(out.status.code(), Some(2));
    let error = json_error(&out);
    assert_eq!(error["exit_code"], 2);
    assert!(
        error["error"].as_str().unwrap().contains("--duration"),
        "{error}"
    );
    let out = dlock(&nobody, &["--json", "release", "x"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        json_error(&out)["error"]
            .as_str()
            .unwrap()
            .contains("--force")
    );
    // Without --json, text.
    let out = dlock(&nobody, &["release", "x"]);
    assert!(errors(&out).starts_with("dlock: "), "{}", errors(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_show_and_release_behind_sentinels() {
    let set = tokio::task::block_in_place(RedisSentinel::start);
    let sentinels = set.sentinel_urls().join(",");
    let locker = Locker::builder()
        .sentinel(set.sentinel_urls(), set.master_name())
        .build()
        .await
        .expect("a locker behind the sentinels");
    let name = unique_name("cli-sentinel");
    let guard = locker.lock(name.as_str()).await.expect("lock");
    let nobody = format!("redis://127.0.0.1:{}/", free_port());
    let args = |rest: &[&str]| -> Vec<String> {
        let mut args = vec![
            "--sentinel".to_owned(),
            sentinels.clone(),
            "--master".to_owned(),
            set.master_name().to_owned(),
        ];
        args.extend(rest.iter().map(|a| (*a).to_owned()));
        args
    };
    let run_with = |rest: &[&str]| {
        let args = args(rest);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        tokio::task::block_in_place(|| dlock(&nobody, &args))
    };
    let out = run_with(&["list"]);
    assert!(out.status.success(), "{}", errors(&out));
    assert!(text(&out).contains(&name), "{}", text(&out));
    let out = run_with(&["show", &name]);
    assert!(
        text(&out).contains("state            held"),
        "{}",
        text(&out)
    );
    let out = run_with(&["release", &name, "--force"]);
    assert_eq!(
        text(&out).trim(),
        format!("released {name}"),
        "{}",
        errors(&out)
    );
    assert!(
        !locker
            .inspect(name.as_str())
            .await
            .expect("inspect")
            .is_taken()
    );
    drop(guard);

    // From the environment, as from the command line; and what is missing is named.
    let from_env = Command::new(env!("CARGO_BIN_EXE_dlock"))
        .args(["list"])
        .env("DLOCK_URL", &nobody)
        .env_remove("DLOCK_CLUSTER_URLS")
        .env("DLOCK_SENTINEL_URLS", &sentinels)
        .env("DLOCK_SENTINEL_MASTER", set.master_name())
        .output()
        .expect("run dlock");
    assert!(from_env.status.success(), "{}", errors(&from_env));
    let out = dlock(&nobody, &["--sentinel", &sentinels, "list"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(errors(&out).contains("--master"), "{}", errors(&out));
    let out = dlock(
        &nobody,
        &["--sentinel", &sentinels, "--cluster", &nobody, "list"],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        errors(&out).contains("give one of them"),
        "{}",
        errors(&out)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_show_release_and_bench_on_a_cluster() {
    let cluster = tokio::task::block_in_place(RedisCluster::start);
    let seeds = cluster.seed_urls().join(",");
    let masters = tokio::task::block_in_place(|| cluster.masters());
    let locker = Locker::builder()
        .cluster(cluster.seed_urls())
        .build()
        .await
        .expect("a locker on the cluster");
    // Names until every master serves one.
    let base = unique_name("cli-cluster");
    let mut by_master = std::collections::BTreeMap::new();
    for i in 0..1000 {
        let name = format!("{base}:order:{i}");
        let slot = key_slot(locker.key_of(name.as_str()).expect("name").as_bytes());
        let master = masters
            .iter()
            .position(|m| m.serves(slot))
            .expect("a master");
        by_master.entry(master).or_insert(name);
        if by_master.len() == masters.len() {
            break;
        }
    }
    assert_eq!(by_master.len(), 3, "{by_master:?}");
    let names: Vec<String> = by_master.into_values().collect();
    let mut guards = Vec::new();
    for name in &names {
        guards.push(locker.lock(name.as_str()).await.expect("lock"));
    }
    let other = locker
        .lock(format!("{base}:cart:1").as_str())
        .await
        .expect("lock");

    // The URL points nowhere: --cluster is what counts.
    let nobody = format!("redis://127.0.0.1:{}/", free_port());
    let pattern = format!("{base}:order:*");
    let out = run(&nobody, &["--cluster", &seeds, "list", &pattern, "--json"]).await;
    assert!(out.status.success(), "{}", errors(&out));
    let listed: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let listed: Vec<&str> = (listed.as_array().expect("an array").iter())
        .map(|info| {
            assert_eq!(info["state"], "held", "{info}");
            info["name"].as_str().expect("a name")
        })
        .collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(listed, sorted);

    // DLOCK_CLUSTER_URLS does the same.
    let out = tokio::task::spawn_blocking({
        let (seeds, name) = (seeds.clone(), names[0].clone());
        move || {
            Command::new(env!("CARGO_BIN_EXE_dlock"))
                .args(["show", &name])
                .env_remove("DLOCK_URL")
                .env("DLOCK_CLUSTER_URLS", seeds)
                .output()
                .expect("run dlock")
        }
    })
    .await
    .expect("the dlock process");
    assert!(out.status.success(), "{}", errors(&out));
    assert!(
        text(&out).contains("state            held"),
        "{}",
        text(&out)
    );

    let out = run(
        &nobody,
        &["--cluster", &seeds, "release", &names[1], "--force"],
    )
    .await;
    assert!(out.status.success(), "{}", errors(&out));
    assert!(
        !locker
            .inspect(names[1].as_str())
            .await
            .expect("inspect")
            .is_taken()
    );

    let out = run(
        &nobody,
        &[
            "--cluster",
            &seeds,
            "bench",
            "--duration",
            "300ms",
            "--json",
        ],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", errors(&out));
    let json: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    for run in json["runs"].as_array().expect("runs") {
        assert!(run["cycles"].as_u64().expect("cycles") > 0, "{run}");
    }
    for master in &masters {
        let left = scan(cluster.node(master.port), "*{bench:*").await;
        assert_eq!(left, Vec::<String>::new(), "on {}", master.port);
    }

    drop((guards, other));
}
