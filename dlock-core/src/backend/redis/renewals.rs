//! Lease changes in batches: the watchdog's renewals and `extend`, on one server or spread over
//! a cluster's masters.

use std::time::Duration;

use redis::{FromRedisValue, Value};

#[cfg(feature = "cluster")]
use crate::backend::cluster::Masters;

use super::RedisBackend;
#[cfg(feature = "cluster")]
use super::RedisConn;
#[cfg(feature = "cluster")]
use super::code;
use super::code::Code;
use crate::backend::{RenewItem, RenewReply};
use crate::error::BackendError;
use crate::protocol;

/// How many locks one renewal script call carries; a tick pipelines as many calls as needed.
const RENEW_CHUNK: usize = 256;

/// What became of one slot's renewal on its master.
#[cfg(feature = "cluster")]
#[derive(Debug, Clone)]
enum SlotAnswer {
    /// Answered: one reply per item.
    Renewed(Vec<RenewReply>),
    /// The slot is migrating (`ASK`, `TRYAGAIN`): its items are renewed one by one, each where
    /// its key is.
    Migrating,
    /// Not renewed (`MOVED`, `CLUSTERDOWN`, ...).
    Failed,
}

impl RedisBackend {
    /// Applies every lease change in one round trip: one script call per chunk, all pipelined.
    /// On a cluster a script may only touch one slot, so the changes are grouped by slot and
    /// each group goes to its slot's master, all groups at once, each bounded by `within`.
    pub(crate) async fn renew(
        &self,
        items: &[RenewItem],
        within: Duration,
    ) -> Result<Vec<RenewReply>, BackendError> {
        #[cfg(feature = "cluster")]
        if let RedisConn::Cluster(_) = self.conn {
            return self.renew_by_slot(items, within).await;
        }
        self.renew_batch(items, within).await
    }

    /// [`renew`](Self::renew) on a cluster. Each slot's group succeeds or fails on its own: a
    /// dead master, or a slot caught mid-migration, leaves only its own groups unanswered.
    #[cfg(feature = "cluster")]
    async fn renew_by_slot(
        &self,
        items: &[RenewItem],
        within: Duration,
    ) -> Result<Vec<RenewReply>, BackendError> {
        use std::collections::BTreeMap;
        let mut groups: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
        for (i, item) in items.iter().enumerate() {
            let slot = crate::backend::cluster::key_slot(item.key.as_bytes());
            groups.entry(slot).or_default().push(i);
        }
        if let Some(masters) = self.masters.as_ref().filter(|m| m.direct()) {
            return self
                .renew_on_masters(masters, items, groups, within.min(self.timeout))
                .await;
        }
        let batches: Vec<(Vec<usize>, Vec<RenewItem>)> = (groups.into_values())
            .map(|idx| {
                let batch = idx.iter().map(|&i| items[i].clone()).collect();
                (idx, batch)
            })
            .collect();
        let within = within.min(self.timeout);
        let replies = futures_util::future::join_all((batches.iter()).map(|(_, batch)| async {
            match tokio::time::timeout(within, self.renew_batch(batch, within)).await {
                Ok(reply) => reply,
                Err(_) => Err(BackendError::timeout(within)),
            }
        }))
        .await;
        let mut out = vec![RenewReply::Unanswered; items.len()];
        let mut failed = 0usize;
        let mut first_error = None;
        for ((idx, _), reply) in batches.iter().zip(replies) {
            match reply {
                Ok(reply) => {
                    for (&i, r) in idx.iter().zip(reply) {
                        out[i] = r;
                    }
                }
                Err(err) => {
                    failed += 1;
                    first_error.get_or_insert(err);
                }
            }
        }
        match first_error {
            Some(err) if failed == batches.len() => Err(err),
            Some(err) => {
                tracing::warn!(
                    slots = batches.len(),
                    failed,
                    error = %err,
                    "dlock: renewal failed on some slots; the others were renewed"
                );
                Ok(out)
            }
            None => Ok(out),
        }
    }

    /// Every item of `items` on one connection, pipelined (with `WAIT` behind them when writes
    /// wait for replicas, waiting less than `within`: see `ReplicaAck::command_within`).
    pub(super) async fn renew_batch(
        &self,
        items: &[RenewItem],
        within: Duration,
    ) -> Result<Vec<RenewReply>, BackendError> {
        let mut pipe = redis::pipe();
        for chunk in items.chunks(RENEW_CHUNK) {
            pipe.add_command(self.renew_call(chunk));
        }
        // Every item is on one master (one server, or one slot of a cluster).
        let ack = match items.first() {
            Some(item) => self.ack_for(&item.key).await,
            None => None,
        };
        if let Some(ack) = ack {
            pipe.add_command(ack.command_within(within));
        }
        let mut replies = self.pipeline(&pipe, Some(self.renew_code())).await?;
        if let Some(ack) = ack {
            let acknowledged = match replies.pop() {
                Some(value) => ack
                    .count(value)
                    .map_err(|e| BackendError::protocol(format!("WAIT reply: {e}")))?,
                None => return Err(BackendError::protocol("no WAIT reply")),
            };
            // Not acknowledged: the changes count as not made (the guards' validity stays).
            self.acknowledged(Some((acknowledged, ack)))?;
        }
        let mut out = Vec::with_capacity(items.len());
        for reply in replies {
            out.extend(renew_codes(reply)?);
        }
        if out.len() != items.len() {
            return Err(BackendError::protocol("renew reply has the wrong length"));
        }
        Ok(out)
    }

