//! Valkey, the fork of Redis that Debian packages: `cargo xtask test` runs the Redis-facing
//! tests a second time against a `valkey-server`.
//!
//! Where it comes from, first found first used: `DLOCK_VALKEY_SERVER`, a `valkey-server` on the
//! `PATH`, one fetched earlier into `target/valkey/`, or Debian's package fetched now with
//! `apt-get download` (from the system's sources, or bookworm-backports on Debian 12) and
//! unpacked into `target/valkey/` — nothing is installed on the system, and no root is needed.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::needs::runs;

/// Points the tests at a `valkey-server` binary of the user's choice.
pub(crate) const ENV: &str = "DLOCK_VALKEY_SERVER";

const PACKAGES: [&str; 2] = ["valkey-server", "valkey-tools"];

/// A runnable `valkey-server`, fetched into `target` if need be.
pub(crate) fn server(target: &Path) -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os(ENV) {
        let path = PathBuf::from(path);
        return if runs(&path.to_string_lossy(), "--version") {
            Ok(path)
        } else {
            Err(format!("{ENV}={} does not run", path.display()))
        };
    }
    if runs("valkey-server", "--version") {
        return Ok(PathBuf::from("valkey-server"));
    }
    let dir = target.join("valkey");
    let unpacked = dir.join("root/usr/bin/valkey-server");
    if runs(&unpacked.to_string_lossy(), "--version") {
        return Ok(unpacked);
    }
    if !runs("apt-get", "--version") {
        return Err(format!(
            "the Valkey pass needs valkey-server: install it, or set {ENV} to its path"
        ));
    }
    println!(
        "xtask: fetching Debian's valkey-server into {} (the tests run once more against \
         Valkey; nothing is installed on the system)",
        dir.display()
    );
    fetch(&dir)?;
    if runs(&unpacked.to_string_lossy(), "--version") {
        Ok(unpacked)
    } else {
        Err(format!(
            "{} was unpacked but does not run (its libraries come with redis-server's \
             package: libjemalloc2, liblzf1)",
            unpacked.display()
        ))
    }
}

/// Downloads the packages with a private package list and unpacks them into `dir/root`.
fn fetch(dir: &Path) -> Result<(), String> {
    let lists = dir.join("apt/lists");
    let cache = dir.join("apt/cache");
    let debs = dir.join("debs");
    for d in [
        lists.join("partial"),
        cache.join("archives/partial"),
        debs.clone(),
    ] {
        std::fs::create_dir_all(&d).map_err(|e| format!("create {}: {e}", d.display()))?;
    }
    let extra = dir.join("apt/sources.list");
    let backports = if debian_codename().as_deref() == Some("bookworm") {
        "deb http://deb.debian.org/debian bookworm-backports main\n"
    } else {
        ""
    };
    let options = [
        format!("Dir::State::Lists={}", lists.display()),
        format!("Dir::Cache={}", cache.display()),
        format!("Dir::Etc::sourcelist={}", extra.display()),
        "Debug::NoLocking=1".to_owned(),
    ];
    // The system's own sources stay in (sources.list here, sources.list.d as they are): a newer
    // Debian or Ubuntu has Valkey in its main archive.
    let mut system = std::fs::read_to_string("/etc/apt/sources.list").unwrap_or_default();
    system.push_str(backports);
    std::fs::write(&extra, system).map_err(|e| format!("write {}: {e}", extra.display()))?;
    apt(&options, &["update", "-qq"], dir)?;
    apt(&options, &["download", PACKAGES[0], PACKAGES[1]], &debs)?;
    let root = dir.join("root");
    let entries = std::fs::read_dir(&debs).map_err(|e| format!("read {}: {e}", debs.display()))?;
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "deb") {
            let status = Command::new("dpkg-deb")
                .arg("-x")
                .arg(&path)
                .arg(&root)
                .status()
                .map_err(|e| format!("cannot run dpkg-deb: {e}"))?;
            if !status.success() {
                return Err(format!("dpkg-deb -x {} failed ({status})", path.display()));
            }
        }
    }
    Ok(())
}

fn apt(options: &[String], args: &[&str], cwd: &Path) -> Result<(), String> {
    let mut cmd = Command::new("apt-get");
    for option in options {
        cmd.arg("-o").arg(option);
    }
    let out = cmd
        .args(args)
        .current_dir(cwd)
        .output()
        .map_err(|e| format!("cannot run apt-get: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`apt-get {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// `VERSION_CODENAME` from `/etc/os-release`, on Debian.
fn debian_codename() -> Option<String> {
    let release = std::fs::read_to_string("/etc/os-release").ok()?;
    let field = |key: &str| {
        release
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .map(|v| v.trim_matches('"').to_owned())
    };
    (field("ID=")? == "debian").then_some(())?;
    field("VERSION_CODENAME=")
}

/// What `valkey-server --version` says, for the log.
pub(crate) fn version(server: &Path) -> String {
    Command::new(server)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}
