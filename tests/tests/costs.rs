//! What each kind of lock costs Redis, from `INFO commandstats`: round trips (commands a client
//! sent) and the commands Redis ran for them, scripts' inner commands included — the figures of
//! the README's "Choosing a lock" table, asserted exactly.

use std::collections::BTreeMap;
use std::time::Duration;

use dlock_core::Locker;
use dlock_tests::handover::offered_token;
use dlock_tests::hold::HoldValue;
use dlock_tests::{RedisServer, unique_name};

/// What one operation cost: commands clients sent (one round trip each, unless pipelined), and
/// every command Redis ran (those sent included).
#[derive(Debug, PartialEq, Eq)]
struct Cost {
    round_trips: u64,
    commands: u64,
}

/// Commands that only take the readings: `INFO`, a new connection's `CLIENT SETINFO` and
/// `HELLO`, the end marker's `ECHO`, the scripts' library loaded after a first "Function not
/// found" (or a script after `NOSCRIPT`), and a replica's acknowledgements of what it received
/// (`REPLCONF ACK`, every second).
fn reading(command: &str) -> bool {
    matches!(
        command,
        "info" | "echo" | "hello" | "script" | "function" | "client" | "replconf"
    ) || command.starts_with("script|")
        || command.starts_with("function|")
        || command.starts_with("client|")
        || command.starts_with("replconf")
}

