//! [`RedisServer`]: one real `redis-server` process on a free loopback port (the crate's
//! documentation says what it does), and how the harness finds the binary.

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, Once, PoisonError};
use std::time::{Duration, Instant};

/// The environment variable naming the `redis-server` binary.
pub const REDIS_SERVER_ENV: &str = "DLOCK_REDIS_SERVER";

/// Live servers: port and log path, for the panic hook.
static LIVE: Mutex<Vec<(u16, PathBuf)>> = Mutex::new(Vec::new());
static HOOK: Once = Once::new();

/// How many log lines of each live server a panic message ends with.
const PANIC_LOG_LINES: usize = 50;

/// The lines `redis-server` logs once it listens: every version from 2.x on and Valkey log the
/// first; a sentinel never does, and logs its ID once it listens.
const READY_LINES: [&str; 2] = ["Ready to accept connections", "Sentinel ID is"];

/// The registry of live servers, usable even after a panic poisoned it.
fn live() -> MutexGuard<'static, Vec<(u16, PathBuf)>> {
    LIVE.lock().unwrap_or_else(PoisonError::into_inner)
}

fn install_panic_hook() {
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            previous(info);
            let servers = live().clone();
            for (port, log) in servers {
                eprintln!("{}", log_tail(port, &log, PANIC_LOG_LINES));
            }
        }));
    });
}

/// The last `lines` lines of a server's log, framed with its port.
fn log_tail(port: u16, log: &std::path::Path, lines: usize) -> String {
    let text = std::fs::read_to_string(log)
        .unwrap_or_else(|e| format!("(could not read {}: {e})", log.display()));
    let all: Vec<&str> = text.lines().collect();
    let tail = &all[all.len().saturating_sub(lines)..];
    format!(
        "--- redis-server on port {port}: last {} log lines ({}) ---\n{}\n--- end of log ---",
        tail.len(),
        log.display(),
        tail.join("\n")
    )
}

/// The `redis-server` binary the harness runs: the one `DLOCK_REDIS_SERVER` names, else
/// `redis-server`.
pub fn redis_server_binary() -> String {
    std::env::var(REDIS_SERVER_ENV).unwrap_or_else(|_| "redis-server".to_owned())
}

/// Panics with the install command when the `redis-server` binary can't be run.
pub fn require_redis_server() {
    require_binary(&redis_server_binary());
}

fn require_binary(binary: &str) {
    let ok = Command::new(binary)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "`{binary}` could not be run: these tests need a real Redis server.\n\
         Install it with `apt-get install redis-server` (Debian/Ubuntu), \
         or point {REDIS_SERVER_ENV} at a redis-server binary."
    );
}

/// A free loopback port (bound then released; the server binds it right after).
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free loopback port");
    listener.local_addr().expect("local address").port()
}

/// A string unique to this process and call, for lock names and keys.
pub fn unique_name(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A `redis-server` process on a free loopback port, killed on drop.
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    /// A configuration file, given first (as `redis-server <file> --sentinel` needs).
    config: Option<PathBuf>,
    args: Vec<String>,
    dir: tempfile::TempDir,
    /// The port, held while the server is killed (see [`PortHold`]).
    hold: Option<PortHold>,
}

impl RedisServer {
    /// Starts a server with the default arguments.
    pub fn start() -> Self {
        Self::start_with_args(&[])
    }

    /// Starts a server with extra arguments (e.g. `["--requirepass", "pw"]`).
    pub fn start_with_args(args: &[&str]) -> Self {
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        Self::start_with_port_args(None, |_| args.clone())
    }

    /// Starts `redis-server <config> <args>`: a server that reads, and may rewrite, a
    /// configuration file (a sentinel: `args = ["--sentinel"]`). Restarts read it again.
    pub fn start_with_config(config: &Path, args: &[&str]) -> Self {
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        Self::start_with_port_args(Some(config.to_owned()), |_| args.clone())
    }

    /// Starts a server whose extra arguments are made from the port it is tried on (a cluster
    /// node's bus port must be another free port). Restarts reuse the arguments of the start.
    pub(crate) fn start_with_port_args(
        config: Option<PathBuf>,
        args: impl Fn(u16) -> Vec<String>,
    ) -> Self {
        require_redis_server();
        install_panic_hook();
        let mut last_error = String::new();
        // A port picked free can be taken before the server binds it: try a few.
        for _ in 0..5 {
            let port = free_port();
            let mut server = Self {
                child: None,
                port,
                config: config.clone(),
                args: args(port),
                dir: tempfile::tempdir().expect("temporary directory for redis-server"),
                hold: None,
            };
            match server.spawn() {
                Ok(()) => return server,
                Err(err) => last_error = err,
            }
        }
        panic!("redis-server did not start: {last_error}");
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }

