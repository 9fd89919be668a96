//! Lock names: trusted literal text plus escaped untrusted values.
//!
//! A [`LockName`] is what a lock is called; the Redis keys that belong to it are derived from it
//! by the [`Locker`](crate::Locker), which adds its prefix and wraps the name in a `{hash tag}` so
//! that every key of one lock lands in the same Redis Cluster slot.
//!
//! # Escaping
//!
//! Values (user ids, SKUs, anything that comes from outside) are written with
//! [`NameBuilder::value`]. Every byte outside `[A-Za-z0-9_.-]` is percent-encoded (`%3A` for `:`),
//! so a value can never forge the literal separators around it: with the template
//! `order:<user>:<voucher>`, the values `("1:2", "3")` give `order:1%3A2:3` while `("1", "2:3")`
//! give `order:1:2%3A3`. When the literal text between two values holds no separator (a character
//! that escaped values never contain, such as `:` or `/`), a `:` is inserted right after the first
//! value, so the mapping from value tuples to names is injective for any fixed template.
//!
//! # Limits
//!
//! A name must be non-empty, at most [`MAX_NAME_LEN`] bytes once escaped, free of control
//! characters, and its literal text must not contain `{` or `}` (they are reserved for the hash
//! tag). Anything else is [`LockError::InvalidName`](crate::LockError::InvalidName).

use std::fmt::{self, Write as _};
use std::sync::Arc;

use crate::error::{InvalidName, LockError};

mod glob;
mod keys;

pub use glob::escape_glob;
pub(crate) use glob::glob_matches;
pub(crate) use keys::{KeyKind, LockKeys, NameKeys, RwKeys, SemaphoreKeys};

/// The longest lock name accepted, in bytes, after escaping.
pub const MAX_NAME_LEN: usize = 512;

/// A validated lock name.
///
/// Cheap to clone. Build one from a plain string (trusted, validated but not escaped) or with
/// [`LockName::builder`] from literal text and escaped values.
///
/// ```
/// use dlock_core::LockName;
///
/// let user_id = "1:admin";
/// let name = LockName::builder().literal("order:").value(user_id).build()?;
/// assert_eq!(name.as_str(), "order:1%3Aadmin");
/// # Ok::<(), dlock_core::LockError>(())
/// ```
#[derive(Clone)]
pub struct LockName {
    name: Arc<str>,
    /// Kept out of logs, spans and metric labels (not part of the name's identity).
    hidden: bool,
    /// The template the name was made from, for its metrics (not part of its identity).
    template: Option<&'static str>,
}

impl PartialEq for LockName {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

impl Eq for LockName {}

impl std::hash::Hash for LockName {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.name.hash(state);
    }
}

impl PartialOrd for LockName {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for LockName {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.name.cmp(&other.name)
    }
}

impl LockName {
    /// Validates `name` as trusted literal text (no escaping).
    pub fn new(name: impl AsRef<str>) -> Result<Self, LockError> {
        let name = name.as_ref();
        if !name.is_empty() && name.len() <= MAX_NAME_LEN && literal_error(name, 0).is_none() {
            // Valid as it is: one allocation, not a builder's buffer and then a copy.
            return Ok(LockName {
                name: Arc::from(name),
                hidden: false,
                template: None,
            });
        }
        let mut builder = NameBuilder::new();
        builder.push_literal(name);
        builder.build()
    }

    /// Starts a name made of literal text and escaped values.
    pub fn builder() -> NameBuilder {
        NameBuilder::new()
    }

    /// The empty name, which no lock has: what a guard of no locks names.
    pub(crate) fn empty() -> Self {
        Self {
            name: Arc::from(""),
            hidden: false,
            template: None,
        }
    }

    /// The name as a string (escaped values included).
    pub fn as_str(&self) -> &str {
        &self.name
    }

    /// The same name, kept out of dlock's logs, spans and metric labels when `hide` is true
    /// (they show `<hidden>`): for names that carry personal data. Errors returned to the
    /// caller still carry the name. Equality, hashing and order ignore it.
    pub fn hidden(mut self, hide: bool) -> Self {
        self.hidden = hide;
        self
    }

