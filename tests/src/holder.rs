//! A lock holder in an OS process of its own (the `holder` binary of this crate), so that tests
//! can `SIGKILL` and `SIGSTOP` it for real, and [`HolderProcess`], the test's handle on it.
//!
//! The binary is run as `holder URL NAME LEASE_MS [RESOURCE]`: it connects a `Locker` to `URL`
//! with a watchdog lease of `LEASE_MS`, takes the lock `NAME` and, if a `RESOURCE` key is given,
//! writes to that [fenced](crate::fenced) resource every [`WRITE_EVERY`] under its token until
//! it learns that it lost the lock. It then makes one more write (which the resource must refuse
//! once someone else wrote with a newer token), releases, and exits. It exits as well as soon as
//! its standard input closes, so that it never outlives the test that started it.
//!
//! It reports on standard output, one line per event (see [`HolderLine`]):
//!
//! ```text
//! acquired token=<token> lease_ms=<lease>
//! write token=<token> seq=<n> accepted|refused
//! write-error token=<token> seq=<n> <error>
//! lost via=deadline|renewal held_ms=<ms since acquired>
//! after-loss-write token=<token> accepted|refused
//! released outcome=<outcome>
//! error <message>
//! note <what dlock logged at WARN or above> <its fields>
//! ```
//!
//! `lost via=deadline`: the guard's own validity deadline passed without a renewal confirming
//! the lease (it learned from its monotonic clock); `via=renewal`: a renewal found the lock gone
//! or owned by another while the deadline still ran.

use std::io::BufRead as _;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

/// How often the holder writes to its fenced resource.
pub const WRITE_EVERY: Duration = Duration::from_millis(50);

/// One line of the holder's standard output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HolderLine {
    /// The lock is held with this fencing token.
    Acquired {
        /// The fencing token.
        token: u64,
    },
    /// A fenced write while the holder believed it held the lock.
    Write {
        /// The token it carried.
        token: u64,
        /// Its sequence number, from 1.
        seq: u64,
        /// Whether the resource accepted it.
        accepted: bool,
    },
    /// A fenced write that did not reach the resource.
    WriteError {
        /// The error.
        message: String,
    },
    /// `lost()` resolved.
    Lost {
        /// `deadline` or `renewal` (see the [module](self) docs).
        via: String,
        /// How long after the acquisition.
        held_ms: u64,
    },
    /// The write made after the loss.
    AfterLossWrite {
        /// Whether the resource accepted it.
        accepted: bool,
    },
    /// The guard was released with this outcome (its `Debug` form).
    Released {
        /// The outcome.
        outcome: String,
    },
    /// The holder failed before holding the lock.
    Error {
        /// What failed.
        message: String,
    },
    /// Anything else.
    Other(String),
}

impl HolderLine {
    /// Parses one line of the holder's output.
    pub fn parse(line: &str) -> Self {
        let mut words = line.split_whitespace();
        let kind = words.next().unwrap_or_default();
        let rest: Vec<&str> = words.collect();
        let field = |name: &str| {
            rest.iter()
                .find_map(|w| w.strip_prefix(name)?.strip_prefix('='))
                .map(str::to_owned)
        };
        let number = |name: &str| field(name).and_then(|v| v.parse::<u64>().ok());
        let verdict = || match rest.last() {
            Some(&"accepted") => Some(true),
            Some(&"refused") => Some(false),
            _ => None,
        };
        let parsed = match kind {
            "acquired" => number("token").map(|token| Self::Acquired { token }),
            "write" => match (number("token"), number("seq"), verdict()) {
                (Some(token), Some(seq), Some(accepted)) => Some(Self::Write {
                    token,
                    seq,
                    accepted,
                }),
                _ => None,
            },
            "write-error" => Some(Self::WriteError {
                message: rest.join(" "),
            }),
            "lost" => match (field("via"), number("held_ms")) {
                (Some(via), Some(held_ms)) => Some(Self::Lost { via, held_ms }),
                _ => None,
            },
            "after-loss-write" => verdict().map(|accepted| Self::AfterLossWrite { accepted }),
            "released" => field("outcome").map(|outcome| Self::Released { outcome }),
            "error" => Some(Self::Error {
                message: rest.join(" "),
            }),
            _ => None,
        };
        parsed.unwrap_or_else(|| Self::Other(line.to_owned()))
    }
}

/// What the holder is asked to do.
#[derive(Debug, Clone)]
pub struct HolderArgs {
    /// The Redis URL its `Locker` connects to (and its fenced resource, if any, lives on).
    pub url: String,
    /// The lock name.
    pub name: String,
    /// The watchdog lease.
    pub lease: Duration,
    /// The fenced resource key to write to, if any.
    pub resource: Option<String>,
}

/// A running holder process: its output lines, each stamped with the instant this process read
/// it, and signals. Killed (and reaped) on drop, also when a test panics.
#[derive(Debug)]
pub struct HolderProcess {
    child: Child,
    /// Kept open: the holder exits when it closes.
    _stdin: ChildStdin,
    lines: mpsc::UnboundedReceiver<(Instant, String)>,
    /// Every line read so far, for panic messages.
    seen: Vec<String>,
}

