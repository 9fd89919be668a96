//! [`PostgresServer`]: one real PostgreSQL cluster, made with `initdb` in a temporary directory
//! and started on a free loopback port, stopped on drop — for the PostgreSQL backend's tests
//! and the shop's. Its faults are real: the whole server paused (`SIGSTOP`) and continued, a
//! restart as after a crash, a session ended with `pg_terminate_backend`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::server::free_port;

/// A throwaway PostgreSQL cluster on a free loopback port, stopped on drop.
#[derive(Debug)]
pub struct PostgresServer {
    bin: PathBuf,
    dir: tempfile::TempDir,
    port: u16,
}

/// The directory of the newest PostgreSQL installed under `/usr/lib/postgresql` (Debian's
/// layout), or a loud failure that says how to install one.
fn postgres_bin() -> PathBuf {
    let versions = std::fs::read_dir("/usr/lib/postgresql")
        .ok()
        .into_iter()
        .flatten();
    let mut found: Vec<PathBuf> = versions
        .filter_map(Result::ok)
        .map(|e| e.path().join("bin"))
        .filter(|p| p.join("initdb").exists())
        .collect();
    found.sort();
    found.pop().unwrap_or_else(|| {
        panic!(
            "PostgreSQL is needed for this test: install it with `apt-get install postgresql` \
             (Debian/Ubuntu), or run `cargo xtask test`, which does"
        )
    })
}

/// Whether this process runs as root (initdb refuses to, so the server runs as `postgres`).
fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// `program` with `args`, as the `postgres` user when this process is root.
fn as_postgres(program: &Path, args: &[&str]) -> Command {
    if is_root() {
        let mut command = Command::new("runuser");
        command
            .args(["-u", "postgres", "--"])
            .arg(program)
            .args(args);
        command
    } else {
        let mut command = Command::new(program);
        command.args(args);
        command
    }
}

impl PostgresServer {
    /// Makes a cluster with `initdb` (trust authentication, user `postgres`) and starts it.
    pub fn start() -> Self {
        let bin = postgres_bin();
        let dir = tempfile::tempdir().expect("a temporary directory");
        if is_root() {
            let _ = Command::new("chown")
                .arg("postgres:postgres")
                .arg(dir.path())
                .status();
        }
        let data = dir.path().join("data");
        let out = as_postgres(
            &bin.join("initdb"),
            &[
                "-D",
                path(&data),
                "--auth=trust",
                "-U",
                "postgres",
                "--no-sync",
            ],
        )
        .output()
        .expect("initdb runs");
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let server = Self {
            bin,
            dir,
            port: free_port(),
        };
        server.pg_ctl_start();
        server
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("postgres.log")
    }

    fn pg_ctl_start(&self) {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200",
            self.port,
            self.dir.path().display()
        );
        let data = self.data();
        let log = self.log_path();
        let out = as_postgres(
            &self.bin.join("pg_ctl"),
            &[
                "-D",
                path(&data),
                "-o",
                &options,
                "-l",
                path(&log),
                "-w",
                "-t",
                "60",
                "start",
            ],
        )
        .output()
        .expect("pg_ctl runs");
        assert!(
            out.status.success(),
            "pg_ctl start failed: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its loopback address (for a [`Proxy`](crate::Proxy) in front of it).
    pub fn addr(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres`.
    pub fn url(&self) -> String {
        Self::url_at(self.port)
    }

    /// The same URL on another port (through a proxy, say).
    pub fn url_at(port: u16) -> String {
        format!("postgres://postgres@127.0.0.1:{port}/postgres")
    }

    /// The `bigint` column of `query`'s rows, on a connection of its own (not a `Locker`'s).
    /// Panics if the query fails: it is a test's.
    pub async fn query_i64(&self, query: &str) -> Vec<i64> {
        use sqlx::Connection as _;
        let mut conn = (sqlx::PgConnection::connect(&self.url()).await)
            .unwrap_or_else(|err| panic!("connecting to PostgreSQL: {err}"));
        (sqlx::query_scalar::<_, i64>(query)
            .fetch_all(&mut conn)
            .await)
            .unwrap_or_else(|err| panic!("{query}: {err}"))
    }

    /// The sessions that hold an advisory lock of dlock's (of the one-number form) now: one
    /// row for each lock held.
    pub async fn advisory_holders(&self) -> Vec<i64> {
        self.query_i64(
            "SELECT pid::bigint FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 \
             AND granted",
        )
        .await
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// The postmaster's process id.
    pub fn pid(&self) -> Option<u32> {
        let text = std::fs::read_to_string(self.data().join("postmaster.pid")).ok()?;
        text.lines().next()?.trim().parse().ok()
    }

    /// The postmaster and every process it started (one per session, and its helpers).
    fn processes(&self) -> Vec<u32> {
        let Some(pid) = self.pid() else {
            return Vec::new();
        };
        let mut all = vec![pid];
        let children = Command::new("pgrep")
            .args(["-P", &pid.to_string()])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        all.extend(
            children
                .lines()
                .filter_map(|l| l.trim().parse::<u32>().ok()),
        );
        all
    }

    fn signal(&self, signal: &str, pids: &[u32]) {
        // A session's process may have ended since it was listed: `kill` would say so.
        for pid in pids {
            let _ = Command::new("kill")
                .args([signal, &pid.to_string()])
                .stderr(std::process::Stdio::null())
                .status();
        }
    }

    /// Pauses the whole server (`SIGSTOP` to every one of its processes): nothing is answered,
    /// nothing is ended, until [`resume`](Self::resume).
    pub fn pause(&self) {
        let pids = self.processes();
        self.signal("-STOP", &pids);
    }

    /// Continues a paused server.
    pub fn resume(&self) {
        let pids = self.processes();
        self.signal("-CONT", &pids);
    }

    /// Stops the server as a crash would (`immediate`: no checkpoint, every session ended) and
    /// starts it again on the same port and data.
    pub fn restart(&self) {
        self.stop_immediately();
        let started = Instant::now();
        // The port is free again once the old postmaster is gone.
        while self.pid().is_some() && started.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
        }
        self.pg_ctl_start();
    }

    fn stop_immediately(&self) {
        let data = self.data();
        let _ = as_postgres(
            &self.bin.join("pg_ctl"),
            &["-D", path(&data), "-m", "immediate", "-w", "stop"],
        )
        .output();
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        // A paused server would not stop.
        self.resume();
        self.stop_immediately();
    }
}

fn path(p: &Path) -> &str {
    p.to_str().expect("a temporary path is UTF-8")
}
