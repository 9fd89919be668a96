//! The operation generator: every session a worker will run, drawn up front from the seed, so the
//! sequence of operations is a pure function of the seed whatever the calls return.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{RngExt as _, SeedableRng as _};

use super::history::LeaseSpec;

/// One acquisition, as planned.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Acquire {
    /// `try_lock()` instead of `lock().wait(..)`.
    pub(crate) try_lock: bool,
    /// The wait (ignored by `try_lock`).
    pub(crate) wait: Duration,
    /// The lease.
    pub(crate) lease: LeaseSpec,
    /// Drop the acquisition future after this long if it has not finished.
    pub(crate) cancel_after: Option<Duration>,
    /// Keep the name taken this long after the grant (`at_least`; capped by a fixed lease).
    pub(crate) at_least: Option<Duration>,
}

impl Acquire {
    /// The `at_least` period the request asks for: the planned one, no longer than a fixed
    /// lease (a longer one is a configuration error).
    pub(crate) fn period(&self) -> Option<Duration> {
        match self.lease {
            LeaseSpec::Fixed(lease) => self.at_least.map(|p| p.min(lease)),
            _ => self.at_least,
        }
    }
}

/// One step while a guard is held.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Step {
    /// Sleep this long.
    Hold(Duration),
    /// Sleep up to `most`; if a failover's replica takes over the name's slot meanwhile, only
    /// until `after` past that moment. A release then is one the new master runs while the
    /// waiters' subscriptions are still being taken again, where a wake-up is most easily lost.
    HoldPastPromotion {
        /// The longest hold.
        most: Duration,
        /// How long after a promotion the hold ends.
        after: Duration,
    },
    /// `guard.extend(d)`.
    Extend(Duration),
    /// `guard.run(sleep(work))`.
    Run(Duration),
    /// `guard.fencing_token()` (minted at the first ask for a plain lock).
    Fence,
}

/// How a guard ends.
#[derive(Debug, Clone, Copy)]
pub(crate) enum End {
    /// `release().await`.
    Release,
    /// `release()` dropped after this long if it has not finished.
    ReleaseWithin(Duration),
    /// Drop the guard.
    Drop,
}

/// What one worker does in one go.
#[derive(Debug, Clone)]
pub(crate) enum Session {
    /// One lock: acquire, steps, end.
    Single {
        /// The locker.
        locker: u8,
        /// The name.
        name: u8,
        /// The acquisition.
        acquire: Acquire,
        /// What to do while held.
        steps: Vec<Step>,
        /// How it ends.
        end: End,
    },
    /// Acquire a name, then acquire it again in the same `scope`, then end both.
    Reenter {
        /// The locker.
        locker: u8,
        /// The name.
        name: u8,
        /// What is taken twice (on the read-write name: a read or the write lock, then a read
        /// or the write lock again).
        nested: Nested,
        /// The first acquisition.
        outer: Acquire,
        /// How long the outer guard is held before the nested acquisition.
        gap: Duration,
        /// The nested one.
        inner: Acquire,
        /// How long both are held.
        hold: Duration,
        /// End the inner guard first.
        inner_first: bool,
        /// How the outer and the inner guard end.
        ends: [End; 2],
    },
    /// Inside a `scope` holding `outer`, two acquisitions of `name` side by side in one task
    /// (`join!`), each in a nested scope of its own, as every `#[distributed_lock]` call runs:
    /// they exclude each other and neither re-enters the other's hold.
    Beside {
        /// The locker.
        locker: u8,
        /// The name the enclosing scope holds.
        outer: u8,
        /// Its acquisition.
        outer_acquire: Acquire,
        /// The name both take.
        name: u8,
        /// Their acquisitions.
        acquires: [Acquire; 2],
        /// How long the second waits before it starts.
        stagger: Duration,
        /// How long each holds.
        holds: [Duration; 2],
        /// How the outer guard and each of the two end.
        ends: [End; 3],
    },
    /// Several tasks of one locker take one plain name side by side (`join_all`, each in a scope
    /// of its own): a local line, whose releases hand the lock on inside the locker.
    Line {
        /// The locker.
        locker: u8,
        /// The name (never the fair one).
        name: u8,
        /// Each task's acquisition, when it starts after the session began, how long it holds,
        /// and how it ends.
        tasks: Vec<(Acquire, Duration, Duration, End)>,
        /// How many times each task takes the name, one after the other.
        rounds: u8,
    },
    /// `lock_all` of a few names.
    Multi {
        /// The locker.
        locker: u8,
        /// The names (distinct).
        names: Vec<u8>,
        /// The acquisition (its `try_lock`, wait, lease and cancellation).
        acquire: Acquire,
        /// How long they are held.
        hold: Duration,
        /// How each guard ends.
        end: End,
    },
    /// A permit of the semaphore: acquire, steps (holds and runs), end.
    Permit {
        /// The locker.
        locker: u8,
        /// How many permits it takes at once (at most the handles' count).
        take: u32,
        /// The acquisition (its `at_least` unused).
        acquire: Acquire,
        /// What to do while held.
        steps: Vec<Step>,
        /// How it ends.
        end: End,
    },
    /// `set_permits(n)` on the semaphore, or `reset_permits()` (`None`).
    SetPermits {
        /// The locker.
        locker: u8,
        /// The count.
        to: Option<u32>,
    },
    /// A read lock of the read-write name: acquire, steps (holds and runs), end.
    Read {
        /// The locker.
        locker: u8,
        /// The acquisition (its `at_least` unused).
        acquire: Acquire,
        /// What to do while held.
        steps: Vec<Step>,
        /// How it ends.
        end: End,
    },
}