impl HolderProcess {
    /// Starts the holder binary at `binary` (a test has it as `env!("CARGO_BIN_EXE_holder")`).
    pub fn spawn(binary: &str, args: &HolderArgs) -> Self {
        let mut cmd = Command::new(binary);
        cmd.arg(&args.url)
            .arg(&args.name)
            .arg(args.lease.as_millis().to_string())
            .args(&args.resource)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("could not start the holder `{binary}`: {e}"));
        let stdin = child.stdin.take().expect("holder stdin");
        let stdout = child.stdout.take().expect("holder stdout");
        let (tx, lines) = mpsc::unbounded_channel();
        // A thread blocked on the pipe stamps each line the moment it arrives.
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send((Instant::now(), line)).is_err() {
                    break;
                }
            }
        });
        Self {
            child,
            _stdin: stdin,
            lines,
            seen: Vec::new(),
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Every line read so far.
    pub fn seen(&self) -> &[String] {
        &self.seen
    }

    /// The next line, with the instant it was read, or `None` if none came `within` (or the
    /// output ended).
    pub async fn next_line(&mut self, within: Duration) -> Option<(Instant, HolderLine)> {
        let (at, line) = tokio::time::timeout(within, self.lines.recv())
            .await
            .ok()
            .flatten()?;
        self.seen.push(line.clone());
        Some((at, HolderLine::parse(&line)))
    }

    /// Reads lines until `pick` accepts one, within `within` in all; panics naming `what` and
    /// the lines seen if none does. Lines skipped on the way are passed to `skipped`.
    pub async fn expect_with<T>(
        &mut self,
        what: &str,
        within: Duration,
        mut pick: impl FnMut(&HolderLine) -> Option<T>,
        mut skipped: impl FnMut(Instant, &HolderLine),
    ) -> (Instant, T) {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Some((at, line)) = self.next_line(left).await else {
                panic!(
                    "holder {}: no `{what}` line within {within:?}; its output so far:\n{}",
                    self.pid(),
                    self.seen.join("\n")
                );
            };
            if let HolderLine::Error { message } = &line {
                panic!("holder {} failed: {message}", self.pid());
            }
            match pick(&line) {
                Some(found) => return (at, found),
                None => skipped(at, &line),
            }
        }
    }

    /// [`expect_with`](Self::expect_with), ignoring the lines skipped.
    pub async fn expect<T>(
        &mut self,
        what: &str,
        within: Duration,
        pick: impl FnMut(&HolderLine) -> Option<T>,
    ) -> (Instant, T) {
        self.expect_with(what, within, pick, |_, _| {}).await
    }

    /// Sends `SIGKILL` and reaps the process; returns the instant the signal was sent.
    pub fn sigkill(&mut self) -> Instant {
        let at = Instant::now();
        self.child.kill().expect("SIGKILL the holder");
        let _ = self.child.wait();
        at
    }

    /// Sends `SIGSTOP`: the process keeps its connections and timers but runs nothing. Returns
    /// the instant just before the signal was sent.
    pub fn sigstop(&self) -> Instant {
        self.signal("STOP")
    }

    /// Sends `SIGCONT` to a stopped process. Returns the instant just before the signal was sent.
    pub fn sigcont(&self) -> Instant {
        self.signal("CONT")
    }

    /// Sends `signal` with `kill(1)` (this crate forbids the `unsafe` a direct `kill(2)` needs).
    fn signal(&self, signal: &str) -> Instant {
        let pid = self.pid();
        let at = Instant::now();
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} {pid} failed");
        at
    }

    /// Waits for the process to exit by itself; panics if it has not within `within`.
    pub async fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("poll the holder") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "holder {} still runs {within:?} after it was expected to exit; its output:\n{}",
                self.pid(),
                self.seen.join("\n")
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for HolderProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // SIGKILL ends a stopped process too.
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::HolderLine;

    #[test]
    fn every_line_the_holder_prints_parses() {
        assert_eq!(
            HolderLine::parse("acquired token=17 lease_ms=900"),
            HolderLine::Acquired { token: 17 }
        );
        assert_eq!(
            HolderLine::parse("write token=17 seq=3 refused"),
            HolderLine::Write {
                token: 17,
                seq: 3,
                accepted: false
            }
        );
        assert_eq!(
            HolderLine::parse("lost via=deadline held_ms=1200"),
            HolderLine::Lost {
                via: "deadline".to_owned(),
                held_ms: 1200
            }
        );
        assert_eq!(
            HolderLine::parse("after-loss-write token=17 refused"),
            HolderLine::AfterLossWrite { accepted: false }
        );
        assert_eq!(
            HolderLine::parse("released outcome=TakenOver"),
            HolderLine::Released {
                outcome: "TakenOver".to_owned()
            }
        );
        assert_eq!(
            HolderLine::parse("error acquire: timed out"),
            HolderLine::Error {
                message: "acquire: timed out".to_owned()
            }
        );
        // A malformed known line is not taken for what it is not.
        assert_eq!(
            HolderLine::parse("write token=x seq=1 accepted"),
            HolderLine::Other("write token=x seq=1 accepted".to_owned())
        );
    }
}
