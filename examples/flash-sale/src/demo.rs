//! The demo: app instances as real processes sharing one Redis and one database, the load
//! generator against all of them, without locks and with them.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

use crate::loadgen::{self, LoadConfig, Report};

/// Running app instances; killed on drop.
#[derive(Debug)]
pub struct Instances {
    children: Vec<Child>,
    /// Their base URLs.
    pub urls: Vec<String>,
    _dir: Option<tempfile::TempDir>,
}

impl Drop for Instances {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.start_kill();
        }
    }
}

fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free port: {e}"))
}

/// The server binary next to `exe` (cargo builds every binary of the package together).
pub fn server_binary(exe: &Path) -> PathBuf {
    exe.with_file_name(format!("flash-sale{}", std::env::consts::EXE_SUFFIX))
}

/// Starts `count` instances of `server` on free ports over a fresh SQLite database (or
/// `database_url`), and waits until each answers.
pub async fn start(
    server: &Path,
    count: usize,
    redis_url: &str,
    database_url: Option<&str>,
    locks: bool,
) -> Result<Instances, String> {
    let (dir, database_url) = match database_url {
        Some(url) => (None, url.to_owned()),
        None => {
            let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
            let url = format!("sqlite://{}?mode=rwc", dir.path().join("shop.db").display());
            (Some(dir), url)
        }
    };
    let mut instances = Instances {
        children: Vec::new(),
        urls: Vec::new(),
        _dir: dir,
    };
    for _ in 0..count {
        let port = free_port()?;
        let mut command = Command::new(server);
        command
            .arg("--port")
            .arg(port.to_string())
            .env("REDIS_URL", redis_url)
            .env("DATABASE_URL", &database_url)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        if !locks {
            command.arg("--no-locks");
        }
        let child = command
            .spawn()
            .map_err(|e| format!("starting {}: {e}", server.display()))?;
        instances.children.push(child);
        instances.urls.push(format!("http://127.0.0.1:{port}"));
        // The first instance creates the tables; the others start after it answers.
        wait_ready(instances.urls.last().map_or("", String::as_str)).await?;
    }
    Ok(instances)
}

async fn wait_ready(url: &str) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let addr = url.trim_start_matches("http://").to_owned();
    loop {
        if tokio::net::TcpStream::connect(&addr).await.is_ok() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!("{url} did not come up within 20 s"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One round: fresh instances and database, the load, the audit.
pub async fn round(
    server: &Path,
    instances: usize,
    redis_url: &str,
    locks: bool,
    load: &LoadConfig,
) -> Result<(Report, Instances), String> {
    let running = start(server, instances, redis_url, None, locks).await?;
    let config = LoadConfig {
        targets: running.urls.clone(),
        ..load.clone()
    };
    let report = loadgen::run(&config).await?;
    Ok((report, running))
}