/// What a [`Session::Reenter`] takes, outside and inside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Nested {
    /// The name's own lock, twice (on the read-write name, the write lock).
    Same,
    /// The read-write name's write lock, then a read.
    ReadInWrite,
    /// The read-write name's read lock, twice.
    ReadInRead,
}

/// What the generator needs to know about the run.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shape {
    /// How many lockers.
    pub(crate) lockers: u8,
    /// How many names.
    pub(crate) names: u8,
    /// The name taken with `fair_lock` (never part of a `lock_all`).
    pub(crate) fair: Option<u8>,
    /// The semaphore's name (not one of the `names`).
    pub(crate) semaphore: Option<u8>,
    /// The read-write lock's name (not one of the `names`).
    pub(crate) rw: Option<u8>,
    /// Whether the semaphore's count may be set at run time (`set_permits`).
    pub(crate) set_permits: bool,
    /// A plain name whose waits are now and then long, as the fair name's are: where a claim
    /// to the next turn left behind would keep waiters out past the wake-up bound.
    pub(crate) long_waits: Option<u8>,
}

/// The longest lease (or extension) the generator ever asks for, `Duration::MAX` aside.
pub(crate) const MAX_PLANNED_LEASE: Duration = Duration::from_millis(1_500);

fn between(rng: &mut StdRng, lo_ms: u64, hi_ms: u64) -> Duration {
    Duration::from_micros(rng.random_range(lo_ms * 1_000..=hi_ms * 1_000))
}

fn wait(rng: &mut StdRng) -> Duration {
    match rng.random_range(0..100) {
        0..15 => Duration::ZERO,
        15..40 => between(rng, 1, 10),
        _ => between(rng, 10, 300),
    }
}

fn lease(rng: &mut StdRng) -> LeaseSpec {
    match rng.random_range(0..100) {
        0..35 => LeaseSpec::Fixed(between(rng, 100, 1_000)),
        35..70 => LeaseSpec::Watchdog(between(rng, 300, 1_000)),
        _ => LeaseSpec::LockerDefault,
    }
}

/// The lease a spec stands for, with the locker's default.
pub(crate) fn lease_of(spec: LeaseSpec, default: Duration) -> Duration {
    match spec {
        LeaseSpec::LockerDefault => default,
        LeaseSpec::Watchdog(d) | LeaseSpec::Fixed(d) => d,
    }
}

/// A hold time: mostly short, sometimes past the lease.
fn hold(rng: &mut StdRng, lease: Duration) -> Duration {
    match rng.random_range(0..100) {
        0..60 => between(rng, 0, 5),
        60..90 => between(rng, 5, 30),
        90..98 => between(rng, 30, 100),
        _ => lease
            .mul_f64(rng.random_range(1.0..1.5))
            .min(MAX_PLANNED_LEASE),
    }
}

fn end(rng: &mut StdRng) -> End {
    match rng.random_range(0..100) {
        0..70 => End::Release,
        70..90 => End::Drop,
        _ => End::ReleaseWithin(between(rng, 0, 3)),
    }
}