    /// Whether the name is kept out of logs, spans and metric labels (see
    /// [`hidden`](Self::hidden)).
    pub fn is_hidden(&self) -> bool {
        self.hidden
    }

    /// The same name, marked as made from `template` (`"order:<user_id>"`): dlock's metrics
    /// of it carry the label `key` with the template, which takes few values where the name
    /// takes as many as there are users (see [`crate::metrics`]). `#[distributed_lock]` marks
    /// every name it builds with its `key`. Equality, hashing and order ignore it.
    pub fn with_template(mut self, template: &'static str) -> Self {
        self.template = Some(template);
        self
    }

    /// The template the name was made from, if it says (see
    /// [`with_template`](Self::with_template)).
    pub fn template(&self) -> Option<&'static str> {
        self.template
    }

    /// The name as logs, spans and metric labels may show it.
    pub(crate) fn for_logs(&self) -> &str {
        if self.hidden { HIDDEN } else { &self.name }
    }
}

/// What logs show instead of a hidden name.
pub(crate) const HIDDEN: &str = "<hidden>";

impl fmt::Debug for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.name, f)
    }
}

impl fmt::Display for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

impl AsRef<str> for LockName {
    fn as_ref(&self) -> &str {
        &self.name
    }
}

/// Builds a [`LockName`] from trusted literal text and untrusted, escaped values.
///
/// Errors are collected and reported by [`build`](NameBuilder::build), so a builder can be
/// chained without `?` at every step.
#[derive(Debug, Clone, Default)]
pub struct NameBuilder {
    buf: String,
    /// Where the last value ended, if any value was written.
    value_end: Option<usize>,
    /// Whether the literal text since the last value holds a separator.
    separated: bool,
    error: Option<InvalidName>,
}

/// Why `text` can't be literal name text (`offset`: where it starts in the name), if it can't.
fn literal_error(text: &str, offset: usize) -> Option<InvalidName> {
    for (index, ch) in text.char_indices() {
        if ch.is_control() {
            return Some(InvalidName::ControlCharacter {
                index: offset + index,
            });
        }
        if ch == '{' || ch == '}' {
            return Some(InvalidName::ReservedCharacter { ch });
        }
    }
    None
}

impl NameBuilder {
    /// An empty builder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends trusted literal text (validated, not escaped).
    pub fn literal(mut self, text: &str) -> Self {
        self.push_literal(text);
        self
    }

    /// Appends an untrusted value, formatted with `Display` and escaped.
    pub fn value(mut self, value: impl fmt::Display) -> Self {
        self.push_value(value);
        self
    }

    /// Appends trusted literal text in place.
    pub fn push_literal(&mut self, text: &str) -> &mut Self {
        if self.error.is_some() {
            return self;
        }
        if let Some(err) = literal_error(text, self.buf.len()) {
            self.error = Some(err);
            return self;
        }
        self.buf.push_str(text);
        if text.bytes().any(is_separator) {
            self.separated = true;
        }
        self
    }

    /// Appends an untrusted value in place, formatted with `Display` and escaped.
    pub fn push_value(&mut self, value: impl fmt::Display) -> &mut Self {
        if self.error.is_some() {
            return self;
        }
        if let (Some(end), false) = (self.value_end, self.separated) {
            self.buf.insert(end, ':');
        }
        let start = self.buf.len();
        let mut escaper = Escaper {
            out: &mut self.buf,
            error: None,
            offset: start,
        };
        // Writing into a String cannot fail; the escaper reports its own errors.
        let _ = write!(escaper, "{value}");
        if let Some(err) = escaper.error {
            self.error = Some(err);
        }
        self.value_end = Some(self.buf.len());
        self.separated = false;
        self
    }

