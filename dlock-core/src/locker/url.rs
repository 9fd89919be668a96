//! Redis URLs in messages, without their secrets.

/// Query parameters whose value is a secret. redis-rs reads a unix socket's password from
/// `?pass=`; the others are not read by it, but a URL that carries one is as secret there.
const SECRET_PARAMS: [&str; 5] = ["pass", "password", "token", "secret", "auth"];

/// The URL as it may be shown: the password in the authority and every secret query parameter
/// replaced by `***` (`redis://user:pw@host/0` → `redis://user:***@host/0`,
/// `redis+unix:///run/redis.sock?pass=pw` → `redis+unix:///run/redis.sock?pass=***`). A URL
/// that does not parse is not shown at all: where its password ends is anyone's guess.
pub(crate) fn redact_url(raw: &str) -> String {
    let Ok(mut url) = url::Url::parse(raw) else {
        return "<a URL that does not parse>".to_owned();
    };
    if url.password().is_some() {
        // Fails only for a URL without a host, which has no password to hide.
        let _ = url.set_password(Some("***"));
    } else if !url.username().is_empty() {
        // `redis://secret@host`: some clients read a lone userinfo as the password.
        let _ = url.set_username("***");
    }
    if url.query().is_some() {
        let pairs: Vec<(String, String)> = (url.query_pairs())
            .map(|(key, value)| {
                let secret = SECRET_PARAMS.contains(&key.to_ascii_lowercase().as_str());
                let value = if secret { "***".into() } else { value };
                (key.into_owned(), value.into_owned())
            })
            .collect();
        url.query_pairs_mut().clear().extend_pairs(pairs);
    }
    url.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact_url("redis://user:secret@host:6379/2"),
            "redis://user:***@host:6379/2"
        );
        assert_eq!(redact_url("redis://:secret@host/"), "redis://:***@host/");
        assert_eq!(redact_url("rediss://secret@host"), "rediss://***@host");
        assert_eq!(redact_url("redis://host:1/0"), "redis://host:1/0");
        assert_eq!(
            redact_url("rediss://u:p%40ss@host/#insecure"),
            "rediss://u:***@host/#insecure"
        );
    }

    #[test]
    fn secrets_in_the_query_are_redacted() {
        assert_eq!(
            redact_url("redis+unix:///run/redis.sock?pass=secret"),
            "redis+unix:///run/redis.sock?pass=***"
        );
        assert_eq!(
            redact_url("unix:///run/redis.sock?db=2&user=app&PASS=s%26cret&protocol=resp3"),
            "unix:///run/redis.sock?db=2&user=app&PASS=***&protocol=resp3"
        );
        assert_eq!(
            redact_url("redis://host/?password=x"),
            "redis://host/?password=***"
        );
    }

    /// Every scheme redis-rs connects with, a password where each form carries it: in the
    /// authority (TCP, IPv4 and IPv6) or in the `pass` query parameter (unix sockets).
    #[test]
    fn every_url_form_redis_accepts_is_redacted() {
        for scheme in ["redis", "rediss", "valkey", "valkeys"] {
            for host in ["127.0.0.1:6379", "[::1]:6379", "cache.internal"] {
                for auth in ["user:s3cret@", ":s3cret@"] {
                    let raw = format!("{scheme}://{auth}{host}/3?protocol=resp3");
                    let shown = redact_url(&raw);
                    assert!(!shown.contains("s3cret"), "{raw} -> {shown}");
                    assert!(shown.starts_with(&format!("{scheme}://")), "{shown}");
                    assert!(shown.contains(host), "{raw} -> {shown}");
                }
            }
        }
        for scheme in ["unix", "redis+unix", "valkey+unix"] {
            let raw = format!("{scheme}:///run/redis.sock?db=1&user=app&pass=s3cret");
            let shown = redact_url(&raw);
            assert_eq!(
                shown,
                format!("{scheme}:///run/redis.sock?db=1&user=app&pass=***")
            );
        }
    }

    #[test]
    fn a_url_that_does_not_parse_is_not_shown() {
        for raw in ["redis://:pw@host:port/", "no scheme :pw@", "redis://[::1/"] {
            assert_eq!(redact_url(raw), "<a URL that does not parse>", "{raw}");
        }
    }
}
