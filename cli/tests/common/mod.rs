//! Running the `dlock` binary from a test.

use std::process::{Command, Output};

/// Runs `dlock ARGS` with `DLOCK_URL=url` (and no cluster or sentinels from the environment).
pub(crate) fn dlock(url: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dlock"))
        .args(args)
        .env("DLOCK_URL", url)
        .env_remove("DLOCK_CLUSTER_URLS")
        .env_remove("DLOCK_SENTINEL_URLS")
        .env_remove("DLOCK_SENTINEL_MASTER")
        .output()
        .expect("run dlock")
}

/// Its standard output.
pub(crate) fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Its standard error.
pub(crate) fn errors(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// [`dlock`] without stalling the test's runtime.
pub(crate) async fn run(url: &str, args: &[&str]) -> Output {
    let (url, args) = (
        url.to_owned(),
        args.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
    );
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        dlock(&url, &args)
    })
    .await
    .expect("the dlock process")
}