    /// [`renew_by_slot`](Self::renew_by_slot) over direct connections to the masters: each
    /// master's slots in one pipeline on its own connection, all masters at once, each bounded
    /// by `within`. A master that fails, or a slot that answers `MOVED`/`ASK`, leaves only its
    /// own items unanswered (and has the slot map read again).
    #[cfg(feature = "cluster")]
    async fn renew_on_masters(
        &self,
        masters: &Masters,
        items: &[RenewItem],
        groups: std::collections::BTreeMap<u16, Vec<usize>>,
        within: Duration,
    ) -> Result<Vec<RenewReply>, BackendError> {
        use std::collections::HashMap;
        if masters.is_stale() {
            masters.refresh(within).await;
        }
        let mut by_node: HashMap<_, Vec<Vec<usize>>> = HashMap::new();
        let mut unknown = false;
        for (slot, idx) in groups {
            match masters.owner(slot) {
                Some(node) => by_node.entry(node).or_default().push(idx),
                None => unknown = true,
            }
        }
        if unknown {
            masters.mark_stale();
        }
        let calls = by_node.into_iter().map(|(node, slots)| async move {
            let run = self.renew_on_master(masters, &node, items, &slots, within);
            let replies = match tokio::time::timeout(within, run).await {
                Ok(replies) => replies,
                Err(_) => Err(BackendError::timeout(within)),
            };
            if replies.is_err() {
                masters.mark_stale();
            }
            (node, slots, replies)
        });
        let answers = futures_util::future::join_all(calls).await;
        let mut out = vec![RenewReply::Unanswered; items.len()];
        let mut answered = false;
        let mut first_error = None;
        let mut one_by_one = Vec::new();
        for (node, slots, replies) in answers {
            match replies {
                Ok(replies) => {
                    for (idx, reply) in slots.iter().zip(replies) {
                        match reply {
                            SlotAnswer::Renewed(reply) => {
                                answered = true;
                                for (&i, r) in idx.iter().zip(reply) {
                                    out[i] = r;
                                }
                            }
                            SlotAnswer::Migrating => {
                                one_by_one.extend(idx.iter().map(|&i| (node.clone(), i)));
                            }
                            SlotAnswer::Failed => {}
                        }
                    }
                }
                Err(err) => {
                    first_error.get_or_insert(err);
                }
            }
        }
        if !one_by_one.is_empty() {
            let singles = futures_util::future::join_all(
                (one_by_one.iter())
                    .map(|(node, i)| self.renew_one(masters, node, &items[*i], within)),
            );
            if let Ok(replies) = tokio::time::timeout(within, singles).await {
                for ((_, i), reply) in one_by_one.iter().zip(replies) {
                    if let Some(reply) = reply {
                        answered = true;
                        out[*i] = reply;
                    }
                }
            }
        }
        if !answered {
            return Err(first_error.unwrap_or_else(|| {
                BackendError::protocol("no slot's renewal was answered (the slot map is moving)")
            }));
        }
        if let Some(err) = first_error {
            tracing::warn!(error = %err, "dlock: renewal failed on a master; the others were renewed");
        }
        Ok(out)
    }

