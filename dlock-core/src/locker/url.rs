//! Redis URLs in messages, without their passwords.

/// `scheme://user:password@host/db` → `scheme://user:***@host/db`.
pub(crate) fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return "<unparsable url>".to_owned();
    };
    let rest = &url[scheme_end + 3..];
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    match authority.rfind('@') {
        Some(at) => {
            let userinfo = &authority[..at];
            let user = userinfo.split(':').next().unwrap_or("");
            let redacted = if userinfo.contains(':') {
                format!("{user}:***")
            } else {
                // A lone userinfo in a redis URL is a password.
                "***".to_owned()
            };
            format!(
                "{}://{redacted}@{}{}",
                &url[..scheme_end],
                &authority[at + 1..],
                &rest[authority_end..]
            )
        }
        None => url.to_owned(),
    }
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
    }
}