    /// Spawns the process on `self.port` and polls until it answers `PING`.
    fn spawn(&mut self) -> Result<(), String> {
        // The port is this server's again.
        self.hold = None;
        let mut cmd = Command::new(redis_server_binary());
        cmd.args(&self.config)
            .arg("--port")
            .arg(self.port.to_string())
            .arg("--bind")
            .arg("127.0.0.1")
            .arg("--save")
            .arg("")
            .arg("--appendonly")
            .arg("no")
            .arg("--daemonize")
            .arg("no")
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(self.log_path())
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // redis-server appends to its log: only what this run writes can announce it ready.
        let log_start = self.log().len();
        let child = cmd
            .spawn()
            .map_err(|e| format!("spawn redis-server: {e}"))?;
        self.child = Some(child);
        let spawned = Instant::now();
        let deadline = spawned + Duration::from_secs(10);
        loop {
            let exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            // Whoever answers on the port must be this process, not another server that took the
            // port first (this one then fails to bind and exits): it says so in its own log, or
            // for a binary that logs otherwise, it has outlived any failure to bind.
            if exited.is_none()
                && self.ping_once(Duration::from_millis(200))
                && (self
                    .log()
                    .get(log_start..)
                    .is_some_and(|l| READY_LINES.iter().any(|ready| l.contains(ready)))
                    || spawned.elapsed() >= Duration::from_secs(2))
            {
                let log = self.log_path();
                let mut live = live();
                live.retain(|(_, l)| *l != log);
                live.push((self.port, log));
                return Ok(());
            }
            if let Some(status) = exited {
                self.child = None;
                return Err(format!(
                    "redis-server exited with {status}; log:\n{}",
                    self.log()
                ));
            }
            if Instant::now() >= deadline {
                self.kill();
                return Err(format!(
                    "redis-server did not answer within 10 s; log:\n{}",
                    self.log()
                ));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// One raw `PING` over a fresh TCP connection (also answers `-NOAUTH`, which counts as up).
    fn ping_once(&self, timeout: Duration) -> bool {
        let Ok(mut stream) = TcpStream::connect_timeout(&self.addr(), timeout) else {
            return false;
        };
        let _ = stream.set_read_timeout(Some(timeout));
        let _ = stream.set_write_timeout(Some(timeout));
        if stream.write_all(b"PING\r\n").is_err() {
            return false;
        }
        let mut buf = [0u8; 64];
        match stream.read(&mut buf) {
            Ok(n) if n > 0 => buf[0] == b'+' || buf[..n].starts_with(b"-NOAUTH"),
            _ => false,
        }
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// `redis://127.0.0.1:PORT/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// A client for this server.
    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("client")
    }

    /// A new multiplexed connection.
    pub async fn connection(&self) -> redis::aio::MultiplexedConnection {
        self.client()
            .get_multiplexed_async_connection()
            .await
            .expect("connect to the test redis-server")
    }

    /// The process id, while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the server (`SIGKILL`) and waits for it. Until it is restarted (or dropped), its
    /// port stays taken and refuses every connection, as a dead server's does: a server that
    /// another test starts meanwhile can't take the port and answer in its place.
    pub fn kill(&mut self) {
        self.stop();
        if self.hold.is_none() {
            self.hold = PortHold::take(self.port);
        }
    }

    /// Kills the process, if it runs, and waits for it.
    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        // By log path, which no other server shares (a failed start may share the port).
        let log = self.log_path();
        live().retain(|(_, l)| *l != log);
    }

    /// Starts the server again on the same port with the same arguments (data is gone).
    pub fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match self.spawn() {
                Ok(()) => return,
                Err(err) if Instant::now() >= deadline => {
                    panic!("redis-server did not restart on port {}: {err}", self.port)
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    fn signal(&self, signal: &str) {
        let pid = self.pid().expect("the server is not running");
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} {pid} failed");
    }

    /// Pauses the process (`SIGSTOP`): it keeps its connections but answers nothing.
    pub fn pause(&self) {
        self.signal("STOP");
    }

    /// Resumes a paused process (`SIGCONT`).
    pub fn resume(&self) {
        self.signal("CONT");
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Script calls the server ran so far, whatever their form (see [`script_calls`]).
    pub fn script_calls(&self) -> u64 {
        script_calls(&self.info_commandstats())
    }

    /// Calls per command from `INFO commandstats` (e.g. `"fcall" -> 12`).
    pub fn info_commandstats(&self) -> BTreeMap<String, u64> {
        let info = self.info("commandstats");
        let mut stats = BTreeMap::new();
        for line in info.lines() {
            // cmdstat_evalsha:calls=12,usec=...,usec_per_call=...
            let Some(rest) = line.strip_prefix("cmdstat_") else {
                continue;
            };
            let Some((name, fields)) = rest.split_once(':') else {
                continue;
            };
            let calls = fields
                .split(',')
                .find_map(|f| f.strip_prefix("calls="))
                .and_then(|c| c.trim().parse().ok())
                .unwrap_or(0);
            stats.insert(name.to_owned(), calls);
        }
        stats
    }

    /// One `INFO <section>` over a synchronous connection.
    pub fn info(&self, section: &str) -> String {
        let mut con = self
            .client()
            .get_connection_with_timeout(Duration::from_secs(2))
            .expect("sync connection to the test redis-server");
        redis::cmd("INFO")
            .arg(section)
            .query::<String>(&mut con)
            .expect("INFO")
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(pid) = self.pid() {
            // A paused process must be resumed to die promptly.
            let _ = Command::new("kill")
                .arg("-CONT")
                .arg(pid.to_string())
                .status();
        }
        self.stop();
    }
}

/// A killed server's port, held: a listener on it (so no other server can bind it) that closes
/// every connection it is offered at once (so a client sees the server gone, not hung). A
/// thread of its own accepts; it ends when the hold is dropped.
#[derive(Debug)]
struct PortHold {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl PortHold {
    /// Holds `port`, unless something else took it already.
    fn take(port: u16) -> Option<Self> {
        let listener = TcpListener::bind(("127.0.0.1", port)).ok()?;
        listener.set_nonblocking(true).ok()?;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => drop(stream),
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Some(Self {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for PortHold {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Script calls among `INFO commandstats`' counts (as [`RedisServer::info_commandstats`] reads
/// them): functions (`FCALL`, how dlock calls its scripts), scripts by hash (`EVALSHA`, an
/// earlier layout's scripts) and by text (`EVAL`, a release's clean-up).
pub fn script_calls(stats: &BTreeMap<String, u64>) -> u64 {
    [
        "fcall",
        "fcall_ro",
        "evalsha",
        "eval",
        "evalsha_ro",
        "eval_ro",
    ]
    .iter()
    .filter_map(|name| stats.get(*name))
    .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[should_panic(expected = "apt-get install redis-server")]
    fn a_missing_binary_names_the_install_command() {
        require_binary("/nonexistent/dlock-no-such-redis-server");
    }

    #[test]
    fn a_server_that_loses_its_port_to_another_is_not_taken_for_ready() {
        let owner = RedisServer::start();
        let mut intruder = RedisServer {
            child: None,
            port: owner.port(),
            config: None,
            args: Vec::new(),
            dir: tempfile::tempdir().unwrap(),
            hold: None,
        };
        let err = intruder.spawn().unwrap_err();
        assert!(err.contains("exited"), "{err}");
        drop(intruder);
        // The failed start left the owner's panic-log registration alone.
        assert!(live().iter().any(|(_, log)| *log == owner.log_path()));
    }

    #[test]
    fn the_panic_log_is_the_tail_of_the_servers_log() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("redis.log");
        let text: String = (0..80).map(|i| format!("line {i}\n")).collect();
        std::fs::write(&path, text).unwrap();
        let tail = log_tail(4242, &path, 50);
        assert!(tail.contains("port 4242"), "{tail}");
        assert!(
            tail.contains("line 30\n") && tail.contains("line 79"),
            "{tail}"
        );
        assert!(!tail.contains("line 29\n"), "{tail}");
    }

    #[test]
    fn a_live_server_is_registered_until_dropped() {
        let server = RedisServer::start();
        let log = server.log_path();
        assert!(live().iter().any(|(p, l)| *p == server.port() && *l == log));
        drop(server);
        assert!(!live().iter().any(|(_, l)| *l == log));
    }

    #[test]
    fn unique_names_differ() {
        let a = unique_name("x");
        let b = unique_name("x");
        assert_ne!(a, b);
        assert!(a.starts_with("x-") && a.contains(&std::process::id().to_string()));
    }
}
