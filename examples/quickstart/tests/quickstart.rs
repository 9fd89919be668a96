//! The README's first command, run for real: two processes take turns on one lock.

use std::process::Command;

#[test]
fn two_processes_take_turns_with_rising_fencing_tokens() {
    let output = Command::new(env!("CARGO_BIN_EXE_quickstart"))
        .env_remove("DLOCK_URL")
        .output()
        .expect("run quickstart");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "quickstart failed: {}\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let tokens: Vec<u64> = stdout
        .lines()
        .filter_map(|l| l.split("fencing token ").nth(1))
        .map(|t| t.trim_end_matches(')').parse().expect("a token"))
        .collect();
    assert_eq!(tokens.len(), 6, "{stdout}");
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    // Each hold ends (`releases`, printed before the release) before the next one starts.
    let events: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains(" holds ") || l.contains(" releases "))
        .collect();
    assert_eq!(events.len(), 12, "{stdout}");
    assert!(
        events
            .chunks(2)
            .all(|p| p[0].contains(" holds ") && p[1].contains(" releases ")),
        "{stdout}"
    );
}
