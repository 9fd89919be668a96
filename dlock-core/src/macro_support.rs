//! Support for the code `#[distributed_lock]` generates. Not a public API: it may change in any
//! release.

use std::future::Future;
use std::time::Duration;

use crate::error::LockError;
use crate::locker::Locker;
use crate::multi::MultiLockRequest;
use crate::name::LockName;
use crate::request::LockRequest;

pub use crate::name::NameBuilder;
pub use crate::policy::OnLost;

/// How the attribute's lock is configured.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// How long to wait (`None`: the `Locker`'s default wait).
    pub wait: Option<Duration>,
    /// A fixed lease (`None`: the `Locker`'s default lease).
    pub lease: Option<Duration>,
    /// How long the name stays taken at least, from the grant (`None`: released at once).
    pub at_least: Option<Duration>,
    /// Loss policy.
    pub on_lost: OnLost,
    /// Whether a nested acquisition of a held name in the same task re-enters.
    pub reentrant: bool,
    /// A fair lock (one name only).
    pub fair: bool,
}

/// One name or several, as the key template produced them.
#[derive(Debug)]
pub enum Names {
    /// A single name.
    One(Result<LockName, LockError>),
    /// Several names (several keys or a collection placeholder): all-or-none.
    Many(Vec<Result<LockName, LockError>>),
}

/// What a `locker = ...` expression may be: a [`Locker`], or a reference or smart pointer to one.
#[diagnostic::on_unimplemented(
    message = "`locker = ...` must be a `dlock_core::Locker`, or a reference or smart pointer to one; found `{Self}`",
    label = "not a `Locker`"
)]
pub trait AsLocker {
    /// The locker.
    fn as_locker(&self) -> &Locker;
}

impl AsLocker for Locker {
    fn as_locker(&self) -> &Locker {
        self
    }
}

impl<T: AsLocker + ?Sized> AsLocker for &T {
    fn as_locker(&self) -> &Locker {
        (**self).as_locker()
    }
}

impl<T: AsLocker + ?Sized> AsLocker for &mut T {
    fn as_locker(&self) -> &Locker {
        (**self).as_locker()
    }
}

impl<T: AsLocker + ?Sized> AsLocker for Box<T> {
    fn as_locker(&self) -> &Locker {
        (**self).as_locker()
    }
}

impl<T: AsLocker + ?Sized> AsLocker for std::sync::Arc<T> {
    fn as_locker(&self) -> &Locker {
        (**self).as_locker()
    }
}

impl<T: AsLocker + ?Sized> AsLocker for std::rc::Rc<T> {
    fn as_locker(&self) -> &Locker {
        (**self).as_locker()
    }
}

/// The `locker = ...` expression's value as an owned `Locker` (a cheap clone), so that no borrow
/// of the function's parameters outlives the key computation.
pub fn to_locker<L: AsLocker + ?Sized>(locker: &L) -> Locker {
    locker.as_locker().clone()
}

/// A name built from the key template `template`, which it carries for its metrics' `key`
/// label.
pub fn from_template(
    name: Result<LockName, LockError>,
    template: &'static str,
) -> Result<LockName, LockError> {
    name.map(|name| name.with_template(template))
}

/// Appends a placeholder's value to a name (`Display`, escaped).
pub fn push_value<T: std::fmt::Display + ?Sized>(name: &mut NameBuilder, value: &T) {
    name.push_value(value);
}

/// Appends one name per item of a collection placeholder (`<items*>`, iterated by reference).
pub fn push_each<I, F>(names: &mut Vec<Result<LockName, LockError>>, items: I, name_of: F)
where
    I: IntoIterator,
    F: FnMut(I::Item) -> Result<LockName, LockError>,
{
    names.extend(items.into_iter().map(name_of));
}

/// The lock(s) the attribute holds.
enum Held {
    One(crate::LockGuard),
    Many(crate::MultiGuard),
}

impl Held {
    async fn acquire(locker: &Locker, names: Names, options: Options) -> Result<Self, LockError> {
        match names {
            Names::One(name) => {
                let mut request: LockRequest = if options.fair {
                    locker.fair_lock(name)
                } else {
                    locker.lock(name)
                };
                if let Some(wait) = options.wait {
                    request = request.wait(wait);
                }
                if let Some(lease) = options.lease {
                    request = request.lease(lease);
                }
                if let Some(at_least) = options.at_least {
                    request = request.at_least(at_least);
                }
                request.await.map(Self::One)
            }
            Names::Many(names) => {
                let mut request: MultiLockRequest = locker.lock_all(names);
                if let Some(wait) = options.wait {
                    request = request.wait(wait);
                }
                if let Some(lease) = options.lease {
                    request = request.lease(lease);
                }
                if let Some(at_least) = options.at_least {
                    request = request.at_least(at_least);
                }
                request.await.map(Self::Many)
            }
        }
    }

    async fn run<F: Future>(&self, body: F) -> Result<F::Output, LockError> {
        match self {
            Self::One(guard) => guard.run(body).await,
            Self::Many(guard) => guard.run(body).await,
        }
    }

    fn record(&self, locker: u64) {
        match self {
            Self::One(guard) => crate::scope::record_with(locker, &guard.state, false),
            Self::Many(guard) => {
                for guard in guard.guards() {
                    crate::scope::record_with(locker, &guard.state, false);
                }
            }
        }
    }

    async fn release(self) {
        match self {
            Self::One(guard) => {
                let _ = guard.release().await;
            }
            Self::Many(guard) => {
                let _ = guard.release().await;
            }
        }
    }
}

/// Acquires the lock(s) in a lock scope of this call's own, nested in the task's (re-entering a
/// hold of an enclosing call, unless `reentrant` is off), runs `body` under the loss policy, and
/// releases on every path: here on return, and through the guards' `Drop` on panic or
/// cancellation.
///
/// Each call's hold lives in its own scope: calls nested in the body see it (and re-enter it),
/// calls running beside it in the same task (`join!`, `select!`, a `FuturesUnordered`) do not —
/// they exclude each other as calls from two tasks would — and `fencing_token()` in the body is
/// this call's own.
///
/// `locker` is the `locker = ...` argument's value, `None` for the process-wide default.
pub async fn run<F, T, E>(
    locker: Option<Locker>,
    names: Names,
    options: Options,
    body: F,
) -> Result<T, E>
where
    F: Future<Output = Result<T, E>>,
    E: From<LockError>,
{
    let locker = match locker {
        Some(locker) => locker,
        None => crate::locker::default_locker()?.clone(),
    };
    let locker = &locker;
    crate::scope::LockScope::nested()
        .run(async move {
            let held = if options.reentrant {
                Held::acquire(locker, names, options).await
            } else {
                // Acquired outside the task's scope: it neither re-enters an outer hold nor can be
                // re-entered from the body.
                crate::scope::isolated_scope(Held::acquire(locker, names, options)).await
            };
            let held = held.map_err(E::from)?;
            if !options.reentrant {
                // Visible to `fencing_token()` and `held_lock()` in the body, never re-entered.
                held.record(locker.id());
            }
            let out = match options.on_lost {
                OnLost::Cancel => match held.run(body).await {
                    Ok(out) => out,
                    Err(lost) => Err(E::from(lost)),
                },
                OnLost::Signal => body.await,
            };
            held.release().await;
            out
        })
        .await
}
