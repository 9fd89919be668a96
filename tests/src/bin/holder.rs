//! `holder URL NAME LEASE_MS [RESOURCE]`: holds one lock in a process of its own, for the fault
//! tests to kill and stop. What it does and prints is described in `dlock_tests::holder`.

use std::process::ExitCode;
use std::time::Duration;

use dlock_core::Locker;
use dlock_core::redis;
use dlock_tests::capture::Capture;
use dlock_tests::fenced;
use dlock_tests::holder::WRITE_EVERY;
use tokio::time::Instant;

/// How long the holder waits for the lock before giving up.
const ACQUIRE_WAIT: Duration = Duration::from_secs(10);
/// The bound on the release after the loss.
const RELEASE_WITHIN: Duration = Duration::from_secs(5);

fn usage() -> ExitCode {
    println!("error usage: holder URL NAME LEASE_MS [RESOURCE]");
    ExitCode::from(2)
}

/// Prints what dlock logs at `WARN` and above (a failed renewal, a lost lock) as `note` lines,
/// so that a test's failure message shows how the holder saw the fault.
fn print_dlock_warnings() {
    let capture = Capture::default();
    if tracing::subscriber::set_global_default(capture.clone()).is_err() {
        return;
    }
    tokio::spawn(async move {
        let mut printed = 0;
        loop {
            tokio::time::sleep(Duration::from_millis(10)).await;
            let events = capture.events();
            for event in events.iter().skip(printed) {
                if event.level <= tracing::Level::WARN {
                    let fields: Vec<String> = (event.fields.iter())
                        .filter(|(k, _)| *k != "message")
                        .map(|(k, v)| format!("{k}={v}"))
                        .collect();
                    println!("note {} {}", event.message(), fields.join(" "));
                }
            }
            printed = events.len();
        }
    });
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (url, name, lease_ms, resource) = match args.as_slice() {
        [url, name, lease] => (url, name, lease, None),
        [url, name, lease, resource] => (url, name, lease, Some(resource.clone())),
        _ => return usage(),
    };
    let Ok(lease_ms) = lease_ms.parse::<u64>() else {
        return usage();
    };
    dlock_tests::exit_when_stdin_closes();
    print_dlock_warnings();

    let locker = match Locker::builder()
        .url(url.as_str())
        .default_lease(dlock_core::Lease::watchdog(Duration::from_millis(lease_ms)))
        .build()
        .await
    {
        Ok(locker) => locker,
        Err(err) => {
            println!("error connect: {err}");
            return ExitCode::FAILURE;
        }
    };
    let mut resource_con = match &resource {
        None => None,
        Some(_) => match redis::Client::open(url.as_str()) {
            Ok(client) => match client.get_multiplexed_async_connection().await {
                Ok(con) => Some(con),
                Err(err) => {
                    println!("error resource connection: {err}");
                    return ExitCode::FAILURE;
                }
            },
            Err(err) => {
                println!("error resource url: {err}");
                return ExitCode::FAILURE;
            }
        },
    };
    let guard = match locker.lock(name.as_str()).wait(ACQUIRE_WAIT).await {
        Ok(guard) => guard,
        Err(err) => {
            println!("error acquire: {err}");
            return ExitCode::FAILURE;
        }
    };
    let acquired_at = Instant::now();
    let token = guard.fencing_token().await.unwrap().get();
    println!("acquired token={token} lease_ms={lease_ms}");

    let lost = guard.lost();
    tokio::pin!(lost);
    let mut every = tokio::time::interval(WRITE_EVERY);
    let mut seq = 0u64;
    loop {
        tokio::select! {
            biased;
            () = &mut lost => break,
            _ = every.tick() => {
                // Deliberately no `is_lost()` check first: the resource's fence is what must
                // refuse a holder that lost the lock without knowing it yet.
                if let (Some(con), Some(resource)) = (resource_con.as_mut(), &resource) {
                    seq += 1;
                    let value = format!("{token}:{seq}");
                    match fenced::write(con, resource, token, &value).await {
                        Ok(true) => println!("write token={token} seq={seq} accepted"),
                        Ok(false) => println!("write token={token} seq={seq} refused"),
                        Err(err) => println!("write-error token={token} seq={seq} {err}"),
                    }
                }
            }
        }
    }
    // `lost()` resolves either when a renewal finds the lock gone (the validity deadline still
    // runs) or when the deadline passes.
    let via = if Instant::now() >= guard.valid_until() {
        "deadline"
    } else {
        "renewal"
    };
    println!(
        "lost via={via} held_ms={}",
        acquired_at.elapsed().as_millis()
    );
    if let (Some(con), Some(resource)) = (resource_con.as_mut(), &resource) {
        let value = format!("{token}:after-loss");
        match fenced::write(con, resource, token, &value).await {
            Ok(true) => println!("after-loss-write token={token} accepted"),
            Ok(false) => println!("after-loss-write token={token} refused"),
            Err(err) => println!("write-error token={token} after-loss {err}"),
        }
    }
    match tokio::time::timeout(RELEASE_WITHIN, guard.release()).await {
        Ok(outcome) => println!(
            "released outcome={}",
            format!("{outcome:?}").replace(' ', "_")
        ),
        Err(_) => println!("released outcome=timed-out"),
    }
    ExitCode::SUCCESS
}
