//! Which layout of the keys this version writes and reads, and an earlier layout's scripts,
//! frozen, for the tests that run `Locker`s of two versions side by side.
//!
//! A layout is the format of everything the scripts keep in Redis for a name. Every token a
//! `Locker` writes — owner tokens, hand-over tokens, its own id in claims, the members of
//! readers, permits and waiting lines — starts with its layout's tag, [`TAG`]. Layout 1 (the
//! first) wrote untagged tokens. This layout speaks layouts 1 and 2: it reads, waits for,
//! passes turns to and writes over both. A hold whose token is tagged with any other layout is
//! *foreign*: an attempt finds it busy and writes nothing on it (no flag, no claim), so nothing
//! a later version keeps in the key is changed by this one; release, renewal and extension are
//! owner-checked, and never match it. The waiter then polls (no release will wake it), logs a
//! warning once, counts `dlock_foreign_layout_total`, and at its deadline fails with
//! [`LockError::HeldInForeignLayout`](crate::LockError::HeldInForeignLayout).

use std::fmt;

use super::Lua;

/// The layout this version writes.
pub const LAYOUT: u32 = 2;

/// What every token this layout writes starts with: `v`, the layout's number, `/`.
pub const TAG: &str = "v2/";

/// An earlier layout's scripts, each as the server got it from that version, and the tag (if
/// any) that version's tokens start with: a `Locker` built with it (see
/// `LockerBuilder::frozen_layout`) runs them instead of this version's, on one server, so
/// tests can run `Locker`s of two versions against one Redis. Not for applications.
#[doc(hidden)]
pub struct FrozenLayout {
    tag: &'static str,
    /// This version's script, and the frozen one that stands in for it.
    scripts: Vec<(&'static Lua, Lua)>,
}

impl FrozenLayout {
    /// The layout whose tokens start with `tag` (`""`: untagged, layout 1) and whose scripts
    /// are `scripts` (each by its name in this version, `ACQUIRE`, …, and its text). Every
    /// script this version runs needs its frozen counterpart; a missing one is named in the
    /// error. Kept for the life of the process.
    pub fn leak(
        tag: &'static str,
        scripts: &[(&str, &str)],
    ) -> Result<&'static FrozenLayout, String> {
        let mut frozen = Vec::new();
        for (name, current) in super::all_scripts() {
            let Some((_, text)) = scripts.iter().find(|(n, _)| *n == name) else {
                return Err(format!("the frozen layout has no script {name}"));
            };
            frozen.push((current, Lua::from_text((*text).to_owned())));
        }
        Ok(Box::leak(Box::new(FrozenLayout {
            tag,
            scripts: frozen,
        })))
    }

    /// What this layout's tokens start with.
    pub(crate) fn tag(&self) -> &'static str {
        self.tag
    }

    /// The frozen script that stands in for this version's `current`.
    pub(crate) fn script_for(&'static self, current: &'static Lua) -> &'static Lua {
        self.scripts
            .iter()
            .find(|(c, _)| std::ptr::eq(*c, current))
            .map_or(current, |(_, frozen)| frozen)
    }
}

impl fmt::Debug for FrozenLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FrozenLayout")
            .field("tag", &self.tag)
            .field("scripts", &self.scripts.len())
            .finish()
    }
}

/// The layout a token is in, by its tag: `Some(1)` for an untagged token.
pub fn layout_of(token: &str) -> Option<u32> {
    match token.strip_prefix('v') {
        Some(rest) => rest.split_once('/')?.0.parse().ok(),
        None => Some(1),
    }
}

/// Whether this version speaks the layout `token` is in (its own, or layout 1).
pub fn speaks(token: &str) -> bool {
    matches!(layout_of(token), Some(1 | LAYOUT))
}

#[cfg(test)]
mod tests {
    use super::{layout_of, speaks};

    #[test]
    fn a_tokens_layout_is_its_tag() {
        assert_eq!(layout_of("0123abcd"), Some(1));
        assert_eq!(layout_of("v2/0123abcd@host"), Some(2));
        assert_eq!(layout_of("v3/0123abcd"), Some(3));
        assert!(speaks("0123abcd") && speaks("v2/0123"));
        assert!(!speaks("v3/0123") && !speaks("v10/0123"));
    }
}
