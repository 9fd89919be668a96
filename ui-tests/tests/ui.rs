//! Compile-time promises, in one trybuild project so their dependencies are built once:
//! - `#[distributed_lock]`: every misuse is a compile error on the right token, and every
//!   supported function shape compiles;
//! - `LockLayer`: a layer without a key function is not a `Layer`, and says so; with one, it
//!   layers axum routers and tower services.

use std::path::PathBuf;
use std::process::Command;

#[test]
fn ui() {
    let outcome = std::panic::catch_unwind(|| {
        let t = trybuild::TestCases::new();
        t.compile_fail("macros/fail/*.rs");
        t.pass("macros/pass/*.rs");
        t.compile_fail("tower/fail/*.rs");
        t.pass("tower/pass/*.rs");
    });
    if let Err(panic) = outcome {
        explain_cargo_failure();
        std::panic::resume_unwind(panic);
    }
}

/// trybuild builds every case in one cargo run and keeps only the compiler's messages: when
/// cargo itself fails (a full disk, a killed process, a broken lock file), every case reads as
/// having compiled. Build the project again and show what cargo said, so such a failure names
/// its cause.
fn explain_cargo_failure() {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let trybuild = target.join("tests/trybuild");
    let project = trybuild.join(env!("CARGO_PKG_NAME"));
    eprintln!(
        "ui: building {} again to show what cargo said",
        project.display()
    );
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    match Command::new(cargo)
        .current_dir(&project)
        .env("CARGO_TARGET_DIR", &trybuild)
        .env_remove("RUSTFLAGS")
        .args([
            "build",
            "--bins",
            "--offline",
            "--keep-going",
            "--color=never",
        ])
        .output()
    {
        Ok(output) => {
            let stderr = String::from_utf8_lossy(&output.stderr);
            let lines: Vec<&str> = stderr.lines().collect();
            let tail = &lines[lines.len().saturating_sub(60)..];
            eprintln!("ui: cargo exited with {}; its last lines:", output.status);
            for line in tail {
                eprintln!("  {line}");
            }
        }
        Err(error) => eprintln!("ui: cargo did not start: {error}"),
    }
    if let Ok(df) = Command::new("df")
        .args(["-h", "."])
        .current_dir(&project)
        .output()
    {
        eprintln!("ui: free space:\n{}", String::from_utf8_lossy(&df.stdout));
    }
}