/// The commands Redis ran between two `commandstats` readings (the readings themselves aside).
fn ran(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> u64 {
    let delta =
        |name: &str| after.get(name).copied().unwrap_or(0) - before.get(name).copied().unwrap_or(0);
    after.keys().filter(|k| !reading(k)).map(|k| delta(k)).sum()
}

/// Runs `op` and returns what it cost: every command from `commandstats`, the ones clients sent
/// from `MONITOR` (which shows a script's own commands as coming from `lua`).
async fn measure<F: std::future::Future<Output = T>, T>(server: &RedisServer, op: F) -> (T, Cost) {
    use futures_util::StreamExt as _;
    let client = dlock_core::redis::Client::open(server.url()).expect("client");
    let mut monitor = client.get_async_monitor().await.expect("MONITOR");
    let before = server.info_commandstats();
    let out = op.await;
    let after = server.info_commandstats();
    let marker = unique_name("costs-end");
    let mut con = server.connection().await;
    let _: String = dlock_core::redis::cmd("ECHO")
        .arg(&marker)
        .query_async(&mut con)
        .await
        .expect("ECHO");
    let mut lines = monitor.on_message::<String>();
    let mut round_trips = 0;
    loop {
        let line = tokio::time::timeout(Duration::from_secs(5), lines.next())
            .await
            .expect("MONITOR showed the end marker")
            .expect("MONITOR stream");
        if line.contains(&marker) {
            break;
        }
        // `<time> [<db> <client address, or lua>] "<COMMAND>" "<arg>" ...`
        let Some((source, command)) = line.split_once("] \"").map(|(head, rest)| {
            let source = head.rsplit(' ').next().unwrap_or_default().to_owned();
            let command = rest.split('"').next().unwrap_or_default().to_lowercase();
            (source, command)
        }) else {
            continue;
        };
        if source != "lua" && !reading(&command) {
            round_trips += 1;
        }
    }
    let cost = Cost {
        round_trips,
        commands: ran(&before, &after),
    };
    (out, cost)
}

const fn cost_of(round_trips: u64, commands: u64) -> Cost {
    Cost {
        round_trips,
        commands,
    }
}

/// A `Locker` whose scripts are loaded already (a first call of each is sent twice).
async fn warm_locker(server: &RedisServer) -> Locker {
    let locker = Locker::connect(&server.url()).await.expect("connect");
    let warm = unique_name("warm-up");
    let plain = locker.lock(format!("{warm}-plain")).await.expect("plain");
    plain.fencing_token().await.expect("a token");
    assert!(plain.release().await.is_released());
    let fair = locker
        .fair_lock(format!("{warm}-fair"))
        .await
        .expect("fair");
    assert!(fair.release().await.is_released());
    let permit = (locker.semaphore(format!("{warm}-sem"), 2).acquire())
        .await
        .expect("permit");
    assert!(permit.release().await.is_released());
    let rw = locker.read_write_lock(format!("{warm}-rw"));
    assert!(rw.read().await.expect("read").release().await.is_released());
    assert!(
        rw.write()
            .await
            .expect("write")
            .release()
            .await
            .is_released()
    );
    let names = [format!("{warm}-a"), format!("{warm}-b")];
    let multi = locker.lock_all(names).await.expect("multi");
    assert!(multi.release().await.is_released());
    dlock_core::scope(async {
        let outer = locker.lock(format!("{warm}-plain")).await.expect("outer");
        let inner = locker.lock(format!("{warm}-plain")).await.expect("inner");
        drop((inner.release().await, outer.release().await));
    })
    .await;
    locker
}

#[tokio::test]
async fn a_plain_lock_costs_one_round_trip_to_take_and_one_to_give_back() {
    let server = RedisServer::start();
    let locker = warm_locker(&server).await;
    let name = unique_name("cost-plain");
    let (guard, taken) = measure(&server, locker.lock(name.as_str()).into_future()).await;
    let guard = guard.expect("lock");
    // `SET NX PX`: no script, no fencing work until asked.
    assert_eq!(taken, cost_of(1, 1));
    let (token, minted) = measure(&server, guard.fencing_token()).await;
    let token = token.expect("a token");
    // FCALL; GET (still the owner? minted already?), TIME, HGET (last token), HSET (counter),
    // PTTL + PEXPIRE (a new counter's TTL), APPEND (the hold's token).
    assert_eq!(minted, cost_of(1, 8));
    let (again, asked_again) = measure(&server, guard.fencing_token()).await;
    assert_eq!(again.expect("the same token"), token);
    assert_eq!(
        asked_again,
        cost_of(0, 0),
        "a token is asked for once per hold"
    );
    let (_, released) = measure(&server, guard.release()).await;
    // FCALL; GET (the owner, a claim to the next turn, a waiter's flag), DEL. Nobody waited:
    // no PUBLISH.
    assert_eq!(released, cost_of(1, 3));

    // The cycle of a holder that never asks for a token, on a name used before.
    let (guard, taken) = measure(&server, locker.lock(name.as_str()).into_future()).await;
    assert_eq!(taken, cost_of(1, 1));
    let (_, released) = measure(&server, guard.expect("lock").release()).await;
    // The same: FCALL; GET, DEL.
    assert_eq!(released, cost_of(1, 3));
}

#[tokio::test]
async fn a_lock_taken_after_a_wait_has_its_token_with_the_grant() {
    let server = RedisServer::start();
    let (holder, waiter) = (warm_locker(&server).await, warm_locker(&server).await);
    let name = unique_name("cost-waited");
    let held = holder.lock(name.as_str()).await.expect("lock");
    let held_token = held.fencing_token().await.expect("a token");
    let waiting = tokio::spawn({
        let (waiter, name) = (waiter.clone(), name.clone());
        async move { waiter.lock(name).wait(Duration::from_secs(10)).await }
    });
    dlock_tests::until_waiting(&holder, name.as_str(), 1).await;
    assert!(held.release().await.is_released());
    let guard = waiting.await.expect("waiter task").expect("granted");
    // Granted by the release, the hold is extended to the waiter's lease in the background:
    // once that is done, nothing else is on its way.
    let until = std::time::Instant::now() + Duration::from_secs(5);
    while guard.remaining() < Duration::from_secs(5) {
        assert!(std::time::Instant::now() < until, "never extended");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Taken after a wait (another process's release woke it): its holder is in a contended
    // critical section, so the token came with the grant and asking costs nothing.
    let (token, asked) = measure(&server, guard.fencing_token()).await;
    assert_eq!(asked, cost_of(0, 0));
    assert!(token.expect("a token") > held_token);
    assert!(guard.release().await.is_released());
}

/// Until a local waiter has tried (more than `calls` scripts ran) and waits for a hand-over.
async fn tried(server: &RedisServer, calls: u64) {
    let until = std::time::Instant::now() + Duration::from_secs(5);
    while server.script_calls() <= calls {
        assert!(
            std::time::Instant::now() < until,
            "the local waiter never tried"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_past_local_waiters_to_another_process_is_one_round_trip() {
    use dlock_core::redis::AsyncCommands as _;
    let server = RedisServer::start();
    // No subscriber, and a long poll: the local waiter sends nothing while the release runs.
    let locker = Locker::builder()
        .multiplexed(server.connection().await)
        .wake_by_polling()
        .poll_interval(Duration::from_secs(2))
        .build()
        .await
        .expect("locker");
    let local_waiter = |name: String| {
        let locker = locker.clone();
        tokio::spawn(async move {
            let guard = locker
                .lock(name.as_str())
                .wait(Duration::from_secs(30))
                .await;
            guard.expect("the local waiter").release().await
        })
    };
    let scripts = || server.script_calls();

    // A hand-over first, so its script is loaded.
    let warm = unique_name("cost-turn-warm");
    let guard = locker.lock(warm.as_str()).await.expect("lock");
    let waiter = local_waiter(warm);
    tried(&server, scripts()).await;
    assert!(guard.release().await.is_released());
    assert!(waiter.await.expect("waiter task").is_released());

    let name = unique_name("cost-turn");
    let key = locker.key_of(name.as_str()).expect("key");
    let guard = locker.lock(name.as_str()).await.expect("lock");
    let calls = scripts();
    let waiter = local_waiter(name);
    tried(&server, calls).await;
    // A waiter of another process claims the next turn.
    let mut con = server.connection().await;
    let other = "0123456789abcdef0123456789abcdef";
    let hold: String = con.get(&key).await.expect("GET");
    // Its claim takes the place of any other (the local waiter's own, if it made one).
    let fields: Vec<&str> = hold.split(' ').filter(|f| !f.starts_with('w')).collect();
    let () = dlock_core::redis::cmd("SET")
        .arg(&key)
        .arg(format!("{} w1:300:{other}", fields.join(" ")))
        .arg("KEEPTTL")
        .query_async(&mut con)
        .await
        .expect("SET");

    let (outcome, released) = measure(&server, guard.release()).await;
    assert!(outcome.is_released());
    // One script: FCALL; GET, PUBSUB NUMSUB (the claim came first: Lua's `or` stops there,
    // so no), PSETEX (kept for the claimant, written over the hold), PUBLISH.
    assert_eq!(released, cost_of(1, 4));
    let kept = HoldValue::read(&mut con, &key).await.expect("GET");
    assert_eq!(kept.and_then(|h| h.kept_for).as_deref(), Some(other));
    // The turn passes unused; the local waiter gets the lock on its next try.
    assert!(
        tokio::time::timeout(Duration::from_secs(15), waiter)
            .await
            .expect("the local waiter got the lock")
            .expect("waiter task")
            .is_released()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_inside_a_process_is_one_script_and_the_next_head_sends_nothing() {
    let server = RedisServer::start();
    let locker = warm_locker(&server).await;
    // The first round loads the hand-over script; the second is counted.
    hand_over_twice(&server, &locker, "cost-hand-over-warm").await;
    let [first, idle, second] = hand_over_twice(&server, &locker, "cost-hand-over-line").await;
    // FCALL; GET (only this `Locker`'s waiters flagged the hold, nobody else claims it),
    // TIME, HGET (the hold had no token yet: the counter's last one), HSET, PTTL + PEXPIRE (a
    // new counter's TTL), PSETEX.
    assert_eq!(first, cost_of(1, 8));
    // The other waiter is the head meanwhile, and sends nothing while a hold of its own
    // `Locker` that will hand the lock on has it.
    assert_eq!(idle, cost_of(0, 0));
    // The next hand-over starts from the hold's own token: neither the counter nor the clock
    // is read. FCALL; GET, HSET, PSETEX.
    assert_eq!(second, cost_of(1, 4));
}

/// A lock held with three local waiters behind it, handed over twice (a waiter is left in line
/// each time): the first hand-over's cost, what the line sent while the first waiter held the
/// lock, and the second hand-over's.
async fn hand_over_twice(server: &RedisServer, locker: &Locker, name: &str) -> [Cost; 3] {
    let name = unique_name(name);
    let first = locker.lock(name.as_str()).await.expect("lock");
    // Three local waiters: the first of them makes its attempt (and subscribes) as the head.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut waiters = Vec::new();
    for _ in 0..3 {
        let (locker, name, tx) = (locker.clone(), name.clone(), tx.clone());
        waiters.push(tokio::spawn(async move {
            let guard = locker
                .lock(name.as_str())
                .wait(Duration::from_secs(30))
                .await
                .expect("a local waiter");
            let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
            tx.send((guard, done_tx)).expect("send");
            let _ = done_rx.await;
        }));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (outcome, first_cost) = measure(server, first.release()).await;
    assert!(outcome.is_released());
    let (second, done) = rx.recv().await.expect("the first waiter holds");
    let (_, idle) = measure(server, tokio::time::sleep(Duration::from_millis(200))).await;
    let (outcome, second_cost) = measure(server, second.release()).await;
    assert!(outcome.is_released());
    let _ = done.send(());
    for _ in 0..2 {
        let (next, done) = rx.recv().await.expect("the next waiter holds");
        assert!(next.release().await.is_released());
        let _ = done.send(());
    }
    for waiter in waiters {
        waiter.await.expect("waiter task");
    }
    [first_cost, idle, second_cost]
}

/// Script calls and `PUBLISH`es from a release with one local waiter until that waiter holds
/// the lock, on a `Locker` with hand-over `on` or off.
async fn until_the_local_waiter_holds(on: bool) -> (u64, u64) {
    let server = RedisServer::start();
    let locker = Locker::builder()
        .url(server.url())
        .hand_over(on)
        .build()
        .await
        .expect("locker");
    let count = |command: &str| {
        server
            .info_commandstats()
            .get(command)
            .copied()
            .unwrap_or(0)
    };
    let scripts = || server.script_calls();
    let mut counted = (0, 0);
    // The first round loads the scripts; the second is counted.
    for round in 0..2 {
        let name = unique_name("cost-hand-over");
        let guard = locker.lock(name.as_str()).await.expect("lock");
        let (held_tx, held_rx) = tokio::sync::oneshot::channel();
        let waiter = {
            let locker = locker.clone();
            tokio::spawn(async move {
                let guard = (locker
                    .lock(name.as_str())
                    .wait(Duration::from_secs(10))
                    .await)
                    .expect("the local waiter");
                let _ = held_tx.send(());
                guard.release().await
            })
        };
        tried(&server, scripts()).await;
        let before = (scripts(), count("publish"));
        assert!(guard.release().await.is_released());
        held_rx.await.expect("the waiter holds the lock");
        if round == 1 {
            counted = (scripts() - before.0, count("publish") - before.1);
        }
        assert!(waiter.await.expect("waiter task").is_released());
    }
    counted
}

#[tokio::test]
async fn a_release_hands_the_lock_to_a_local_waiter_unless_hand_over_is_off() {
    // On: the release's script grants the lock to the waiter in the same round trip and wakes
    // nobody through Redis. (The waiter sets its own lease in the background: a second script,
    // if it ran by the time of counting.)
    let (scripts, publishes) = until_the_local_waiter_holds(true).await;
    assert!(
        (1..=2).contains(&scripts) && publishes == 0,
        "{scripts} scripts, {publishes} PUBLISH"
    );
    // Off: the release frees the name and publishes the wake-up, and the woken waiter takes the
    // name with a script of its own.
    let (scripts, publishes) = until_the_local_waiter_holds(false).await;
    assert!(
        scripts >= 2 && publishes >= 1,
        "{scripts} scripts, {publishes} PUBLISH"
    );
}

#[tokio::test]
async fn a_fair_lock_costs_one_round_trip_each_way_when_nobody_waits() {
    let server = RedisServer::start();
    let locker = warm_locker(&server).await;
    let name = unique_name("cost-fair");
    let (guard, taken) = measure(&server, locker.fair_lock(name.as_str()).into_future()).await;
    let guard = guard.expect("lock");
    // FCALL; TIME, GET, a look at the (empty) line, the fencing work (TIME, HGET, HSET, PTTL,
    // PEXPIRE), PSETEX.
    assert_eq!(taken, cost_of(1, 10));
    let (_, released) = measure(&server, guard.release()).await;
    // The plain release's, with two ZREMs (leaving the line) and a look for its head (TIME,
    // ZRANGE) before any PUBLISH: nobody in line, nobody woken.
    assert_eq!(released, cost_of(1, 7));
}

#[tokio::test]
async fn a_multi_lock_on_one_server_costs_one_round_trip_to_take_them_all() {
    let server = RedisServer::start();
    let locker = warm_locker(&server).await;
    let base = unique_name("cost-multi");
    let names: Vec<String> = (0..3).map(|i| format!("{base}-{i}")).collect();
    let (guard, taken) = measure(&server, locker.lock_all(names.clone()).into_future()).await;
    let guard = guard.expect("lock all");
    // FCALL; per name GET, the fencing work (TIME, HGET, HSET, PTTL, PEXPIRE) and PSETEX.
    assert_eq!(taken, cost_of(1, 1 + 3 * 7));
    let (_, released) = measure(&server, guard.release()).await;
    // One release per name, all at once.
    assert_eq!(released, cost_of(3, 3 * 3));
}

#[tokio::test]
async fn a_reentry_costs_one_read_only_round_trip() {
    let server = RedisServer::start();
    let locker = warm_locker(&server).await;
    let name = unique_name("cost-reentry");
    dlock_core::scope(async {
        let outer = locker.lock(name.as_str()).await.expect("outer");
        let (inner, taken) = measure(&server, locker.lock(name.as_str()).into_future()).await;
        let inner = inner.expect("inner");
        assert!(inner.is_reentrant());
        // FCALL; GET.
        assert_eq!(taken, cost_of(1, 2));
        let (_, released) = measure(&server, inner.release()).await;
        assert_eq!(
            released,
            cost_of(0, 0),
            "an inner release is counted in the process"
        );
        assert!(outer.release().await.is_released());
    })
    .await;
}

#[tokio::test]
async fn an_at_least_release_keeps_the_key_in_the_same_round_trip() {
    let server = RedisServer::start();
    let locker = warm_locker(&server).await;
    let name = unique_name("cost-at-least");
    let guard = (locker.lock(name.as_str()))
        .at_least(Duration::from_secs(5))
        .await
        .expect("lock");
    let (_, released) = measure(&server, guard.release()).await;
    // The plain release's (FCALL; GET), and PSETEX written over the hold to keep the name
    // taken. Nobody waited: no PUBLISH.
    assert_eq!(released, cost_of(1, 3));
}

#[tokio::test]
async fn a_semaphore_permit_costs_one_round_trip_each_way() {
    let server = RedisServer::start();
    let locker = warm_locker(&server).await;
    let semaphore = locker.semaphore(unique_name("cost-semaphore"), 3);
    let (permit, taken) = measure(&server, semaphore.acquire().into_future()).await;
    let permit = permit.expect("permit");
    // FCALL; TIME, ZREMRANGEBYSCORE (expired permits), ZSCORE (a retry?), GET (the count set
    // at run time), GET (a claim of several keeping free permits?), ZCARD, ZADD, PTTL + PEXPIRE
    // (the set's TTL).
    assert_eq!(taken, cost_of(1, 10));
    let (_, released) = measure(&server, permit.release()).await;
    // FCALL; ZSCORE (its expiry), ZREM, TIME (expired already?), GET (another process
    // claims the next permit?), PUBLISH.
    assert_eq!(released, cost_of(1, 6));
}

#[tokio::test]
async fn permits_taken_at_once_cost_what_one_permit_costs() {
    let server = RedisServer::start();
    let locker = warm_locker(&server).await;
    let semaphore = locker.semaphore(unique_name("cost-semaphore-many"), 5);
    let (permit, taken) = measure(&server, semaphore.acquire_many(3).into_future()).await;
    let permit = permit.expect("permits");
    assert_eq!(permit.permits(), 3);
    // As one permit: the three members go in with one ZADD.
    assert_eq!(taken, cost_of(1, 10));
    let (_, released) = measure(&server, permit.release()).await;
    // As one permit: the three go with one ZREM.
    assert_eq!(released, cost_of(1, 6));
}

#[tokio::test]
async fn a_read_write_lock_costs_one_round_trip_each_way() {
    let server = RedisServer::start();
    let locker = warm_locker(&server).await;
    let lock = locker.read_write_lock(unique_name("cost-rw"));
    let (read, taken) = measure(&server, lock.read().into_future()).await;
    let read = read.expect("read");
    // FCALL; TIME, ZREMRANGEBYSCORE (expired readers), ZSCORE (a retry?), EXISTS (a
    // writer?), ZREMRANGEBYSCORE + ZCARD (writers waiting?), ZADD, PTTL + PEXPIRE.
    assert_eq!(taken, cost_of(1, 10));
    let (_, released) = measure(&server, read.release()).await;
    // FCALL; ZSCORE (its expiry), ZREM, TIME (expired already?), EXISTS (the last reader?),
    // PUBLISH.
    assert_eq!(released, cost_of(1, 6));
    let (write, taken) = measure(&server, lock.write().into_future()).await;
    let write = write.expect("write");
    // FCALL; TIME, two ZREMRANGEBYSCOREs, GET, ZRANGE (a reader?), ZREM (its wait), the
    // fencing work (TIME, HGET, HSET, PTTL, PEXPIRE) and PSETEX.
    assert_eq!(taken, cost_of(1, 13));
    let (_, released) = measure(&server, write.release()).await;
    // FCALL; ZREM (its wait, if any), GET, DEL, PUBLISH (readers may wait without having
    // flagged the hold: a writer's release always wakes).
    assert_eq!(released, cost_of(1, 5));
}

#[tokio::test]
async fn replica_acknowledgement_adds_a_wait_in_the_same_round_trip() {
    let master = RedisServer::start_with_args(&["--repl-diskless-sync-delay", "0"]);
    let replica = RedisServer::start();
    let mut con = replica.connection().await;
    let () = dlock_core::redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(master.port())
        .query_async(&mut con)
        .await
        .expect("REPLICAOF");
    let locker = Locker::builder()
        .url(master.url())
        .replica_ack(dlock_core::ReplicaAck::new(1, Duration::from_millis(1_000)))
        .build()
        .await
        .expect("connect");
    // Until the replica is in sync, a grant is not acknowledged (and rolled back).
    let warm = unique_name("cost-ack-warm-up");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let guard = loop {
        match locker.lock(warm.as_str()).await {
            Ok(guard) => break guard,
            Err(err) => assert!(std::time::Instant::now() < deadline, "{err}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(guard.release().await.is_released());

    let name = unique_name("cost-ack");
    let (guard, taken) = measure(&master, locker.lock(name.as_str()).into_future()).await;
    let guard = guard.expect("lock");
    // The plain acquisition, and a WAIT pipelined behind it: one round trip.
    assert_eq!(taken, cost_of(2, 1 + 1));
    let (_, released) = measure(&master, guard.release()).await;
    // The plain release, and a WAIT.
    assert_eq!(released, cost_of(2, 3 + 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_behind_a_local_line_send_no_attempt_of_their_own() {
    let server = RedisServer::start();
    let holder = warm_locker(&server).await;
    let waiter = warm_locker(&server).await;
    let name = unique_name("cost-line");
    let guard = (holder.lock(name.as_str()).lease(Duration::from_secs(30)))
        .await
        .expect("hold");
    // The waiting `Locker`'s subscriber connects on its first wait: done here, unmeasured.
    let busy = holder.lock(format!("{name}-busy")).await.expect("hold");
    let waited = waiter
        .lock(format!("{name}-busy"))
        .wait(Duration::from_millis(50));
    assert!(waited.await.is_err());
    assert!(busy.release().await.is_released());
    let before = server.info_commandstats();
    let waiters: Vec<_> = (0..20)
        .map(|_| {
            let (waiter, name) = (waiter.clone(), name.clone());
            tokio::spawn(async move {
                let guard = (waiter.lock(name.as_str()).wait(Duration::from_secs(20))).await?;
                Ok::<_, dlock_core::LockError>(guard.release().await.is_released())
            })
        })
        .collect();
    let until = std::time::Instant::now() + Duration::from_secs(5);
    while waiter.stats().watched_names < 1 {
        assert!(std::time::Instant::now() < until, "no waiter subscribed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let after = server.info_commandstats();
    let delta =
        |name: &str| after.get(name).copied().unwrap_or(0) - before.get(name).copied().unwrap_or(0);
    // The first request's attempt (its `SET NX PX`, then the script that claims the turn),
    // and the head's script after it subscribed; the nineteen others wait in line without a
    // round trip of their own.
    let scripts = dlock_tests::script_calls(&after) - dlock_tests::script_calls(&before);
    assert_eq!(scripts, 2, "{after:?}");
    assert_eq!(delta("set"), 1, "{after:?}");
    assert_eq!(delta("subscribe"), 1, "{after:?}");
    assert!(guard.release().await.is_released());
    for waiter in waiters {
        assert!(waiter.await.expect("waiter task").expect("acquired"));
    }
}

/// A hold that a release granted to a waiter of another process lasts twice a window from the
/// release, and the waiter asks for its own lease only a grace after the grant came: given back
/// before, it never sends that extension. From the holder's release to the waiter's: the two
/// releases' scripts, nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_granted_to_another_process_and_given_back_soon_is_not_extended() {
    let server = RedisServer::start();
    let holder = Locker::builder()
        .url(server.url())
        .build()
        .await
        .expect("locker");
    let waiter = Locker::builder()
        .url(server.url())
        .build()
        .await
        .expect("locker");
    for round in 0..2 {
        let name = unique_name("cost-granted");
        let key = holder.key_of(name.as_str()).expect("key");
        let held = holder.lock(name.as_str()).await.expect("lock");
        let (granted_tx, granted_rx) = tokio::sync::oneshot::channel();
        let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
        let waiting = tokio::spawn({
            let (waiter, name) = (waiter.clone(), name.clone());
            async move {
                let guard = (waiter.lock(name.as_str()))
                    .wait(Duration::from_secs(5))
                    .await
                    .expect("waiter");
                let _ = granted_tx.send(guard.remaining());
                let _ = release_rx.await;
                guard.release().await
            }
        });
        // The waiter's head offers its hand-over token with its claim.
        let mut con = server.connection().await;
        offered_token(&mut con, &key).await;
        let before = server.script_calls();
        assert!(held.release().await.is_released());
        let left = granted_rx.await.expect("granted");
        // Granted for twice the window (a quarter more than the command timeout), counted from
        // the claim's send: under 5 s, not the lease.
        assert!(left < Duration::from_secs(5), "{left:?} left");
        tokio::time::sleep(Duration::from_millis(20)).await;
        let _ = release_tx.send(());
        assert!(waiting.await.expect("waiter task").is_released());
        let calls = server.script_calls() - before;
        // The first round loads the scripts; the second is counted.
        if round == 1 {
            assert_eq!(
                calls, 2,
                "the holder's release and the waiter's, and no extension"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_passed_to_another_process_is_granted_without_reading_the_counter() {
    let server = RedisServer::start();
    let holder = warm_locker(&server).await;
    let waiter = warm_locker(&server).await;
    // The waiting `Locker`'s subscriber connects on its first wait, and its first grant loads
    // nothing new: both done here, unmeasured.
    for round in 0..2 {
        let name = unique_name("cost-turn-across");
        let held = holder.lock(name.as_str()).await.expect("lock");
        // A hold with a token, as one taken in turn has (the name's counter made).
        held.fencing_token().await.expect("a token");
        let (granted_tx, granted_rx) = tokio::sync::oneshot::channel();
        let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
        let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
        let wait = tokio::spawn({
            let (waiter, name) = (waiter.clone(), name.clone());
            async move {
                let _ = go_rx.await;
                let guard = (waiter.lock(name.as_str()))
                    .wait(Duration::from_secs(5))
                    .await
                    .expect("waiter");
                let _ = granted_tx.send(());
                let _ = release_rx.await;
                guard.release().await
            }
        });
        let ((), waited) = measure(&server, async {
            let calls = server.script_calls();
            let _ = go_tx.send(());
            tried(&server, calls).await;
        })
        .await;
        let (outcome, released) = measure(&server, async {
            let outcome = held.release().await;
            granted_rx.await.expect("granted");
            let until = std::time::Instant::now() + Duration::from_secs(5);
            while waiter.stats().watched_names > 0 {
                assert!(std::time::Instant::now() < until, "still waiting");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            // The subscription lingers a while after its last waiter, then goes.
            tokio::time::sleep(LINGER_PAST).await;
            outcome
        })
        .await;
        assert!(outcome.is_released());
        let _ = release_tx.send(());
        assert!(wait.await.expect("waiter task").is_released());
        if round == 1 {
            // The waiter: `SET NX PX`, found taken; `ACQUIRE`, which claims the next turn
            // (GET, PTTL, PSETEX); `SUBSCRIBE`; then `ACQUIRE` again as the head of its line,
            // which offers its hand-over token: GET, PTTL, PSETEX (the claim's time is its
            // send time, from the client: the script reads no clock).
            assert_eq!(waited, cost_of(4, 4 + 3 + 3));
            // The holder's release grants the lock in the same script: GET, TIME, HSET (the
            // new token: the hold's own was the counter's last, so the counter is not read),
            // PSETEX, PUBLISH; and the waiter, granted, unsubscribes once its subscription
            // has lingered.
            assert_eq!(released, cost_of(2, 2 + 5));
        }
    }
}

/// Longer than a subscription lingers after its last waiter left (100 ms), with a margin.
const LINGER_PAST: Duration = Duration::from_millis(250);

/// Two processes taking turns with one name, as W3 does: a side asks again soon after its last
/// wait ended, while its subscription lingers. Its request then sends neither a `SET NX PX` nor
/// a claim of its own before the head's attempt, nor a `SUBSCRIBE`: each turn costs the
/// waiter's one script (which claims the turn and offers its hand-over token) and the holder's
/// release, which grants it the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_taking_turns_send_one_script_each_per_turn() {
    let server = RedisServer::start();
    let a = warm_locker(&server).await;
    let b = warm_locker(&server).await;
    let name = unique_name("cost-turns");
    let con = server.connection().await;
    let held = a.lock(name.as_str()).await.expect("lock");
    // The first two turns subscribe each side.
    let held = take_turn(&con, held, &b, &name).await;
    let mut held = take_turn(&con, held, &a, &name).await;
    for (waiter, side) in [(&b, "b"), (&a, "a"), (&b, "b")] {
        let before = server.info_commandstats();
        let calls = server.script_calls();
        held = take_turn(&con, held, waiter, &name).await;
        let after = server.info_commandstats();
        let delta = |name: &str| {
            after.get(name).copied().unwrap_or(0) - before.get(name).copied().unwrap_or(0)
        };
        assert_eq!(
            server.script_calls() - calls,
            2,
            "{side}'s turn: its attempt and the holder's release, nothing else ({after:?})"
        );
        assert_eq!(delta("set"), 0, "{side}'s turn sent a SET: {after:?}");
        // The waiter's script claims the turn with PTTL and PSETEX (and a GET), reading no
        // clock; the release grants with TIME (the claim's age and the token), HSET (the
        // counter), PSETEX and PUBLISH (and a GET). The test's own look for the offer sends
        // GETs too, so those are not counted.
        let per_turn = [
            ("time", 1),
            ("pttl", 1),
            ("psetex", 2),
            ("hset", 1),
            ("publish", 1),
        ];
        for (command, count) in per_turn {
            assert_eq!(
                delta(command),
                count,
                "{side}'s turn: {command} ({after:?})"
            );
        }
        assert_eq!(
            delta("subscribe"),
            0,
            "{side}'s turn subscribed again: {after:?}"
        );
    }
    assert!(held.release().await.is_released());
}

/// `waiter` asks for `name` while `held` has it; once its head offers its hand-over token on the
/// hold, `held` is released, and the waiter's guard is returned.
async fn take_turn(
    con: &redis::aio::MultiplexedConnection,
    held: dlock_core::LockGuard,
    waiter: &Locker,
    name: &str,
) -> dlock_core::LockGuard {
    let key = waiter.key_of(name).expect("key");
    let waiting = tokio::spawn({
        let (waiter, name) = (waiter.clone(), name.to_owned());
        async move {
            waiter
                .lock(name.as_str())
                .wait(Duration::from_secs(5))
                .await
        }
    });
    let mut con = con.clone();
    offered_token(&mut con, &key).await;
    assert!(held.release().await.is_released());
    (waiting.await.expect("waiter task")).expect("the waiter's turn")
}

/// A side that gives the lock to the other and asks for it again at once, as W3's sides do:
/// its release grants the lock to the other's claim, and its new request's attempt claims the
/// turn after that on the granted hold. The release's wake-up reaches its own lingering
/// subscription too, often after that attempt went out; it announces only the grant the attempt
/// already found, so the request does not attempt again: one script for the release and one for
/// the request, every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_followed_at_once_by_a_wait_costs_two_scripts() {
    let server = RedisServer::start();
    let a = warm_locker(&server).await;
    let b = warm_locker(&server).await;
    let name = unique_name("cost-release-then-wait");
    let key = a.key_of(name.as_str()).expect("key");
    let mut con = server.connection().await;
    let held = a.lock(name.as_str()).await.expect("lock");
    // Both sides have waited once, so both subscriptions linger from now on.
    let held = take_turn(&con, held, &b, &name).await;
    let mut held = take_turn(&con, held, &a, &name).await;
    let (holder, other) = (&a, &b);
    let mut calls = Vec::new();
    for _ in 0..10 {
        // The other side claims the next turn and offers its hand-over token.
        let waiting = tokio::spawn({
            let (other, name) = (other.clone(), name.clone());
            async move { other.lock(name.as_str()).wait(Duration::from_secs(5)).await }
        });
        offered_token(&mut con, &key).await;
        let before = server.script_calls();
        assert!(held.release().await.is_released());
        // The holder asks again at once; once it has claimed the turn after, it sits still.
        let again = tokio::spawn({
            let (holder, name) = (holder.clone(), name.clone());
            async move {
                holder
                    .lock(name.as_str())
                    .wait(Duration::from_secs(5))
                    .await
            }
        });
        let granted = (waiting.await.expect("waiter task")).expect("the other side's turn");
        offered_token(&mut con, &key).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        calls.push(server.script_calls() - before);
        assert!(granted.release().await.is_released());
        held = (again.await.expect("waiter task")).expect("the holder's next turn");
    }
    assert!(held.release().await.is_released());
    assert_eq!(
        calls, [2; 10],
        "scripts per turn: the release and the new request's attempt, nothing else"
    );
}
