//! `dlock`: look at and free dlock's locks in Redis.
//!
//! ```text
//! dlock list [PATTERN]         names with a lock in Redis (SCAN, never KEYS)
//! dlock show NAME              holder, TTL, fencing tokens, waiting lockers
//! dlock release NAME --force   free a name whoever holds it
//! dlock watch NAME             print the name's state each time it changes
//! dlock completions SHELL      shell completions
//! ```
//!
//! `--url` (or `REDIS_URL`) names the server, `--prefix` the key prefix the applications use,
//! `--json` prints JSON instead of text. Exit codes: 0 done, 1 Redis could not be reached or
//! failed, 2 a bad argument or URL.

mod render;

use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory as _, Parser, Subcommand};
use dlock_core::{LockError, Locker};

/// Look at and free dlock's distributed locks in Redis.
#[derive(Debug, Parser)]
#[command(name = "dlock", version)]
struct Cli {
    /// The Redis server (`redis://[user:password@]host:6379[/db]`).
    #[arg(
        long,
        env = "REDIS_URL",
        default_value = "redis://127.0.0.1:6379/",
        global = true
    )]
    url: String,
    /// The key prefix of the applications' `Locker`s.
    #[arg(long, default_value = dlock_core::DEFAULT_PREFIX, global = true)]
    prefix: String,
    /// Print JSON instead of text.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List the names that have a lock in Redis now (SCAN, never KEYS).
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
        /// How often to read it.
        #[arg(long, default_value = "250ms", value_parser = parse_duration)]
        interval: Duration,
        /// Stop after this many changes.
        #[arg(long)]
        changes: Option<u64>,
    },
    /// Print completions for a shell.
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    let (number, unit) = text
        .find(|c: char| !c.is_ascii_digit())
        .map_or((text, ""), |i| text.split_at(i));
    let n: u64 = number
        .parse()
        .map_err(|_| format!("bad duration {text:?}"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" | "" => Ok(Duration::from_secs(n)),
        _ => Err(format!("bad duration {text:?}: use ms or s")),
    }
}

/// A failure and its exit code.
struct Failure(ExitCode, String);

impl From<LockError> for Failure {
    fn from(err: LockError) -> Self {
        let code = if err.is_backend() { 1 } else { 2 };
        Failure(ExitCode::from(code), err.to_string())
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure(code, message)) => {
            eprintln!("dlock: {message}");
            code
        }
    }
}

async fn run(cli: Cli) -> Result<(), Failure> {
    if let Command::Completions { shell } = cli.command {
        clap_complete::generate(shell, &mut Cli::command(), "dlock", &mut std::io::stdout());
        return Ok(());
    }
    let locker = Locker::builder()
        .url(&cli.url)
        .prefix(&cli.prefix)
        .connect_timeout(Duration::from_secs(2))
        .command_timeout(Duration::from_secs(2))
        .build()
        .await?;
    match cli.command {
        Command::List { pattern } => {
            let names = locker.list(&pattern).await?;
            let mut infos = Vec::with_capacity(names.len());
            for name in names {
                infos.push(locker.inspect(name.as_str()).await?);
            }
            println!("{}", render::list(&infos, cli.json));
        }
        Command::Show { name } => {
            let info = locker.inspect(name.as_str()).await?;
            println!("{}", render::show(&info, cli.json));
        }
        Command::Release { name, force } => {
            if !force {
                return Err(Failure(
                    ExitCode::from(2),
                    format!("releasing `{name}` frees it whoever holds it: say so with --force"),
                ));
            }
            let removed = locker.force_release(name.as_str()).await?;
            println!("{}", render::released(&name, removed, cli.json));
        }
        Command::Watch {
            name,
            interval,
            changes,
        } => watch(&locker, &name, interval, changes, cli.json).await?,
        Command::Completions { .. } => {}
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
    let mut seen = 0;
    loop {
        let info = locker.inspect(name).await?;
        let line = render::watch_line(&info, json);
        // The TTL moves on every read; a change is anything else.
        let state = render::watch_key(&info);
        if last.as_ref() != Some(&state) {
            println!("{line}");
            last = Some(state);
            seen += 1;
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
