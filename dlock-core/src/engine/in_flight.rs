//! The guard of a command whose reply may not have come: what makes every acquisition and
//! release cancellation-safe.

use std::sync::Arc;

use tokio::time::Instant;

use super::*;
use crate::backend::{Backend, Session};
use crate::name::LockKeys;

/// A command whose reply may not have come: dropped while armed, it sends a release for its
/// owner in the background — on the command's own connection when there is one, so the release
/// arrives after it.
pub(crate) struct InFlight {
    backend: Backend,
    pub(crate) session: Option<Session>,
    /// The lock the command was for, with its owner (a command for one lock needs no `Vec`)...
    one: Option<(Arc<LockKeys>, Arc<str>)>,
    /// ...or the locks of a command for several.
    many: Vec<(Arc<LockKeys>, Arc<str>)>,
    /// For a release: until when it keeps the name taken (`at_least`).
    keep_until: Option<Instant>,
    /// When the command went out (as its caller read it): an awaited clean-up ends one command
    /// timeout after it.
    since: Option<Instant>,
    armed: bool,
}

impl InFlight {
    pub(crate) fn new(locker: &Engine, keys: &Arc<LockKeys>, owner: &Arc<str>) -> Self {
        Self {
            backend: locker.inner.backend.clone(),
            session: None,
            one: Some((keys.clone(), owner.clone())),
            many: Vec::new(),
            keep_until: None,
            since: None,
            armed: true,
        }
    }

    /// For a command that took (or may have taken) several locks.
    pub(crate) fn many(locker: &Engine, holds: Vec<(Arc<LockKeys>, Arc<str>)>) -> Self {
        Self {
            backend: locker.inner.backend.clone(),
            session: None,
            one: None,
            many: holds,
            keep_until: None,
            since: None,
            armed: true,
        }
    }

    /// For a command its caller sent at `sent_at` (read for its own timing anyway): a
    /// [`settle`](Self::settle) after it is bounded from then.
    pub(crate) fn sent_at(mut self, sent_at: Instant) -> Self {
        self.since = Some(sent_at);
        self
    }

    /// For a release that keeps the name taken until `until`.
    pub(crate) fn keeping(mut self, until: Option<&Instant>) -> Self {
        self.keep_until = until.copied();
        self
    }

    pub(crate) fn disarm(&mut self) {
        self.armed = false;
    }

    /// Takes the answer of the command: an answer disarms the guard. A grant that came back
    /// [not replicated](crate::BackendError::is_not_replicated) is released before the caller
    /// hears of it, awaited on the command's own connection (which just answered), so the
    /// caller's next request finds the name as it was — within one command timeout of when the
    /// command went out, so that the call keeps its bound: a release that takes longer (a
    /// failover under way) goes on in the background. Any other failure leaves the guard armed:
    /// its release goes in the background once the guard is dropped.
    pub(crate) async fn settle<T>(&mut self, res: &Result<T, crate::BackendError>) {
        match res {
            Ok(_) => self.disarm(),
            Err(err) if err.is_not_replicated() && self.backend.is_remote() => {
                // Dropped while this runs, or out of time, the guard is still armed and sends
                // it again.
                let since = self.since.unwrap_or_else(Instant::now);
                let until = since + self.backend.command_timeout();
                let done = clean_up(
                    self.backend.clone(),
                    self.session.clone(),
                    self.one.clone(),
                    self.many.clone(),
                    self.keep_until,
                );
                if tokio::time::timeout_at(until, done).await == Ok(true) {
                    self.disarm();
                }
            }
            Err(_) => {}
        }
    }
}

/// Sends a release for each of `one` and `many` (kept taken until `keep_until`, for a
/// release's), on `session` when there is one, and says whether every one was answered.
async fn clean_up(
    backend: Backend,
    session: Option<Session>,
    one: Option<(Arc<LockKeys>, Arc<str>)>,
    many: Vec<(Arc<LockKeys>, Arc<str>)>,
    keep_until: Option<Instant>,
) -> bool {
    let session = match session {
        Some(session) => session,
        None => match backend.session().await {
            Ok(session) => session,
            Err(_) => return false,
        },
    };
    let keep = keep_until
        .map(|until| until.saturating_duration_since(Instant::now()))
        .filter(|left| !left.is_zero());
    let mut answered = true;
    for (keys, owner) in one.into_iter().chain(many) {
        answered &= session.clean_up(&keys, &owner, keep).await.is_ok();
    }
    answered
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if !self.armed || !self.backend.is_remote() {
            return;
        }
        let (backend, session) = (self.backend.clone(), self.session.take());
        let (one, many) = (self.one.take(), std::mem::take(&mut self.many));
        let keep_until = self.keep_until;
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                clean_up(backend, session, one, many, keep_until).await;
            });
        }
    }
}