fn acquire(rng: &mut StdRng, try_lock: bool) -> Acquire {
    Acquire {
        try_lock,
        wait: if try_lock { Duration::ZERO } else { wait(rng) },
        lease: lease(rng),
        cancel_after: None,
        // Now and then a job that must not run twice within a period.
        at_least: rng.random_bool(0.15).then(|| between(rng, 20, 600)),
    }
}

/// An extension shorter or longer than `lease`.
fn extension(rng: &mut StdRng, lease: Duration) -> Duration {
    if rng.random_bool(0.5) {
        between(rng, 5, (lease.as_millis() as u64 / 2).max(6))
    } else {
        lease
            .mul_f64(rng.random_range(1.2..2.0))
            .min(MAX_PLANNED_LEASE)
    }
}

/// A wait on the fair name (or the name of `Shape::long_waits`): now and then long enough for
/// later waiters to line up behind it (the fair-order check compares waiters that came more
/// than `SLACK` apart).
fn fair_wait(rng: &mut StdRng, shape: Shape, name: u8, acquire: &mut Acquire) {
    let long = shape.fair == Some(name) || shape.long_waits == Some(name);
    if long && !acquire.try_lock && rng.random_bool(0.3) {
        acquire.wait = between(rng, 300, 1_000);
    }
}

fn single(rng: &mut StdRng, shape: Shape, default_lease: Duration) -> Session {
    let locker = rng.random_range(0..shape.lockers);
    let name = rng.random_range(0..shape.names);
    let roll = rng.random_range(0..1_000);
    let mut acquire = acquire(rng, roll < 200);
    fair_wait(rng, shape, name, &mut acquire);
    let lease = lease_of(acquire.lease, default_lease);
    let mut steps = vec![Step::Hold(hold(rng, lease))];
    match roll {
        // A guarded run under a fixed lease, the work sometimes outliving it.
        200..350 => {
            let fixed = between(rng, 100, 600);
            acquire.lease = LeaseSpec::Fixed(fixed);
            let work = if rng.random_bool(0.3) {
                fixed.mul_f64(rng.random_range(1.0..1.5))
            } else {
                fixed.mul_f64(rng.random_range(0.0..0.5))
            };
            steps = vec![Step::Run(work)];
        }
        // An acquisition dropped half-way.
        350..500 => {
            acquire.cancel_after = Some(if rng.random_bool(0.7) {
                between(rng, 0, 3)
            } else {
                between(rng, 3, 50)
            });
        }
        // Extend, then hold on (sometimes past a shortened lease).
        500..700 => {
            let to = extension(rng, lease);
            steps.push(Step::Extend(to));
            let after = if rng.random_bool(0.5) {
                to.mul_f64(rng.random_range(1.0..2.0))
                    .min(MAX_PLANNED_LEASE)
            } else {
                hold(rng, to)
            };
            steps.push(Step::Hold(after));
        }
        // Rare edge values: waiting "forever", extending "forever".
        999.. => {
            if rng.random_bool(0.5) {
                acquire.try_lock = false;
                acquire.wait = Duration::MAX;
            } else {
                steps.push(Step::Extend(Duration::MAX));
            }
        }
        _ => {}
    }
    // Most holders ask for their token: right after the grant (so the samples and the release
    // check see it), or last, just before letting go; the rest never ask.
    match rng.random_range(0..10) {
        0..6 => steps.insert(0, Step::Fence),
        6..9 => steps.push(Step::Fence),
        _ => {}
    }
    Session::Single {
        locker,
        name,
        acquire,
        steps,
        end: end(rng),
    }
}

/// Holds and guarded runs (a permit or a read lock has no `extend`).
fn shared_steps(rng: &mut StdRng, acquire: &mut Acquire, default_lease: Duration) -> Vec<Step> {
    let lease = lease_of(acquire.lease, default_lease);
    if rng.random_bool(0.15) {
        let fixed = between(rng, 100, 600);
        acquire.lease = LeaseSpec::Fixed(fixed);
        let work = fixed.mul_f64(rng.random_range(0.0..1.5));
        return vec![Step::Run(work)];
    }
    if rng.random_bool(0.1) {
        // A holder that overstays a fixed lease while others hold theirs, then lets go: its
        // release must say the hold was gone.
        let fixed = between(rng, 100, 400);
        acquire.lease = LeaseSpec::Fixed(fixed);
        return vec![Step::Hold(fixed.mul_f64(rng.random_range(1.1..1.5)))];
    }
    vec![Step::Hold(hold(rng, lease))]
}

