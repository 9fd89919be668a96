//! One shop instance: `flash-sale [--port N] [--no-locks]`, with `REDIS_URL` and `DATABASE_URL`
//! (default: a SQLite file `flash-sale.db` in the current directory).

use std::time::Duration;

use dlock_core::Locker;

#[tokio::main]
async fn main() {
    let mut port = 8080u16;
    let mut locks = true;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--port" => match args.next().and_then(|p| p.parse().ok()) {
                Some(p) => port = p,
                None => fail("--port needs a number"),
            },
            "--no-locks" => locks = false,
            "--help" | "-h" => {
                println!("flash-sale [--port N] [--no-locks]   (env: REDIS_URL, DATABASE_URL)");
                return;
            }
            other => fail(&format!("unknown argument `{other}`")),
        }
    }
    let redis_url =
        std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".to_owned());
    let database_url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "sqlite://flash-sale.db?mode=rwc".to_owned());
    let locker = match Locker::builder()
        .url(redis_url)
        .command_timeout(Duration::from_secs(2))
        .build()
        .await
    {
        Ok(locker) => locker,
        Err(err) => fail(&format!("cannot reach Redis: {err}")),
    };
    let app = match flash_sale::app(&database_url, locker, locks).await {
        Ok(app) => app,
        Err(err) => fail(&format!("database: {err}")),
    };
    let listener = match tokio::net::TcpListener::bind(("127.0.0.1", port)).await {
        Ok(listener) => listener,
        Err(err) => fail(&format!("cannot listen on port {port}: {err}")),
    };
    if let Err(err) = axum::serve(listener, flash_sale::router(app)).await {
        fail(&format!("server: {err}"));
    }
}

fn fail(message: &str) -> ! {
    eprintln!("flash-sale: {message}");
    std::process::exit(2);
}
