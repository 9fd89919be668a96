//! The load generator: `loadgen URL [URL ...] [--users N] [--stock N] [--requests N]
//! [--concurrency N]`. Prints the audit and exits non-zero if an invariant breaks.

use flash_sale::loadgen::{self, LoadConfig};

#[tokio::main]
async fn main() {
    let mut config = LoadConfig::default();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut number = || args.next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        match arg.as_str() {
            "--users" => config.users = number(),
            "--stock" => config.stock = i64::try_from(number()).unwrap_or(0),
            "--requests" => config.requests_per_user = u32::try_from(number()).unwrap_or(1),
            "--concurrency" => config.concurrency = usize::try_from(number()).unwrap_or(1),
            url if url.starts_with("http") => {
                config.targets.push(url.trim_end_matches('/').to_owned())
            }
            other => {
                eprintln!("loadgen: unknown argument `{other}`");
                std::process::exit(2);
            }
        }
    }
    match loadgen::run(&config).await {
        Ok(report) => {
            print!("{}", loadgen::table(&[("this run", &report)]));
            if !report.clean() {
                std::process::exit(1);
            }
        }
        Err(err) => {
            eprintln!("loadgen: {err}");
            std::process::exit(2);
        }
    }
}
