//! `fair_waiter URL NAME HOLD_MS DEAD_WAITER_MS`: waits (up to 30 s) for the fair lock `NAME` in
//! a process of its own, holds it for `HOLD_MS`, releases it and exits, so that tests can watch
//! the order of grants across processes and kill a waiter for real.
//!
//! Prints `acquired token=<fencing token>`, then `released outcome=<outcome>`, or
//! `error <message>`. Exits as soon as its standard input closes.

use std::process::ExitCode;
use std::time::Duration;

use dlock_core::Locker;

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, name, hold_ms, dead_ms] = args.as_slice() else {
        println!("error usage: fair_waiter URL NAME HOLD_MS DEAD_WAITER_MS");
        return ExitCode::from(2);
    };
    let (Ok(hold_ms), Ok(dead_ms)) = (hold_ms.parse::<u64>(), dead_ms.parse::<u64>()) else {
        println!("error HOLD_MS and DEAD_WAITER_MS are milliseconds");
        return ExitCode::from(2);
    };
    dlock_tests::exit_when_stdin_closes();
    let locker = Locker::builder()
        .url(url)
        .dead_waiter_timeout(Duration::from_millis(dead_ms))
        .build()
        .await;
    let locker = match locker {
        Ok(locker) => locker,
        Err(err) => {
            println!("error {err}");
            return ExitCode::FAILURE;
        }
    };
    let request = locker
        .fair_lock(name.as_str())
        .wait(Duration::from_secs(30));
    match request.await {
        Ok(guard) => {
            println!("acquired token={}", guard.fencing_token().await.unwrap());
            tokio::time::sleep(Duration::from_millis(hold_ms)).await;
            println!("released outcome={:?}", guard.release().await);
            ExitCode::SUCCESS
        }
        Err(err) => {
            println!("error {err}");
            ExitCode::FAILURE
        }
    }
}