fn permit(rng: &mut StdRng, shape: Shape, default_lease: Duration) -> Session {
    let locker = rng.random_range(0..shape.lockers);
    if rng.random_bool(0.05) && shape.set_permits {
        return Session::SetPermits {
            locker,
            to: rng.random_bool(0.7).then(|| rng.random_range(1..=4)),
        };
    }
    let take = match rng.random_range(0..100) {
        0..75 => 1,
        75..95 => 2,
        _ => 3,
    };
    let (acquire, steps) = shared(rng, default_lease);
    Session::Permit {
        locker,
        take,
        acquire,
        steps,
        end: end(rng),
    }
}

/// The acquisition and steps of a permit or read session (neither has `at_least`).
fn shared(rng: &mut StdRng, default_lease: Duration) -> (Acquire, Vec<Step>) {
    let try_lock = rng.random_bool(0.2);
    let mut acquire = acquire(rng, try_lock);
    acquire.at_least = None;
    if rng.random_bool(0.1) {
        acquire.cancel_after = Some(between(rng, 0, 5));
    }
    let steps = shared_steps(rng, &mut acquire, default_lease);
    (acquire, steps)
}

/// A session on the read-write name: mostly reads, some writes (a plain session on it), some
/// re-entries.
fn read_write(rng: &mut StdRng, shape: Shape, rw: u8, default_lease: Duration) -> Session {
    let roll = rng.random_range(0..100);
    if roll < 25 {
        let mut session = single(rng, shape, default_lease);
        if let Session::Single { name, .. } = &mut session {
            *name = rw;
        }
        return session;
    }
    if roll < 40 {
        let nested = match roll {
            25..30 => Nested::Same,
            30..35 => Nested::ReadInWrite,
            _ => Nested::ReadInRead,
        };
        let mut session = reenter(rng, shape);
        if let Session::Reenter {
            name,
            nested: n,
            inner,
            outer,
            ..
        } = &mut session
        {
            *name = rw;
            *n = nested;
            if nested != Nested::Same {
                inner.at_least = None;
            }
            if nested == Nested::ReadInRead {
                outer.at_least = None;
            }
        }
        return session;
    }
    let locker = rng.random_range(0..shape.lockers);
    let (acquire, steps) = shared(rng, default_lease);
    Session::Read {
        locker,
        acquire,
        steps,
        end: end(rng),
    }
}

fn beside(rng: &mut StdRng, shape: Shape) -> Session {
    let name = rng.random_range(0..shape.names);
    let outer = (name + 1) % shape.names;
    let mut outer_acquire = acquire(rng, false);
    outer_acquire.cancel_after = None;
    let mut sibling = || {
        let try_lock = rng.random_bool(0.2);
        let mut a = acquire(rng, try_lock);
        a.at_least = None;
        a
    };
    let acquires = [sibling(), sibling()];
    Session::Beside {
        locker: rng.random_range(0..shape.lockers),
        outer,
        outer_acquire,
        name,
        acquires,
        stagger: between(rng, 0, 10),
        holds: [between(rng, 0, 30), between(rng, 0, 30)],
        ends: [End::Release, end(rng), end(rng)],
    }
}

fn line(rng: &mut StdRng, shape: Shape) -> Session {
    let plain: Vec<u8> = (0..shape.names)
        .filter(|&n| shape.fair != Some(n))
        .collect();
    let name = plain[rng.random_range(0..plain.len())];
    let tasks = (0..rng.random_range(3..=5))
        .map(|_| {
            let mut a = acquire(rng, false);
            // Long enough to queue behind the others, renewed by the watchdog mostly, now and
            // then given up half-way.
            a.wait = between(rng, 100, 1_000);
            a.at_least = None;
            if rng.random_bool(0.8) {
                a.lease = LeaseSpec::Watchdog(between(rng, 300, 1_000));
            }
            if rng.random_bool(0.1) {
                a.cancel_after = Some(between(rng, 0, 20));
            }
            (a, between(rng, 0, 10), between(rng, 0, 5), end(rng))
        })
        .collect();
    Session::Line {
        locker: rng.random_range(0..shape.lockers),
        name,
        tasks,
        rounds: rng.random_range(1..=2),
    }
}

