//! Compile-time checks of `#[distributed_lock]` (trybuild): one mistake per file under
//! `ui/fail` with its reviewed `.stderr`; `ui/pass` files compile under `deny(warnings)` and
//! run.

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.pass("ui/pass/*.rs");
    cases.compile_fail("ui/fail/*.rs");
}
