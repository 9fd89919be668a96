//! The invariants' checks on histories built by hand: each excuse of one check, and what it
//! does not excuse.

use std::sync::atomic::AtomicU64;
use std::sync::{Mutex, OnceLock};

use super::*;
use crate::faults::Reach;
use crate::history::{EndHow, GuardEnd, Special};

fn rec(id: u32, t: Instant, (call, start, end): (u64, u64, u64), token: u64) -> Hold {
    let at = |ms: u64| t + Duration::from_millis(ms);
    let guard = Arc::new(GuardRec {
        id,
        worker: 0,
        locker: 0,
        name: 0,
        fencing_token: AtomicU64::new(token),
        reentrant: false,
        share: Share::Exclusive,
        permits: 1,
        watchdog: false,
        call: at(call),
        multi: false,
        start: at(start),
        handed_out_lost: false,
        granted_until: at(end + 500),
        lost_at: OnceLock::new(),
        lease: Duration::from_millis(600),
        at_least: None,
        extends: Mutex::default(),
        end: Mutex::default(),
    });
    Hold {
        guard,
        start: at(start),
        end: at(end),
        last: at(end),
    }
}

fn overlaps(a: &Hold, b: &Hold, faults: &[FaultRec], t: Instant) -> usize {
    let history = History::new(
        vec!["n".to_owned()],
        vec!["l".to_owned()],
        Special::default(),
        Duration::from_secs(1),
    );
    let mut out = Vec::new();
    let finish = t + Duration::from_secs(5);
    mutual_exclusion(&history, 0, &[a, b], faults, finish, &mut out);
    out.len()
}

/// A plain lock with no token granted right after a `DEL`, and a multi-lock whose name Redis
/// had granted before the `DEL` (its token says so) but that returned later, once it had
/// its other names: the `DEL` explains the overlap. The same seen from a plain lock, whose
/// grant comes with its last round trip, does not.
#[test]
fn a_multi_lock_may_have_been_granted_before_its_belief() {
    let t = Instant::now();
    let del = FaultRec {
        kind: FaultKind::Del,
        reach: Reach::name(0),
        from: t + Duration::from_millis(90),
        to: t + Duration::from_millis(91),
    };
    let plain = rec(1, t, (95, 100, 200), 0);
    let mut multi = rec(2, t, (0, 150, 250), 77);
    assert_eq!(overlaps(&plain, &multi, &[del], t), 1);
    Arc::get_mut(&mut multi.guard).expect("one owner").multi = true;
    assert_eq!(overlaps(&plain, &multi, &[del], t), 0);
    assert_eq!(overlaps(&plain, &multi, &[], t), 1);
}

/// A plain lock with no token, taken after a `DEL` and released within its at-least
/// period, and a multi-lock called before it whose name Redis had granted before the
/// `DEL` (and so before the plain lock) but that returned once it had its other names,
/// right after that release: the `DEL` explains it. A multi-lock called after the plain
/// lock's grant, or a plain lock in its place, or no fault, does not.
#[test]
fn a_multi_lock_granted_before_an_at_least_hold_may_believe_inside_its_period() {
    let t = Instant::now();
    let at = |ms: u64| t + Duration::from_millis(ms);
    let del = FaultRec {
        kind: FaultKind::Del,
        reach: Reach::name(0),
        from: at(90),
        to: at(91),
    };
    let history = History::new(
        vec!["n".to_owned()],
        vec!["l".to_owned()],
        Special::default(),
        Duration::from_secs(1),
    );
    let finish = t + Duration::from_secs(5);
    // Released 14 ms in, kept for 272 ms.
    let mut kept = rec(1, t, (100, 100, 114), 0);
    {
        let guard = Arc::get_mut(&mut kept.guard).expect("one owner");
        guard.at_least = Some(Duration::from_millis(272));
        *guard.end.get_mut().expect("not poisoned") = Some(GuardEnd {
            at: at(114),
            how: EndHow::Released,
            valid_until: at(600),
            lost_before: false,
            returned: Some((at(114), Outcome::Released)),
            final_of_hold: true,
            hget: None,
        });
    }
    let early = |call: u64, multi: bool, faults: &[FaultRec]| {
        let mut b = rec(2, t, (call, 115, 700), 77);
        Arc::get_mut(&mut b.guard).expect("one owner").multi = multi;
        let mut out = Vec::new();
        at_least(&history, 0, &[&kept, &b], faults, finish, &mut out);
        out.len()
    };
    assert_eq!(early(0, true, &[del]), 0);
    assert_eq!(early(0, true, &[]), 1);
    assert_eq!(early(0, false, &[del]), 1);
    assert_eq!(early(105, true, &[del]), 1);
}
