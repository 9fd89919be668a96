//! Two processes contend for one lock.
//!
//! `cargo run -p quickstart` starts a `redis-server` on a free port (unless `DLOCK_URL` is set),
//! then runs two copies of itself that each take the lock `quickstart:report` three times, hold
//! it for a moment and release it. The output shows the holders taking turns, never overlapping,
//! each hold with a higher fencing token than the one before. Each worker builds its `Locker`
//! from the `DLOCK_*` environment variables (`LockerConfig::from_env`), as a service would.

use std::time::{Duration, Instant};

use dlock_core::{LockError, LockerConfig};

const NAME: &str = "quickstart:report";

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let outcome = match (args.next().as_deref(), args.next()) {
        (Some("--worker"), Some(who)) => worker(&who).await,
        // Ctrl-C drops the orchestration, and with it the workers and the redis-server it
        // started.
        _ => tokio::select! {
            outcome = orchestrate() => outcome,
            _ = tokio::signal::ctrl_c() => Err("interrupted".to_owned()),
        },
    };
    if let Err(err) = outcome {
        eprintln!("quickstart: {err}");
        std::process::exit(1);
    }
}

/// Starts Redis if needed and two workers, and waits for both.
async fn orchestrate() -> Result<(), String> {
    let (url, _server) = dlock_tests::redis_from_env_or_start()?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut workers = Vec::new();
    for who in ["A", "B"] {
        let child = tokio::process::Command::new(&exe)
            .args(["--worker", who])
            .env("DLOCK_URL", &url)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("start worker {who}: {e}"))?;
        workers.push((who, child));
    }
    for (who, mut child) in workers {
        let status = child.wait().await.map_err(|e| e.to_string())?;
        if !status.success() {
            return Err(format!("worker {who} failed: {status}"));
        }
    }
    println!("both workers done: the lock was never held by two at once");
    Ok(())
}

/// One process: take the lock three times, hold it, release it.
async fn worker(who: &str) -> Result<(), String> {
    let config = LockerConfig::from_env().map_err(|e| e.to_string())?;
    let locker = config.build().await.map_err(|e| e.to_string())?;
    let started = Instant::now();
    for round in 1..=3 {
        let guard = match locker.lock(NAME).wait(Duration::from_secs(10)).await {
            Ok(guard) => guard,
            Err(LockError::Busy { retry_after, .. }) => {
                return Err(format!(
                    "{who}: still busy after 10 s (retry in {retry_after:?})"
                ));
            }
            Err(err) => return Err(format!("{who}: {err}")),
        };
        // The token to hand to whatever the lock protects: minted by Redis at this first ask.
        // Lost (Redis no longer has the hold) or Redis unreachable: this round must not go on.
        let token = match guard.fencing_token().await {
            Ok(token) => token,
            Err(err) => {
                let _ = guard.release().await;
                return Err(format!("{who}: no fencing token: {err}"));
            }
        };
        println!(
            "[{:>5} ms] {who} holds {NAME} (round {round}, fencing token {token})",
            started.elapsed().as_millis(),
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        // Printed before releasing: the other process can only print its `holds` after this.
        println!(
            "[{:>5} ms] {who} releases it",
            started.elapsed().as_millis()
        );
        let outcome = guard.release().await;
        if !outcome.is_released() {
            return Err(format!("{who}: release found {outcome:?}"));
        }
        // Give the other process a fair chance at the next round.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}