    /// Validates the whole name.
    pub fn build(self) -> Result<LockName, LockError> {
        if let Some(err) = self.error {
            return Err(LockError::InvalidName(err));
        }
        if self.buf.is_empty() {
            return Err(LockError::InvalidName(InvalidName::Empty));
        }
        if self.buf.len() > MAX_NAME_LEN {
            return Err(LockError::InvalidName(InvalidName::TooLong {
                len: self.buf.len(),
                max: MAX_NAME_LEN,
            }));
        }
        Ok(LockName {
            name: Arc::from(self.buf),
            hidden: false,
            template: None,
        })
    }
}

/// Percent-encodes everything outside `[A-Za-z0-9_.-]`, rejecting control characters.
struct Escaper<'a> {
    out: &'a mut String,
    error: Option<InvalidName>,
    offset: usize,
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

fn is_plain(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'.' || b == b'-'
}

/// A byte that an escaped value never contains.
fn is_separator(b: u8) -> bool {
    !is_plain(b) && b != b'%'
}

impl fmt::Write for Escaper<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        if self.error.is_some() {
            return Ok(());
        }
        for ch in s.chars() {
            if ch.is_control() {
                self.error = Some(InvalidName::ControlCharacter {
                    index: self.offset + self.out.len().saturating_sub(self.offset),
                });
                return Ok(());
            }
            let mut utf8 = [0u8; 4];
            for &b in ch.encode_utf8(&mut utf8).as_bytes() {
                if is_plain(b) {
                    self.out.push(b as char);
                } else {
                    self.out.push('%');
                    self.out.push(HEX[usize::from(b >> 4)] as char);
                    self.out.push(HEX[usize::from(b & 0xF)] as char);
                }
            }
            if self.out.len() > MAX_NAME_LEN * 4 {
                // Stop early on absurdly long values; `build` reports the length.
                return Ok(());
            }
        }
        Ok(())
    }
}

/// Anything that can name a lock: a `&str`/`String` (trusted literal text) or a [`LockName`].
pub trait IntoLockName {
    /// Converts into a validated name.
    fn into_lock_name(self) -> Result<LockName, LockError>;
}

impl IntoLockName for LockName {
    fn into_lock_name(self) -> Result<LockName, LockError> {
        Ok(self)
    }
}

impl IntoLockName for &LockName {
    fn into_lock_name(self) -> Result<LockName, LockError> {
        Ok(self.clone())
    }
}

impl IntoLockName for &str {
    fn into_lock_name(self) -> Result<LockName, LockError> {
        LockName::new(self)
    }
}

impl IntoLockName for String {
    fn into_lock_name(self) -> Result<LockName, LockError> {
        LockName::new(self)
    }
}

impl IntoLockName for &String {
    fn into_lock_name(self) -> Result<LockName, LockError> {
        LockName::new(self)
    }
}

impl IntoLockName for Result<LockName, LockError> {
    fn into_lock_name(self) -> Result<LockName, LockError> {
        self
    }
}

