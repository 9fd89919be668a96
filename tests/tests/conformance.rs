//! The protocol's conformance table: for every script (and the first attempt's `SET NX PX`),
//! the keys before, the call, its reply and the keys after — run on the Redis-compatible server
//! of this test pass (Redis, or Valkey with `DLOCK_REDIS_SERVER`) and on the memory store, which
//! must answer alike. Each row starts from an empty keyspace.
//!
//! In the expected texts, `{n}` stands for any whole number (a fencing token from the clock, a
//! score from `TIME`), `{~N}` for a remaining time of about `N` ms (a little less: the row runs
//! after the keys were set), `{+}` for any positive time.

use std::time::Duration;

use std::future::IntoFuture as _;

use dlock_core::redis::{self, AsyncCommands as _, Value, aio::ConnectionLike};
use dlock_core::{Locker, MemoryStore, ReplicaAck};
use dlock_tests::RedisServer;

/// A key before a row runs: its value and its TTL (ms; 0: none).
#[derive(Clone, Copy)]
enum Before {
    Str(&'static str, &'static str, u64),
    Hash(&'static str, &'static [(&'static str, &'static str)]),
    Zset(&'static str, &'static [(&'static str, &'static str)]),
}

/// What a row runs: a script by name, or a plain command.
#[derive(Clone, Copy)]
enum Op {
    Script(
        &'static str,
        &'static [&'static str],
        &'static [&'static str],
    ),
    Command(&'static [&'static str]),
}

struct Row {
    what: &'static str,
    before: &'static [Before],
    op: Op,
    reply: &'static str,
    /// Every key after, sorted, as `key type value ttl`.
    after: &'static [&'static str],
}

use Before::{Hash, Str, Zset};
use Op::{Command, Script};

/// A time far ahead, in server ms (a member that never expires within a row).
const LATER: &str = "9999999999999";

/// `INSPECT`'s keys for the name `lk`: its lock, counter, channel and line, its read-write
/// lock's writer and readers, its semaphore's permits and set count.
const INSPECT_KEYS: &[&str] = &[
    "lk",
    "lk:fence",
    "lk:wake",
    "lk:queue",
    "lk:write",
    "lk:read",
    "lk:permits",
    "lk:permits:limit",
];

/// `FORCE_RELEASE`'s keys for the name `lk`: each kind's hold and wake-up channel.
const FORCE_RELEASE_KEYS: &[&str] = &[
    "lk",
    "lk:wake",
    "lk:queue",
    "lk:alive",
    "lk:write",
    "lk:read",
    "lk:rw:wake",
    "lk:permits",
    "lk:permits:wake",
];

