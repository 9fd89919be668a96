//! A lock's key as Redis holds it, for the tests that look behind the library's back: the
//! library's own codec (`dlock_core::protocol::hold`), so the tests read holds as the scripts
//! write them, with no parser of their own.

pub use dlock_core::protocol::hold::{ClaimValue, GrantValue, HoldValue};
