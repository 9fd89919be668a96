//! The protocol: every Lua script dlock runs, the typed calls that run them, and the codec of
//! what a lock's key holds, in one place.
//!
//! Each script is a file in `protocol/lua/`, headed by its `KEYS`, `ARGV` and replies; the
//! helpers they share are in `protocol/lua/lib/` (the hold codec in `hold.lua`), pulled in by an
//! `--@include <name>` line where the script needs them. A call site never lists a script's
//! arguments by position: it fills a struct of `calls`, which writes them in the script's
//! order. [`hold`] reads and writes what a lock's key holds, as `hold.lua` does in the scripts.
//!
//! Key layout (all keys of one lock share the `{name}` hash tag):
//!
//! | key | type | holds |
//! | --- | --- | --- |
//! | `<prefix>{<name>}` | string | the hold (see below); lease = PTTL |
//! | `<prefix>{<name>}:fence` | hash | `n -> last fencing token` |
//! | `<prefix>{<name>}:wake` | channel | a message on every final release (sharded on a cluster) |
//! | `<prefix>{<name>}:queue` | sorted set | fair locks: `waiter -> place in line` |
//! | `<prefix>{<name>}:alive` | sorted set | fair locks: `waiter -> until when it counts as alive` (server ms) |
//! | `<prefix>{<name>}:wake:<waiter>` | channel | fair locks: wakes that waiter, once it heads the line |
//! | `<prefix>{<name>}:permits` | sorted set | semaphores: `permit id -> expiry` (server ms); permits taken at once add `<id>*2` … `<id>*n` |
//! | `<prefix>{<name>}:permits:limit` | string | semaphores: the permit count set at run time |
//! | `<prefix>{<name>}:permits:wake` | channel | semaphores: a message on every release |
//! | `<prefix>{<name>}:permits:turn` | string | semaphores: the claim to the next free permit (`<since>:<ms>:<turn id>`, `:<n>` for a claim of several) |
//! | `<prefix>{<name>}:write` | string | read-write locks: the writer's hold, as a lock's |
//! | `<prefix>{<name>}:write:fence` | hash | read-write locks: the writers' fencing counter |
//! | `<prefix>{<name>}:write:waiting` | sorted set | read-write locks: `writer -> until when its wait counts` (server ms) |
//! | `<prefix>{<name>}:read` | sorted set | read-write locks: `reader id -> expiry` (server ms) |
//! | `<prefix>{<name>}:rw:wake` | channel | read-write locks: a message when the writer or the last reader leaves |
//!
//! A lock's key holds one string, its first word saying what it is:
//!
//! - `<owner token>`: held by that owner (plain, fair, all-or-none locks, a writer);
//! - `#k:<owner token>`: kept taken after that owner's release (`at_least`), until it expires;
//! - `#r:<locker id>`: kept for the `Locker` next in turn after a release, for the time it asked.
//!
//! Every token (owner and hand-over tokens, locker ids, the members of the sorted sets) starts
//! with the tag of the key layout it was written in, `v2/` for this one; see [`layout`] for
//! which layouts this version speaks and what it does with a hold in another.
//!
//! Then fields, each one word after a space: ` f<token>` the hold's fencing token (once minted),
//! ` s<n>` the sequence number of the last lease change, ` w<waiting since>:<ms>:<locker id>`
//! the `Locker` next in turn (plain locks; a head waiter's claim goes on with
//! `:<sent ms>:<grant window ms>:<fence TTL ms>:<attempt>:<hand-over token>`), ` l` a waiter
//! found the hold taken (so a release wakes the waiters; one nobody waits for publishes
//! nothing). A plain lock taken at a first
//! attempt is `SET NX PX` of its owner token: no script runs for an uncontended acquisition.
//! Scripts write a hold with `PSETEX` (the same as `SET .. PX`), so `SET` in `INFO
//! commandstats` counts first attempts only.
//!
//! Fencing tokens: a plain lock's hold taken at a first attempt gets its token when its holder
//! first asks for it (`FENCE`, owner-checked; the token is kept on the hold as ` f`); one taken
//! after a wait, and the other kinds' holds (fair, writer, all-or-none, hand-over), get theirs
//! with the grant. Minting takes the server's
//! clock in microseconds (`TIME`), or the last token + 1 when that is not below it, and stores it
//! as the last token; a hand-over inside a `Locker`, which follows the hold that minted the last
//! token, mints that + 1 without reading the clock (tokens raised by one per hand-over stay below
//! the clock: hand-overs come more than a microsecond apart). So tokens
//! strictly increase on one server, and they also keep increasing when the last token is gone:
//! after the counter key expired, and after a failover to a replica that never received the
//! latest tokens (asynchronous replication). The second needs only that the new master's clock
//! is not behind the old master's by more than the time between the old master's last grant and
//! the new one's first — a failover takes seconds; NTP keeps clocks within milliseconds — and
//! that tokens do not run ahead of the clock, which takes more than one acquisition of one name
//! per microsecond. The counter key gets the configured TTL when it is created and is not
//! refreshed, so no counter key outlives its use by more than the TTL; only minting creates it
//! (a name whose holders never ask for a token has none).
//!
//! Holds are not counted in Redis: one owner token is one hold, and re-entry inside a lock scope
//! counts guards in the process (see `scope`). A re-entry only checks, read-only, that Redis still
//! has the hold, so nothing a re-entry does can be left behind by a dropped future or a timeout.
//!
//! A fair lock is a plain lock plus a waiting line: a waiter joins the line when it finds the lock
//! taken, and while anyone is in line only the head may take the free lock. Waiters prove they
//! are alive with every attempt (one per third of their timeout at least); the head of the line
//! is dropped, by whichever script next looks at it, once its time is up. Each waiter has its
//! own wake-up channel, and a release wakes only the head. Both sorted sets expire no earlier
//! than their last waiter's deadline, and Redis deletes a sorted set when its last member goes,
//! so no key outlives the line.
//!
//! Turns across processes (plain locks; writers and permits below): a waiter that finds the lock
//! taken claims the next turn
//! for its `Locker` (` w` on the hold), unless a claim from a waiter that has waited as long or
//! longer is there (by wall clock: hosts whose clocks are apart favour one by that much). So a
//! process farther from Redis, which loses every race to a nearer one, still gets its turn. A
//! `Locker` hands the lock from task to task only while no waiter of another `Locker` found the
//! hold taken (every attempt that does flags the hold: ` l<locker id>`, a bare ` l` once waiters
//! of two `Locker`s did) and no other `Locker` claimed the turn; otherwise it releases, and the
//! wake-up sends the other waiters to claim the turn on the next hold. Who subscribes does not
//! count: a subscription may linger after its last waiter. A
//! release with a claim on the hold keeps the key for the claimant's `Locker` (`#r:`) for the time
//! it asked for (a few of its round trips), and wakes the waiters as usual: a waiter of that
//! `Locker` takes it, the others find it taken and claim the next turn. A claimant that never
//! comes delays the lock by that time only; the kept key's PTTL is what the others wait for.
//!
//! A claim made by the head of a `Locker`'s local line carries that waiter's hand-over token,
//! a grant window (its command timeout, at most a third of its lease, at least its claim's
//! time, and a quarter of that more: the grace below), its fence TTL, when the attempt was sent
//! (on the clock that orders claims: the attempt reads no server clock) and the attempt's
//! number. A release that finds such
//! a claim no older than its window grants the lock to the token in the same step, for twice
//! the window (its fencing token minted with the grant), and says so in the
//! wake-up (`g<attempt>:<ms>:<fencing token>:<token>`): the waiter has the lock without a round
//! trip of its own, counts that lease from when it sent the attempt (before the grant, so its
//! belief ends before the server's grant does, whatever the clocks say), and
//! extends it to its own lease after the grace (a claim no older than the window leaves it at
//! least the window, whose rest gives that extension the
//! time any command has); a hold given back within the grace, as most are under contention,
//! never sends that extension. The claim's age is the server's clock against the waiter's:
//! clocks apart by some milliseconds only move which claims count as fresh. A grant heard of
//! when half of its lease is gone (counted from the send) is taken over by the waiter's next
//! attempt instead. A claimant that died delays the lock by twice its window at most; an older claim gets
//! the kept key instead. A waiter that leaves lets a grant to its token go, as a release would;
//! one whose wake-up was lost finds the grant at its next attempt and takes it over (its own
//! lease and owner token).
//!
//! A read-write lock's writers take turns the same way, their claims on the writer's hold, which
//! a writer's release keeps for the claimant's `Locker`; no grant is made in the release (the
//! claimant's head waiter takes the kept hold with its attempt). A semaphore's claim to its next
//! free permit is a key of its own (`:permits:turn`, lasting as long as the permits may plus
//! the claim's time); a permit given back while another `Locker` claims is kept for it as the
//! member `#r:<locker>`, counted as held until that `Locker`'s head waiter takes it or the
//! claim's time ends. Permits taken at once are several members (`<id>`, `<id>*2`, …), and a
//! waiter for several claims with its count appended (`:<n>`): while that claim stands, only
//! its `Locker`'s head waiter takes free permits (see `ACQUIRE_PERMIT`). Readers share the lock
//! and claim nothing.
//!
//! Lease changes (watchdog renewals, `extend`) carry a per-hold sequence number and apply only
//! if it is higher than the last one applied: a renewal that arrives late (a slow server, a
//! command that timed out but ran anyway) can't undo a later `extend`.