const ROWS: &[Row] = &[
    // A first attempt.
    Row {
        what: "a first attempt takes a free lock without a script",
        before: &[],
        op: Command(&["SET", "lk", "o1", "NX", "PX", "30000"]),
        reply: "OK",
        after: &["lk string \"o1\" {~30000}"],
    },
    Row {
        what: "a first attempt finds the lock taken",
        before: &[Str("lk", "o0", 10000)],
        op: Command(&["SET", "lk", "o1", "NX", "PX", "30000"]),
        reply: "nil",
        after: &["lk string \"o0\" {~10000}"],
    },
    // ACQUIRE
    Row {
        what: "ACQUIRE takes a free lock, no token minted",
        before: &[],
        op: Script(
            "ACQUIRE",
            &["lk", "lk:fence"],
            &["o1", "30000", "0", "0", "aa", "0", "0"],
        ),
        reply: "[1, -1]",
        after: &["lk string \"o1\" {~30000}"],
    },
    Row {
        what: "ACQUIRE finds it taken: flags it and claims the next turn",
        before: &[Str("lk", "o0", 10000)],
        op: Script(
            "ACQUIRE",
            &["lk", "lk:fence"],
            &["o1", "30000", "300", "1000", "aa", "0", "0"],
        ),
        reply: "[0, {~10000}, -1]",
        after: &["lk string \"o0 laa w1000:300:aa\" {~10000}"],
    },
    Row {
        what: "ACQUIRE flagged by another Locker's waiter says several wait",
        before: &[Str("lk", "o0 lbb w500:300:bb", 10000)],
        op: Script(
            "ACQUIRE",
            &["lk", "lk:fence"],
            &["o1", "30000", "300", "1000", "aa", "0", "0"],
        ),
        reply: "[0, {~10000}, -1]",
        after: &["lk string \"o0 w500:300:bb l\" {~10000}"],
    },
    Row {
        what: "ACQUIRE finds a hold with a fencing token: busy, and says the token",
        before: &[Str("lk", "o0 f42", 10000)],
        op: Script(
            "ACQUIRE",
            &["lk", "lk:fence"],
            &["o1", "30000", "300", "1000", "aa", "0", "0"],
        ),
        reply: "[0, {~10000}, 42]",
        after: &["lk string \"o0 f42 laa w1000:300:aa\" {~10000}"],
    },
    Row {
        what: "ACQUIRE leaves an older claim of another Locker",
        before: &[Str("lk", "o0 l w500:300:bb", 10000)],
        op: Script(
            "ACQUIRE",
            &["lk", "lk:fence"],
            &["o1", "30000", "300", "1000", "aa", "0", "0"],
        ),
        reply: "[0, {~10000}, -1]",
        after: &["lk string \"o0 l w500:300:bb\" {~10000}"],
    },
    Row {
        what: "ACQUIRE from a head waiter mints with the grant",
        before: &[],
        op: Script(
            "ACQUIRE",
            &["lk", "lk:fence"],
            &["o1", "30000", "0", "0", "aa", "1", "60000"],
        ),
        reply: "[1, {n}]",
        after: &[
            "lk string \"o1 f{n}\" {~30000}",
            "lk:fence hash {n={n}} {~60000}",
        ],
    },
    Row {
        what: "ACQUIRE: a head waiter takes the lock kept for its Locker, another claim stays",
        before: &[Str("lk", "#r:aa w2000:300:bb l", 300)],
        op: Script(
            "ACQUIRE",
            &["lk", "lk:fence"],
            &["o1", "30000", "0", "0", "aa", "1", "0"],
        ),
        reply: "[1, {n}]",
        after: &[
            "lk string \"o1 w2000:300:bb l f{n}\" {~30000}",
            "lk:fence hash {n={n}} none",
        ],
    },
    Row {
        what: "ACQUIRE: a head waiter's claim offers its hand-over token",
        before: &[Str("lk", "o0", 10000)],
        op: Script(
            "ACQUIRE",
            &["lk", "lk:fence"],
            &[
                "o1", "30000", "300", "1000", "aa", "1", "0", "tk", "7", "40", "1234",
            ],
        ),
        reply: "[0, {~10000}, -1]",
        after: &["lk string \"o0 laa w1000:300:aa:1234:40:0:7:tk\" {~10000}"],
    },
    Row {
        what: "ACQUIRE: a waiter granted the lock takes the hold over with a token of its own",
        before: &[Str("lk", "tk f55 s3 l", 400)],
        op: Script(
            "ACQUIRE",
            &["lk", "lk:fence"],
            &["o1", "30000", "0", "0", "aa", "1", "0", "tk", "8", "40"],
        ),
        reply: "[1, {n}]",
        after: &[
            "lk string \"o1 l f{n}\" {~30000}",
            "lk:fence hash {n={n}} none",
        ],
    },
    Row {
        what: "ACQUIRE: a retry finds the lock held by its owner, and sets its lease from now",
        before: &[Str("lk", "o1 f9", 5000)],
        op: Script(
            "ACQUIRE",
            &["lk", "lk:fence"],
            &["o1", "30000", "0", "0", "aa", "0", "0"],
        ),
        reply: "[1, 9]",
        after: &["lk string \"o1 f9\" {~30000}"],
    },
    Row {
        what: "ACQUIRE: a late copy finds the lock held by its owner longer: left as it is",
        before: &[Str("lk", "o1 f9", 60000)],
        op: Script(
            "ACQUIRE",
            &["lk", "lk:fence"],
            &["o1", "30000", "0", "0", "aa", "0", "0"],
        ),
        reply: "[1, 9]",
        after: &["lk string \"o1 f9\" {~60000}"],
    },
    Row {
        what: "ACQUIRE names the lock alone while its slot moves: no token",
        before: &[],
        op: Script(
            "ACQUIRE",
            &["lk"],
            &["o1", "30000", "0", "0", "aa", "1", "0"],
        ),
        reply: "[1, -1]",
        after: &["lk string \"o1\" {~30000}"],
    },
    // FENCE
    Row {
        what: "FENCE mints a token at the first ask, the counter with its TTL",
        before: &[Str("lk", "o1", 30000)],
        op: Script("FENCE", &["lk", "lk:fence"], &["o1", "60000"]),
        reply: "{n}",
        after: &[
            "lk string \"o1 f{n}\" {~30000}",
            "lk:fence hash {n={n}} {~60000}",
        ],
    },
    Row {
        what: "FENCE answers the token minted before",
        before: &[Str("lk", "o1 f42", 30000)],
        op: Script("FENCE", &["lk", "lk:fence"], &["o1", "60000"]),
        reply: "42",
        after: &["lk string \"o1 f42\" {~30000}"],
    },
    Row {
        what: "FENCE refuses one that does not hold the lock",
        before: &[Str("lk", "o2", 30000)],
        op: Script("FENCE", &["lk", "lk:fence"], &["o1", "0"]),
        reply: "-1",
        after: &["lk string \"o2\" {~30000}"],
    },
    Row {
        what: "FENCE goes past a last token ahead of the clock",
        before: &[
            Str("lk", "o1", 30000),
            Hash("lk:fence", &[("n", "9000000000000000")]),
        ],
        op: Script("FENCE", &["lk", "lk:fence"], &["o1", "60000"]),
        reply: "9000000000000001",
        after: &[
            "lk string \"o1 f9000000000000001\" {~30000}",
            "lk:fence hash {n=9000000000000001} none",
        ],
    },
    // ACQUIRE_ALL
    Row {
        what: "ACQUIRE_ALL takes every free lock, each with a token",
        before: &[],
        op: Script(
            "ACQUIRE_ALL",
            &["a", "a:fence", "b", "b:fence"],
            &["30000", "0", "o1", "o2"],
        ),
        reply: "[1, {n}, {n}]",
        after: &[
            "a string \"o1 f{n}\" {~30000}",
            "a:fence hash {n={n}} none",
            "b string \"o2 f{n}\" {~30000}",
            "b:fence hash {n={n}} none",
        ],
    },
    Row {
        what: "ACQUIRE_ALL finds one busy: nothing taken, the busy one flagged",
        before: &[Str("b", "ox", 10000)],
        op: Script(
            "ACQUIRE_ALL",
            &["a", "a:fence", "b", "b:fence"],
            &["30000", "0", "o1", "o2"],
        ),
        reply: "[0, 2, {~10000}]",
        after: &["b string \"ox l\" {~10000}"],
    },
    // HOLDS
    Row {
        what: "HOLDS: still held, with its token",
        before: &[Str("lk", "o1 f7", 30000)],
        op: Script("HOLDS", &["lk"], &["o1"]),
        reply: "[1, 7]",
        after: &["lk string \"o1 f7\" {~30000}"],
    },
    Row {
        what: "HOLDS: gone",
        before: &[],
        op: Script("HOLDS", &["lk"], &["o1"]),
        reply: "[0, -2]",
        after: &[],
    },
    // RELEASE
    Row {
        what: "RELEASE: the common release deletes the key",
        before: &[Str("lk", "o1", 30000)],
        op: Script("RELEASE", &["lk"], &["o1"]),
        reply: "0",
        after: &[],
    },
    Row {
        what: "RELEASE: a hold with fields nobody waits for",
        before: &[Str("lk", "o1 f5 s2", 30000)],
        op: Script("RELEASE", &["lk"], &["o1", "", "PUBLISH", "0", "0"]),
        reply: "0",
        after: &[],
    },
    Row {
        what: "RELEASE keeps the lock for the Locker that claimed the next turn",
        before: &[Str("lk", "o1 l w1000:300:aa", 30000)],
        op: Script("RELEASE", &["lk"], &["o1", "", "PUBLISH", "0", "0"]),
        reply: "0",
        after: &["lk string \"#r:aa\" {~300}"],
    },
    Row {
        what: "RELEASE grants the lock to a head waiter's claim, minting its token",
        before: &[Str("lk", "o1 l w1000:300:aa:0:9999999999999:0:7:tk", 30000)],
        op: Script("RELEASE", &["lk"], &["o1", "", "PUBLISH", "0", "0"]),
        reply: "0",
        after: &["lk string \"tk f{n} l\" {+}", "lk:fence hash {n={n}} none"],
    },
    Row {
        what: "RELEASE grants a fresh claim (sent later than the server's clock) for twice its window",
        before: &[Str(
            "lk",
            "o1 l w1000:300:aa:9999999999999:400:0:7:tk",
            30000,
        )],
        op: Script("RELEASE", &["lk"], &["o1", "", "PUBLISH", "0", "0"]),
        reply: "0",
        after: &[
            "lk string \"tk f{n} l\" {~800}",
            "lk:fence hash {n={n}} none",
        ],
    },
    Row {
        what: "RELEASE keeps the lock for a head waiter whose claim is older than its window",
        before: &[Str("lk", "o1 l w1000:300:aa:1000:400:0:7:tk", 30000)],
        op: Script("RELEASE", &["lk"], &["o1", "", "PUBLISH", "0", "0"]),
        reply: "0",
        after: &["lk string \"#r:aa\" {~300}"],
    },
    Row {
        what: "RELEASE keeps the name taken after the release (at_least)",
        before: &[Str("lk", "o1", 30000)],
        op: Script("RELEASE", &["lk"], &["o1", "", "PUBLISH", "5000", "0"]),
        reply: "0",
        after: &["lk string \"#k:o1\" {~5000}"],
    },
    Row {
        what: "RELEASE: held by another owner",
        before: &[Str("lk", "o2", 30000)],
        op: Script("RELEASE", &["lk"], &["o1"]),
        reply: "-2",
        after: &["lk string \"o2\" {~30000}"],
    },
    Row {
        what: "RELEASE: gone",
        before: &[],
        op: Script("RELEASE", &["lk"], &["o1"]),
        reply: "-1",
        after: &[],
    },
    Row {
        what: "RELEASE of a fair lock: the line stays for its head",
        before: &[
            Str("lk", "o1 f3", 30000),
            Zset("lk:queue", &[("o2", "1")]),
            Zset("lk:alive", &[("o2", LATER)]),
        ],
        op: Script(
            "RELEASE",
            &["lk", "lk:wake", "lk:queue", "lk:alive"],
            &["o1", "", "PUBLISH", "0", "1"],
        ),
        reply: "0",
        after: &[
            "lk:alive zset {o2=9999999999999} none",
            "lk:queue zset {o2=1} none",
        ],
    },
    Row {
        what: "RELEASE of a writer that gave up: it stops waiting",
        before: &[Zset("rw:write:waiting", &[("o1", LATER)])],
        op: Script(
            "RELEASE",
            &["rw:write", "rw:rw:wake", "rw:write:waiting"],
            &["o1", "", "PUBLISH", "0", "2"],
        ),
        reply: "-1",
        after: &[],
    },
    Row {
        what: "RELEASE by the key alone while the slot moves (mode 3)",
        before: &[Str("lk", "o1", 30000)],
        op: Script(
            "RELEASE",
            &["lk"],
            &["o1", "", "PUBLISH", "0", "3", "lk:wake"],
        ),
        reply: "0",
        after: &[],
    },
    // RENEW
    Row {
        what: "RENEW applies a later lease change",
        before: &[Str("lk", "o1 s1", 1000)],
        op: Script("RENEW", &["lk"], &["o1", "30000", "2"]),
        reply: "[1]",
        after: &["lk string \"o1 s2\" {~30000}"],
    },
    Row {
        what: "RENEW ignores a stale one",
        before: &[Str("lk", "o1 s5", 10000)],
        op: Script("RENEW", &["lk"], &["o1", "30000", "3"]),
        reply: "[2]",
        after: &["lk string \"o1 s5\" {~10000}"],
    },
    Row {
        what: "RENEW moves a permit's expiry, and answers 0 for a key of another type",
        before: &[Zset("sp", &[("p1", LATER)]), Hash("other", &[("a", "b")])],
        op: Script(
            "RENEW",
            &["sp", "other"],
            &["p1", "30000", "p4", "o1", "30000", "1"],
        ),
        reply: "[1, 0]",
        after: &["other hash {a=b} none", "sp zset {p1={n}} {~30000}"],
    },
    Row {
        what: "RENEW moves the expiry of permits taken at once together",
        before: &[Zset("sp", &[("p1", LATER), ("p1*2", LATER), ("p2", LATER)])],
        op: Script("RENEW", &["sp"], &["p1", "30000", "p4x2"]),
        reply: "[1]",
        after: &["sp zset {p1={n}, p1*2={n}, p2=9999999999999} {~30000}"],
    },
    // HANDOFF
    Row {
        what: "HANDOFF hands the lock over in one step, with a fresh token",
        before: &[Str("lk", "o1 f3", 30000)],
        op: Script(
            "HANDOFF",
            &["lk", "lk:fence", "lk:wake"],
            &["o1", "o2", "30000", "0", "NUMSUB", "aa", "PUBLISH"],
        ),
        reply: "[1, {n}]",
        after: &[
            "lk string \"o2 f{n}\" {~30000}",
            "lk:fence hash {n={n}} none",
        ],
    },
    Row {
        what: "HANDOFF releases instead when another Locker claimed the next turn",
        before: &[Str("lk", "o1 l w1000:300:bb", 30000)],
        op: Script(
            "HANDOFF",
            &["lk", "lk:fence", "lk:wake"],
            &["o1", "o2", "30000", "0", "NUMSUB", "aa", "PUBLISH"],
        ),
        reply: "[2, 0]",
        after: &["lk string \"#r:bb\" {~300}"],
    },
    Row {
        what: "HANDOFF releases instead when a waiter of another Locker found the hold taken",
        before: &[Str("lk", "o1 f3 lbb", 30000)],
        op: Script(
            "HANDOFF",
            &["lk", "lk:fence", "lk:wake"],
            &["o1", "o2", "30000", "0", "NUMSUB", "aa", "PUBLISH"],
        ),
        reply: "[2, 0]",
        after: &[],
    },
    Row {
        what: "HANDOFF hands over when only its own Locker's waiters found the hold taken",
        before: &[Str("lk", "o1 f3 laa w1000:300:aa", 30000)],
        op: Script(
            "HANDOFF",
            &["lk", "lk:fence", "lk:wake"],
            &["o1", "o2", "30000", "0", "NUMSUB", "aa", "PUBLISH"],
        ),
        reply: "[1, {n}]",
        after: &[
            "lk string \"o2 f{n}\" {~30000}",
            "lk:fence hash {n={n}} none",
        ],
    },
    Row {
        what: "HANDOFF: held by another owner",
        before: &[Str("lk", "o9", 30000)],
        op: Script(
            "HANDOFF",
            &["lk", "lk:fence", "lk:wake"],
            &["o1", "o2", "30000", "0", "NUMSUB", "aa", "PUBLISH"],
        ),
        reply: "[0, -2]",
        after: &["lk string \"o9\" {~30000}"],
    },
    // LEAVE_TURN
    Row {
        what: "LEAVE_TURN takes a waiter's claim back",
        before: &[Str("lk", "o0 l w1000:300:aa", 10000)],
        op: Script(
            "LEAVE_TURN",
            &["lk", "lk:wake"],
            &["1000", "aa", "0", "PUBLISH"],
        ),
        reply: "1",
        after: &["lk string \"o0 l\" {~10000}"],
    },
    Row {
        what: "LEAVE_TURN leaves another Locker's claim",
        before: &[Str("lk", "o0 w1000:300:bb", 10000)],
        op: Script(
            "LEAVE_TURN",
            &["lk", "lk:wake"],
            &["1000", "aa", "0", "PUBLISH"],
        ),
        reply: "0",
        after: &["lk string \"o0 w1000:300:bb\" {~10000}"],
    },
    Row {
        what: "LEAVE_TURN: the last waiter gives up the lock kept for its Locker",
        before: &[Str("lk", "#r:aa", 300)],
        op: Script(
            "LEAVE_TURN",
            &["lk", "lk:wake"],
            &["1000", "aa", "1", "PUBLISH"],
        ),
        reply: "1",
        after: &[],
    },
    Row {
        what: "LEAVE_TURN passes a grant to its token on to the next claimant",
        before: &[Str("lk", "tk f9 l w2000:300:bb", 400)],
        op: Script(
            "LEAVE_TURN",
            &["lk", "lk:wake"],
            &["1000", "aa", "0", "PUBLISH", "tk"],
        ),
        reply: "1",
        after: &["lk string \"#r:bb\" {~300}"],
    },
    // INSPECT
    Row {
        what: "INSPECT: a holder (never its whole token), its token, the last one, the line",
        before: &[
            Str("lk", "0123456789abcdef0123456789abcdef@job f12", 30000),
            Hash("lk:fence", &[("n", "15")]),
            Zset("lk:queue", &[("w1", "1"), ("w2", "2")]),
        ],
        op: Script("INSPECT", INSPECT_KEYS, &["NUMSUB"]),
        reply: "[{~30000}, [\"01234567\", \"job\"], \"12\", 0, 0, \"15\", 0, 2, -2, [], 0, 0, \"\"]",
        after: &[
            "lk string \"0123456789abcdef0123456789abcdef@job f12\" {~30000}",
            "lk:fence hash {n=15} none",
            "lk:queue zset {w1=1, w2=2} none",
        ],
    },
    Row {
        what: "INSPECT: a key kept after a release",
        before: &[Str("lk", "#k:o1", 5000)],
        op: Script("INSPECT", INSPECT_KEYS, &["NUMSUB"]),
        reply: "[{~5000}, [], \"\", 1, 0, \"\", 0, 0, -2, [], 0, 0, \"\"]",
        after: &["lk string \"#k:o1\" {~5000}"],
    },
    Row {
        what: "INSPECT: a value that is not a lock's",
        before: &[Str("lk", "hello", 0)],
        op: Script("INSPECT", INSPECT_KEYS, &["NUMSUB"]),
        reply: "[-1, [], \"\", 0, 1, \"\", 0, 0, -2, [], 0, 0, \"\"]",
        after: &["lk string \"hello\" none"],
    },
    Row {
        what: "INSPECT: the read-write lock's writer and live readers, the semaphore's live \
               permits and set count",
        before: &[
            Str("lk:write", "fedcba9876543210fedcba9876543210@api f3", 20000),
            Zset("lk:read", &[("r1", LATER), ("r2", "1")]),
            Zset("lk:permits", &[("p1", LATER), ("p2", LATER), ("p3", "1")]),
            Str("lk:permits:limit", "5", 0),
        ],
        op: Script("INSPECT", INSPECT_KEYS, &["NUMSUB"]),
        reply: "[-2, [], \"\", 0, 0, \"\", 0, 0, {~20000}, [\"fedcba98\", \"api\"], 1, 2, \"5\"]",
        after: &[
            "lk:permits zset {p3=1, p1=9999999999999, p2=9999999999999} none",
            "lk:permits:limit string \"5\" none",
            "lk:read zset {r2=1, r1=9999999999999} none",
            "lk:write string \"fedcba9876543210fedcba9876543210@api f3\" {~20000}",
        ],
    },
    // FORCE_RELEASE
    Row {
        what: "FORCE_RELEASE removes any holder; the line stays for its head",
        before: &[
            Str("lk", "o1", 30000),
            Zset("lk:queue", &[("w1", "1")]),
            Zset("lk:alive", &[("w1", LATER)]),
        ],
        op: Script("FORCE_RELEASE", FORCE_RELEASE_KEYS, &["PUBLISH"]),
        reply: "1",
        after: &[
            "lk:alive zset {w1=9999999999999} none",
            "lk:queue zset {w1=1} none",
        ],
    },
    Row {
        what: "FORCE_RELEASE: nothing to remove",
        before: &[],
        op: Script("FORCE_RELEASE", FORCE_RELEASE_KEYS, &["PUBLISH"]),
        reply: "0",
        after: &[],
    },
    Row {
        what: "FORCE_RELEASE removes the writer, the readers and the permits; the set count stays",
        before: &[
            Str("lk:write", "o1", 20000),
            Zset("lk:read", &[("r1", LATER)]),
            Zset("lk:permits", &[("p1", LATER)]),
            Str("lk:permits:limit", "5", 0),
        ],
        op: Script("FORCE_RELEASE", FORCE_RELEASE_KEYS, &["PUBLISH"]),
        reply: "3",
        after: &["lk:permits:limit string \"5\" none"],
    },
    // ACQUIRE_FAIR
    Row {
        what: "ACQUIRE_FAIR takes a free lock nobody waits for",
        before: &[],
        op: Script(
            "ACQUIRE_FAIR",
            &["lk", "lk:fence", "lk:wake", "lk:queue", "lk:alive"],
            &["o1", "30000", "0", "5000", "PUBLISH"],
        ),
        reply: "[1, {n}]",
        after: &[
            "lk string \"o1 f{n}\" {~30000}",
            "lk:fence hash {n={n}} none",
        ],
    },
    Row {
        what: "ACQUIRE_FAIR finds it taken: the waiter joins the line",
        before: &[Str("lk", "o0", 10000)],
        op: Script(
            "ACQUIRE_FAIR",
            &["lk", "lk:fence", "lk:wake", "lk:queue", "lk:alive"],
            &["o1", "30000", "0", "5000", "PUBLISH"],
        ),
        reply: "[0, {~10000}, 0]",
        after: &[
            "lk string \"o0\" {~10000}",
            "lk:alive zset {o1={n}} {~5000}",
            "lk:queue zset {o1=1} {~5000}",
        ],
    },
    Row {
        what: "ACQUIRE_FAIR: free, but another heads the line, so it is woken and this one queues",
        before: &[
            Zset("lk:queue", &[("o0", "1")]),
            Zset("lk:alive", &[("o0", LATER)]),
        ],
        op: Script(
            "ACQUIRE_FAIR",
            &["lk", "lk:fence", "lk:wake", "lk:queue", "lk:alive"],
            &["o1", "30000", "0", "5000", "PUBLISH"],
        ),
        reply: "[0, -2, 1]",
        after: &[
            "lk:alive zset {o1={n}, o0=9999999999999} {~5000}",
            "lk:queue zset {o0=1, o1=2} {~5000}",
        ],
    },
    Row {
        what: "ACQUIRE_FAIR: the head takes it and leaves the line",
        before: &[
            Zset("lk:queue", &[("o1", "1")]),
            Zset("lk:alive", &[("o1", LATER)]),
        ],
        op: Script(
            "ACQUIRE_FAIR",
            &["lk", "lk:fence", "lk:wake", "lk:queue", "lk:alive"],
            &["o1", "30000", "60000", "5000", "PUBLISH"],
        ),
        reply: "[1, {n}]",
        after: &[
            "lk string \"o1 f{n}\" {~30000}",
            "lk:fence hash {n={n}} {~60000}",
        ],
    },
    // ACQUIRE_PERMIT
    Row {
        what: "ACQUIRE_PERMIT takes one while fewer than the count are held",
        before: &[],
        op: Script("ACQUIRE_PERMIT", &["sp", "sp:limit"], &["p1", "30000", "2"]),
        reply: "[1, 0]",
        after: &["sp zset {p1={n}} {~30000}"],
    },
    Row {
        what: "ACQUIRE_PERMIT: all taken",
        before: &[Zset("sp", &[("p0", LATER), ("p9", LATER)])],
        op: Script("ACQUIRE_PERMIT", &["sp", "sp:limit"], &["p1", "30000", "2"]),
        reply: "[0, {n}]",
        after: &["sp zset {p0=9999999999999, p9=9999999999999} none"],
    },
    Row {
        what: "ACQUIRE_PERMIT: the count set at run time wins",
        before: &[Str("sp:limit", "1", 0), Zset("sp", &[("p0", LATER)])],
        op: Script("ACQUIRE_PERMIT", &["sp", "sp:limit"], &["p1", "30000", "5"]),
        reply: "[0, {n}]",
        after: &[
            "sp zset {p0=9999999999999} none",
            "sp:limit string \"1\" none",
        ],
    },
    Row {
        what: "ACQUIRE_PERMIT drops expired permits first",
        before: &[Zset("sp", &[("p0", "1")])],
        op: Script("ACQUIRE_PERMIT", &["sp", "sp:limit"], &["p1", "30000", "1"]),
        reply: "[1, 0]",
        after: &["sp zset {p1={n}} {~30000}"],
    },
    Row {
        what: "ACQUIRE_PERMIT takes several permits at once, in one ZADD",
        before: &[Zset("sp", &[("p0", LATER)])],
        op: Script(
            "ACQUIRE_PERMIT",
            &["sp", "sp:limit", "sp:turn"],
            &[
                "p1", "30000", "3", "0", "0", "v2/a", "0", "2", "PUBLISH", "sp:wake",
            ],
        ),
        reply: "[1, 0]",
        after: &["sp zset {p1={n}, p1*2={n}, p0=9999999999999} {~30000}"],
    },
    Row {
        what: "ACQUIRE_PERMIT: another Locker's claim of several keeps the free permits",
        before: &[
            Zset("sp", &[("p0", LATER)]),
            Str("sp:turn", "1:5000:v2/b:2", 5000),
        ],
        op: Script(
            "ACQUIRE_PERMIT",
            &["sp", "sp:limit", "sp:turn"],
            &[
                "p1", "30000", "3", "0", "0", "v2/a", "0", "1", "PUBLISH", "sp:wake",
            ],
        ),
        reply: "[0, {~5000}]",
        after: &[
            "sp zset {p0=9999999999999} none",
            "sp:turn string \"1:5000:v2/b:2\" {~5000}",
        ],
    },
    Row {
        what: "ACQUIRE_PERMIT: the claimant's head waiter takes its several, and wakes the others",
        before: &[
            Zset("sp", &[("p0", LATER)]),
            Str("sp:turn", "1:5000:v2/b:2", 5000),
        ],
        op: Script(
            "ACQUIRE_PERMIT",
            &["sp", "sp:limit", "sp:turn"],
            &[
                "p1", "30000", "4", "5000", "1", "v2/b", "1", "2", "PUBLISH", "sp:wake",
            ],
        ),
        reply: "[1, 0]",
        after: &["sp zset {p1={n}, p1*2={n}, p0=9999999999999} {~30000}"],
    },
    // RELEASE_PERMIT
    Row {
        what: "RELEASE_PERMIT gives a permit back; the last one takes the set",
        before: &[Zset("sp", &[("p1", LATER)])],
        op: Script("RELEASE_PERMIT", &["sp"], &["p1", "PUBLISH", "sp:wake"]),
        reply: "0",
        after: &[],
    },
    Row {
        what: "RELEASE_PERMIT: an expired permit counts as gone",
        before: &[Zset("sp", &[("p1", "1"), ("p2", LATER)])],
        op: Script("RELEASE_PERMIT", &["sp"], &["p1", "PUBLISH", "sp:wake"]),
        reply: "-1",
        after: &["sp zset {p2=9999999999999} none"],
    },
    Row {
        what: "RELEASE_PERMIT gives back permits taken at once together",
        before: &[Zset(
            "sp",
            &[
                ("p1", LATER),
                ("p1*2", LATER),
                ("p1*3", LATER),
                ("p2", LATER),
            ],
        )],
        op: Script(
            "RELEASE_PERMIT",
            &["sp"],
            &["p1", "PUBLISH", "sp:wake", "3"],
        ),
        reply: "0",
        after: &["sp zset {p2=9999999999999} none"],
    },
    // SET_PERMITS, PERMITS
    Row {
        what: "SET_PERMITS sets the count",
        before: &[],
        op: Script("SET_PERMITS", &["sp:limit", "sp:wake"], &["3", "PUBLISH"]),
        reply: "1",
        after: &["sp:limit string \"3\" none"],
    },
    Row {
        what: "SET_PERMITS removes it",
        before: &[Str("sp:limit", "3", 0)],
        op: Script("SET_PERMITS", &["sp:limit", "sp:wake"], &["", "PUBLISH"]),
        reply: "1",
        after: &[],
    },
    Row {
        what: "PERMITS counts the unexpired permits and the count set",
        before: &[
            Zset("sp", &[("p1", LATER), ("p2", "1")]),
            Str("sp:limit", "4", 0),
        ],
        op: Script("PERMITS", &["sp", "sp:limit"], &[]),
        reply: "[1, 4]",
        after: &[
            "sp zset {p2=1, p1=9999999999999} none",
            "sp:limit string \"4\" none",
        ],
    },
    // ACQUIRE_WRITE
    Row {
        what: "ACQUIRE_WRITE takes a free write lock",
        before: &[],
        op: Script(
            "ACQUIRE_WRITE",
            &["rw:write", "rw:write:fence", "rw:read", "rw:write:waiting"],
            &["o1", "30000", "0", "5000"],
        ),
        reply: "[1, {n}]",
        after: &[
            "rw:write string \"o1 f{n}\" {~30000}",
            "rw:write:fence hash {n={n}} none",
        ],
    },
    Row {
        what: "ACQUIRE_WRITE: readers are in, so the writer's wait is recorded",
        before: &[Zset("rw:read", &[("r1", LATER)])],
        op: Script(
            "ACQUIRE_WRITE",
            &["rw:write", "rw:write:fence", "rw:read", "rw:write:waiting"],
            &["o1", "30000", "0", "5000"],
        ),
        reply: "[0, {n}]",
        after: &[
            "rw:read zset {r1=9999999999999} none",
            "rw:write:waiting zset {o1={n}} {~5000}",
        ],
    },
    // A hold in a layout this version does not speak (a later version's `v9/` token): busy
    // (`2`) to every attempt, and left exactly as it was.
    Row {
        what: "ACQUIRE finds a newer layout's hold: busy, neither flagged nor claimed",
        before: &[Str("lk", "v9/o0 f7", 10000)],
        op: Script(
            "ACQUIRE",
            &["lk", "lk:fence"],
            &["v2/o1", "30000", "300", "1000", "v2/aa", "0", "0"],
        ),
        reply: "[2, {~10000}]",
        after: &["lk string \"v9/o0 f7\" {~10000}"],
    },
    Row {
        what: "ACQUIRE speaks layout 1: an untagged hold is flagged and claimed",
        before: &[Str("lk", "o0", 10000)],
        op: Script(
            "ACQUIRE",
            &["lk", "lk:fence"],
            &["v2/o1", "30000", "300", "1000", "v2/aa", "0", "0"],
        ),
        reply: "[0, {~10000}, -1]",
        after: &["lk string \"o0 lv2/aa w1000:300:v2/aa\" {~10000}"],
    },
    Row {
        what: "ACQUIRE replaces a claim of a layout it does not speak on a hold it speaks",
        before: &[Str("lk", "o0 l w500:300:v9/bb", 10000)],
        op: Script(
            "ACQUIRE",
            &["lk", "lk:fence"],
            &["v2/o1", "30000", "300", "1000", "v2/aa", "0", "0"],
        ),
        reply: "[0, {~10000}, -1]",
        after: &["lk string \"o0 l w1000:300:v2/aa\" {~10000}"],
    },
    Row {
        what: "ACQUIRE_ALL finds a newer layout's hold: busy, nothing written",
        before: &[Str("b", "#k:v9/o0", 10000)],
        op: Script(
            "ACQUIRE_ALL",
            &["a", "a:fence", "b", "b:fence"],
            &["30000", "0", "o1", "o2"],
        ),
        reply: "[2, 2, {~10000}]",
        after: &["b string \"#k:v9/o0\" {~10000}"],
    },
    Row {
        what: "ACQUIRE_FAIR finds a newer layout's hold: busy, the waiter in line",
        before: &[Str("lk", "#r:v9/bb", 10000)],
        op: Script(
            "ACQUIRE_FAIR",
            &["lk", "lk:fence", "lk:wake", "lk:queue", "lk:alive"],
            &["o1", "30000", "0", "5000", "PUBLISH"],
        ),
        reply: "[2, {~10000}, 0]",
        after: &[
            "lk string \"#r:v9/bb\" {~10000}",
            "lk:alive zset {o1={n}} {~5000}",
            "lk:queue zset {o1=1} {~5000}",
        ],
    },
    Row {
        what: "ACQUIRE_WRITE finds a newer layout's writer: busy, not written",
        before: &[Str("rw:write", "v9/o0", 10000)],
        op: Script(
            "ACQUIRE_WRITE",
            &["rw:write", "rw:write:fence", "rw:read", "rw:write:waiting"],
            &["o1", "30000", "0", "0"],
        ),
        reply: "[2, {~10000}]",
        after: &["rw:write string \"v9/o0\" {~10000}"],
    },
    Row {
        what: "ACQUIRE_READ finds a newer layout's writer: busy",
        before: &[Str("rw:write", "v9/o0", 10000)],
        op: Script(
            "ACQUIRE_READ",
            &["rw:read", "rw:write", "rw:write:waiting"],
            &["r1", "30000", "1"],
        ),
        reply: "[2, {~10000}]",
        after: &["rw:write string \"v9/o0\" {~10000}"],
    },
    // ACQUIRE_READ, RELEASE_READ
    Row {
        what: "ACQUIRE_READ: in when no writer holds it",
        before: &[],
        op: Script(
            "ACQUIRE_READ",
            &["rw:read", "rw:write", "rw:write:waiting"],
            &["r1", "30000", "1"],
        ),
        reply: "[1, 0]",
        after: &["rw:read zset {r1={n}} {~30000}"],
    },
    Row {
        what: "ACQUIRE_READ: a writer waits and writers are preferred",
        before: &[Zset("rw:write:waiting", &[("o1", LATER)])],
        op: Script(
            "ACQUIRE_READ",
            &["rw:read", "rw:write", "rw:write:waiting"],
            &["r1", "30000", "1"],
        ),
        reply: "[0, -1]",
        after: &["rw:write:waiting zset {o1=9999999999999} none"],
    },
    Row {
        what: "ACQUIRE_READ: a writer holds it",
        before: &[Str("rw:write", "o0", 10000)],
        op: Script(
            "ACQUIRE_READ",
            &["rw:read", "rw:write", "rw:write:waiting"],
            &["r1", "30000", "0"],
        ),
        reply: "[0, {~10000}]",
        after: &["rw:write string \"o0\" {~10000}"],
    },
    Row {
        what: "RELEASE_READ: another reader stays",
        before: &[Zset("rw:read", &[("r1", LATER), ("r2", LATER)])],
        op: Script(
            "RELEASE_READ",
            &["rw:read"],
            &["r1", "PUBLISH", "rw:rw:wake"],
        ),
        reply: "0",
        after: &["rw:read zset {r2=9999999999999} none"],
    },
    // HOLDS_MEMBER
    Row {
        what: "HOLDS_MEMBER: still in",
        before: &[Zset("sp", &[("p1", LATER)])],
        op: Script("HOLDS_MEMBER", &["sp"], &["p1"]),
        reply: "[1, 0]",
        after: &["sp zset {p1=9999999999999} none"],
    },
    Row {
        what: "HOLDS_MEMBER: expired",
        before: &[Zset("sp", &[("p1", "1")])],
        op: Script("HOLDS_MEMBER", &["sp"], &["p1"]),
        reply: "[0, -2]",
        after: &["sp zset {p1=1} none"],
    },
    // ECHO
    Row {
        what: "ECHO publishes and writes nothing",
        before: &[],
        op: Script("ECHO", &["lk:wake"], &["e1f:1"]),
        reply: "0",
        after: &[],
    },
];