fn reenter(rng: &mut StdRng, shape: Shape) -> Session {
    let mut inner = acquire(rng, false);
    inner.wait = between(rng, 0, 50);
    if rng.random_bool(0.25) {
        inner.cancel_after = Some(between(rng, 0, 2));
    }
    let mut ends = [end(rng), end(rng)];
    for e in &mut ends {
        if let End::Drop = e {
            // Mostly awaited releases, so the final one can be checked against Redis.
            if rng.random_bool(0.5) {
                *e = End::Release;
            }
        }
    }
    let name = rng.random_range(0..shape.names);
    let mut outer = acquire(rng, false);
    fair_wait(rng, shape, name, &mut outer);
    Session::Reenter {
        locker: rng.random_range(0..shape.lockers),
        name,
        nested: Nested::Same,
        outer,
        // Mostly at once; sometimes late in the hold — past renewals, or just before a fixed
        // lease runs out — where an answer that comes back late (a fault that holds answers
        // back) says the hold is there when it no longer is.
        gap: match (rng.random_range(0..10), outer.lease) {
            (0..5, _) => Duration::ZERO,
            (5..8, _) => between(rng, 0, 20),
            (_, LeaseSpec::Fixed(lease)) => lease.saturating_sub(between(rng, 5, 60)),
            _ => between(rng, 0, 1_500),
        },
        inner,
        hold: between(rng, 0, 20),
        inner_first: rng.random_bool(0.5),
        ends,
    }
}

fn multi(rng: &mut StdRng, shape: Shape) -> Session {
    // A multi-lock is never fair: it picks among the plain names.
    let mut names: Vec<u8> = (0..shape.names)
        .filter(|&n| shape.fair != Some(n))
        .collect();
    let count = rng.random_range(2..=3usize).min(names.len());
    // A partial Fisher–Yates shuffle picks `count` distinct names.
    for i in 0..count {
        let j = rng.random_range(i..names.len());
        names.swap(i, j);
    }
    names.truncate(count);
    let try_lock = rng.random_bool(0.2);
    let mut acquire = acquire(rng, try_lock);
    if rng.random_bool(0.1) {
        acquire.cancel_after = Some(between(rng, 0, 5));
    }
    Session::Multi {
        locker: rng.random_range(0..shape.lockers),
        names,
        acquire,
        hold: between(rng, 0, 30),
        end: end(rng),
    }
}

/// `count` sessions for one worker, from its own stream of the seed.
pub(crate) fn sessions(
    seed: u64,
    worker: u16,
    count: usize,
    shape: Shape,
    default_lease: Duration,
) -> Vec<Session> {
    let mut rng =
        StdRng::seed_from_u64(seed ^ (u64::from(worker) + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    (0..count)
        .map(
            |_| match (rng.random_range(0..100), shape.semaphore, shape.rw) {
                (76..88, Some(_), _) => permit(&mut rng, shape, default_lease),
                (88.., _, Some(rw)) => read_write(&mut rng, shape, rw, default_lease),
                (0..50, ..) | (76.., ..) => single(&mut rng, shape, default_lease),
                (50..52, ..) => line(&mut rng, shape),
                (52..56, ..) if shape.names > 1 => beside(&mut rng, shape),
                (52..56, ..) => single(&mut rng, shape, default_lease),
                (56..67, ..) => reenter(&mut rng, shape),
                _ => multi(&mut rng, shape),
            },
        )
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_is_a_function_of_the_seed() {
        let shape = Shape {
            lockers: 4,
            names: 3,
            fair: Some(2),
            semaphore: Some(3),
            rw: Some(4),
            set_permits: true,
            long_waits: None,
        };
        let a = sessions(7, 2, 200, shape, Duration::from_millis(500));
        let b = sessions(7, 2, 200, shape, Duration::from_millis(500));
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
        let c = sessions(8, 2, 200, shape, Duration::from_millis(500));
        assert_ne!(format!("{a:?}"), format!("{c:?}"));
    }

    #[test]
    fn multi_locks_never_take_the_fair_name() {
        let shape = Shape {
            lockers: 4,
            names: 3,
            fair: Some(2),
            semaphore: Some(3),
            rw: Some(4),
            set_permits: true,
            long_waits: None,
        };
        let mut multis = 0;
        for worker in 0..8 {
            for session in sessions(11, worker, 300, shape, Duration::from_millis(500)) {
                if let Session::Multi { names, .. } = session {
                    assert_eq!(names.len(), 2, "two plain names: {names:?}");
                    assert!(
                        !names.contains(&2),
                        "the fair name in a multi-lock: {names:?}"
                    );
                    multis += 1;
                }
            }
        }
        assert!(multis > 0, "the plan has multi-locks");
    }
}