    /// One master's share of a renewal: a script call per slot (and chunk), pipelined, with
    /// `WAIT` behind them when writes wait for replicas. By slot: its replies, or what kept it
    /// from being renewed.
    #[cfg(feature = "cluster")]
    async fn renew_on_master(
        &self,
        masters: &Masters,
        node: &crate::backend::cluster::Node,
        items: &[RenewItem],
        slots: &[Vec<usize>],
        within: Duration,
    ) -> Result<Vec<SlotAnswer>, BackendError> {
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        // Which slot each call renews, and how many items it carries.
        let mut calls: Vec<usize> = Vec::new();
        for (s, idx) in slots.iter().enumerate() {
            let batch: Vec<RenewItem> = idx.iter().map(|&i| items[i].clone()).collect();
            for chunk in batch.chunks(RENEW_CHUNK) {
                pipe.add_command(self.renew_call(chunk));
                calls.push(s);
            }
        }
        let ack = (self.ack).and_then(|ack| ack.for_listed(masters.listed_replicas_of(node)));
        if let Some(ack) = ack {
            pipe.add_command(ack.command_within(within));
        }
        let mut conn = masters
            .connection(node, within)
            .await
            .map_err(BackendError::redis)?;
        let mut replies: Vec<redis::RedisResult<Value>> = match pipe.query_async(&mut conn).await {
            Ok(replies) => replies,
            Err(err) => {
                masters.forget(node);
                return Err(BackendError::redis(err));
            }
        };
        let missing = |r: &redis::RedisResult<Value>| r.as_ref().is_err_and(code::is_missing);
        if let Some(Err(err)) =
            (replies.iter()).find(|r| r.as_ref().is_err_and(code::refuses_functions))
        {
            // The next renewal goes by `EVALSHA`.
            self.functions.refuse();
            return Err(BackendError::redis(err.clone()));
        }
        if replies.iter().any(missing) {
            // Changes carry sequence numbers: sending them again is harmless.
            (self.renew_code().load(&mut conn).await).map_err(BackendError::redis)?;
            replies = pipe.query_async(&mut conn).await.map_err(|err| {
                masters.forget(node);
                BackendError::redis(err)
            })?;
        }
        if let Some(ack) = ack {
            let acknowledged = match replies.pop() {
                Some(Ok(value)) => ack
                    .count(value)
                    .map_err(|e| BackendError::protocol(format!("WAIT reply: {e}")))?,
                Some(Err(err)) => return Err(BackendError::redis(err)),
                None => return Err(BackendError::protocol("no WAIT reply")),
            };
            self.acknowledged(Some((acknowledged, ack)))?;
        }
        if replies.len() != calls.len() {
            return Err(BackendError::protocol("renew reply has the wrong length"));
        }
        let mut out = vec![SlotAnswer::Renewed(Vec::new()); slots.len()];
        for (s, reply) in calls.into_iter().zip(replies) {
            match reply {
                Ok(value) => {
                    if let SlotAnswer::Renewed(codes) = &mut out[s] {
                        codes.extend(renew_codes(value)?);
                    }
                }
                Err(err) => {
                    tracing::debug!(node = ?node, error = %err, "dlock: a slot's renewal failed");
                    masters.mark_stale();
                    out[s] = match err.kind() {
                        redis::ErrorKind::Server(
                            redis::ServerErrorKind::Ask | redis::ServerErrorKind::TryAgain,
                        ) => SlotAnswer::Migrating,
                        _ => SlotAnswer::Failed,
                    };
                }
            }
        }
        for (s, idx) in slots.iter().enumerate() {
            if matches!(&out[s], SlotAnswer::Renewed(codes) if codes.len() != idx.len()) {
                return Err(BackendError::protocol("renew reply has the wrong length"));
            }
        }
        Ok(out)
    }

    /// One item of a migrating slot renewed on its own: on the slot's master, or, if its key
    /// moved already (`ASK`), on the master it moves to. `None` when neither answered.
    #[cfg(feature = "cluster")]
    async fn renew_one(
        &self,
        masters: &Masters,
        node: &crate::backend::cluster::Node,
        item: &RenewItem,
        within: Duration,
    ) -> Option<RenewReply> {
        use crate::backend::cluster::Node;
        let call = self.renew_call(std::slice::from_ref(item));
        let ack = self.ack_for(&item.key).await;
        let mut at = node.clone();
        let mut asking = false;
        for _ in 0..3 {
            let mut conn = masters.connection(&at, within).await.ok()?;
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            if asking {
                pipe.cmd("ASKING");
            }
            pipe.add_command(call.clone());
            if let Some(ack) = ack {
                pipe.add_command(ack.command_within(within));
            }
            let mut replies: Vec<redis::RedisResult<Value>> =
                pipe.query_async(&mut conn).await.ok()?;
            if let Some(ack) = ack {
                let acknowledged = ack.count(replies.pop()?.ok()?).ok()?;
                self.acknowledged(Some((acknowledged, ack))).ok()?;
            }
            match replies.pop()? {
                Ok(value) => return renew_codes(value).ok()?.into_iter().next(),
                Err(err) if err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::Ask) => {
                    at = Node::parse(err.redirect_node()?.0)?;
                    asking = true;
                }
                Err(err) if code::is_missing(&err) => {
                    self.renew_code().load(&mut conn).await.ok()?;
                }
                Err(err) if code::refuses_functions(&err) => {
                    self.functions.refuse();
                    return None;
                }
                Err(_) => return None,
            }
        }
        None
    }
}

impl RedisBackend {
    /// One renewal script call for `chunk` (all of one slot on a cluster).
    fn renew_call(&self, chunk: &[RenewItem]) -> redis::Cmd {
        self.script_call(&protocol::Renew { items: chunk }).cmd
    }

    /// What a renewal runs (the library's function, or the script), loaded where the server
    /// lacks it.
    fn renew_code(&self) -> Code {
        Code::of(
            self.lua_of(&protocol::Renew { items: &[] }),
            &self.functions,
        )
    }
}

/// A renewal script's reply: one code per item.
fn renew_codes(reply: Value) -> Result<Vec<RenewReply>, BackendError> {
    let codes: Vec<i64> = FromRedisValue::from_redis_value(reply)
        .map_err(|e| BackendError::protocol(format!("renew reply: {e}")))?;
    Ok((codes.into_iter())
        .map(|c| match c {
            1 => RenewReply::Applied,
            2 => RenewReply::Stale,
            _ => RenewReply::Gone,
        })
        .collect())
}