/// A reply as the table writes it.
fn show(value: &Value) -> String {
    match value {
        Value::Nil => "nil".to_owned(),
        Value::Int(n) => n.to_string(),
        Value::Okay => "OK".to_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::BulkString(b) => format!("{:?}", String::from_utf8_lossy(b)),
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(show).collect();
            format!("[{}]", items.join(", "))
        }
        other => format!("{other:?}"),
    }
}

/// Whether `actual` reads as `pattern` (see the module docs for `{n}`, `{~N}`, `{+}`).
fn like(pattern: &str, actual: &str) -> bool {
    let start = ["{n}", "{~", "{+}"]
        .iter()
        .filter_map(|p| pattern.find(p))
        .min();
    let Some(start) = start else {
        return pattern == actual;
    };
    let (literal, rest) = pattern.split_at(start);
    let Some(actual) = actual.strip_prefix(literal) else {
        return false;
    };
    let Some(end) = rest.find('}') else {
        return false;
    };
    let (placeholder, rest) = (&rest[1..end], &rest[end + 1..]);
    let digits = actual
        .char_indices()
        .take_while(|(i, c)| c.is_ascii_digit() || (*i == 0 && *c == '-'))
        .count();
    // Every split of the number: a shorter one may be what the pattern wants.
    (1..=digits).any(|len| {
        let Ok(n) = actual[..len].parse::<i64>() else {
            return false;
        };
        let fits = match placeholder {
            "n" => true,
            "+" => n > 0,
            about => about[1..]
                .parse::<i64>()
                .is_ok_and(|ms| n <= ms && n >= ms - 2000),
        };
        fits && like(rest, &actual[len..])
    })
}

