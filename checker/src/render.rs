//! Printing: relative times, faults, the minimal history around a violation, and the report of
//! all violations grouped by invariant and suspected cause.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::Duration;

use tokio::time::Instant;

use super::faults::FaultRec;
use super::history::{ErrKind, Event, EventKind, History, ms};
use super::invariants::{Invariant, Violation};

/// How long before a violation's window the faults that hit its name are still shown.
const FAULTS_BEFORE: Duration = Duration::from_millis(200);

impl History {
    /// `+12.345ms` since the run's start.
    pub fn rel(&self, at: Instant) -> String {
        if at >= self.origin {
            format!("+{}", ms(at - self.origin))
        } else {
            format!("-{}", ms(self.origin - at))
        }
    }

    /// A fault as one line.
    pub fn fault_line(&self, f: &FaultRec) -> String {
        let target = f.reach.describe(&self.names);
        format!(
            "{:>13} .. {:<13} FAULT {:?} on {target} ({})",
            self.rel(f.from),
            self.rel(f.to),
            f.kind,
            ms(f.to - f.from)
        )
    }

    /// The events of `name` in `[from, to]` and the faults hitting it in that window or shortly
    /// before it (up to 200 ms), one per line, in time order: the minimal history of a
    /// violation. `compact` leaves out the acquisitions that found the lock busy (they change
    /// nothing), and says how many.
    #[allow(clippy::too_many_arguments)]
    pub fn render_window(
        &self,
        events: &[Event],
        faults: &[FaultRec],
        tokens: &dyn Fn(u32) -> u64,
        name: u8,
        from: Instant,
        to: Instant,
        compact: bool,
    ) -> String {
        let start = events.partition_point(|e| e.at < from);
        let window: Vec<&Event> = events[start..]
            .iter()
            .take_while(|e| e.at <= to)
            .filter(|e| e.name == name)
            .collect();
        let mut hidden = vec![false; window.len()];
        if compact {
            // An end and its call share the call's id.
            let mut pending: std::collections::HashMap<u32, usize> = Default::default();
            for (i, e) in window.iter().enumerate() {
                match e.kind {
                    EventKind::AcquireCall { .. } => {
                        pending.insert(e.call, i);
                    }
                    EventKind::Busy | EventKind::AcquireFailed(ErrKind::Busy) => {
                        hidden[i] = true;
                        if let Some(call) = pending.remove(&e.call) {
                            hidden[call] = true;
                        }
                    }
                    EventKind::Acquired { .. }
                    | EventKind::AcquireFailed(_)
                    | EventKind::AcquireDropped => {
                        pending.remove(&e.call);
                    }
                    _ => {}
                }
            }
        }
        let mut lines: Vec<(Instant, String)> = Vec::new();
        for (e, _) in window.iter().zip(&hidden).filter(|(_, h)| !**h) {
            let locker = &self.lockers[usize::from(e.locker)];
            let mut what = describe(&e.kind, tokens);
            if self.is_fair(name) && matches!(e.kind, EventKind::AcquireCall { .. }) {
                what = format!("fair {what}");
            }
            lines.push((
                e.at,
                format!(
                    "{:>13} {locker:<15} w{:<3} {what}",
                    self.rel(e.at),
                    e.worker
                ),
            ));
        }
        // A fault just before the window may be what the window's events follow from (a key
        // deleted under a hold that goes on being believed).
        let faults_from = from.checked_sub(FAULTS_BEFORE).unwrap_or(from);
        // Faults elsewhere are shown too, marked: a fault on another master can still reach
        // the name through what its lockers share (a subscriber, a connection's slot map).
        for f in faults
            .iter()
            .filter(|f| f.to >= faults_from && f.from <= to)
        {
            let line = self.fault_line(f);
            if f.hits(name) {
                lines.push((f.from, line));
            } else {
                lines.push((f.from, format!("{line} (elsewhere)")));
            }
        }
        lines.sort_by_key(|(at, _)| *at);
        let mut out = String::new();
        let omitted = hidden.iter().filter(|h| **h).count();
        if omitted > 0 {
            let _ = writeln!(
                out,
                "    ({omitted} events of acquisitions that found the lock busy left out)"
            );
        }
        for (_, line) in lines {
            let _ = writeln!(out, "    {line}");
        }
        out
    }
}

