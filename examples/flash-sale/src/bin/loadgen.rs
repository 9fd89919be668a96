//! The load generator: `loadgen URL [URL ...] [--users N] [--stock N] [--requests N]
//! [--concurrency N] [--skus N] [--sku-stock N]`, as the operator of `SHOP_OPERATOR_TOKEN`
//! (it puts the voucher and the SKUs on sale and reads the numbers). Fires the buyers at every URL, audits the
//! database behind them, prints the table, and exits 1 if an invariant broke (2 on a usage or
//! connection error).

use std::process::ExitCode;

use flash_sale::loadgen::{self, LoadConfig};

const USAGE: &str = "loadgen URL [URL ...] [--users N] [--stock N] [--requests N] \
                     [--concurrency N] [--skus N] [--sku-stock N]   \
                     (env: SHOP_OPERATOR_TOKEN, the shop's operator token)";

fn number<T: std::str::FromStr>(flag: &str, value: Option<String>) -> Result<T, String> {
    value
        .as_deref()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("{flag} needs a number"))
}

fn config() -> Result<Option<LoadConfig>, String> {
    let mut config = LoadConfig {
        operator: flash_sale::auth::OperatorToken::from_env()?,
        ..LoadConfig::default()
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--users" => config.users = number(&arg, args.next())?,
            "--stock" => config.stock = number(&arg, args.next())?,
            "--requests" => config.requests_per_user = number(&arg, args.next())?,
            "--concurrency" => config.concurrency = number(&arg, args.next())?,
            "--skus" => config.skus = number(&arg, args.next())?,
            "--sku-stock" => config.sku_stock = number(&arg, args.next())?,
            "--help" | "-h" => {
                println!("{USAGE}");
                return Ok(None);
            }
            url if url.starts_with("http://") => {
                config.targets.push(url.trim_end_matches('/').to_owned())
            }
            other => return Err(format!("unknown argument `{other}`\nusage: {USAGE}")),
        }
    }
    if config.targets.is_empty() {
        return Err(format!("no instance to load\nusage: {USAGE}"));
    }
    Ok(Some(config))
}

#[tokio::main]
async fn main() -> ExitCode {
    let config = match config() {
        Ok(Some(config)) => config,
        Ok(None) => return ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("loadgen: {err}");
            return ExitCode::from(2);
        }
    };
    match loadgen::run(&config).await {
        Ok(report) => {
            print!("{}", loadgen::table(&[("this run", &report)]));
            for sample in &report.error_samples {
                eprintln!("loadgen: an error answer: {sample}");
            }
            if report.clean() {
                ExitCode::SUCCESS
            } else {
                eprintln!("loadgen: an invariant broke");
                ExitCode::FAILURE
            }
        }
        Err(err) => {
            eprintln!("loadgen: {err}");
            ExitCode::from(2)
        }
    }
}
