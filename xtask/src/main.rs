//! The project's two commands, for a fresh machine that has only the Rust toolchain:
//!
//! ```text
//! cargo xtask demo [ARGS]   the flash-sale demo (ARGS go to it: --exit, --users N, --instances N,
//!                           --cluster, --locks postgres)
//! cargo xtask test          the whole test suite, exactly as CI runs it
//! ```
//!
//! Each first installs what it needs and is missing, saying what and why: `redis-server` for
//! both; Chromium and its driver, PostgreSQL and cargo-nextest for the tests. On Debian and
//! Ubuntu it installs with apt-get (as root, or through sudo); elsewhere it stops with the list
//! of what to install. Everything it runs is built by the command itself. The test command
//! also checks the dependencies against the stated MSRV ([`msrv`]) and runs the Redis-facing
//! tests a second time on Valkey ([`valkey`]).

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

mod msrv;
mod needs;
mod valkey;

use needs::{POSTGRES, REDIS, TEST_NEEDS, ensure};

const USAGE: &str = "\
usage: cargo xtask <command>

  demo [ARGS]   build and run the flash-sale demo: three shop instances, one private
                redis-server, 2,000 buyers, without locks then with them (ARGS: --exit to stop
                after the table, --users N, --instances N; DLOCK_URL to use your own Redis;
                --cluster to lock on a private Redis Cluster of three masters and three
                replicas instead, or on yours: DLOCK_CLUSTER_URLS; --locks postgres to keep
                the locks beside the orders in a private PostgreSQL, with no Redis)
  test          install what the test suite needs, then run it: the MSRV check of the
                dependencies, doc tests, every test with cargo-nextest (the CI profile), then
                the tests that talk to a server once more on Valkey

  msrv          (part of test) check the dependencies against the stated rust-version
  valkey        (part of test) find or fetch a valkey-server and print its path";

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let result = match args.next().as_deref() {
        Some("demo") => demo(args.collect()),
        Some("test") => test(),
        Some("msrv") => workspace_root().and_then(|root| msrv::check(&root)),
        Some("valkey") => workspace_root()
            .and_then(|root| valkey::server(&root.join("target")))
            .map(|path| println!("{}", path.display())),
        Some("help" | "--help" | "-h") => {
            println!("{USAGE}");
            Ok(())
        }
        Some(other) => Err(format!("unknown command `{other}`\n{USAGE}")),
        None => Err(USAGE.to_owned()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("xtask: {err}");
            ExitCode::FAILURE
        }
    }
}

fn demo(args: Vec<String>) -> Result<(), String> {
    // The demo starts its own server (or cluster: redis-server and redis-cli, both brought by
    // the package) unless the environment names one; with `--locks postgres`, a PostgreSQL
    // server and no Redis.
    let postgres = args
        .windows(2)
        .any(|w| w[0] == "--locks" && w[1] == "postgres");
    let own = if args.iter().any(|a| a == "--cluster") {
        "DLOCK_CLUSTER_URLS"
    } else {
        "DLOCK_URL"
    };
    if postgres {
        ensure(&[POSTGRES])?;
    } else if std::env::var_os(own).is_none() {
        ensure(&[REDIS])?;
    }
    cargo(
        &[
            "run",
            "--release",
            "--locked",
            "-p",
            "flash-sale",
            "--bin",
            "demo",
            "--",
        ],
        &args,
        &[],
    )
}

fn test() -> Result<(), String> {
    ensure(&TEST_NEEDS)?;
    let root = workspace_root()?;
    msrv::check(&root)?;
    let valkey = valkey::server(&root.join("target"))?;
    if !nextest_installed() {
        println!("xtask: installing cargo-nextest (the test runner the suite and CI use)");
        cargo(&["install", "--locked", "cargo-nextest"], &[], &[])?;
    }
    cargo(&["test", "--workspace", "--doc", "--locked"], &[], &[])?;
    let nextest = [
        "nextest",
        "run",
        "--all-targets",
        "--locked",
        "--profile",
        "ci",
    ];
    cargo(&nextest, &["--workspace".to_owned()], &[])?;
    // Once more on Valkey: everything that talks to a server the harness starts, bar the shop.
    println!(
        "xtask: the Redis-facing tests once more, on {}",
        valkey::version(&valkey)
    );
    // The same build as the first run (a filter, not a narrower package set, so nothing is
    // compiled again). Compile-fail tests and the in-memory checker never start a server: once
    // is enough. The checker's cluster and sentinel runs and the harness's own cluster and
    // sentinel checks (two minutes of the CI's two cores) run on Redis only; the cluster and
    // sentinel tests of the lock run on both. What talks to PostgreSQL alone runs once.
    let filter = [
        "--workspace",
        "-E",
        "(package(dlock-checker) | package(dlock-tests) | package(dlock-macros) \
         | package(dlock-tower)) & not (binary(ui) | test(=checker_memory_paused_clock) \
         | binary(checker_distributed) | binary(cluster_harness) | binary(~postgres) \
         | test(=checker_postgres_sessions_ended))",
    ];
    cargo(
        &nextest,
        &filter.map(str::to_owned),
        &[("DLOCK_REDIS_SERVER", valkey.as_os_str())],
    )
}

fn nextest_installed() -> bool {
    Command::new(cargo_program())
        .args(["nextest", "--version"])
        .output()
        .is_ok_and(|out| out.status.success())
}

fn cargo_program() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

fn workspace_root() -> Result<PathBuf, String> {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .ok_or_else(|| "the xtask crate has no parent directory".to_owned())
}

/// Runs cargo with `args` then `extra` and the environment `envs`, in the workspace root; fails
/// on a non-zero exit.
fn cargo(args: &[&str], extra: &[String], envs: &[(&str, &OsStr)]) -> Result<(), String> {
    let status = Command::new(cargo_program())
        .args(args)
        .args(extra)
        .envs(envs.iter().copied())
        .current_dir(workspace_root()?)
        .status()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!(
            "`cargo {}` failed ({status})",
            args.iter()
                .copied()
                .chain(extra.iter().map(String::as_str))
                .collect::<Vec<_>>()
                .join(" ")
        ))
    }
}
