//! Reading a [`LockerConfig`] from `DLOCK_*` variables: which there are, and how each value is
//! read (durations as people write them, flags, URL lists), with an error naming the variable.

use std::time::Duration;

use super::{ConfigError, LockerConfig};

impl LockerConfig {
    /// Every variable [`from_env`](Self::from_env) reads, and what it sets.
    pub const ENV_VARS: [(&'static str, &'static str); 23] = [
        (
            "DLOCK_URL",
            "one Redis server: redis://[user:password@]host:6379[/db]",
        ),
        (
            "DLOCK_TLS_CA",
            "a PEM file of a certificate authority to trust for a rediss:// DLOCK_URL",
        ),
        (
            "DLOCK_CLUSTER_URLS",
            "a Redis Cluster's seed nodes' URLs, comma-separated",
        ),
        (
            "DLOCK_SENTINEL_URLS",
            "the sentinels' URLs, comma-separated",
        ),
        (
            "DLOCK_SENTINEL_MASTER",
            "the name the sentinels monitor the master under",
        ),
        (
            "DLOCK_MASTERS",
            "independent masters' URLs, comma-separated (a MasterSet)",
        ),
        ("DLOCK_PREFIX", "the prefix of every key (default dlock:)"),
        (
            "DLOCK_DEFAULT_WAIT",
            "how long a request waits by default (default 0s)",
        ),
        ("DLOCK_DEFAULT_LEASE", "the default lease (default 30s)"),
        (
            "DLOCK_FIXED_LEASE",
            "true: the default lease is never renewed (default false)",
        ),
        (
            "DLOCK_FENCE_TTL",
            "an idle fencing counter's life, or forever (default 7days)",
        ),
        (
            "DLOCK_COMMAND_TIMEOUT",
            "the bound on every command (default 2s)",
        ),
        (
            "DLOCK_CONNECT_TIMEOUT",
            "the bound on connecting (default 2s)",
        ),
        (
            "DLOCK_POLL_INTERVAL",
            "how often a waiter retries without wake-ups (default 50ms)",
        ),
        (
            "DLOCK_DEAD_WAITER_TIMEOUT",
            "a fair waiter's place without an attempt (default 5s)",
        ),
        (
            "DLOCK_HAND_OVER",
            "hand a released lock to a local waiter (default true)",
        ),
        (
            "DLOCK_CONNECT_LAZILY",
            "build without connecting (default false)",
        ),
        (
            "DLOCK_METRICS_NAME_LABEL",
            "label metrics with lock names (default false)",
        ),
        (
            "DLOCK_HIDE_NAMES",
            "keep lock names out of logs and metrics (default false)",
        ),
        (
            "DLOCK_HOLDER_LABEL",
            "a label on every lock taken, shown to operators",
        ),
        (
            "DLOCK_SPAN_LEVEL",
            "the level of dlock's spans (default info)",
        ),
        (
            "DLOCK_REPLICA_ACK",
            "replicas that acknowledge each lock write; 0: none",
        ),
        (
            "DLOCK_REPLICA_ACK_TIMEOUT",
            "how long a write waits for them",
        ),
    ];

    /// The configuration the `DLOCK_*` environment variables give ([`ENV_VARS`](Self::ENV_VARS));
    /// a variable that is unset, or set to nothing, keeps the default. A value that can't be
    /// read is a [`ConfigError`] naming the variable.
    pub fn from_env() -> Result<Self, ConfigError> {
        let mut bad = None;
        let config = Self::from_vars(|name| match std::env::var(name) {
            Ok(value) => Some(value),
            Err(std::env::VarError::NotPresent) => None,
            Err(std::env::VarError::NotUnicode(_)) => {
                bad.get_or_insert_with(|| ConfigError::new(name, "is not valid UTF-8"));
                None
            }
        })?;
        match bad {
            Some(err) => Err(err),
            None => Ok(config),
        }
    }

