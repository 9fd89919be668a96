//! The demo: three shop instances sharing one Redis (or PostgreSQL alone) and one database,
//! 2,000 buyers, first without locks and then with them, side by side. Then the shop (with locks) stays up for a
//! person to open in a browser.
//!
//! `demo [--exit] [--users N] [--instances N] [--cluster | --locks postgres]`. `--exit` ends
//! after the table (for tests and CI). Redis: `DLOCK_URL`, or a `redis-server` started on a
//! free port. With `--cluster`, the instances lock on a Redis Cluster instead:
//! `DLOCK_CLUSTER_URLS` (seed URLs, comma-separated), or a cluster of three masters and three
//! replicas started on free ports (it needs `redis-cli` too, to create it). With `--locks
//! postgres`, there is no Redis: a PostgreSQL server started on a free port keeps both the
//! orders and the locks, each round in a database of its own.

use std::process::ExitCode;

use flash_sale::loadgen::{self, LoadConfig};
use flash_sale::{NewVoucher, demo, now_ms, server};

const USAGE: &str = "demo [--exit] [--users N] [--instances N] [--cluster | --locks redis|postgres]   \
(env: DLOCK_URL; with --cluster, DLOCK_CLUSTER_URLS)";

fn number<T: std::str::FromStr>(flag: &str, value: Option<String>) -> Result<T, String> {
    value
        .as_deref()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("{flag} needs a number"))
}

#[tokio::main]
async fn main() -> ExitCode {
    // Ctrl-C at any point drops `run`, and with it the shop instances and the redis-server or
    // Redis Cluster it started: nothing outlives the demo.
    let outcome = tokio::select! {
        outcome = run() => outcome,
        _ = tokio::signal::ctrl_c() => return ExitCode::from(130),
    };
    match outcome {
        Ok(code) => code,
        Err(err) => {
            eprintln!("demo: {err}");
            ExitCode::from(2)
        }
    }
}

async fn run() -> Result<ExitCode, String> {
    let mut args = std::env::args().skip(1).peekable();
    if args.peek().is_some_and(|a| a == "serve") {
        // One shop instance: the demo starts its instances as copies of itself.
        args.next();
        if let Some(config) = server::ServerConfig::from_args(args)? {
            server::serve(config).await?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    let mut exit = false;
    let mut cluster = false;
    let mut postgres = false;
    let mut instances = 3usize;
    let mut load = LoadConfig::default();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--exit" | "--ci" => exit = true,
            "--cluster" => cluster = true,
            "--locks" => match args.next().as_deref() {
                Some("postgres") => postgres = true,
                Some("redis") => postgres = false,
                _ => {
                    return Err(format!(
                        "--locks takes `redis` or `postgres`\nusage: {USAGE}"
                    ));
                }
            },
            "--users" => load.users = number("--users", args.next())?,
            "--instances" => instances = number::<usize>("--instances", args.next())?.max(1),
            "--help" | "-h" => {
                println!("{USAGE}");
                return Ok(ExitCode::SUCCESS);
            }
            other => return Err(format!("unknown argument `{other}`\nusage: {USAGE}")),
        }
    }
    if postgres && cluster {
        return Err(format!(
            "--cluster is a Redis Cluster: not with --locks postgres\nusage: {USAGE}"
        ));
    }
    // Declared before the instances, so dropped after them, on every path out of `run`.
    let store = demo::Store::new(postgres, cluster).await?;
    let server = demo::ServerCommand::this_program()?;
    println!(
        "{} buyers × {} simultaneous orders for one voucher (stock {}), then a checkout each \
         ({} SKUs × {} in stock); {instances} instances, {}, {}",
        load.users,
        load.requests_per_user,
        load.stock,
        load.skus,
        load.sku_stock,
        store.describe(),
        store.database(),
    );
    println!("round 1: without locks (--no-locks) …");
    let (unlocked, first) = demo::round(&server, instances, &store, false, &load).await?;
    drop(first);
    println!("round 2: with locks …");
    let (locked, running) = demo::round(&server, instances, &store, true, &load).await?;
    println!();
    print!(
        "{}",
        loadgen::table(&[("without locks", &unlocked), ("with locks", &locked)])
    );
    for (name, report) in [("without locks", &unlocked), ("with locks", &locked)] {
        for sample in &report.error_samples {
            eprintln!("demo: {name}: an error answer: {sample}");
        }
    }
    if unlocked.clean() {
        println!(
            "\n(this time the race did not show without locks; it depends on timing — run again)"
        );
    }
    if !locked.clean() {
        eprintln!("demo: an invariant broke with the locks on");
        return Ok(ExitCode::FAILURE);
    }
    if exit {
        return Ok(ExitCode::SUCCESS);
    }

    // Something for a person to buy: one voucher on sale now, one a minute away.
    let shop = &running.urls[0];
    for (title, stock, begin_in, lasts) in [
        ("Coffee for a year", 5, 0, 30 * 60_000),
        ("Noise-cancelling headphones", 3, 60_000, 30 * 60_000),
    ] {
        let begin_at = now_ms() + begin_in;
        let voucher = NewVoucher {
            title: title.to_owned(),
            price_cents: 1_999,
            stock,
            starts_at_ms: begin_at,
            ends_at_ms: begin_at + lasts,
        };
        loadgen::create_voucher(shop, Some(&running.operator), &voucher).await?;
    }
    println!(
        "\nThe shop (with locks) is up on {} instances:",
        running.urls.len()
    );
    for url in &running.urls {
        println!("  {url}/");
    }
    println!(
        "The operator's view (invariants, totals, each instance plotted live): \
         {shop}/operator/login, with the operator's token {}",
        running.operator.expose()
    );
    println!("Open one in a browser; Ctrl-C to stop.");
    std::future::pending::<()>().await;
    Ok(ExitCode::SUCCESS)
}
