//! A live status line on stderr for long commands (`bench`, `watch`), redrawn in place with `\r`.
//!
//! Only when stderr is a terminal and the output is text: scripts, pipes and `--json` get none
//! of it. Hand-rolled rather than a progress-bar crate: one line of text needs no dependency.

use std::io::{IsTerminal as _, Write as _};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// How often the line is redrawn.
const TICK: Duration = Duration::from_millis(100);

/// Clears the terminal line the cursor is on and returns to its start.
const CLEAR: &str = "\r\x1b[2K";

/// Whether a live line may be shown: stderr is a terminal and the output is not JSON.
pub(crate) fn wanted(json: bool) -> bool {
    !json && std::io::stderr().is_terminal()
}

/// A status line redrawn every [`TICK`] from `render`, until dropped (which clears it).
#[derive(Debug)]
pub(crate) struct Ticker {
    state: Option<Arc<Mutex<Drawn>>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

/// Whether the line is on screen, and whether the ticker stopped.
#[derive(Debug, Default)]
struct Drawn {
    shown: bool,
    stopped: bool,
}

impl Ticker {
    /// Starts redrawing `render()` when `enabled`; does nothing otherwise.
    pub(crate) fn start(enabled: bool, render: impl Fn() -> String + Send + 'static) -> Self {
        if !enabled {
            return Self {
                state: None,
                task: None,
            };
        }
        let state = Arc::new(Mutex::new(Drawn::default()));
        let task = tokio::spawn({
            let state = state.clone();
            async move {
                let mut tick = tokio::time::interval(TICK);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                loop {
                    tick.tick().await;
                    let mut drawn = lock(&state);
                    if drawn.stopped {
                        return;
                    }
                    // A failed write to the terminal only costs the status line.
                    let _ = write!(std::io::stderr(), "{CLEAR}{}", render());
                    let _ = std::io::stderr().flush();
                    drawn.shown = true;
                }
            }
        });
        Self {
            state: Some(state),
            task: Some(task),
        }
    }

    /// Runs `print` with the line taken off the screen (it comes back at the next tick), so
    /// what `print` writes does not land in the middle of it.
    pub(crate) fn suspend<T>(&self, print: impl FnOnce() -> T) -> T {
        let Some(state) = &self.state else {
            return print();
        };
        let mut drawn = lock(state);
        if drawn.shown {
            let _ = write!(std::io::stderr(), "{CLEAR}");
            let _ = std::io::stderr().flush();
            drawn.shown = false;
        }
        print()
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        if let Some(state) = &self.state {
            let mut drawn = lock(state);
            drawn.stopped = true;
            if drawn.shown {
                let _ = write!(std::io::stderr(), "{CLEAR}");
                let _ = std::io::stderr().flush();
            }
        }
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

fn lock(state: &Mutex<Drawn>) -> MutexGuard<'_, Drawn> {
    state.lock().unwrap_or_else(|e| e.into_inner())
}

/// `1.2s` for a status line.
pub(crate) fn seconds(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}
