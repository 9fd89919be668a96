//! Compile-time promises, in one trybuild project so their dependencies are built once:
//! - `#[distributed_lock]`: every misuse is a compile error on the right token, and every
//!   supported function shape compiles;
//! - `LockLayer`: a layer without a key function is not a `Layer`, and says so; with one, it
//!   layers axum routers and tower services.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("macros/fail/*.rs");
    t.pass("macros/pass/*.rs");
    t.compile_fail("tower/fail/*.rs");
    t.pass("tower/pass/*.rs");
}