use std::sync::{LazyLock, OnceLock};

use redis::Script;

pub(crate) mod calls;
pub mod hold;
pub mod layout;
mod library;
#[cfg(feature = "cluster")]
pub mod slot;

pub(crate) use calls::*;
pub(crate) use library::LIBRARY;

/// A script of the protocol: its text, as sent with `EVAL`, the `redis::Script` that sends
/// it as `EVALSHA` (loading it when the server does not have it), and its function in the
/// [`library`] (this version's scripts; an earlier layout's frozen ones have none).
pub(crate) struct Lua {
    text: String,
    script: Script,
    /// The script's own lines (no helpers), and its function's flags: what the library makes
    /// its function of.
    body: String,
    flags: Vec<String>,
    /// The script's name (`ACQUIRE`, …), for its function's; `None` for a frozen script.
    name: Option<&'static str>,
    function: OnceLock<String>,
}

impl Lua {
    fn new(name: &'static str, file: &str) -> Self {
        Self {
            body: compose_with(file, false),
            flags: library::flags(file),
            name: Some(name),
            ..Self::from_text(compose(file))
        }
    }

    /// A script already made whole (an earlier layout's, frozen).
    fn from_text(text: String) -> Self {
        let script = Script::new(&text);
        Self {
            text,
            script,
            body: String::new(),
            flags: Vec::new(),
            name: None,
            function: OnceLock::new(),
        }
    }

