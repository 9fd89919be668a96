//! Fencing tokens minted at the first ask (see the `protocol` module).

use std::sync::Arc;

use super::*;
use crate::fencing::FencingToken;
use crate::guard::{HoldState, LossReason};

impl Locker {
    /// `hold`'s fencing token: the one it got with its grant or an earlier ask, or one Redis
    /// mints now after checking that the hold is still there. A hold known to be lost gets
    /// `Lost`; one Redis no longer has is marked lost.
    pub(crate) async fn fencing_token(
        &self,
        hold: &Arc<HoldState>,
    ) -> Result<FencingToken, LockError> {
        // Lost here first: a token known from the grant is no authority once the hold is gone.
        if hold.is_lost() {
            return Err(hold.lost_error());
        }
        if let Some(token) = hold.fence.get() {
            return Ok(*token);
        }
        let session = (self.inner.backend.session().await).map_err(LockError::Backend)?;
        let minted = session
            .fence(&hold.keys, &hold.owner, self.inner.config.fence_ttl)
            .await
            .map_err(LockError::Backend)?;
        match minted {
            Some(token) => Ok(*hold.fence.get_or_init(|| FencingToken::new(token))),
            None => {
                hold.mark_lost(LossReason::Gone);
                Err(hold.lost_error())
            }
        }
    }

    /// The `Locker` behind `inner`, if it still lives.
    pub(crate) fn from_inner(inner: &std::sync::Weak<LockerInner>) -> Option<Locker> {
        inner.upgrade().map(|inner| Locker { inner })
    }
}
