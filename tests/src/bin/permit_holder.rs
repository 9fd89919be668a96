//! `permit_holder URL NAME PERMITS LEASE_MS`: takes a permit of the semaphore `NAME` (waiting up
//! to 10 s) with a watchdog lease of `LEASE_MS` in a process of its own and holds it until the
//! process is killed, so that tests can see a crashed holder's permit come back.
//!
//! Prints `acquired id=<permit id>` or `error <message>`. Exits when its standard input closes.

use std::process::ExitCode;
use std::time::Duration;

use dlock_core::Locker;

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, name, permits, lease_ms] = args.as_slice() else {
        println!("error usage: permit_holder URL NAME PERMITS LEASE_MS");
        return ExitCode::from(2);
    };
    let (Ok(permits), Ok(lease_ms)) = (permits.parse::<u32>(), lease_ms.parse::<u64>()) else {
        println!("error PERMITS is a count and LEASE_MS milliseconds");
        return ExitCode::from(2);
    };
    dlock_tests::exit_when_stdin_closes();
    let locker = match Locker::connect(url).await {
        Ok(locker) => locker,
        Err(err) => {
            println!("error {err}");
            return ExitCode::FAILURE;
        }
    };
    let request = (locker.semaphore(name.as_str(), permits).acquire())
        .wait(Duration::from_secs(10))
        .watchdog_lease(Duration::from_millis(lease_ms));
    match request.await {
        Ok(permit) => {
            println!("acquired id={}", permit.id());
            std::future::pending::<()>().await;
            drop(permit);
            ExitCode::SUCCESS
        }
        Err(err) => {
            println!("error {err}");
            ExitCode::FAILURE
        }
    }
}
