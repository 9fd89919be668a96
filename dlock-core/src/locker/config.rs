//! A `Locker`'s whole configuration as data: written in code, read from the environment
//! (`DLOCK_*` variables), or, with the `serde` feature, from any format serde reads.

use std::fmt;
use std::time::Duration;

use super::url::redact_url;
use super::{Locker, LockerBuilder};
use crate::engine::Lease;
use crate::error::LockError;
use crate::replication::ReplicaAck;

mod env;

/// Everything a [`Locker`] is built from, as data: where Redis is (one source of
/// [`url`](Self::url), [`cluster`](Self::cluster), [`sentinels`](Self::sentinels) or
/// [`masters`](Self::masters)) and every setting of [`LockerBuilder`]. Unset fields keep the
/// builder's defaults.
///
/// Read it from the environment with [`from_env`](Self::from_env) (the variables are in
/// [`ENV_VARS`](Self::ENV_VARS)), or, with the `serde` feature, from a configuration file:
/// durations are written as people write them (`"250ms"`, `"30s"`, `"1m 30s"`), and unknown
/// fields are refused.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dlock_core::LockError> {
/// use dlock_core::LockerConfig;
///
/// let config = LockerConfig::from_vars(|name| match name {
///     "DLOCK_URL" => Some("redis://127.0.0.1:6379/".to_owned()),
///     "DLOCK_DEFAULT_WAIT" => Some("3s".to_owned()),
///     "DLOCK_CONNECT_LAZILY" => Some("true".to_owned()),
///     _ => None,
/// })?;
/// assert_eq!(config.default_wait, Some(std::time::Duration::from_secs(3)));
/// let locker = config.build().await?; // lazily: Redis may be down for now
/// assert_eq!(locker.default_wait(), std::time::Duration::from_secs(3));
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default, deny_unknown_fields))]
#[non_exhaustive]
pub struct LockerConfig {
    /// One Redis server, or a master its replicas follow (`DLOCK_URL`;
    /// [`LockerBuilder::url`]); with the `postgres` feature, a PostgreSQL database
    /// (`postgres://`) instead.
    pub url: Option<String>,
    /// A certificate authority to trust for a `rediss://` [`url`](Self::url), beside the
    /// well-known roots: the path of a PEM file (`DLOCK_TLS_CA`; feature `tls-rustls`).
    pub tls_ca: Option<std::path::PathBuf>,
    /// A Redis Cluster's seed nodes (`DLOCK_CLUSTER_URLS`, comma-separated;
    /// [`LockerBuilder::cluster`], feature `cluster`).
    pub cluster: Vec<String>,
    /// Redis Sentinel's sentinels (`DLOCK_SENTINEL_URLS`, comma-separated;
    /// [`LockerBuilder::sentinel`], feature `sentinel`), with
    /// [`sentinel_master`](Self::sentinel_master).
    pub sentinels: Vec<String>,
    /// The name the sentinels monitor the master under (`DLOCK_SENTINEL_MASTER`).
    pub sentinel_master: Option<String>,
    /// Independent masters, each a Redis URL, for a [`MasterSet`](crate::MasterSet) that needs a majority of them
    /// (`DLOCK_MASTERS`, comma-separated; [`build_master_set`](Self::build_master_set)).
    pub masters: Vec<String>,
    /// The prefix of every key (`DLOCK_PREFIX`; [`LockerBuilder::prefix`]).
    pub prefix: Option<String>,
    /// How long a request waits when it does not say (`DLOCK_DEFAULT_WAIT`;
    /// [`LockerBuilder::default_wait`]).
    #[cfg_attr(feature = "serde", serde(with = "durations::optional"))]
    pub default_wait: Option<Duration>,
    /// The default lease (`DLOCK_DEFAULT_LEASE`; [`LockerBuilder::default_lease`]): renewed by
    /// the watchdog, unless [`fixed_lease`](Self::fixed_lease).
    #[cfg_attr(feature = "serde", serde(with = "durations::optional"))]
    pub default_lease: Option<Duration>,
    /// The default lease is never renewed (`DLOCK_FIXED_LEASE`): `Lease::fixed`.
    pub fixed_lease: bool,
    /// How long an idle fencing counter lives: `Some(None)` is forever (`DLOCK_FENCE_TTL`,
    /// a duration or `forever`; [`LockerBuilder::fence_ttl`]).
    #[cfg_attr(feature = "serde", serde(with = "durations::fence_ttl"))]
    pub fence_ttl: Option<Option<Duration>>,
    /// The bound on every Redis command (`DLOCK_COMMAND_TIMEOUT`;
    /// [`LockerBuilder::command_timeout`]).
    #[cfg_attr(feature = "serde", serde(with = "durations::optional"))]
    pub command_timeout: Option<Duration>,
    /// The bound on connecting (`DLOCK_CONNECT_TIMEOUT`; [`LockerBuilder::connect_timeout`]).
    #[cfg_attr(feature = "serde", serde(with = "durations::optional"))]
    pub connect_timeout: Option<Duration>,
    /// How often a waiter retries when wake-ups can't be delivered (`DLOCK_POLL_INTERVAL`;
    /// [`LockerBuilder::poll_interval`]).
    #[cfg_attr(feature = "serde", serde(with = "durations::optional"))]
    pub poll_interval: Option<Duration>,
    /// How long a fair lock's waiter keeps its place without an attempt
    /// (`DLOCK_DEAD_WAITER_TIMEOUT`; [`LockerBuilder::dead_waiter_timeout`]).
    #[cfg_attr(feature = "serde", serde(with = "durations::optional"))]
    pub dead_waiter_timeout: Option<Duration>,
    /// Whether a release hands the lock to a waiter of the same `Locker` (`DLOCK_HAND_OVER`;
    /// [`LockerBuilder::hand_over`]).
    pub hand_over: Option<bool>,
    /// Build without connecting (`DLOCK_CONNECT_LAZILY`; [`LockerBuilder::connect_lazily`]).
    pub connect_lazily: bool,
    /// Label metrics with lock names (`DLOCK_METRICS_NAME_LABEL`;
    /// [`LockerBuilder::metrics_name_label`]).
    pub metrics_name_label: bool,
    /// Keep lock names out of logs, spans and metric labels (`DLOCK_HIDE_NAMES`;
    /// [`LockerBuilder::hide_names`]).
    pub hide_names: bool,
    /// A label on every lock taken, shown to operators (`DLOCK_HOLDER_LABEL`;
    /// [`LockerBuilder::holder_label`]).
    pub holder_label: Option<String>,
    /// The level of dlock's spans (`DLOCK_SPAN_LEVEL`: `error`, `warn`, `info`, `debug` or
    /// `trace`; [`LockerBuilder::span_level`]).
    #[cfg_attr(feature = "serde", serde(with = "levels"))]
    pub span_level: Option<tracing::Level>,
    /// How many replicas acknowledge every lock write; `0` turns acknowledgement off
    /// (`DLOCK_REPLICA_ACK`; [`LockerBuilder::replica_ack`],
    /// [`ReplicaAck::none`]). Unset: the builder's default for the source.
    pub replica_ack: Option<u32>,
    /// How long a write waits for [`replica_ack`](Self::replica_ack) replicas
    /// (`DLOCK_REPLICA_ACK_TIMEOUT`; default a quarter of the command timeout, at most 250 ms).
    #[cfg_attr(feature = "serde", serde(with = "durations::optional"))]
    pub replica_ack_timeout: Option<Duration>,
}

