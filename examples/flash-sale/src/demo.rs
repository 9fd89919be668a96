//! The demo: app instances as real processes sharing one Redis (or one Redis Cluster, or their
//! PostgreSQL database alone) and one database, the load generator against all of them, without
//! locks and with them.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

use crate::auth::{OPERATOR_TOKEN_ENV, OperatorToken};
use crate::loadgen::{self, LoadConfig, Report};
use crate::server::{LockTarget, REDIS_CLUSTER_URLS_ENV, REDIS_URL_ENV};

/// Running app instances and their database; the processes are killed and the database removed
/// on drop.
#[derive(Debug)]
pub struct Instances {
    children: Vec<Child>,
    /// Their base URLs (`http://127.0.0.1:PORT`).
    pub urls: Vec<String>,
    /// The operator's token they were started with (new for each start).
    pub operator: OperatorToken,
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

/// How to start one shop instance: a program, and the arguments that come before the
/// instance's own (`--port N`, `--no-locks`).
#[derive(Debug, Clone)]
pub struct ServerCommand {
    /// The program.
    pub program: PathBuf,
    /// Its leading arguments.
    pub args: Vec<String>,
    /// The operator's token to start instances with; `None`: a new one for each start.
    pub operator: Option<OperatorToken>,
}

impl ServerCommand {
    /// The `flash-sale` server binary at `path`.
    pub fn binary(path: impl Into<PathBuf>) -> Self {
        Self {
            program: path.into(),
            args: Vec::new(),
            operator: None,
        }
    }

    /// The same, starting its instances with the operator's token `token`.
    pub fn with_operator(mut self, token: OperatorToken) -> Self {
        self.operator = Some(token);
        self
    }

    /// The running program itself with `serve` first: the demo binary serves the shop too, so
    /// `cargo run --bin demo` needs no other binary built.
    pub fn this_program() -> Result<Self, String> {
        let program = std::env::current_exe().map_err(|e| format!("current program: {e}"))?;
        Ok(Self {
            program,
            args: vec!["serve".to_owned()],
            operator: None,
        })
    }

    fn command(&self) -> Command {
        let mut command = Command::new(&self.program);
        command.args(&self.args);
        command
    }
}

/// Starts `count` instances on free loopback ports over `redis` and `database_url` (default: a
/// fresh SQLite file in a temporary directory), all at once — as replicas start, racing to migrate the
/// schema — and waits until each answers. They share one operator's token
/// ([`Instances::operator`]): the command's, or a new one. Their logs go to stderr at `warn` unless `RUST_LOG`
/// says otherwise. An instance that exits at start-up (its port taken meanwhile, say) is started
/// again on another port, twice at most.
pub async fn start(
    server: &ServerCommand,
    count: usize,
    redis: &LockTarget,
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
        operator: server
            .operator
            .clone()
            .unwrap_or_else(OperatorToken::generate),
        _dir: dir,
    };
    let log_level = std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".to_owned());
    let operator = instances.operator.clone();
    let spawn = |port: u16| -> Result<Child, String> {
        let mut command = server.command();
        command
            .arg("--port")
            .arg(port.to_string())
            .env("DATABASE_URL", &database_url)
            .env(OPERATOR_TOKEN_ENV, operator.expose())
            .env("RUST_LOG", &log_level)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        // The instance reads one of the two (both set is an error): the other is cleared, so a
        // variable of the demo's own environment can't point it elsewhere.
        match redis {
            LockTarget::Server(url) | LockTarget::Postgres(url) => command
                .env(REDIS_URL_ENV, url)
                .env_remove(REDIS_CLUSTER_URLS_ENV),
            LockTarget::Cluster(urls) => command
                .env(REDIS_CLUSTER_URLS_ENV, urls.join(","))
                .env_remove(REDIS_URL_ENV),
        };
        if !locks {
            command.arg("--no-locks");
        }
        command
            .spawn()
            .map_err(|e| format!("starting {}: {e}", server.program.display()))
    };
    for _ in 0..count {
        let port = free_port()?;
        instances.children.push(spawn(port)?);
        instances.urls.push(format!("http://127.0.0.1:{port}"));
    }
    for i in 0..count {
        // A port found free may be taken before the instance binds it (by another program's
        // connection, say): an instance that exits at start-up gets another port, twice.
        let mut tries = 0;
        loop {
            let (child, url) = (&mut instances.children[i], &instances.urls[i]);
            match wait_ready(child, url).await {
                Ok(()) => break,
                Err(err) if tries >= 2 || !exited(child) => return Err(err),
                Err(_) => {
                    tries += 1;
                    let port = free_port()?;
                    instances.children[i] = spawn(port)?;
                    instances.urls[i] = format!("http://127.0.0.1:{port}");
                }
            }
        }
    }
    Ok(instances)
}

