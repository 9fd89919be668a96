//! What the cluster and sentinel harnesses share: synchronous admin commands to a port,
//! `INFO`-style fields, whether a replica is in sync, and polling with a deadline.

use std::collections::HashMap;
use std::fmt::Display;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use redis::{FromRedisValue, RedisResult};

/// How long an admin command may take to connect, or to answer: a paused or dead server is an
/// error after this, never a hang.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a poll waits between two looks.
const POLL_INTERVAL: Duration = Duration::from_millis(25);

/// One synchronous connection per port, made on first use and dropped after any error (a
/// connection whose answer timed out is out of step with its server).
#[derive(Default)]
pub(crate) struct Admin {
    connections: Mutex<HashMap<u16, redis::Connection>>,
}

impl std::fmt::Debug for Admin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let connections = self
            .connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let ports: Vec<&u16> = connections.keys().collect();
        f.debug_struct("Admin").field("connected", &ports).finish()
    }
}

impl Admin {
    /// Sends `cmd` to `127.0.0.1:port`.
    pub(crate) fn query<T: FromRedisValue>(&self, port: u16, cmd: &redis::Cmd) -> RedisResult<T> {
        let mut connections = self
            .connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let con = match connections.entry(port) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => e.insert(connect(port)?),
        };
        let answer = cmd.query(con);
        if answer.is_err() {
            connections.remove(&port);
        }
        answer
    }

    /// `INFO <section>` on `port`.
    pub(crate) fn info(&self, port: u16, section: &str) -> RedisResult<String> {
        self.query(port, redis::cmd("INFO").arg(section))
    }
}

fn connect(port: u16) -> RedisResult<redis::Connection> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/"))?;
    let con = client.get_connection_with_timeout(ADMIN_TIMEOUT)?;
    con.set_read_timeout(Some(ADMIN_TIMEOUT))?;
    con.set_write_timeout(Some(ADMIN_TIMEOUT))?;
    Ok(con)
}

/// The value of `field` in `INFO`-style text (`field:value` lines).
pub(crate) fn field<'a>(text: &'a str, field: &str) -> Option<&'a str> {
    text.lines().find_map(|line| {
        line.strip_prefix(field)
            .and_then(|rest| rest.strip_prefix(':'))
            .map(str::trim)
    })
}

/// Ok when the data node on `replica` follows `master` with its link up, and `master` lists it
/// online: only from then on does the master count its acknowledgements (`WAIT`) — with Valkey
/// that is up to a second after the replica says its link is up.
pub(crate) fn replica_in_sync(admin: &Admin, replica: u16, master: u16) -> Result<(), String> {
    let info = (admin.info(replica, "replication"))
        .map_err(|e| format!("INFO replication on {replica}: {e}"))?;
    if !matches!(field(&info, "role"), Some("slave" | "replica"))
        || field(&info, "master_port") != Some(&master.to_string())
        || field(&info, "master_link_status") != Some("up")
    {
        return Err(format!(
            "{replica} is not in sync with {master}: role {:?}, master_port {:?}, link {:?}",
            field(&info, "role"),
            field(&info, "master_port"),
            field(&info, "master_link_status")
        ));
    }
    let info = (admin.info(master, "replication"))
        .map_err(|e| format!("INFO replication on {master}: {e}"))?;
    let port = format!("port={replica}");
    // slave0:ip=127.0.0.1,port=7004,state=online,offset=1234,lag=0
    let online = (info.lines())
        .filter_map(|line| line.strip_prefix("slave")?.split_once(':'))
        .any(|(_, entry)| {
            let entry: Vec<&str> = entry.trim().split(',').collect();
            entry.contains(&port.as_str()) && entry.contains(&"state=online")
        });
    if online {
        Ok(())
    } else {
        Err(format!("{master} does not list {replica} online:\n{info}"))
    }
}

/// Calls `look` until it returns `Ok`, for at most `within`; then panics with `what` and the last
/// state `look` described (the panic hook adds the tail of every live server's log).
pub(crate) fn poll<T>(
    what: impl Display,
    within: Duration,
    look: impl FnMut() -> Result<T, String>,
) -> T {
    match try_poll(within, look) {
        Ok(done) => done,
        Err(state) => panic!("{what}: still not so after {within:?}; last seen: {state}"),
    }
}

/// As [`poll`], but gives back the last state seen instead of panicking when `within` runs out.
pub(crate) fn try_poll<T>(
    within: Duration,
    mut look: impl FnMut() -> Result<T, String>,
) -> Result<T, String> {
    let started = Instant::now();
    loop {
        match look() {
            Ok(done) => return Ok(done),
            Err(state) if started.elapsed() >= within => return Err(state),
            Err(_) => std::thread::sleep(POLL_INTERVAL),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_read_from_info_lines() {
        let info = "# Replication\r\nrole:slave\r\nmaster_port:7001\r\nmaster_link_status:up\r\n";
        assert_eq!(field(info, "role"), Some("slave"));
        assert_eq!(field(info, "master_port"), Some("7001"));
        assert_eq!(field(info, "master"), None);
        assert_eq!(field(info, "master_link_status"), Some("up"));
    }

    #[test]
    #[should_panic(expected = "the answer: still not so after")]
    fn a_poll_that_never_succeeds_panics_with_the_last_state() {
        poll("the answer", Duration::from_millis(60), || {
            Err::<(), _>("42 is not 43".to_owned())
        });
    }
}