/// Validates a key prefix: no control characters, no braces.
pub(crate) fn validate_prefix(prefix: &str) -> Result<(), LockError> {
    if prefix
        .chars()
        .any(|c| c.is_control() || c == '{' || c == '}')
    {
        return Err(LockError::Config(format!(
            "key prefix {prefix:?} must not contain control characters or braces"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn build(parts: &[(bool, &str)]) -> Result<LockName, LockError> {
        let mut b = NameBuilder::new();
        for (is_value, s) in parts {
            if *is_value {
                b.push_value(s);
            } else {
                b.push_literal(s);
            }
        }
        b.build()
    }

    #[test]
    fn escapes_separators_in_values() {
        let a = build(&[(false, "order:"), (true, "1:admin")]).unwrap();
        let b = build(&[(false, "order:"), (true, "1"), (false, ":admin")]).unwrap();
        assert_eq!(a.as_str(), "order:1%3Aadmin");
        assert_ne!(a, b);
    }

    #[test]
    fn adjacent_values_are_separated() {
        let a = build(&[(true, "1"), (true, "23")]).unwrap();
        let b = build(&[(true, "12"), (true, "3")]).unwrap();
        assert_ne!(a, b);
        assert_eq!(a.as_str(), "1:23");
        // A literal without a separator between values gets one, too.
        let a = build(&[(true, "1-2"), (false, "-"), (true, "3")]).unwrap();
        let b = build(&[(true, "1"), (false, "-"), (true, "2-3")]).unwrap();
        assert_ne!(a, b);
        assert_eq!(a.as_str(), "1-2:-3");
        // A literal with a separator is left alone.
        let c = build(&[(false, "order:"), (true, "7"), (false, ":"), (true, "9")]).unwrap();
        assert_eq!(c.as_str(), "order:7:9");
    }

    #[test]
    fn rejects_bad_names() {
        assert!(matches!(
            LockName::new(""),
            Err(LockError::InvalidName(InvalidName::Empty))
        ));
        assert!(matches!(
            LockName::new("a\nb"),
            Err(LockError::InvalidName(InvalidName::ControlCharacter {
                index: 1
            }))
        ));
        assert!(matches!(
            LockName::new("a{b}"),
            Err(LockError::InvalidName(InvalidName::ReservedCharacter {
                ch: '{'
            }))
        ));
        assert!(matches!(
            LockName::new("x".repeat(MAX_NAME_LEN + 1)),
            Err(LockError::InvalidName(InvalidName::TooLong { .. }))
        ));
        assert!(LockName::new("x".repeat(MAX_NAME_LEN)).is_ok());
        assert!(matches!(
            build(&[(false, "a:"), (true, "x\u{7}y")]),
            Err(LockError::InvalidName(InvalidName::ControlCharacter {
                index: 3
            }))
        ));
        // Braces in values are escaped, not rejected.
        assert_eq!(
            build(&[(false, "a:"), (true, "{x}")]).unwrap().as_str(),
            "a:%7Bx%7D"
        );
    }

    #[test]
    fn keys_share_one_hash_tag() {
        let name = LockName::new("order:1").unwrap();
        let keys = LockKeys::new("dlock:", &name);
        assert_eq!(keys.lock, "dlock:{order:1}");
        assert_eq!(keys.fence(), "dlock:{order:1}:fence");
        assert_eq!(keys.channel(), "dlock:{order:1}:wake");
    }

    /// A template: literal text between value slots (possibly empty, so values can be adjacent).
    fn template() -> impl Strategy<Value = Vec<String>> {
        prop::collection::vec("[a-z:/|%.-]{0,3}", 1..5)
    }

    fn render(template: &[String], values: &[String]) -> Option<String> {
        let mut b = NameBuilder::new();
        for (i, lit) in template.iter().enumerate() {
            b.push_literal(lit);
            if let (Some(v), true) = (values.get(i), i + 1 < template.len()) {
                b.push_value(v);
            }
        }
        b.build().ok().map(|n| n.as_str().to_owned())
    }

    proptest! {
        /// Distinct value tuples never give the same name under one template.
        #[test]
        fn escaping_is_injective(
            template in template(),
            a in prop::collection::vec("(\\PC|[:%{}])*", 4),
            b in prop::collection::vec("(\\PC|[:%{}])*", 4),
        ) {
            let slots = template.len() - 1;
            let (a, b) = (&a[..slots], &b[..slots]);
            prop_assume!(a != b);
            if let (Some(x), Some(y)) = (render(&template, a), render(&template, b)) {
                prop_assert_ne!(x, y);
            }
        }

        /// Near-collisions: the same characters moved across a value boundary.
        #[test]
        fn shifting_characters_between_values_changes_the_name(
            template in template(),
            s in "[a-z0-9:%.-]{0,12}",
            cut1 in 0usize..13,
            cut2 in 0usize..13,
        ) {
            prop_assume!(template.len() >= 3);
            let c1 = cut1.min(s.len());
            let c2 = cut2.min(s.len());
            prop_assume!(c1 != c2);
            let a = vec![s[..c1].to_owned(), s[c1..].to_owned()];
            let b = vec![s[..c2].to_owned(), s[c2..].to_owned()];
            let t = &template[..3];
            if let (Some(x), Some(y)) = (render(t, &a), render(t, &b)) {
                prop_assert_ne!(x, y);
            }
        }
    }
}
