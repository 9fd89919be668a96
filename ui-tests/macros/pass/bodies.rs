//! Bodies and signatures the rewrite must keep intact.
#![deny(warnings)]
// Public items here show that the rewrite keeps a function's visibility; they are not an API.
#![allow(missing_docs, missing_debug_implementations)]

use std::fmt::Display;
use std::rc::Rc;
use std::sync::Arc;

use dlock_core::{LockError, Locker, distributed_lock};

// A one-expression body on one line: no `unused_braces` from the rewrite.
#[rustfmt::skip]
#[distributed_lock(key = "a:<id>")]
async fn one_line(id: u64) -> Result<u64, LockError> { Ok(id) }

// Inner attributes stay in the body.
#[distributed_lock(key = "a:<id>")]
async fn inner_attribute(id: u64) -> Result<u64, LockError> {
    #![allow(clippy::needless_return)]
    return Ok(id);
}

// `impl Trait` in the return type.
#[distributed_lock(key = "a:<id>")]
async fn opaque(id: u64) -> Result<impl Display, LockError> {
    Ok(id)
}

// Lockers behind smart pointers and references.
#[distributed_lock(key = "a:<id>", locker = locker)]
async fn arc_locker(locker: Arc<Locker>, id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[distributed_lock(key = "a:<id>", locker = locker)]
async fn rc_locker(locker: Rc<Locker>, id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[distributed_lock(key = "a:<id>", locker = *locker)]
async fn deref_locker(locker: &&Locker, id: u64) -> Result<u64, LockError> {
    Ok(id)
}

// Raw identifiers, tuple fields, `mut` parameters and lifetimes.
pub struct Pair(pub u64, pub String);

#[distributed_lock(key = "p:<pair.0>:<pair.1>:<r#type>")]
async fn fields<'a>(pair: &'a Pair, r#type: &'a str, mut n: u32) -> Result<&'a str, LockError> {
    n += 1;
    let _ = n;
    Ok(r#type)
}

// Parameters the body never touches are still moved into it and dropped with it.
#[distributed_lock(key = "a:<id>")]
async fn unused(id: u64, _unused: String) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

// A collection reached through a field, with a literal after it.
pub struct Cart {
    pub skus: Vec<u32>,
}

#[distributed_lock(key = "sku:<cart.skus*>:stock")]
async fn cart(cart: Cart) -> Result<usize, LockError> {
    Ok(cart.skus.len())
}

fn main() {
    let _ = (
        one_line(1),
        inner_attribute(1),
        opaque(1),
        arc_locker,
        rc_locker,
        deref_locker,
        fields,
        unused(1, String::new()),
        cart(Cart { skus: vec![1] }),
    );
}
