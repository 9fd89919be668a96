//! The demo as its tests run it, and its printed table as they read it.

use std::time::Duration;

/// Runs the `demo` binary with `args` (and neither of dlock's Redis variables, so it starts
/// its own servers) to its end, within `within`: its standard output and error. Panics, showing
/// both, unless it exits with success.
pub async fn run_demo(args: &[&str], within: Duration) -> (String, String) {
    let demo = tokio::process::Command::new(env!("CARGO_BIN_EXE_demo"))
        .args(args)
        .env_remove(flash_sale::server::REDIS_URL_ENV)
        .env_remove(flash_sale::server::REDIS_CLUSTER_URLS_ENV)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(within, demo)
        .await
        .unwrap_or_else(|_| panic!("the demo ends within {within:?}"))
        .expect("the demo starts");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{}\n{stdout}\n{stderr}", out.status);
    (stdout, stderr)
}

/// The cells of the row `label` of the demo's table in `stdout`, after the label: one per
/// column, trimmed. Panics, showing the output, when there is no such row.
pub fn row(stdout: &str, label: &str) -> Vec<String> {
    let line = (stdout.lines().find(|l| l.starts_with(label)))
        .unwrap_or_else(|| panic!("no `{label}` row in:\n{stdout}"));
    line[label.len()..]
        .split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Asserts that the table's second column (the round with locks) holds every invariant of a
/// demo of 300 buyers: no error, no duplicate order, nothing oversold, lost or sold twice, the
/// voucher's whole stock sold.
pub fn assert_locked_round_holds(stdout: &str, stderr: &str) {
    let cell = |label: &str| row(stdout, label)[1].clone();
    assert_eq!(cell("other errors"), "0", "{stdout}\n{stderr}");
    assert_eq!(cell("users with duplicate orders"), "0", "{stdout}");
    assert_eq!(cell("SKU units oversold"), "0", "{stdout}");
    assert_eq!(cell("units lost (stock − orders)"), "0", "{stdout}");
    assert_eq!(cell("units sold twice (lost updates)"), "0", "{stdout}");
    assert_eq!(cell("voucher orders / stock"), "100 / 100", "{stdout}");
    assert_eq!(cell("invariants hold"), "yes", "{stdout}");
}
