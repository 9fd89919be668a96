//! (d) What is left behind once every guard is gone and every lease and every fair waiter's
//! place in line ran out: keys in Redis, waiters in a memory store's fair line, holds a locker
//! still renews or names it still watches.

use crate::hold::HoldValue;
use std::time::Duration;

use dlock_core::redis::{self, AsyncCommands as _};

use super::actors::Actor;
use super::history::ms;
use super::invariants::{Invariant, Violation};
use super::ops::Ctx;
use super::run::{Params, settle};

/// Whether `key` is one of a fair lock's line keys (`:queue`, `:alive`).
pub(super) fn is_fair_line(key: &str) -> bool {
    key.ends_with(":queue") || key.ends_with(":alive")
}

/// (d) every locker: no hold renewed, no name watched, once every guard is gone.
pub(super) fn locker_leftovers(actors: &[Actor], out: &mut Vec<Violation>) {
    for actor in actors {
        for (generation, l) in actor.generations().iter().enumerate() {
            let (renewed, watched) = (l.stats().renewed_holds, l.stats().watched_names);
            if renewed != 0 || watched != 0 {
                out.push(Violation {
                    invariant: Invariant::LeftBehind,
                    summary: format!(
                        "locker {} (generation {generation}) still renews {renewed} hold(s) and \
                         watches {watched} name(s) after every guard is gone",
                        actor.label
                    ),
                    window: None,
                    hint: "",
                });
            }
        }
    }
}

/// (d) on Redis or the memory store: every key of the run's prefix but the fencing counters
/// (which must have a TTL), after every lease and every waiter's place in line ran out.
pub(super) async fn redis_leftovers<C>(
    ctx: &Ctx,
    admin: &C,
    prefix: &str,
    settle: Duration,
) -> Vec<Violation>
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync,
{
    let mut out = Vec::new();
    let mut con = admin.clone();
    let keys: Vec<String> = {
        let mut iter = con
            .scan_match::<_, String>(format!("{}*", dlock_core::escape_glob(prefix)))
            .await
            .expect("SCAN the run's prefix");
        let mut keys = Vec::new();
        while let Some(key) = futures_util::StreamExt::next(&mut iter).await {
            keys.push(key.expect("a SCAN reply"));
        }
        keys
    };
    let guards = ctx.history.guards();
    for key in keys {
        let mut con = admin.clone();
        let pttl: i64 = con.pttl(&key).await.expect("PTTL");
        if key.ends_with(":fence") {
            if pttl == -1 {
                out.push(Violation {
                    invariant: Invariant::LeftBehind,
                    summary: format!("fencing counter {key} has no TTL"),
                    window: None,
                    hint: "",
                });
            }
            continue;
        }
        if is_fair_line(&key) {
            let members: Vec<(String, f64)> =
                (con.zrange_withscores(&key, 0, 4).await).unwrap_or_default();
            out.push(Violation {
                invariant: Invariant::LeftBehind,
                summary: format!(
                    "fair line key {key} remains {} after the last session ended, past the \
                     dead-waiter timeout ({}) of its last waiter: PTTL {pttl} ms, first \
                     members {members:?}",
                    ms(settle),
                    ms(ctx.history.dead_waiter_timeout)
                ),
                window: None,
                hint: "",
            });
            continue;
        }
        let fields: Option<String> = con.get(&key).await.unwrap_or_default();
        let name = ctx.keys.iter().position(|k| *k == key);
        let token = (fields.as_deref())
            .and_then(|v| HoldValue::try_parse(v).ok())
            .and_then(|h| h.token);
        let holder = guards
            .iter()
            .filter(|g| Some(usize::from(g.name)) == name && Some(g.token()) == token)
            .min_by_key(|g| g.call);
        let window = holder.map(|g| {
            let end = g.end();
            let last = end.map_or(g.start, |e| {
                e.hget.map_or(e.returned.map_or(e.at, |r| r.0), |h| h.0)
            });
            (g.name, g.call, last.max(g.start))
        });
        out.push(Violation {
            invariant: Invariant::LeftBehind,
            summary: format!(
                "lock key {key} remains after every guard is gone and every lease ran out: \
                 {fields:?}, PTTL {pttl} ms{}",
                holder.map_or(String::new(), |g| format!(
                    ", hold of g{} ({} w{})",
                    g.id,
                    ctx.history.lockers[usize::from(g.locker)],
                    g.worker
                ))
            ),
            window,
            hint: "",
        });
    }
    locker_leftovers(&ctx.actors, &mut out);
    out
}

/// (d) on the memory store, whose lines do not expire: nobody is left in the fair name's line.
pub(super) async fn fair_line_leftovers(ctx: &Ctx, p: Params, out: &mut Vec<Violation>) {
    let name = ctx.history.names[usize::from(p.fair_name())].as_str();
    match ctx.actors[0].locker().inspect(name).await {
        Ok(info) if info.queued_waiters == 0 => {}
        Ok(info) => out.push(Violation {
            invariant: Invariant::LeftBehind,
            summary: format!(
                "{} waiter(s) remain in the line of fair `{name}` {} after the last session \
                 ended (a waiter leaves the line when its call returns; the memory store's \
                 lines never expire): {info:?}",
                info.queued_waiters,
                ms(settle(p)),
            ),
            window: None,
            hint: "",
        }),
        Err(err) => out.push(Violation {
            invariant: Invariant::LeftBehind,
            summary: format!("inspect(`{name}`) failed on the memory store at the end: {err}"),
            window: None,
            hint: "",
        }),
    }
}