/// Whether `child` has exited.
fn exited(child: &mut Child) -> bool {
    matches!(child.try_wait(), Ok(Some(_)))
}

/// Polls `url` until the instance answers `/healthz` (it listens once its schema is up to
/// date), failing fast if the process exits.
pub async fn wait_ready(child: &mut Child, url: &str) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!(
                "the instance for {url} exited at start-up ({status})"
            ));
        }
        if loadgen::healthy(url).await {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!("{url} did not answer within 30 s"));
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// One round: fresh instances over a fresh database, the load, the audit. The instances are
/// returned still running. On [`Store::Postgres`] the database is a new one of that server,
/// and the locks live in it too; otherwise it is a new SQLite file.
pub async fn round(
    server: &ServerCommand,
    instances: usize,
    store: &Store,
    locks: bool,
    load: &LoadConfig,
) -> Result<(Report, Instances), String> {
    let running = match store {
        Store::Redis(redis, _) => start(server, instances, redis, None, locks).await?,
        Store::Postgres(pg) => {
            let database = fresh_database(pg).await?;
            let target = LockTarget::Postgres(database.clone());
            start(server, instances, &target, Some(&database), locks).await?
        }
    };
    let config = LoadConfig {
        targets: running.urls.clone(),
        operator: Some(running.operator.clone()),
        ..load.clone()
    };
    let report = loadgen::run(&config).await?;
    Ok((report, running))
}

/// Where the demo keeps its locks and orders.
#[derive(Debug)]
pub enum Store {
    /// Locks in Redis (one server or a cluster, perhaps the demo's own), orders in SQLite.
    Redis(LockTarget, OwnRedis),
    /// Locks and orders in one PostgreSQL server the demo started: each round a database of
    /// its own, no Redis at all.
    Postgres(dlock_tests::PostgresServer),
}

impl Store {
    /// The demo's store: PostgreSQL alone with `postgres`, else its Redis (see [`redis`]).
    pub async fn new(postgres: bool, cluster: bool) -> Result<Self, String> {
        if !postgres {
            let (target, own) = redis(cluster).await?;
            return Ok(Self::Redis(target, own));
        }
        // `initdb` and the first start take a second or two: off the runtime's threads.
        let started = tokio::task::spawn_blocking(dlock_tests::PostgresServer::start)
            .await
            .map_err(|e| {
                format!(
                    "PostgreSQL did not start ({}); on Debian or Ubuntu: apt-get install \
                     postgresql",
                    panic_text(e)
                )
            })?;
        println!("started a PostgreSQL server on port {}", started.port());
        Ok(Self::Postgres(started))
    }

    /// Where the locks are, for people.
    pub fn describe(&self) -> &'static str {
        match self {
            Self::Redis(target, _) => target.describe(),
            Self::Postgres(_) => "locks in PostgreSQL beside the orders (no Redis)",
        }
    }

    /// The orders' database, for people.
    pub fn database(&self) -> &'static str {
        match self {
            Self::Redis(..) => "one SQLite database",
            Self::Postgres(_) => "one PostgreSQL database",
        }
    }
}

