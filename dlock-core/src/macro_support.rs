//! Support for the code `#[distributed_lock]` generates. Not a public API: it may change in any
//! release.
