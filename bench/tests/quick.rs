//! The benchmark's smoke run: every workload runs, with a row for every primitive and mode, and
//! sees no mutual-exclusion violation.
//! Timings are printed, never judged here.

use std::process::Command;

/// What `dlock-bench ARGS` printed on stdout, on its own servers; it must exit with success.
fn bench(args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_dlock-bench"))
        .args(args)
        .env_remove("DLOCK_URL")
        .output()
        .expect("run dlock-bench");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "dlock-bench {args:?} failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

#[test]
fn every_workload_runs_without_violations() {
    let stdout = bench(&["--quick"]);
    for workload in ["W1", "W2", "W3", "W4", "W5", "W6", "W7"] {
        assert!(
            stdout.contains(&format!("\"workload\":\"{workload}\"")),
            "{workload} did not report:\n{stdout}"
        );
    }
    let others = ["dlock-fair", "dlock-write", "dlock-permit"];
    let modes = [
        "dlock-cluster",
        "dlock-cluster-unacked",
        "dlock-sentinel",
        "dlock-sentinel-unacked",
        "dlock-ack",
        "dlock-majority",
    ];
    for lib in others.into_iter().chain(modes) {
        for workload in ["W1", "W2", "W3"] {
            assert!(
                stdout.contains(&format!(
                    "\"workload\":\"{workload}\",\"library\":\"{lib}\""
                )),
                "{workload} has no {lib} row:\n{stdout}"
            );
        }
    }
    assert!(
        stdout.contains("\"acquired_all\":1.000"),
        "W6: a waiter never acquired:\n{stdout}"
    );
}

#[test]
fn the_protocol_probes_run_when_named_and_only_then() {
    let probes =
        "raw,raw-scripted-acquire,raw-marked-release,raw-recorded-release,raw-hash-acquire";
    let stdout = bench(&["--quick", "--only", "W1", "--json-only", "--libs", probes]);
    for lib in probes.split(',') {
        let row = stdout
            .lines()
            .find(|l| l.contains(&format!("\"workload\":\"W1\",\"library\":\"{lib}\"")))
            .unwrap_or_else(|| panic!("no W1 row for {lib}:\n{stdout}"));
        assert!(row.contains("\"errors\":0,\"violations\":0"), "{row}");
    }
    // A run without `--libs` leaves them out.
    let all = bench(&["--quick", "--only", "W1", "--json-only"]);
    assert!(all.contains("\"library\":\"raw\""), "{all}");
    assert!(!all.contains("raw-scripted-acquire"), "{all}");
}