/// A new, empty database on `pg`, for one round: its URL.
async fn fresh_database(pg: &dlock_tests::PostgresServer) -> Result<String, String> {
    use sqlx::Connection as _;
    static ROUNDS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = ROUNDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
    let name = format!("shop_round_{n}");
    let mut admin = sqlx::PgConnection::connect(&pg.url())
        .await
        .map_err(|e| format!("PostgreSQL: {e}"))?;
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut admin)
        .await
        .map_err(|e| format!("PostgreSQL: creating {name}: {e}"))?;
    Ok(format!(
        "postgres://postgres@127.0.0.1:{}/{name}",
        pg.port()
    ))
}

/// The Redis processes the demo started itself; they are killed on drop.
#[derive(Debug)]
pub enum OwnRedis {
    /// None: the demo uses a Redis named by the environment.
    None,
    /// A private `redis-server`.
    Server(dlock_tests::RedisServer),
    /// A private Redis Cluster: three masters, three replicas.
    Cluster(dlock_tests::RedisCluster),
}

/// The demo's Redis. Without `cluster`: `DLOCK_URL` if set, else a private `redis-server` on a
/// free port. With `cluster`: `DLOCK_CLUSTER_URLS` if set, else a private cluster of three
/// masters and three replicas on free ports. What it starts is announced on stdout and killed
/// when the returned [`OwnRedis`] is dropped; a missing binary is an error naming the install
/// command.
pub async fn redis(cluster: bool) -> Result<(LockTarget, OwnRedis), String> {
    if !cluster {
        let (url, server) = dlock_tests::redis_from_env_or_start()?;
        let own = server.map_or(OwnRedis::None, OwnRedis::Server);
        return Ok((LockTarget::Server(url), own));
    }
    let from_env = std::env::var(REDIS_CLUSTER_URLS_ENV).ok();
    if let Some(list) = from_env.filter(|l| !l.trim().is_empty()) {
        return Ok((LockTarget::from_vars(None, Some(list))?, OwnRedis::None));
    }
    // Forming a cluster blocks for seconds: off the runtime's threads. Should the demo be
    // interrupted meanwhile, the cluster is dropped (its nodes killed) as soon as it is up.
    let started = tokio::task::spawn_blocking(dlock_tests::RedisCluster::try_start)
        .await
        .map_err(|e| format!("the Redis Cluster did not form: {}", panic_text(e)))??;
    let ports: Vec<String> = started.ports().iter().map(u16::to_string).collect();
    println!(
        "started a Redis Cluster (3 masters, 3 replicas) on ports {}",
        ports.join(", ")
    );
    Ok((
        LockTarget::Cluster(started.seed_urls()),
        OwnRedis::Cluster(started),
    ))
}

/// What a task that failed said (its panic message, or that it was cancelled).
fn panic_text(err: tokio::task::JoinError) -> String {
    match err.try_into_panic() {
        Ok(payload) => payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_else(|| "it panicked".to_owned()),
        Err(err) => err.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An instance that can't start is started again twice on other ports, then the error is
    /// the caller's — at once, not after the 30 s wait for an answer.
    #[tokio::test]
    async fn an_instance_that_exits_at_start_up_is_tried_three_times_then_reported() {
        let marker = tempfile::tempdir().expect("a directory");
        let tries = marker.path().join("tries");
        let script = format!("echo x >> {}; exit 2", tries.display());
        let server = ServerCommand {
            program: "sh".into(),
            args: vec!["-c".to_owned(), script, "sh".to_owned()],
            operator: None,
        };
        let redis = LockTarget::Server("redis://127.0.0.1:1/".to_owned());
        let started = Instant::now();
        let err = start(&server, 1, &redis, None, true)
            .await
            .expect_err("it never starts");
        assert!(err.contains("exited at start-up"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(10));
        let count = std::fs::read_to_string(&tries)
            .expect("tries")
            .lines()
            .count();
        assert_eq!(count, 3);
    }
}