    /// The script, for `EVALSHA`.
    pub(crate) fn script(&self) -> &Script {
        &self.script
    }

    /// The script's text, for `EVAL`.
    pub(crate) fn text(&self) -> &str {
        &self.text
    }

    /// The function of [`LIBRARY`] that runs this script, for `FCALL`; `None` for an earlier
    /// layout's script, which is sent by `EVALSHA` only.
    pub(crate) fn function(&self) -> Option<&str> {
        let name = self.name?;
        Some(self.function.get_or_init(|| LIBRARY.function(name)))
    }

    /// The script's lines without its helpers.
    fn body(&self) -> &str {
        &self.body
    }

    /// Its function's flags.
    fn flags(&self) -> &[String] {
        &self.flags
    }
}

/// A script's file made whole: each `--@include <name>` line replaced by the helpers of
/// `lua/lib/<name>.lua`, and comment lines left out (they are for the reader of the file; the
/// server would parse them on every load, and an `EVAL` would send them).
fn compose(file: &str) -> String {
    compose_with(file, true)
}

/// [`compose`], or the file's own lines only (`helpers` false: its `--@include` lines left
/// out, for the library, which defines the helpers once for all its functions).
fn compose_with(file: &str, helpers: bool) -> String {
    let mut text = String::with_capacity(file.len() + 4096);
    for line in file.lines() {
        if let Some(name) = line.trim_start().strip_prefix("--@include ") {
            match helper(name.trim()) {
                Some(_) if !helpers => continue,
                Some(lib) => text.push_str(&compose(lib)),
                // Kept as it is, a comment the server ignores; a test fails on it.
                None => text.push_str(line),
            }
        } else if !line.trim_start().starts_with("--") {
            text.push_str(line);
        }
        text.push('\n');
    }
    text
}

/// The helpers a script may include, by name.
fn helper(name: &str) -> Option<&'static str> {
    Some(match name {
        "clock" => include_str!("protocol/lua/lib/clock.lua"),
        "fence" => include_str!("protocol/lua/lib/fence.lua"),
        "hold" => include_str!("protocol/lua/lib/hold.lua"),
        "let_go" => include_str!("protocol/lua/lib/let_go.lua"),
        "sorted_sets" => include_str!("protocol/lua/lib/sorted_sets.lua"),
        _ => return None,
    })
}

