//! Compile-time checks: every misuse is a compile error on the right token, and every supported
//! function shape compiles.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/fail/*.rs");
    t.pass("tests/ui/pass/*.rs");
}
