//! The demo's printed table, as its tests read it.

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
