//! Redis's glob patterns (`SCAN .. MATCH`), for listing names.

/// `text` with Redis's glob characters (`*`, `?`, `[`, `]`, `\`) escaped, so that it matches
/// literally: to build a [`Locker::list`](crate::Locker::list) pattern from a name's text.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dlock_core::LockError> {
/// let locker = dlock_core::Locker::memory();
/// let _a = locker.lock("report*2026:01").await?;
/// let _b = locker.lock("report-2026:01").await?;
/// let pattern = format!("{}*", dlock_core::escape_glob("report*"));
/// assert_eq!(locker.list(&pattern).await?, ["report*2026:01"]);
/// # Ok(())
/// # }
/// ```
pub fn escape_glob(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Whether `name` matches the glob `pattern` (`*`, `?`, `[...]`, `\` escapes), as Redis's
/// `MATCH` does: the memory store's `SCAN`, and a second check on what a server's `SCAN` returned.
pub(crate) fn glob_matches(pattern: &str, name: &str) -> bool {
    fn go(p: &[char], n: &[char]) -> bool {
        match p.split_first() {
            None => n.is_empty(),
            Some(('*', rest)) => (0..=n.len()).any(|i| go(rest, &n[i..])),
            Some(('?', rest)) => !n.is_empty() && go(rest, &n[1..]),
            Some(('[', rest)) => {
                let Some(end) = rest.iter().position(|c| *c == ']') else {
                    return n.first() == Some(&'[') && go(rest, &n[1..]);
                };
                let (class, after) = (&rest[..end], &rest[end + 1..]);
                let Some(c) = n.first() else {
                    return false;
                };
                let (negate, class) = match class.split_first() {
                    Some(('^', class)) => (true, class),
                    _ => (false, class),
                };
                let mut hit = false;
                let mut i = 0;
                while i < class.len() {
                    if i + 2 < class.len() && class[i + 1] == '-' {
                        hit |= class[i] <= *c && *c <= class[i + 2];
                        i += 3;
                    } else {
                        hit |= class[i] == *c;
                        i += 1;
                    }
                }
                hit != negate && go(after, &n[1..])
            }
            Some(('\\', rest)) if !rest.is_empty() => {
                n.first() == Some(&rest[0]) && go(&rest[1..], &n[1..])
            }
            Some((c, rest)) => n.first() == Some(c) && go(rest, &n[1..]),
        }
    }
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    go(&p, &n)
}

#[cfg(test)]
mod tests {
    use super::{escape_glob, glob_matches};

    #[test]
    fn globs_match_as_redis_does() {
        assert!(glob_matches("*", "order:1"));
        assert!(glob_matches("order:*", "order:1"));
        assert!(!glob_matches("order:*", "cart:1"));
        assert!(glob_matches("order:?", "order:1"));
        assert!(!glob_matches("order:?", "order:12"));
        assert!(glob_matches("order:[0-4]", "order:3"));
        assert!(!glob_matches("order:[^0-4]", "order:3"));
        assert!(glob_matches("a\\*b", "a*b"));
        assert!(!glob_matches("a\\*b", "axb"));
        assert_eq!(escape_glob("my*app:"), "my\\*app:");
    }
}