/// Declares each script as a `static` read from its file.
macro_rules! scripts {
    ($($(#[$doc:meta])* $name:ident = $file:literal;)*) => {
        $(
            $(#[$doc])*
            pub(crate) static $name: LazyLock<Lua> =
                LazyLock::new(|| Lua::new(stringify!($name), include_str!(concat!("protocol/lua/", $file))));
        )*

        /// Every script, by name.
        static ALL: &[(&str, &LazyLock<Lua>)] = &[$((stringify!($name), &$name)),*];
    };
}

scripts! {
    /// A plain lock's attempt after a first `SET NX PX` found it taken, or a head waiter's.
    ACQUIRE = "acquire.lua";
    /// The fencing token of a plain lock's hold, minted when its holder first asks.
    FENCE = "fence.lua";
    /// All-or-none acquisition of several locks in one slot.
    ACQUIRE_ALL = "acquire_all.lua";
    /// A re-entry's read-only check of a lock's hold.
    HOLDS = "holds.lua";
    /// The owner-checked release of a lock or a writer's hold, passing it on to a claimant.
    RELEASE = "release.lua";
    /// A batch of lease changes.
    RENEW = "renew.lua";
    /// A hand-over inside one process.
    HANDOFF = "handoff.lua";
    /// A waiter that claimed the next turn leaves without the lock.
    LEAVE_TURN = "leave_turn.lua";
    /// What a name holds, for operators.
    INSPECT = "inspect.lua";
    /// An operator's release of whatever holds a name.
    FORCE_RELEASE = "force_release.lua";
    /// A fair lock's attempt, and its waiter's place in line.
    ACQUIRE_FAIR = "acquire_fair.lua";
    /// A semaphore's permit.
    ACQUIRE_PERMIT = "acquire_permit.lua";
    /// A permit given back.
    RELEASE_PERMIT = "release_permit.lua";
    /// A semaphore's permit count set at run time.
    SET_PERMITS = "set_permits.lua";
    /// A semaphore's permits now.
    PERMITS = "permits.lua";
    /// A read-write lock's writer's attempt.
    ACQUIRE_WRITE = "acquire_write.lua";
    /// A read-write lock's reader's attempt.
    ACQUIRE_READ = "acquire_read.lua";
    /// A reader leaves.
    RELEASE_READ = "release_read.lua";
    /// A permit's or a reader's read-only check.
    HOLDS_MEMBER = "holds_member.lua";
    /// A cluster subscriber's test message, published by the master of a channel's slot.
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    ECHO = "echo.lua";
}

/// Every script's name (`ACQUIRE`, …) and text as the server gets it: for the conformance
/// tests, which run each one on a server and on the memory store.
pub fn script_texts() -> Vec<(&'static str, &'static str)> {
    ALL.iter().map(|(name, lua)| (*name, lua.text())).collect()
}

/// This version's scripts as one library of Redis functions, as `FUNCTION LOAD` takes it, and
/// the function that runs each script (by the script's name, `ACQUIRE`, …): for the
/// conformance tests, which run each script both ways.
pub fn library() -> (&'static str, Vec<(&'static str, String)>) {
    let functions = ALL.iter().map(|(name, _)| (*name, LIBRARY.function(name)));
    (LIBRARY.text(), functions.collect())
}

/// Every script, by name.
fn all_scripts() -> impl Iterator<Item = (&'static str, &'static Lua)> {
    ALL.iter().map(|(name, lua)| (*name, &***lua))
}

#[cfg(test)]
mod tests {
    use super::{ALL, HANDOFF, LEAVE_TURN, compose};

    /// Every `--@include` names a helper that exists, and every script is made whole.
    #[test]
    fn every_include_is_resolved() {
        for (name, lua) in ALL {
            assert!(
                !lua.text().contains("--@include"),
                "{name} includes an unknown helper"
            );
            assert!(!lua.text().trim().is_empty(), "{name} is empty");
        }
        assert_eq!(
            compose("--@include none\nreturn 1"),
            "--@include none\nreturn 1\n"
        );
    }

    /// A script that publishes what `let_go` returns tells it whether it runs on a cluster by the
    /// very argument it publishes with: another argument would leave a cluster's grant rules
    /// (a token minted only where the name's fence is) to whatever that argument holds.
    #[test]
    fn let_go_is_told_of_a_cluster_by_the_publishing_argument() {
        for lua in [&HANDOFF, &LEAVE_TURN] {
            let call = (lua.text().lines())
                .find(|l| l.contains("let_go(KEYS[1]"))
                .expect("the script lets go");
            let published = call
                .split("redis.call(")
                .nth(1)
                .and_then(|rest| rest.split(',').next())
                .expect("the publish command's argument");
            assert!(
                call.contains(&format!("{published} == 'SPUBLISH'")),
                "{call}"
            );
        }
    }
}
