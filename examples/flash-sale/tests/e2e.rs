//! The demo's flow at small scale: instances as real processes, one Redis, one SQLite database,
//! a few hundred buyers. With locks every invariant holds; without them the race shows.

use std::time::Duration;

use flash_sale::demo;
use flash_sale::loadgen::LoadConfig;
use flash_sale::server::LockTarget;

mod common;

fn small_load() -> LoadConfig {
    LoadConfig {
        users: 300,
        requests_per_user: 3,
        concurrency: 100,
        ..LoadConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_with_locks_never_duplicate_or_oversell() {
    let redis = dlock_tests::RedisServer::start();
    let server = demo::ServerCommand::binary(env!("CARGO_BIN_EXE_flash-sale"));
    let store = demo::Store::Redis(LockTarget::Server(redis.url()), demo::OwnRedis::None);
    let load = small_load();
    let round = demo::round(&server, 2, &store, true, &load);
    let (report, _instances) = tokio::time::timeout(Duration::from_secs(180), round)
        .await
        .expect("the round ends within 180 s")
        .expect("the round runs");
    let stats = &report.stats;
    assert_eq!(report.errors, 0, "{report:?}");
    // Each buyer: 3 voucher orders and a checkout.
    assert_eq!(report.purchases, 300 * 4, "{report:?}");
    assert_eq!(stats.duplicate_orders, 0, "{report:?}");
    assert_eq!(stats.oversold_vouchers, 0, "{report:?}");
    assert_eq!(stats.units_oversold, 0, "{report:?}");
    assert_eq!(stats.negative_stock_rows, 0, "{report:?}");
    // Every unit that left the stock is in exactly one order, cart edits during checkouts
    // notwithstanding.
    assert!(report.edited_checkouts > 0, "{report:?}");
    assert_eq!(stats.units_lost, 0, "{report:?}");
    assert_eq!(stats.units_double_sold, 0, "{report:?}");
    // 300 buyers for 100 vouchers: all sold, one each. 300 checkouts for 100 SKU units: sold,
    // never beyond (a checkout that waited too long for its SKU is a 409, so maybe not all).
    assert_eq!(stats.voucher_orders, 100, "{report:?}");
    assert!(stats.units_sold > 0, "{report:?}");
    assert!(stats.units_sold <= stats.sku_initial_stock, "{report:?}");
    // Every purchase ran under its locks; nothing was stale in a healthy run.
    assert_eq!(stats.requests, report.purchases, "{report:?}");
    assert!(stats.locked > 0, "{report:?}");
    assert_eq!(stats.stale_refused, 0, "{report:?}");
    assert!(report.clean());
}

/// The README's first command, at small scale: its own Redis, both rounds, the table, exit
/// status 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_command_prints_both_rounds_side_by_side() {
    let (stdout, stderr) = common::table::run_demo(
        &["--exit", "--users", "300", "--instances", "2"],
        Duration::from_secs(240),
    )
    .await;
    assert!(
        stdout.starts_with("started redis-server on port"),
        "{stdout}"
    );

    let header = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("without locks"))
        .unwrap_or_else(|| panic!("no table in:\n{stdout}"));
    assert!(header.trim_end().ends_with("with locks"), "{stdout}");
    common::table::assert_locked_round_holds(&stdout, &stderr);
    assert_eq!(
        common::table::row(&stdout, "invariants hold"),
        ["NO", "yes"],
        "the race shows without locks:\n{stdout}"
    );
}