    /// As [`from_env`](Self::from_env), with the variables looked up by `lookup` (a map, a
    /// secrets store, a test's fixed values).
    pub fn from_vars(mut lookup: impl FnMut(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let values: std::collections::HashMap<&str, String> = (Self::ENV_VARS.iter())
            .filter_map(|&(name, _)| Some((name, lookup(name)?)))
            .filter(|(_, value)| !value.trim().is_empty())
            .collect();
        let text = |name: &str| values.get(name).map(|v| v.trim().to_owned());
        let duration = |name: &str| text(name).map(|v| duration(name, &v)).transpose();
        let flag = |name: &str| text(name).map(|v| flag(name, &v)).transpose();
        let url = text("DLOCK_URL");
        if let Some(url) = &url {
            // With the `postgres` feature, one server may be a PostgreSQL database too.
            let postgres = cfg!(feature = "postgres")
                && (url.starts_with("postgres://") || url.starts_with("postgresql://"));
            if !postgres {
                check_url("DLOCK_URL", url, None)?;
            }
        }
        Ok(Self {
            url,
            cluster: urls("DLOCK_CLUSTER_URLS", text("DLOCK_CLUSTER_URLS"))?,
            sentinels: urls("DLOCK_SENTINEL_URLS", text("DLOCK_SENTINEL_URLS"))?,
            sentinel_master: text("DLOCK_SENTINEL_MASTER"),
            masters: urls("DLOCK_MASTERS", text("DLOCK_MASTERS"))?,
            // Kept as written: a prefix or a label with spaces is refused by `build`, loudly.
            prefix: values.get("DLOCK_PREFIX").cloned(),
            default_wait: duration("DLOCK_DEFAULT_WAIT")?,
            default_lease: duration("DLOCK_DEFAULT_LEASE")?,
            fixed_lease: flag("DLOCK_FIXED_LEASE")?.unwrap_or(false),
            fence_ttl: match text("DLOCK_FENCE_TTL") {
                None => None,
                Some(v) if v.eq_ignore_ascii_case("forever") => Some(None),
                Some(_) => Some(duration("DLOCK_FENCE_TTL")?),
            },
            command_timeout: duration("DLOCK_COMMAND_TIMEOUT")?,
            connect_timeout: duration("DLOCK_CONNECT_TIMEOUT")?,
            poll_interval: duration("DLOCK_POLL_INTERVAL")?,
            dead_waiter_timeout: duration("DLOCK_DEAD_WAITER_TIMEOUT")?,
            hand_over: flag("DLOCK_HAND_OVER")?,
            connect_lazily: flag("DLOCK_CONNECT_LAZILY")?.unwrap_or(false),
            metrics_name_label: flag("DLOCK_METRICS_NAME_LABEL")?.unwrap_or(false),
            hide_names: flag("DLOCK_HIDE_NAMES")?.unwrap_or(false),
            holder_label: values.get("DLOCK_HOLDER_LABEL").cloned(),
            span_level: match text("DLOCK_SPAN_LEVEL") {
                None => None,
                Some(v) => Some(v.parse::<tracing::Level>().map_err(|_| {
                    ConfigError::new(
                        "DLOCK_SPAN_LEVEL",
                        format!("`{v}` is not a level: error, warn, info, debug or trace"),
                    )
                })?),
            },
            replica_ack: match text("DLOCK_REPLICA_ACK") {
                None => None,
                Some(v) => Some(v.parse::<u32>().map_err(|_| {
                    ConfigError::new(
                        "DLOCK_REPLICA_ACK",
                        format!("`{v}` is not a number of replicas (0 turns it off)"),
                    )
                })?),
            },
            replica_ack_timeout: duration("DLOCK_REPLICA_ACK_TIMEOUT")?,
            tls_ca: text("DLOCK_TLS_CA").map(std::path::PathBuf::from),
        })
    }
}

/// A duration as people write it.
fn duration(name: &str, value: &str) -> Result<Duration, ConfigError> {
    humantime::parse_duration(value.trim()).map_err(|e| {
        ConfigError::new(
            name,
            format!(
                "`{}` is not a duration ({e}; write it as 250ms, 5s, 1m 30s)",
                value.trim()
            ),
        )
    })
}

/// `true`/`false` (or `1`/`0`, `yes`/`no`, `on`/`off`).
fn flag(name: &str, value: &str) -> Result<bool, ConfigError> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        other => Err(ConfigError::new(
            name,
            format!("`{other}` is not true or false"),
        )),
    }
}

/// A comma-separated list of URLs: each must parse; none is repeated in an error.
fn urls(name: &str, value: Option<String>) -> Result<Vec<String>, ConfigError> {
    let Some(value) = value else {
        return Ok(Vec::new());
    };
    let urls: Vec<String> = (value.split(','))
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(str::to_owned)
        .collect();
    if urls.is_empty() {
        return Err(ConfigError::new(name, "names no URL"));
    }
    for (i, url) in urls.iter().enumerate() {
        check_url(name, url, Some(i + 1))?;
    }
    Ok(urls)
}