fn describe(kind: &EventKind, tokens: &dyn Fn(u32) -> u64) -> String {
    match *kind {
        EventKind::AcquireCall { kind, wait, lease } => {
            format!("{kind:?} call wait={} lease={lease}", ms(wait))
        }
        EventKind::Acquired {
            guard,
            token,
            reentrant,
        } => format!(
            "  -> acquired g{guard} token={token}{}",
            if reentrant { " (re-entered)" } else { "" }
        ),
        EventKind::Busy => "  -> busy".to_owned(),
        EventKind::AcquireFailed(err) => format!("  -> error {err:?}"),
        EventKind::AcquireDropped => "  -> acquisition future dropped".to_owned(),
        EventKind::Lost { guard } => format!("lost() resolved g{guard} token={}", tokens(guard)),
        EventKind::ExtendCall { guard, lease } => {
            format!("extend g{guard} token={} to {}", tokens(guard), ms(lease))
        }
        EventKind::ExtendDone { guard, result } => {
            format!("  -> extend g{guard} {result:?}")
        }
        EventKind::RunDone {
            guard,
            work,
            cancelled,
        } => format!(
            "run g{guard} token={} work={} -> {}",
            tokens(guard),
            ms(work),
            if cancelled { "cancelled (Lost)" } else { "Ok" }
        ),
        EventKind::ReleaseCall { guard } => {
            format!("release g{guard} token={}", tokens(guard))
        }
        EventKind::ReleaseDone { guard, outcome } => {
            format!("  -> release g{guard} {outcome:?}")
        }
        EventKind::ReleaseDropped { guard } => format!("  -> release g{guard} future dropped"),
        EventKind::Dropped { guard } => format!("drop g{guard} token={}", tokens(guard)),
        EventKind::PermitsSet { to, ok } => format!(
            "  -> {} {}",
            to.map_or("reset_permits()".to_owned(), |n| format!(
                "set_permits({n})"
            )),
            if ok { "Ok" } else { "failed" }
        ),
        EventKind::Fenced { guard, token, .. } => match token {
            Some(token) => format!("fencing_token() g{guard} -> {token}"),
            None => format!("fencing_token() g{guard} -> error"),
        },
        EventKind::Hget { guard, found } => {
            format!("  token on the key after release of g{guard}: {found:?}")
        }
    }
}

/// The report of the violations: counts per invariant, and for each invariant the few with the
/// shortest histories, printed in full.
pub(super) fn render(history: &History, violations: &[Violation], per_invariant: usize) -> String {
    let events: Vec<Event> = history.events();
    let faults = history.faults();
    let guards = history.guards();
    let mut tokens = vec![0u64; guards.len()];
    for g in &guards {
        tokens[g.id as usize] = g.token();
    }
    let token = |id: u32| tokens.get(id as usize).copied().unwrap_or(0);
    let mut by_inv: HashMap<(Invariant, &str), Vec<&Violation>> = HashMap::new();
    for v in violations {
        by_inv.entry((v.invariant, v.hint)).or_default().push(v);
    }
    let mut invs: Vec<_> = by_inv.keys().copied().collect();
    invs.sort();
    let mut out = String::new();
    for (inv, hint) in invs {
        let mut vs = by_inv.remove(&(inv, hint)).unwrap_or_default();
        let hint = if hint.is_empty() {
            String::new()
        } else {
            format!(" [{hint}]")
        };
        out.push_str(&format!(
            "\n=== {inv}{hint}: {} violation(s) ===\n",
            vs.len()
        ));
        let compact = inv != Invariant::Bounded;
        let span = |v: &Violation| v.window.map_or(Duration::ZERO, |(_, a, b)| b - a);
        vs.sort_by_key(|v| span(v));
        for v in vs.iter().take(per_invariant) {
            out.push_str(&format!("  * {}\n", v.summary));
            if let Some((name, from, to)) = v.window {
                out.push_str(&format!(
                    "    history of `{}` from {} to {}:\n",
                    history.names[usize::from(name)],
                    history.rel(from),
                    history.rel(to)
                ));
                out.push_str(
                    &history.render_window(&events, &faults, &token, name, from, to, compact),
                );
            }
        }
    }
    out
}
