//! The demo: three instances sharing one Redis and one database, 2,000 buyers, without locks and
//! with them, side by side. `--exit` ends after the table instead of leaving the shop up;
//! `--users N` scales the load.

use flash_sale::demo;
use flash_sale::loadgen::{self, LoadConfig};

#[tokio::main]
async fn main() {
    let mut exit = false;
    let mut load = LoadConfig::default();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--exit" => exit = true,
            "--users" => {
                load.users = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(load.users)
            }
            other => {
                eprintln!("demo: unknown argument `{other}` (flags: --exit, --users N)");
                std::process::exit(2);
            }
        }
    }
    let (redis_url, _server) = match dlock_tests::redis_from_env_or_start() {
        Ok(redis) => redis,
        Err(err) => {
            eprintln!("demo: {err}");
            std::process::exit(2);
        }
    };
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(err) => {
            eprintln!("demo: {err}");
            std::process::exit(2);
        }
    };
    let server = demo::server_binary(&exe);
    println!(
        "{} buyers, {} requests each at once, {} vouchers in stock, {} SKUs × {} in carts; 3 instances",
        load.users, load.requests_per_user, load.stock, load.skus, load.sku_stock
    );
    println!("round 1: without locks …");
    let (unlocked, first) = match demo::round(&server, 3, &redis_url, false, &load).await {
        Ok(result) => result,
        Err(err) => {
            eprintln!("demo: {err}");
            std::process::exit(1);
        }
    };
    drop(first);
    println!("round 2: with locks …");
    let (locked, running) = match demo::round(&server, 3, &redis_url, true, &load).await {
        Ok(result) => result,
        Err(err) => {
            eprintln!("demo: {err}");
            std::process::exit(1);
        }
    };
    println!();
    print!(
        "{}",
        loadgen::table(&[("without locks", &unlocked), ("with locks", &locked)])
    );
    if !locked.clean() {
        eprintln!("demo: an invariant broke with the locks on");
        std::process::exit(1);
    }
    if exit {
        return;
    }
    println!(
        "\nThe shop (with locks) is up: open {}/ in a browser; Ctrl-C to stop.",
        running.urls[0]
    );
    let _ = tokio::signal::ctrl_c().await;
}
