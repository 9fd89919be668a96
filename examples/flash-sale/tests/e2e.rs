//! The demo's flow at small scale: two instances as real processes, one Redis, one database,
//! a few hundred buyers. With locks every invariant holds.

use flash_sale::demo;
use flash_sale::loadgen::LoadConfig;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_with_locks_never_duplicate_or_oversell() {
    let redis = dlock_tests::RedisServer::start();
    let server = std::path::PathBuf::from(env!("CARGO_BIN_EXE_flash-sale"));
    let load = LoadConfig {
        users: 300,
        requests_per_user: 3,
        concurrency: 100,
        ..LoadConfig::default()
    };
    let (report, _instances) = demo::round(&server, 2, &redis.url(), true, &load)
        .await
        .expect("the round runs");
    let stats = &report.stats;
    assert_eq!(report.errors, 0, "{report:?}");
    assert_eq!(report.requests, 300 * 4, "{report:?}");
    assert_eq!(stats.duplicate_orders, 0, "{report:?}");
    assert_eq!(stats.oversold_vouchers, 0, "{report:?}");
    assert_eq!(stats.sku_units_oversold, 0, "{report:?}");
    assert_eq!(stats.negative_stock_rows, 0, "{report:?}");
    // 300 buyers for 100 vouchers: all sold, one each.
    assert_eq!(stats.voucher_orders, 100, "{report:?}");
    assert!(stats.sku_units_sold <= 100, "{report:?}");
    assert!(stats.locked > 0, "{report:?}");
    assert!(report.clean());
}
