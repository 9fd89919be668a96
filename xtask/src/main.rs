//! The project's two commands, for a fresh machine that has only the Rust toolchain:
//!
//! ```text
//! cargo xtask demo [ARGS]   the flash-sale demo (ARGS go to it: --exit, --users N, --instances N)
//! cargo xtask test          the whole test suite, exactly as CI runs it
//! ```
//!
//! Each first installs what it needs and is missing, saying what and why: `redis-server` for
//! both; Chromium and its driver, PostgreSQL and cargo-nextest for the tests. On Debian and
//! Ubuntu it installs with apt-get (as root, or through sudo); elsewhere it stops with the list
//! of what to install. Everything it runs is built by the command itself.

use std::path::Path;
use std::process::{Command, ExitCode};

const USAGE: &str = "\
usage: cargo xtask <command>

  demo [ARGS]   build and run the flash-sale demo: three shop instances, one private
                redis-server, 2,000 buyers, without locks then with them (ARGS: --exit to stop
                after the table, --users N, --instances N; REDIS_URL to use your own Redis)
  test          install what the test suite needs, then run it: doc tests, then every test
                with cargo-nextest (the CI profile)";

/// Something a command needs: how to tell it is there, and the Debian package that brings it.
struct Need {
    what: &'static str,
    why: &'static str,
    package: &'static str,
    present: fn() -> bool,
}

fn runs(program: &str, arg: &str) -> bool {
    Command::new(program)
        .arg(arg)
        .output()
        .is_ok_and(|out| out.status.success())
}

fn redis_server() -> bool {
    let binary = std::env::var("DLOCK_REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
    runs(&binary, "--version")
}

fn chromium() -> bool {
    runs("chromium", "--version")
}

fn chromedriver() -> bool {
    runs("chromedriver", "--version")
}

fn postgresql() -> bool {
    std::fs::read_dir("/usr/lib/postgresql").is_ok_and(|versions| {
        versions
            .flatten()
            .any(|v| v.path().join("bin").join("initdb").exists())
    })
}

const REDIS: Need = Need {
    what: "redis-server",
    why: "every lock lives in Redis; the demo and the tests start private servers on free ports",
    package: "redis-server",
    present: redis_server,
};

const TEST_NEEDS: [Need; 4] = [
    REDIS,
    Need {
        what: "chromium",
        why: "the flash-sale browser test drives the shop's page in headless Chromium",
        package: "chromium",
        present: chromium,
    },
    Need {
        what: "chromedriver",
        why: "the browser test talks to Chromium through its driver",
        package: "chromium-driver",
        present: chromedriver,
    },
    Need {
        what: "PostgreSQL",
        why: "the flash-sale test on PostgreSQL starts a throwaway cluster with initdb",
        package: "postgresql",
        present: postgresql,
    },
];

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let result = match args.next().as_deref() {
        Some("demo") => demo(args.collect()),
        Some("test") => test(),
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
    if std::env::var_os("REDIS_URL").is_none() {
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
    )
}

fn test() -> Result<(), String> {
    ensure(&TEST_NEEDS)?;
    if !nextest_installed() {
        println!("xtask: installing cargo-nextest (the test runner the suite and CI use)");
        cargo(&["install", "--locked", "cargo-nextest"], &[])?;
    }
    cargo(&["test", "--workspace", "--doc", "--locked"], &[])?;
    cargo(
        &[
            "nextest",
            "run",
            "--workspace",
            "--all-targets",
            "--locked",
            "--profile",
            "ci",
        ],
        &[],
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

/// Runs cargo with `args` then `extra`, in the workspace root; fails on a non-zero exit.
fn cargo(args: &[&str], extra: &[String]) -> Result<(), String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .ok_or("the xtask crate has no parent directory")?;
    let status = Command::new(cargo_program())
        .args(args)
        .args(extra)
        .current_dir(root)
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

/// Installs whatever of `needs` is missing, or says how to.
fn ensure(needs: &[Need]) -> Result<(), String> {
    let missing: Vec<&Need> = needs.iter().filter(|n| !(n.present)()).collect();
    if missing.is_empty() {
        return Ok(());
    }
    let packages: Vec<&str> = missing.iter().map(|n| n.package).collect();
    for need in &missing {
        println!("xtask: {} is missing: {}", need.what, need.why);
    }
    let apt = runs("apt-get", "--version");
    if !apt {
        return Err(format!(
            "install {} with your system's package manager (Debian/Ubuntu: \
             `apt-get install {}`), then run this again",
            missing
                .iter()
                .map(|n| n.what)
                .collect::<Vec<_>>()
                .join(", "),
            packages.join(" ")
        ));
    }
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0");
    let sudo = !root && runs("sudo", "--version");
    if !root && !sudo {
        return Err(format!(
            "installing needs root: run `apt-get install {}` as root, then this again",
            packages.join(" ")
        ));
    }
    println!("xtask: installing {} with apt-get", packages.join(" "));
    let apt_get = |args: &[&str]| -> Result<(), String> {
        let mut cmd = if sudo {
            let mut c = Command::new("sudo");
            c.arg("apt-get");
            c
        } else {
            Command::new("apt-get")
        };
        let status = cmd
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .map_err(|e| format!("cannot run apt-get: {e}"))?;
        if status.success() {
            Ok(())
        } else {
            Err(format!("`apt-get {}` failed ({status})", args.join(" ")))
        }
    };
    apt_get(&["update", "-qq"])?;
    let mut install = vec!["install", "-y", "-qq"];
    install.extend(&packages);
    apt_get(&install)?;
    // The packages start system services; the demo and the tests start servers of their own.
    for service in ["redis-server", "postgresql"] {
        if packages.iter().any(|p| p.starts_with(service)) {
            let mut stop = if sudo {
                let mut c = Command::new("sudo");
                c.arg("service");
                c
            } else {
                Command::new("service")
            };
            let _ = stop.args([service, "stop"]).output();
        }
    }
    let still: Vec<&str> = missing
        .iter()
        .filter(|n| !(n.present)())
        .map(|n| n.what)
        .collect();
    if still.is_empty() {
        Ok(())
    } else {
        Err(format!("still missing after apt-get: {}", still.join(", ")))
    }
}
