//! `dlock`: look at and free dlock's locks in Redis.
//!
//! ```text
//! dlock list [PATTERN]         names with a lock in Redis (SCAN, never KEYS); on PostgreSQL,
//!                              every advisory lock held, with its session
//! dlock show NAME              holder, TTL, fencing tokens, waiting lockers
//! dlock release NAME --force   free a name whoever holds it
//! dlock watch NAME             print the name's state each time it changes
//! dlock bench                  acquire and release latencies, uncontended and contended
//! dlock check                  run the randomized checker against this Redis for a while
//! dlock completions SHELL      shell completions
//! ```
//!
//! `--url` (or `DLOCK_URL`) names the server (`rediss://` for TLS, `--tls-ca FILE` to trust a
//! private certificate authority), `--cluster` (or `DLOCK_CLUSTER_URLS`) a Redis Cluster's seed
//! nodes instead, `--sentinel` and `--master` (or `DLOCK_SENTINEL_URLS` and
//! `DLOCK_SENTINEL_MASTER`) the sentinels that know the master, `--prefix` the key prefix the
//! applications use, `--json` prints JSON instead of text, errors included. Durations are
//! written as `250ms`, `5s`, `1m 30s`. The other `DLOCK_*` variables of
//! [`LockerConfig::from_env`](dlock_core::LockerConfig::from_env) (timeouts, TLS aside) apply as
//! they do to an application's `Locker`. The exit codes are [`EXIT_CODES`], which `--help`
//! prints.

mod bench;
mod check;
mod progress;
mod render;

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{CommandFactory as _, FromArgMatches as _, Parser, Subcommand};
use dlock_core::{LockError, Locker, LockerBuilder, LockerConfig, redis};
use futures_util::{StreamExt as _, TryStreamExt as _};

/// What each exit code means, as `--help` prints it.
const EXIT_CODES: &str = "\
Exit codes:
  0    done
  1    Redis could not be reached, or failed
  2    a bad argument, URL or lock name
  3    `check` found violations
  130  `bench` or `check` interrupted by Ctrl-C (after its clean-up)

