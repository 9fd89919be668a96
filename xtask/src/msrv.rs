//! The stated minimum Rust version, held to account: no dependency of a published crate may
//! need a newer compiler than the workspace's `rust-version`, and clippy's `incompatible_msrv`
//! (which catches newer standard-library APIs in our own code) is never silenced.

use std::path::Path;
use std::process::Command;

/// The crates users depend on or install, each with its directory.
const PUBLISHED: [(&str, &str); 5] = [
    ("dlock-core", "dlock-core"),
    ("dlock-macros", "dlock-macros"),
    ("dlock-tower", "dlock-tower"),
    ("dlock-checker", "checker"),
    ("dlock-cli", "cli"),
];

pub(crate) fn check(root: &Path) -> Result<(), String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--locked"])
        .current_dir(root)
        .output()
        .map_err(|e| format!("cannot run cargo metadata: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let meta: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("cargo metadata: {e}"))?;
    let packages = meta["packages"].as_array().ok_or("no packages")?;
    let ours = packages
        .iter()
        .find(|p| p["name"] == "dlock-core" && p["source"].is_null())
        .and_then(|p| p["rust_version"].as_str())
        .ok_or("dlock-core states no rust-version")?
        .to_owned();
    let version_of = |id: &str| packages.iter().find(|p| p["id"] == id);
    let nodes = meta["resolve"]["nodes"]
        .as_array()
        .ok_or("no resolve graph")?;
    let node = |id: &str| nodes.iter().find(|n| n["id"] == id);
    // Everything a published crate pulls in to build (normal and build dependencies).
    let mut stack: Vec<String> = packages
        .iter()
        .filter(|p| p["source"].is_null() && PUBLISHED.iter().any(|(n, _)| p["name"] == *n))
        .filter_map(|p| p["id"].as_str().map(str::to_owned))
        .collect();
    let mut seen = std::collections::BTreeSet::new();
    let mut too_new = Vec::new();
    while let Some(id) = stack.pop() {
        if !seen.insert(id.clone()) {
            continue;
        }
        if let Some(p) = version_of(&id)
            && let Some(needs) = p["rust_version"].as_str()
            && parse(needs) > parse(&ours)
        {
            too_new.push(format!("{} {} needs Rust {needs}", p["name"], p["version"]));
        }
        let deps = node(&id)
            .and_then(|n| n["deps"].as_array())
            .into_iter()
            .flatten();
        for dep in deps {
            let runtime = dep["dep_kinds"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|k| k["kind"].is_null() || k["kind"] == "build");
            if runtime && let Some(pkg) = dep["pkg"].as_str() {
                stack.push(pkg.to_owned());
            }
        }
    }
    if !too_new.is_empty() {
        return Err(format!(
            "the stated MSRV is {ours}, but: {}",
            too_new.join("; ")
        ));
    }
    for (_, dir) in PUBLISHED {
        silenced(&root.join(dir).join("src"))?;
    }
    println!(
        "xtask: MSRV {ours} holds for the {} crates the published ones build with",
        seen.len()
    );
    Ok(())
}

fn parse(version: &str) -> Vec<u64> {
    let mut parts: Vec<u64> = version.split('.').map(|p| p.parse().unwrap_or(0)).collect();
    parts.resize(3, 0);
    parts
}

/// Fails if a source file allows `incompatible_msrv`.
fn silenced(dir: &Path) -> Result<(), String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("read {}: {e}", dir.display()))?;
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            silenced(&path)?;
        } else if path.extension().is_some_and(|e| e == "rs")
            && std::fs::read_to_string(&path).is_ok_and(|s| s.contains("incompatible_msrv"))
        {
            return Err(format!(
                "{} silences clippy's incompatible_msrv",
                path.display()
            ));
        }
    }
    Ok(())
}