impl fmt::Debug for LockerConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let urls = |urls: &[String]| urls.iter().map(|u| redact_url(u)).collect::<Vec<_>>();
        f.debug_struct("LockerConfig")
            .field("url", &self.url.as_deref().map(redact_url))
            .field("tls_ca", &self.tls_ca)
            .field("cluster", &urls(&self.cluster))
            .field("sentinels", &urls(&self.sentinels))
            .field("sentinel_master", &self.sentinel_master)
            .field("masters", &urls(&self.masters))
            .field("prefix", &self.prefix)
            .field("default_wait", &self.default_wait)
            .field("default_lease", &self.default_lease)
            .field("fixed_lease", &self.fixed_lease)
            .field("fence_ttl", &self.fence_ttl)
            .field("command_timeout", &self.command_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("poll_interval", &self.poll_interval)
            .field("dead_waiter_timeout", &self.dead_waiter_timeout)
            .field("hand_over", &self.hand_over)
            .field("connect_lazily", &self.connect_lazily)
            .field("metrics_name_label", &self.metrics_name_label)
            .field("hide_names", &self.hide_names)
            .field("holder_label", &self.holder_label)
            .field("span_level", &self.span_level)
            .field("replica_ack", &self.replica_ack)
            .field("replica_ack_timeout", &self.replica_ack_timeout)
            .finish()
    }
}