/// Every key, sorted, as `key type value ttl`.
async fn keyspace<C: ConnectionLike + Send + Sync>(con: &mut C) -> Vec<String> {
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(con)
        .await
        .expect("KEYS");
    keys.sort();
    let mut out = Vec::new();
    for key in keys {
        let kind: String = redis::cmd("TYPE")
            .arg(&key)
            .query_async(con)
            .await
            .expect("TYPE");
        let value = match kind.as_str() {
            "string" => format!("{:?}", con.get::<_, String>(&key).await.expect("GET")),
            "hash" => {
                let mut pairs: Vec<(String, String)> = con.hgetall(&key).await.expect("HGETALL");
                pairs.sort();
                let pairs: Vec<String> = pairs.iter().map(|(f, v)| format!("{f}={v}")).collect();
                format!("{{{}}}", pairs.join(", "))
            }
            "zset" => {
                let members: Vec<(String, String)> =
                    con.zrange_withscores(&key, 0, -1).await.expect("ZRANGE");
                let members: Vec<String> =
                    members.iter().map(|(m, s)| format!("{m}={s}")).collect();
                format!("{{{}}}", members.join(", "))
            }
            other => other.to_owned(),
        };
        let pttl: i64 = con.pttl(&key).await.expect("PTTL");
        let ttl = if pttl == -1 {
            "none".to_owned()
        } else {
            pttl.to_string()
        };
        out.push(format!("{key} {kind} {value} {ttl}"));
    }
    out
}

