//! Compile-time checks of `#[distributed_lock]` (dlock-macros) and `LockLayer` (dlock-tower),
//! run with trybuild from `tests/ui.rs`: the cases are in `macros/` and `tower/`, each split into
//! `fail/` (with the expected compiler output next to each case) and `pass/`.