With --json, an error is one JSON object on standard error: {\"error\": \"...\", \"exit_code\": N}.";

/// How many names `list` inspects at once: their reads share the connection, each sent without
/// waiting for the one before.
const LIST_IN_FLIGHT: usize = 64;

/// Look at and free dlock's distributed locks in Redis.
#[derive(Debug, Parser)]
#[command(name = "dlock", version, after_help = EXIT_CODES)]
struct Cli {
    /// The Redis server (`redis://[user:password@]host:6379[/db]`).
    #[arg(
        long,
        env = "DLOCK_URL",
        default_value = "redis://127.0.0.1:6379/",
        global = true
    )]
    url: String,
    /// A Redis Cluster instead, through these seed nodes, comma-separated (one is enough; the
    /// others are discovered). On the command line, not with --url; from the environment, it
    /// wins over DLOCK_URL unless --url is given.
    #[arg(
        long,
        env = "DLOCK_CLUSTER_URLS",
        value_delimiter = ',',
        value_name = "URL,...",
        global = true
    )]
    cluster: Vec<String>,
    /// Redis Sentinel instead: the sentinels' URLs, comma-separated, with --master. The data
    /// nodes are reached without a password.
    #[arg(
        long,
        env = "DLOCK_SENTINEL_URLS",
        value_delimiter = ',',
        value_name = "URL,...",
        global = true
    )]
    sentinel: Vec<String>,
    /// The name the sentinels monitor the master under (with --sentinel).
    #[arg(
        long,
        env = "DLOCK_SENTINEL_MASTER",
        value_name = "NAME",
        global = true
    )]
    master: Option<String>,
    /// Trust this certificate authority (a PEM file) for a `rediss://` --url, beside the
    /// well-known roots.
    #[arg(long, value_name = "FILE", env = "DLOCK_TLS_CA", global = true)]
    tls_ca: Option<std::path::PathBuf>,
    /// The key prefix of the applications' `Locker`s.
    #[arg(
        long,
        env = "DLOCK_PREFIX",
        default_value = dlock_core::DEFAULT_PREFIX,
        global = true
    )]
    prefix: String,
    /// Print JSON instead of text (an error too, on standard error).
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List the names that have a lock in Redis now (SCAN, never KEYS); on PostgreSQL, every
    /// advisory lock held, with its session.
    List {
        /// Only names matching this glob (`*`, `?`, `[...]`).
        #[arg(default_value = "*")]
        pattern: String,
    },
    /// Show who holds a name, its TTL, its fencing tokens and how many lockers wait.
    Show {
        /// The lock's name.
        name: String,
    },
    /// Free a name whoever holds it; its holder learns of the loss at its next renewal.
    Release {
        /// The lock's name.
        name: String,
        /// Required: releasing someone else's lock is an operator's decision.
        #[arg(long)]
        force: bool,
    },
    /// Print a name's state each time it changes, until Ctrl-C.
    Watch {
        /// The lock's name.
        name: String,
        /// How often to read it (`250ms`, `1s`).
        #[arg(long, default_value = "250ms", value_parser = parse_duration)]
        interval: Duration,
        /// Stop after this many changes.
        #[arg(long)]
        changes: Option<u64>,
    },
    /// Measure lock latencies (writes, then deletes, lock keys of its own under the prefix).
    ///
    /// Two runs of acquire-and-release cycles: each task on a name of its own (uncontended),
    /// then every task on one name (contended); for each, the cycles, cycles per second and the
    /// p50/p90/p99/max latencies of the acquisition (waiting included) and of the whole cycle.
    /// It writes lock keys under the prefix, on names of its own (`--name` and a random suffix),
    /// and deletes them at the end; killed before that, they expire within a minute. Ctrl-C
    /// stops it early (exit code 130, after the clean-up).
    Bench {
        /// How long each of the two runs lasts (`500ms`, `5s`, `1m`).
        #[arg(long, default_value = "5s", value_parser = parse_positive_duration)]
        duration: Duration,
        /// How many tasks cycle at once, in each run.
        #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=10_000))]
        tasks: u32,
        /// What the bench's lock names start with; a random suffix follows.
        #[arg(long, default_value = "bench:", value_name = "PREFIX")]
        name: String,
    },
    /// Validate this Redis for dlock: run the randomized checker against it for a while.
    ///
    /// Lockers of every kind dlock offers (over a URL, bb8 and deadpool pools, a multiplexed
    /// connection, a connection manager, a second runtime, a loopback proxy, a tiny command
    /// timeout) run random sessions — waits, try-locks, re-entry, multi-locks, a fair lock,
    /// extend, guarded runs, releases, drops, futures dropped half-way — on a few names of the
    /// check's own. Then the history is checked: overlapping holds, untruthful outcomes, keys or
    /// renewals left behind, losses no fault explains, calls that took too long; and latencies
    /// are reported. Non-destructive: it writes only keys under `PREFIX` + `check-<random>:`
    /// and deletes them at the end. With `--faults` it also deletes and overwrites its own lock
    /// keys and cuts and stalls its own connections (through a loopback proxy); it never pauses
    /// or restarts the server. Exit code 3 if it found a violation; Ctrl-C stops it early
    /// (exit code 130, after the check and the clean-up).
    Check {
        /// How long the sessions go on (`500ms`, `30s`, `10m`); the check then takes a few
        /// seconds more.
        #[arg(long, default_value = "30s", value_parser = parse_positive_duration)]
        duration: Duration,
        /// Also inject faults that touch only the check's own keys and connections.
        #[arg(long)]
        faults: bool,
        /// Draw the sessions and faults from this seed (printed by every run) instead of a
        /// random one.
        #[arg(long)]
        seed: Option<u64>,
    },
    /// Print completions for a shell.
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
}

/// A duration as people write it: `250ms`, `5s`, `1m`, `1m 30s`, `2h`.
fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text)
        .map_err(|e| format!("bad duration {text:?}: {e} (write it as 250ms, 5s, 1m 30s)"))
}

/// [`parse_duration`], and more than zero.
fn parse_positive_duration(text: &str) -> Result<Duration, String> {
    match parse_duration(text)? {
        Duration::ZERO => Err(format!("bad duration {text:?}: must be more than zero")),
        d => Ok(d),
    }
}

/// A seed for `check` when none was given: the clock's nanoseconds and the process id, mixed.
fn rand_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    (nanos ^ u64::from(std::process::id()).rotate_left(32)).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// A failure and its exit code ([`EXIT_CODES`]).
struct Failure(u8, String);

