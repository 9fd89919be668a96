//! Compile-time checks of `#[distributed_lock]` (dlock-macros) and `LockLayer` (dlock-tower),
//! in `macros/` and `tower/`, each split into `fail/` (checked with trybuild from `tests/ui.rs`,
//! the expected compiler output next to each case) and `pass/` (test binaries of this package).