/// Sets the keys of `before`.
async fn set<C: ConnectionLike + Send + Sync>(con: &mut C, before: &[Before]) {
    for key in before {
        match *key {
            Str(key, value, 0) => con.set::<_, _, ()>(key, value).await.expect("SET"),
            Str(key, value, ms) => con
                .pset_ex::<_, _, ()>(key, value, ms)
                .await
                .expect("PSETEX"),
            Hash(key, pairs) => {
                let mut cmd = redis::cmd("HSET");
                cmd.arg(key);
                for (field, value) in pairs {
                    cmd.arg(field).arg(value);
                }
                cmd.query_async::<()>(con).await.expect("HSET");
            }
            Zset(key, members) => {
                for (member, score) in members {
                    redis::cmd("ZADD")
                        .arg(key)
                        .arg(score)
                        .arg(member)
                        .query_async::<()>(con)
                        .await
                        .expect("ZADD");
                }
            }
        }
    }
}

/// Runs `row` on `con` (an empty keyspace): its reply and every key after. A script runs as
/// `EVAL` of its text, or (`function`) as `FCALL` of its function in the loaded library.
async fn run<C: ConnectionLike + Send + Sync>(
    con: &mut C,
    row: &Row,
    function: bool,
) -> (String, Vec<String>) {
    set(con, row.before).await;
    let cmd = match row.op {
        Script(name, keys, args) if function => {
            let (_, functions) = dlock_core::protocol::library();
            let (_, function) = (functions.into_iter())
                .find(|(n, _)| *n == name)
                .unwrap_or_else(|| panic!("no function for {name}"));
            let mut cmd = redis::cmd("FCALL");
            cmd.arg(function).arg(keys.len()).arg(keys).arg(args);
            cmd
        }
        Script(name, keys, args) => {
            let text = dlock_core::protocol::script_texts()
                .into_iter()
                .find(|(n, _)| *n == name)
                .unwrap_or_else(|| panic!("no script {name}"))
                .1;
            let mut cmd = redis::cmd("EVAL");
            cmd.arg(text).arg(keys.len()).arg(keys).arg(args);
            cmd
        }
        Command(words) => {
            let mut cmd = redis::cmd(words[0]);
            cmd.arg(&words[1..]);
            cmd
        }
    };
    let reply: Value = match cmd.query_async(con).await {
        Ok(value) => value,
        Err(err) => panic!("{}: {err}", row.what),
    };
    (show(&reply), keyspace(con).await)
}