impl Failure {
    fn new(code: u8, message: impl Into<String>) -> Self {
        Self(code, message.into())
    }

    /// Prints it on standard error, as text or as JSON, and gives its exit code.
    fn report(self, json: bool) -> ExitCode {
        let Failure(code, message) = self;
        if json {
            eprintln!(
                "{}",
                serde_json::json!({ "error": message, "exit_code": code })
            );
        } else {
            eprintln!("dlock: {message}");
        }
        ExitCode::from(code)
    }
}

/// Whether `url` is a PostgreSQL database's.
fn is_postgres_url(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

/// Whether the locks are in a PostgreSQL database.
fn is_postgres(target: &Target) -> bool {
    matches!(target, Target::Url(Server { url, .. }) if is_postgres_url(url))
}

impl From<LockError> for Failure {
    fn from(err: LockError) -> Self {
        let code = if err.is_backend() { 1 } else { 2 };
        Failure(code, err.to_string())
    }
}

/// One server, and the certificate authority to trust for it.
#[derive(Debug)]
struct Server {
    url: String,
    /// A PEM certificate authority (`--tls-ca`).
    ca: Option<Vec<u8>>,
}

impl Server {
    /// A client for it: over TLS trusting the CA, if one was given.
    fn client(&self) -> Result<redis::Client, redis::RedisError> {
        match &self.ca {
            None => redis::Client::open(self.url.as_str()),
            Some(ca) => redis::Client::build_with_tls(
                self.url.as_str(),
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(ca.clone()),
                },
            ),
        }
    }
}

/// Where the locks are.
#[derive(Debug)]
enum Target {
    /// One server (or a master that replicas follow).
    Url(Server),
    /// A Redis Cluster, through its seed nodes.
    Cluster(Vec<String>),
    /// A master found through Redis Sentinel.
    Sentinel {
        /// The sentinels' URLs.
        urls: Vec<String>,
        /// The name they monitor the master under.
        master: String,
    },
}

/// The non-empty entries of a comma-separated list, trimmed.
fn entries(list: &[String]) -> Vec<String> {
    (list.iter())
        .map(|u| u.trim())
        .filter(|u| !u.is_empty())
        .map(str::to_owned)
        .collect()
}

impl Target {
    /// `--url`, `--cluster` or `--sentinel`, whichever was given on the command line; from the
    /// environment, a cluster or sentinels win over `DLOCK_URL`.
    fn of(cli: &Cli, matches: &clap::ArgMatches) -> Result<Self, Failure> {
        let on_command_line = |id| matches.value_source(id) == Some(ValueSource::CommandLine);
        let given: Vec<&str> = ["url", "cluster", "sentinel"]
            .into_iter()
            .filter(|id| on_command_line(id))
            .collect();
        if let [first, second, ..] = given[..] {
            return Err(Failure::new(
                2,
                format!("--{first} and --{second} name different servers: give one of them"),
            ));
        }
        let (seeds, sentinels) = (entries(&cli.cluster), entries(&cli.sentinel));
        let chosen = match given.first() {
            Some(&id) => id,
            None if !seeds.is_empty() && !sentinels.is_empty() => {
                return Err(Failure::new(
                    2,
                    "DLOCK_CLUSTER_URLS and DLOCK_SENTINEL_URLS are both set: unset one, or \
                     choose with --url, --cluster or --sentinel",
                ));
            }
            None if !seeds.is_empty() => "cluster",
            None if !sentinels.is_empty() => "sentinel",
            None => "url",
        };
        if chosen != "url" && cli.tls_ca.is_some() {
            return Err(Failure::new(
                2,
                format!("--tls-ca works with --url, not with --{chosen}"),
            ));
        }
        match chosen {
            "cluster" if seeds.is_empty() => Err(Failure::new(2, "--cluster names no seed node")),
            "cluster" => Ok(Self::Cluster(seeds)),
            "sentinel" if sentinels.is_empty() => {
                Err(Failure::new(2, "--sentinel names no sentinel"))
            }
            "sentinel" => {
                let master = (cli.master.as_deref().map(str::trim))
                    .filter(|m| !m.is_empty())
                    .ok_or_else(|| {
                        Failure::new(
                            2,
                            "--sentinel needs --master NAME (or DLOCK_SENTINEL_MASTER): the \
                             name the sentinels monitor the master under",
                        )
                    })?;
                Ok(Self::Sentinel {
                    urls: sentinels,
                    master: master.to_owned(),
                })
            }
            _ => {
                let ca = match &cli.tls_ca {
                    None => None,
                    Some(path) => Some(std::fs::read(path).map_err(|e| {
                        Failure::new(2, format!("cannot read --tls-ca {}: {e}", path.display()))
                    })?),
                };
                Ok(Self::Url(Server {
                    url: cli.url.clone(),
                    ca,
                }))
            }
        }
    }

