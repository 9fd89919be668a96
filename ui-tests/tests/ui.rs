//! Compile-time promises, in one trybuild project so their dependencies are built once:
//! - `#[distributed_lock]`: every misuse is a compile error on the right token;
//! - `LockLayer`: a layer without a key function is not a `Layer`, and says so.
//!
//! What must compile (every supported function shape, layers with a key) lives in `macros/pass/`
//! and `tower/pass/`, built and run by cargo as test binaries of this package.

use std::path::PathBuf;
use std::process::Command;

#[test]
fn ui() {
    let outcome = std::panic::catch_unwind(cases);
    let Err(panic) = outcome else { return };
    // A regression in the macro or the layer fails the same cases the same way every time; a
    // run in which cargo itself broke fails every case at once. Show what cargo said, then run
    // the cases once more: only a second failure is the verdict.
    explain_cargo_failure();
    eprintln!("ui: running every case again");
    if std::panic::catch_unwind(cases).is_err() {
        std::panic::resume_unwind(panic);
    }
    eprintln!("ui: the second run passed; the first one's failure is explained above");
}

fn cases() {
    let t = trybuild::TestCases::new();
    t.compile_fail("macros/fail/*.rs");
    t.compile_fail("tower/fail/*.rs");
}

/// trybuild builds every case in one cargo run and keeps only the compiler's messages: when
/// cargo itself fails (a full disk, a killed process, a broken lock file), every case reads as
/// having compiled. Check the project again and show what cargo said, so such a failure names
/// its cause.
fn explain_cargo_failure() {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let trybuild = target.join("tests/trybuild");
    let project = trybuild.join(env!("CARGO_PKG_NAME"));
    eprintln!(
        "ui: checking {} again to show what cargo said",
        project.display()
    );
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    match Command::new(cargo)
        .current_dir(&project)
        .env("CARGO_TARGET_DIR", &trybuild)
        .env_remove("RUSTFLAGS")
        .args([
            "check",
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