/// A configuration value that could not be read: which variable, and what is wrong with its
/// value. A URL's value is never repeated (it may hold a password).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{variable}: {problem}")]
pub struct ConfigError {
    variable: String,
    problem: String,
}

impl ConfigError {
    fn new(variable: &str, problem: impl Into<String>) -> Self {
        Self {
            variable: variable.to_owned(),
            problem: problem.into(),
        }
    }

    /// The variable (`DLOCK_DEFAULT_WAIT`).
    pub fn variable(&self) -> &str {
        &self.variable
    }

    /// What is wrong with its value.
    pub fn problem(&self) -> &str {
        &self.problem
    }
}

impl From<ConfigError> for LockError {
    fn from(err: ConfigError) -> Self {
        LockError::Config(err.to_string())
    }
}

impl LockerConfig {
    /// A [`LockerBuilder`] with every setting of this configuration. Exactly one of
    /// [`url`](Self::url), [`cluster`](Self::cluster) and [`sentinels`](Self::sentinels) must be
    /// set ([`masters`](Self::masters) builds a [`MasterSet`](crate::MasterSet) instead).
    pub fn builder(&self) -> Result<LockerBuilder, LockError> {
        let given: Vec<&str> = [
            ("DLOCK_URL", self.url.is_some()),
            ("DLOCK_CLUSTER_URLS", !self.cluster.is_empty()),
            ("DLOCK_SENTINEL_URLS", !self.sentinels.is_empty()),
            ("DLOCK_MASTERS", !self.masters.is_empty()),
        ]
        .into_iter()
        .filter_map(|(name, set)| set.then_some(name))
        .collect();
        let builder = match given[..] {
            [] => {
                return Err(LockError::Config(
                    "no Redis to lock on: set DLOCK_URL, DLOCK_CLUSTER_URLS, DLOCK_SENTINEL_URLS \
                     (with DLOCK_SENTINEL_MASTER) or DLOCK_MASTERS"
                        .into(),
                ));
            }
            [_, _, ..] => {
                return Err(LockError::Config(format!(
                    "{} name different Redis deployments: set one of them",
                    given.join(" and ")
                )));
            }
            ["DLOCK_MASTERS"] => {
                return Err(LockError::Config(
                    "DLOCK_MASTERS names a set of masters: build it with `build_master_set`".into(),
                ));
            }
            ["DLOCK_URL"] => match &self.tls_ca {
                None => Locker::builder().url(self.url.clone().unwrap_or_default()),
                Some(ca) => self.tls_builder(ca)?,
            },
            [source] if self.tls_ca.is_some() => {
                return Err(LockError::Config(format!(
                    "DLOCK_TLS_CA works with DLOCK_URL, not with {source}"
                )));
            }
            ["DLOCK_CLUSTER_URLS"] => self.cluster_builder()?,
            _ => self.sentinel_builder()?,
        };
        Ok(self.settings(builder))
    }

    /// Builds the `Locker` ([`builder`](Self::builder), then [`LockerBuilder::build`]).
    pub async fn build(&self) -> Result<Locker, LockError> {
        self.builder()?.build().await
    }