    /// Where the user told us to look, for a message (no URL: it may carry a password).
    fn describe(&self) -> &'static str {
        match self {
            Self::Url(_) => "the server (--url, DLOCK_URL)",
            Self::Cluster(_) => "the cluster (--cluster, DLOCK_CLUSTER_URLS)",
            Self::Sentinel { .. } => "the sentinels (--sentinel, DLOCK_SENTINEL_URLS)",
        }
    }
}

/// A `Locker` builder for `target` under `prefix`: the `DLOCK_*` settings of the environment
/// ([`LockerConfig::from_env`]), the source the command line chose, and 2 s timeouts unless
/// the environment sets others. A variable, URL or certificate authority that does not parse
/// is a bad argument (2).
fn builder(target: &Target, prefix: &str) -> Result<LockerBuilder, Failure> {
    let mut config = LockerConfig::from_env().map_err(|e| Failure::new(2, e.to_string()))?;
    config.url = None;
    config.cluster.clear();
    config.sentinels.clear();
    config.sentinel_master = None;
    config.masters.clear();
    match target {
        Target::Url(server) => config.url = Some(server.url.clone()),
        Target::Cluster(seeds) => config.cluster = seeds.clone(),
        Target::Sentinel { urls, master } => {
            config.sentinels = urls.clone();
            config.sentinel_master = Some(master.clone());
        }
    }
    config.prefix = Some(prefix.to_owned());
    config.connect_timeout.get_or_insert(Duration::from_secs(2));
    config.command_timeout.get_or_insert(Duration::from_secs(2));
    let builder = config.builder()?;
    match target {
        Target::Url(server) if server.ca.is_some() => {
            let client = server
                .client()
                .map_err(|e| Failure::new(2, format!("bad URL or --tls-ca: {e}")))?;
            Ok(builder.client(client))
        }
        _ => Ok(builder),
    }
}

/// A `Locker` that could not be built: Redis out of reach (1) or a bad URL or prefix (2).
fn connect_failure(target: &Target, err: LockError) -> Failure {
    if err.is_backend() {
        Failure::new(1, format!("cannot reach {}: {err}", target.describe()))
    } else {
        Failure::from(err)
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    // `rediss://` needs a crypto provider; one may be in place already, which is as good.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let matches = match Cli::command().try_get_matches() {
        Ok(matches) => matches,
        Err(err) => return bad_command_line(err),
    };
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(err) => return bad_command_line(err),
    };
    let json = cli.json;
    match run(cli, &matches).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => failure.report(json),
    }
}

/// A command line clap refused (or `--help`, `--version`): as clap prints it, or, under
/// `--json`, as a JSON error with clap's first line.
fn bad_command_line(err: clap::Error) -> ExitCode {
    let json = std::env::args_os().any(|arg| arg == "--json");
    if !json || !err.use_stderr() {
        err.exit();
    }
    let rendered = err.render().to_string();
    let first = rendered.lines().next().unwrap_or_default();
    let message = first.strip_prefix("error: ").unwrap_or(first);
    let code = u8::try_from(err.exit_code()).unwrap_or(2);
    Failure::new(code, message).report(true)
}