/// Checks `row`'s reply and keys after on one target.
fn check(target: &str, row: &Row, (reply, after): &(String, Vec<String>)) -> Vec<String> {
    let mut failures = Vec::new();
    if !like(row.reply, reply) {
        failures.push(format!(
            "{target}: {}: replied {reply}, not {}",
            row.what, row.reply
        ));
    }
    let after_ok =
        after.len() == row.after.len() && after.iter().zip(row.after).all(|(a, p)| like(p, a));
    if !after_ok {
        failures.push(format!(
            "{target}: {}: keys after {after:#?}, not {:#?}",
            row.what, row.after
        ));
    }
    failures
}

#[tokio::test]
async fn every_script_answers_alike_on_the_server_and_the_memory_store() {
    let server = RedisServer::start();
    let mut con = server.connection().await;
    let load = || {
        let mut cmd = redis::cmd("FUNCTION");
        cmd.arg("LOAD").arg(dlock_core::protocol::library().0);
        cmd
    };
    load()
        .query_async::<String>(&mut con)
        .await
        .expect("FUNCTION LOAD");
    let mut failures = Vec::new();
    for row in ROWS {
        for (function, how) in [(false, "EVAL"), (true, "FCALL")] {
            // Functions stay through FLUSHALL, as on a server that keeps them.
            redis::cmd("FLUSHALL")
                .query_async::<()>(&mut con)
                .await
                .expect("FLUSHALL");
            let on_server = run(&mut con, row, function).await;
            failures.extend(check(&format!("server, {how}"), row, &on_server));
            let mut memory = MemoryStore::new().connection();
            load()
                .query_async::<String>(&mut memory)
                .await
                .expect("FUNCTION LOAD");
            let in_memory = run(&mut memory, row, function).await;
            failures.extend(check(&format!("memory, {how}"), row, &in_memory));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // Every script has its rows.
    for (name, _) in dlock_core::protocol::script_texts() {
        assert!(
            ROWS.iter()
                .any(|r| matches!(r.op, Script(n, ..) if n == name)),
            "no row runs {name}"
        );
    }
}

// What differs on the memory store (ARCHITECTURE.md, "The memory store"), a test each.

/// One node: a memory store has no replicas to acknowledge a write.
#[tokio::test]
async fn the_memory_store_refuses_replica_acknowledgement() {
    let err = Locker::builder()
        .memory(MemoryStore::new())
        .replica_ack(ReplicaAck::new(1, Duration::from_millis(100)))
        .build()
        .await
        .expect_err("a memory store has no replicas");
    assert!(err.to_string().contains("no replicas"), "{err}");
}

/// A `Locker` is subscribed at once, and `PUBSUB NUMSUB` counts `Locker`s, one subscriber each.
#[tokio::test(start_paused = true)]
async fn the_memory_store_counts_each_waiting_locker_as_one_subscriber() {
    let store = MemoryStore::new();
    let lockers: Vec<_> = (0..2).map(|_| Locker::memory_with(store.clone())).collect();
    let held = lockers[0].lock("job").await.expect("lock");
    let mut waiters = Vec::new();
    for locker in lockers.iter().chain(lockers.iter()) {
        let request = locker.lock("job").wait(Duration::from_secs(5));
        waiters.push(tokio::spawn(request.into_future()));
    }
    tokio::task::yield_now().await;
    let channel = format!("{}:wake", lockers[0].key_of("job").expect("key"));
    let mut con = store.connection();
    let (_, subscribers): (String, i64) = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(&channel)
        .query_async(&mut con)
        .await
        .expect("PUBSUB NUMSUB");
    assert_eq!(subscribers, 2, "four waiters in two lockers");
    drop(held);
    for waiter in waiters {
        drop(waiter.await.expect("a waiter").expect("the lock in turn"));
    }
}

/// `SCAN` answers every matching key in one batch.
#[tokio::test]
async fn the_memory_store_scans_in_one_batch() {
    let mut con = MemoryStore::new().connection();
    for key in ["a:1", "a:2", "b:1"] {
        con.set::<_, _, ()>(key, "x").await.expect("SET");
    }
    let (cursor, mut keys): (u64, Vec<String>) = redis::cmd("SCAN")
        .arg(0)
        .arg("MATCH")
        .arg("a:*")
        .arg("COUNT")
        .arg(1)
        .query_async(&mut con)
        .await
        .expect("SCAN");
    keys.sort();
    assert_eq!(
        (cursor, keys),
        (0, vec!["a:1".to_owned(), "a:2".to_owned()])
    );
}

/// `TIME` moves with tokio's clock, so fencing tokens follow a paused clock.
#[tokio::test(start_paused = true)]
async fn the_memory_stores_clock_is_tokios() {
    let store = MemoryStore::new();
    let before = server_time(&store).await;
    tokio::time::advance(Duration::from_secs(3600)).await;
    let after = server_time(&store).await;
    assert_eq!(after - before, Duration::from_secs(3600));
}

async fn server_time(store: &MemoryStore) -> Duration {
    let mut con = store.connection();
    let (s, us): (u64, u64) = redis::cmd("TIME")
        .query_async(&mut con)
        .await
        .expect("TIME");
    Duration::from_secs(s) + Duration::from_micros(us)
}

#[test]
fn the_tables_patterns_read_as_meant() {
    assert!(like("[1, {n}]", "[1, 1764000000000001]"));
    assert!(like("x {~300} y", "x 299 y"));
    assert!(!like("x {~300} y", "x 301 y"));
    assert!(like(
        "lk string \"o1 f{n}\" {~30000}",
        "lk string \"o1 f12\" 29998"
    ));
    assert!(!like("{n}", "-"));
    assert!(like("h hash {n={n}} none", "h hash {n=17} none"));
}