    /// A builder over a client of [`url`](Self::url) that trusts the certificate authority
    /// in the file `ca`.
    #[cfg(feature = "tls-rustls")]
    fn tls_builder(&self, ca: &std::path::Path) -> Result<LockerBuilder, LockError> {
        let pem = std::fs::read(ca).map_err(|err| {
            LockError::Config(format!("DLOCK_TLS_CA: cannot read {}: {err}", ca.display()))
        })?;
        let url = self.url.as_deref().unwrap_or_default();
        let certificates = redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(pem),
        };
        // The error's text may repeat the URL, and the URL may hold a password.
        let client = redis::Client::build_with_tls(url, certificates).map_err(|err| {
            LockError::Config(format!(
                "DLOCK_URL with DLOCK_TLS_CA: no TLS client ({:?}) for {}",
                err.kind(),
                redact_url(url)
            ))
        })?;
        Ok(Locker::builder().client(client))
    }

    #[cfg(not(feature = "tls-rustls"))]
    fn tls_builder(&self, _ca: &std::path::Path) -> Result<LockerBuilder, LockError> {
        Err(LockError::Config(
            "DLOCK_TLS_CA needs dlock-core's `tls-rustls` feature".into(),
        ))
    }

    #[cfg(feature = "cluster")]
    fn cluster_builder(&self) -> Result<LockerBuilder, LockError> {
        Ok(Locker::builder().cluster(self.cluster.iter().cloned()))
    }

    #[cfg(not(feature = "cluster"))]
    fn cluster_builder(&self) -> Result<LockerBuilder, LockError> {
        Err(LockError::Config(
            "DLOCK_CLUSTER_URLS names a Redis Cluster: enable dlock-core's `cluster` feature"
                .into(),
        ))
    }

    #[cfg(feature = "sentinel")]
    fn sentinel_builder(&self) -> Result<LockerBuilder, LockError> {
        let master = self.sentinel_master.as_deref().ok_or_else(|| {
            LockError::Config(
                "DLOCK_SENTINEL_URLS needs DLOCK_SENTINEL_MASTER, the name the sentinels \
                 monitor the master under"
                    .into(),
            )
        })?;
        Ok(Locker::builder().sentinel(self.sentinels.iter().cloned(), master))
    }

    #[cfg(not(feature = "sentinel"))]
    fn sentinel_builder(&self) -> Result<LockerBuilder, LockError> {
        Err(LockError::Config(
            "DLOCK_SENTINEL_URLS names Redis Sentinel: enable dlock-core's `sentinel` feature"
                .into(),
        ))
    }

    /// `builder` with every setting but the source.
    pub(crate) fn settings(&self, mut builder: LockerBuilder) -> LockerBuilder {
        if let Some(prefix) = &self.prefix {
            builder = builder.prefix(prefix.as_str());
        }
        if let Some(wait) = self.default_wait {
            builder = builder.default_wait(wait);
        }
        if let Some(lease) = self.default_lease {
            builder = builder.default_lease(match self.fixed_lease {
                true => Lease::fixed(lease),
                false => Lease::watchdog(lease),
            });
        }
        if let Some(ttl) = self.fence_ttl {
            builder = builder.fence_ttl(ttl);
        }
        if let Some(timeout) = self.command_timeout {
            builder = builder.command_timeout(timeout);
        }
        if let Some(timeout) = self.connect_timeout {
            builder = builder.connect_timeout(timeout);
        }
        if let Some(interval) = self.poll_interval {
            builder = builder.poll_interval(interval);
        }
        if let Some(timeout) = self.dead_waiter_timeout {
            builder = builder.dead_waiter_timeout(timeout);
        }
        if let Some(hand_over) = self.hand_over {
            builder = builder.hand_over(hand_over);
        }
        if let Some(label) = &self.holder_label {
            builder = builder.holder_label(label.as_str());
        }
        if let Some(level) = self.span_level {
            builder = builder.span_level(level);
        }
        builder = builder
            .connect_lazily(self.connect_lazily)
            .metrics_name_label(self.metrics_name_label)
            .hide_names(self.hide_names);
        match self.replica_ack {
            None => builder,
            Some(0) => builder.replica_ack(ReplicaAck::none()),
            Some(replicas) => {
                let command = self
                    .command_timeout
                    .unwrap_or(crate::DEFAULT_COMMAND_TIMEOUT);
                let timeout = self
                    .replica_ack_timeout
                    .unwrap_or((command / 4).min(Duration::from_millis(250)));
                builder.replica_ack(ReplicaAck::new(replicas, timeout))
            }
        }
    }
}

