//! The bounds of the API, checked at the edge: every number and text that reaches the database
//! is inside them, so sums and totals can't overflow and every number the API answers is exact
//! in JavaScript.

use unicode_properties::{GeneralCategory, UnicodeGeneralCategory as _};

use crate::AppError;

/// The largest integer a JavaScript number holds exactly (2⁵³ − 1): the API's numbers stay at or
/// below it.
pub const MAX_SAFE_INTEGER: i64 = 9_007_199_254_740_991;
/// A price: 0 to 1,000,000.00 (in cents).
pub const MAX_PRICE_CENTS: i64 = 100_000_000;
/// A voucher's or a SKU's stock: 0 to 1,000,000.
pub const MAX_STOCK: i64 = 1_000_000;
/// How many of one SKU a cart holds, and one addition adds: 1 to 100.
pub const MAX_QTY: i64 = 100;
/// How many different SKUs a cart holds (and so how many SKU locks a checkout takes).
pub const MAX_CART_LINES: i64 = 20;
/// A user's name: 1 to 40 characters after trimming.
pub const MAX_USER_NAME: usize = 40;
/// A SKU's name: 1 to 80 characters after trimming.
pub const MAX_SKU_NAME: usize = 80;
/// A voucher's title: 1 to 120 characters after trimming.
pub const MAX_TITLE: usize = 120;
/// The largest request body the API reads (bigger ones: 413).
pub const MAX_BODY_BYTES: usize = 16 * 1024;
/// How long a request body may take to arrive, whole (slower ones: 408).
pub const BODY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// `id` is an id: 1 to 2⁵³ − 1.
pub fn id(what: &str, id: i64) -> Result<i64, AppError> {
    if (1..=MAX_SAFE_INTEGER).contains(&id) {
        Ok(id)
    } else {
        Err(AppError::BadRequest(format!(
            "{what} must be a whole number from 1 to {MAX_SAFE_INTEGER}"
        )))
    }
}

/// `value` is within `min..=max`.
pub fn within(what: &str, value: i64, min: i64, max: i64) -> Result<i64, AppError> {
    if (min..=max).contains(&value) {
        Ok(value)
    } else {
        Err(AppError::BadRequest(format!(
            "{what} must be from {min} to {max}"
        )))
    }
}

/// `text`, trimmed: not blank, at most `max` characters, no control characters (NUL, newlines,
/// escapes: nothing that a database, a log line or a page would read differently) and no format
/// characters (Unicode category Cf: bidi overrides such as U+202E that show a name backwards,
/// zero-width spaces and joiners that make two names look alike, soft hyphens).
pub fn text(what: &str, text: &str, max: usize) -> Result<String, AppError> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err(AppError::BadRequest(format!("{what} must not be blank")));
    }
    if trimmed.chars().count() > max {
        return Err(AppError::BadRequest(format!(
            "{what} must be at most {max} characters"
        )));
    }
    if trimmed.chars().any(char::is_control) {
        return Err(AppError::BadRequest(format!(
            "{what} must not contain control characters"
        )));
    }
    if let Some(c) = trimmed.chars().find(|c| is_format(*c)) {
        return Err(AppError::BadRequest(format!(
            "{what} must not contain invisible format characters (U+{:04X})",
            u32::from(c)
        )));
    }
    Ok(trimmed.to_owned())
}

/// Whether `c` is a Unicode format character (general category Cf): it changes how the text
/// around it is shown (direction, joining, breaking) without being seen itself.
fn is_format(c: char) -> bool {
    c.general_category() == GeneralCategory::Format
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_are_trimmed_bounded_and_printable() {
        assert_eq!(text("name", "  alice ", 40).unwrap(), "alice");
        assert!(text("name", "   ", 40).is_err());
        assert!(text("name", "a\0b", 40).is_err());
        assert!(text("name", "a\u{1b}[31m", 40).is_err());
        assert!(text("name", &"é".repeat(40), 40).is_ok());
        assert!(text("name", &"é".repeat(41), 40).is_err());
    }

    #[test]
    fn format_characters_are_refused() {
        // Right-to-left override, zero-width joiner, zero-width space, byte-order mark, soft
        // hyphen, a tag character.
        for bad in [
            "evil\u{202E}gpj.exe",
            "a\u{200D}b",
            "a\u{200B}b",
            "\u{FEFF}a",
            "soft\u{AD}",
            "a\u{E0041}",
        ] {
            let err = text("name", bad, 40).unwrap_err();
            assert!(
                err.to_string().contains("format characters"),
                "{bad:?}: {err}"
            );
        }
        // Letters of other scripts, marks and emoji without joiners stay welcome.
        for good in ["Zoë", "日本語", "עברית", "Ω≈ç", "☕", "e\u{301}"] {
            assert!(text("name", good, 40).is_ok(), "{good:?}");
        }
    }

    #[test]
    fn ids_and_bounds() {
        assert!(id("user", 0).is_err());
        assert!(id("user", -3).is_err());
        assert!(id("user", MAX_SAFE_INTEGER + 1).is_err());
        assert_eq!(id("user", 7).unwrap(), 7);
        assert!(within("qty", 101, 1, MAX_QTY).is_err());
        assert!(within("qty", i64::MAX, 1, MAX_QTY).is_err());
    }
}