async fn run(cli: Cli, matches: &clap::ArgMatches) -> Result<(), Failure> {
    if let Command::Completions { shell } = cli.command {
        clap_complete::generate(shell, &mut Cli::command(), "dlock", &mut std::io::stdout());
        return Ok(());
    }
    if let Command::Release { name, force: false } = &cli.command {
        return Err(Failure::new(
            2,
            format!("releasing `{name}` frees it whoever holds it: say so with --force"),
        ));
    }
    let target = Target::of(&cli, matches)?;
    if let Command::Bench {
        duration,
        tasks,
        name,
    } = cli.command
    {
        let options = bench::Options {
            duration,
            tasks: usize::try_from(tasks).unwrap_or(usize::MAX),
            name,
            progress: progress::wanted(cli.json),
            notice: !cli.json,
        };
        let report = bench::bench(&target, &cli.prefix, &options).await?;
        println!("{}", render::bench(&report, cli.json));
        if report.interrupted {
            return Err(Failure::new(130, "interrupted"));
        }
        return Ok(());
    }
    if let Command::Check {
        duration,
        faults,
        seed,
    } = cli.command
    {
        let Target::Url(Server { url, .. }) = target else {
            return Err(Failure::new(
                2,
                "dlock check runs against one server (--url); on a cluster or behind \
                 sentinels, point it at one master's URL",
            ));
        };
        if is_postgres_url(&url) {
            return Err(Failure::new(
                2,
                "dlock check runs against Redis; dlock's own tests run the checker on \
                 PostgreSQL",
            ));
        }
        let options = check::Options {
            url,
            prefix: cli.prefix.clone(),
            duration,
            faults,
            seed: seed.unwrap_or_else(rand_seed),
            progress: progress::wanted(cli.json),
        };
        let checked = check::check(options.clone()).await?;
        println!("{}", check::render(&checked, &options, cli.json));
        if checked.interrupted {
            return Err(Failure::new(130, "interrupted"));
        }
        if !checked.report.violations.is_empty() {
            return Err(Failure::new(3, "the check found violations"));
        }
        return Ok(());
    }
    let locker = (builder(&target, &cli.prefix)?.build().await)
        .map_err(|err| connect_failure(&target, err))?;
    match cli.command {
        Command::List { pattern } if is_postgres(&target) => {
            // PostgreSQL keeps each lock as a number made from its name: no name to match.
            if pattern != "*" {
                return Err(Failure::new(
                    2,
                    "on PostgreSQL, `list` takes no pattern: it lists every advisory lock \
                     held (a lock is kept as a number made from its name); `show NAME` reads \
                     one name",
                ));
            }
            let locks = locker.advisory_locks().await?;
            println!("{}", render::advisory_locks(&locks, cli.json));
        }
        Command::List { pattern } => {
            let names = locker.list(&pattern).await?;
            let infos: Vec<_> = futures_util::stream::iter(&names)
                .map(|name| locker.inspect(name.as_str()))
                .buffered(LIST_IN_FLIGHT)
                .try_collect()
                .await?;
            println!("{}", render::list(&infos, cli.json));
        }
        Command::Show { name } => {
            let info = locker.inspect(name.as_str()).await?;
            println!("{}", render::show(&info, cli.json));
        }
        Command::Release { name, .. } => {
            let removed = locker.force_release(name.as_str()).await?;
            println!("{}", render::released(&name, removed, cli.json));
        }
        Command::Watch {
            name,
            interval,
            changes,
        } => watch(&locker, &name, interval, changes, cli.json).await?,
        Command::Bench { .. } | Command::Check { .. } | Command::Completions { .. } => {}
    }
    Ok(())
}

/// Reads `name` every `interval` and prints its state when it changed.
async fn watch(
    locker: &Locker,
    name: &str,
    interval: Duration,
    changes: Option<u64>,
    json: bool,
) -> Result<(), Failure> {
    let mut last = None;
    let seen = Arc::new(AtomicU64::new(0));
    let started = tokio::time::Instant::now();
    let ticker = progress::Ticker::start(progress::wanted(json), {
        let (name, seen) = (name.to_owned(), seen.clone());
        move || {
            let seen = seen.load(Ordering::Relaxed);
            let of = changes.map_or_else(String::new, |n| format!("/{n}"));
            format!(
                "watching {name}  {}  {seen}{of} changes  (Ctrl-C stops)",
                progress::seconds(started.elapsed())
            )
        }
    });
    loop {
        let info = locker.inspect(name).await?;
        let line = render::watch_line(&info, json);
        // The TTL moves on every read; a change is anything else.
        let state = render::watch_key(&info);
        if last.as_ref() != Some(&state) {
            ticker.suspend(|| println!("{line}"));
            last = Some(state);
            let seen = seen.fetch_add(1, Ordering::Relaxed) + 1;
            if changes.is_some_and(|n| seen >= n) {
                return Ok(());
            }
        }
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
    }
}