/// A span level in a configuration file: `"info"`, `"debug"`.
#[cfg(feature = "serde")]
mod levels {
    use serde::{Deserialize as _, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(
        value: &Option<tracing::Level>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match value {
            Some(level) => s.serialize_str(&level.as_str().to_ascii_lowercase()),
            None => s.serialize_none(),
        }
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<tracing::Level>, D::Error> {
        let text = Option::<String>::deserialize(d)?;
        text.map(|t| t.trim().parse().map_err(serde::de::Error::custom))
            .transpose()
    }
}

/// Durations in a configuration file, as people write them.
#[cfg(feature = "serde")]
mod durations {
    use std::time::Duration;

    use serde::{Deserialize as _, Deserializer, Serializer};

    /// `Option<Duration>` as `"250ms"`, `"1m 30s"`.
    pub(super) mod optional {
        use super::*;

        pub(crate) fn serialize<S: Serializer>(
            value: &Option<Duration>,
            s: S,
        ) -> Result<S::Ok, S::Error> {
            match value {
                Some(d) => s.serialize_str(&humantime::format_duration(*d).to_string()),
                None => s.serialize_none(),
            }
        }

        pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Option<Duration>, D::Error> {
            let text = Option::<String>::deserialize(d)?;
            text.map(|t| humantime::parse_duration(t.trim()).map_err(serde::de::Error::custom))
                .transpose()
        }
    }

    /// The fencing counter's TTL: a duration, or `"forever"`.
    pub(super) mod fence_ttl {
        use super::*;

        pub(crate) fn serialize<S: Serializer>(
            value: &Option<Option<Duration>>,
            s: S,
        ) -> Result<S::Ok, S::Error> {
            match value {
                Some(Some(d)) => s.serialize_str(&humantime::format_duration(*d).to_string()),
                Some(None) => s.serialize_str("forever"),
                None => s.serialize_none(),
            }
        }

        pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Option<Option<Duration>>, D::Error> {
            match Option::<String>::deserialize(d)? {
                None => Ok(None),
                Some(t) if t.trim().eq_ignore_ascii_case("forever") => Ok(Some(None)),
                Some(t) => humantime::parse_duration(t.trim())
                    .map(|d| Some(Some(d)))
                    .map_err(serde::de::Error::custom),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Result<LockerConfig, ConfigError> {
        LockerConfig::from_vars(|name| {
            (pairs.iter())
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_owned())
        })
    }

    #[test]
    fn one_source_is_needed() {
        let refused = |pairs: &[(&str, &str)]| vars(pairs).unwrap().builder().unwrap_err();
        assert!(refused(&[]).to_string().contains("no Redis to lock on"));
        let both = refused(&[
            ("DLOCK_URL", "redis://a/"),
            ("DLOCK_CLUSTER_URLS", "redis://b/"),
        ]);
        assert!(
            both.to_string()
                .contains("DLOCK_URL and DLOCK_CLUSTER_URLS"),
            "{both}"
        );
        let masters = refused(&[("DLOCK_MASTERS", "redis://a/,redis://b/,redis://c/")]);
        assert!(
            masters.to_string().contains("build_master_set"),
            "{masters}"
        );
        #[cfg(feature = "sentinel")]
        {
            let e = refused(&[("DLOCK_SENTINEL_URLS", "redis://s:26379/")]);
            assert!(e.to_string().contains("DLOCK_SENTINEL_MASTER"), "{e}");
        }
    }

    #[cfg(feature = "serde")]
    #[test]
    fn a_file_reads_durations_as_people_write_them() {
        let config: LockerConfig = serde_json::from_str(
            r#"{"url": "redis://127.0.0.1/", "default_wait": "3s", "fence_ttl": "forever",
                "command_timeout": "1m 30s", "hide_names": true, "span_level": "debug"}"#,
        )
        .unwrap();
        assert_eq!(config.default_wait, Some(Duration::from_secs(3)));
        assert_eq!(config.fence_ttl, Some(None));
        assert_eq!(config.command_timeout, Some(Duration::from_secs(90)));
        assert!(config.hide_names);
        let back: LockerConfig =
            serde_json::from_str(&serde_json::to_string(&config).unwrap()).unwrap();
        assert_eq!(back, config);
        let unknown = serde_json::from_str::<LockerConfig>(r#"{"urls": "x"}"#).unwrap_err();
        assert!(
            unknown.to_string().contains("unknown field `urls`"),
            "{unknown}"
        );
        let bad = serde_json::from_str::<LockerConfig>(r#"{"default_wait": "soon"}"#);
        assert!(bad.is_err());
    }
}
