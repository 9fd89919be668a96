//! One shop instance: `flash-sale [--port N] [--no-locks]`, with `DLOCK_URL` (one server) or
//! `DLOCK_CLUSTER_URLS` (a Redis Cluster's seed URLs, comma-separated), and `DATABASE_URL`
//! (default: a SQLite file `flash-sale.db` in the current directory).

use std::process::ExitCode;

use flash_sale::server::{self, ServerConfig};

#[tokio::main]
async fn main() -> ExitCode {
    let result = match ServerConfig::from_args(std::env::args().skip(1)) {
        Ok(Some(config)) => server::serve(config).await,
        Ok(None) => {
            println!("flash-sale {}", server::USAGE);
            Ok(())
        }
        Err(err) => Err(err),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("flash-sale: {err}");
            ExitCode::from(2)
        }
    }
}