/// A Redis URL that parses; the error never repeats it.
fn check_url(name: &str, url: &str, entry: Option<usize>) -> Result<(), ConfigError> {
    let which = entry.map_or_else(|| "the value".to_owned(), |i| format!("entry {i}"));
    let parsed = ::url::Url::parse(url).map_err(|e| {
        ConfigError::new(
            name,
            format!("{which} is not a URL ({e}): write redis://[user:password@]host:port[/db]"),
        )
    })?;
    match parsed.scheme() {
        "redis" | "rediss" | "valkey" | "valkeys" | "redis+unix" | "unix" => Ok(()),
        scheme => Err(ConfigError::new(
            name,
            format!(
                "{which} is a `{scheme}` URL, not a Redis one (redis://, rediss://, redis+unix://)"
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::{ConfigError, LockerConfig};

    fn vars(pairs: &[(&str, &str)]) -> Result<LockerConfig, ConfigError> {
        LockerConfig::from_vars(|name| {
            (pairs.iter())
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_owned())
        })
    }

    #[test]
    fn every_variable_is_read() {
        let config = vars(&[
            ("DLOCK_URL", " redis://:pw@127.0.0.1:6379/1 "),
            ("DLOCK_PREFIX", "app:"),
            ("DLOCK_DEFAULT_WAIT", "1m 30s"),
            ("DLOCK_DEFAULT_LEASE", "10s"),
            ("DLOCK_FIXED_LEASE", "yes"),
            ("DLOCK_FENCE_TTL", "forever"),
            ("DLOCK_COMMAND_TIMEOUT", "500ms"),
            ("DLOCK_CONNECT_TIMEOUT", "1s"),
            ("DLOCK_POLL_INTERVAL", "20ms"),
            ("DLOCK_DEAD_WAITER_TIMEOUT", "3s"),
            ("DLOCK_HAND_OVER", "off"),
            ("DLOCK_CONNECT_LAZILY", "TRUE"),
            ("DLOCK_METRICS_NAME_LABEL", "1"),
            ("DLOCK_HIDE_NAMES", "true"),
            ("DLOCK_HOLDER_LABEL", "web-3"),
            ("DLOCK_SPAN_LEVEL", "DEBUG"),
            ("DLOCK_REPLICA_ACK", "0"),
            ("DLOCK_REPLICA_ACK_TIMEOUT", "100ms"),
            ("DLOCK_TLS_CA", "/etc/redis/ca.pem"),
        ])
        .unwrap();
        let ms = Duration::from_millis;
        assert_eq!(config.url.as_deref(), Some("redis://:pw@127.0.0.1:6379/1"));
        assert_eq!(config.prefix.as_deref(), Some("app:"));
        assert_eq!(config.default_wait, Some(ms(90_000)));
        assert_eq!(
            (config.default_lease, config.fixed_lease),
            (Some(ms(10_000)), true)
        );
        assert_eq!(config.fence_ttl, Some(None));
        assert_eq!(config.command_timeout, Some(ms(500)));
        assert_eq!(config.connect_timeout, Some(ms(1000)));
        assert_eq!(config.poll_interval, Some(ms(20)));
        assert_eq!(config.dead_waiter_timeout, Some(ms(3000)));
        assert_eq!(config.hand_over, Some(false));
        assert!(config.connect_lazily && config.metrics_name_label && config.hide_names);
        assert_eq!(config.holder_label.as_deref(), Some("web-3"));
        assert_eq!(config.span_level, Some(tracing::Level::DEBUG));
        assert_eq!(
            (config.replica_ack, config.replica_ack_timeout),
            (Some(0), Some(ms(100)))
        );
        assert_eq!(
            config.tls_ca.as_deref(),
            Some(std::path::Path::new("/etc/redis/ca.pem"))
        );
        let shown = format!("{config:?}");
        assert!(!shown.contains("pw"), "{shown}");
        // Every variable read is documented, and every documented one is read.
        let mut asked = Vec::new();
        let _ = LockerConfig::from_vars(|name| {
            asked.push(name.to_owned());
            None
        });
        asked.sort();
        let mut documented: Vec<String> = LockerConfig::ENV_VARS
            .iter()
            .map(|(n, _)| (*n).to_owned())
            .collect();
        documented.sort();
        assert_eq!(asked, documented);
    }

    #[test]
    fn a_bad_value_names_its_variable_and_never_a_password() {
        let err = |pairs: &[(&str, &str)]| vars(pairs).unwrap_err();
        let e = err(&[("DLOCK_DEFAULT_WAIT", "3 parsecs")]);
        assert_eq!(e.variable(), "DLOCK_DEFAULT_WAIT");
        assert!(e.problem().contains("`3 parsecs` is not a duration"), "{e}");
        let e = err(&[("DLOCK_HIDE_NAMES", "maybe")]);
        assert_eq!(
            e.to_string(),
            "DLOCK_HIDE_NAMES: `maybe` is not true or false"
        );
        let e = err(&[("DLOCK_URL", "redis://:s3cret@host:port/")]);
        assert_eq!(e.variable(), "DLOCK_URL");
        assert!(!e.to_string().contains("s3cret"), "{e}");
        let e = err(&[("DLOCK_CLUSTER_URLS", "redis://a:7000/, http://:s3cret@b/")]);
        assert!(e.problem().starts_with("entry 2 is a `http` URL"), "{e}");
        assert!(!e.to_string().contains("s3cret"), "{e}");
        let e = err(&[("DLOCK_MASTERS", " , ")]);
        assert_eq!(e.to_string(), "DLOCK_MASTERS: names no URL");
        let e = err(&[("DLOCK_SPAN_LEVEL", "loud")]);
        assert!(e.problem().contains("`loud` is not a level"), "{e}");
        let e = err(&[("DLOCK_REPLICA_ACK", "two")]);
        assert!(e.problem().contains("not a number of replicas"), "{e}");
        // Set to nothing is unset.
        assert_eq!(
            vars(&[("DLOCK_DEFAULT_WAIT", " ")]).unwrap().default_wait,
            None
        );
    }
}
