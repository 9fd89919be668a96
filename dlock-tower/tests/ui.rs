//! Compile-time promises: a `LockLayer` without a key function is not a `Layer`, and says so;
//! with one, it layers axum routers and tower services.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/fail/*.rs");
    t.pass("tests/ui/pass/*.rs");
}
