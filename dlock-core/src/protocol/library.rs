//! The protocol's scripts as one library of Redis functions: loaded once per server with
//! `FUNCTION LOAD`, each script then called by name with `FCALL`.
//!
//! Why: a script sent with `EVALSHA` runs its whole text on every call, and that includes
//! defining every helper it includes (the hold codec alone is some twenty functions). That
//! setup costs the server more than the commands the script runs. A library defines its helpers
//! once, when it is loaded; a call runs only its script's own lines.
//!
//! The library is made from the very files the `EVAL` texts are made from: the helpers of
//! `lua/lib/`, each once, in [`HELPERS`]'s order, then each script's lines (its `--@include`
//! lines left out) as the body of a function `function(KEYS, ARGV) … end`, so a script reads
//! the same in both forms. A script's `--@flags` line gives its function's flags: `no-writes`
//! for a check that writes nothing, `allow-oom` for a script that gives something back (a
//! release must work on a server out of memory, as it does with `EVALSHA`, where only writes
//! that add data are refused).
//!
//! The library's name and its functions' names carry a hash of the scripts
//! (`dlock_<hash>`, `dlock_<hash>_acquire`, …), so two versions of dlock on one server each
//! call their own, as two versions' `EVALSHA`s do; a server that lacks the library answers
//! "Function not found", and the caller loads it and calls again, as it does after `NOSCRIPT`.

use std::fmt::Write as _;
use std::sync::LazyLock;

use super::all_scripts;

/// The helpers, in the order the library defines them: each may use only those before it.
pub(super) const HELPERS: &[&str] = &["clock", "sorted_sets", "hold", "fence", "let_go"];

/// The library: its name and its text, as `FUNCTION LOAD` takes it.
pub(crate) struct Library {
    name: String,
    text: String,
}

impl Library {
    /// What `FUNCTION LOAD` takes.
    pub(crate) fn text(&self) -> &str {
        &self.text
    }

    /// The function that runs the script `name` (`ACQUIRE`, …).
    pub(crate) fn function(&self, name: &str) -> String {
        function_name(&self.name, name)
    }
}

/// The function of the library `library` that runs the script `script`.
fn function_name(library: &str, script: &str) -> String {
    format!("{library}_{}", script.to_ascii_lowercase())
}

/// This version's library.
pub(crate) static LIBRARY: LazyLock<Library> = LazyLock::new(|| {
    let scripts: Vec<_> = all_scripts().collect();
    // Named by the scripts it runs: any change to one is a new library.
    let mut all = String::new();
    for (name, lua) in &scripts {
        all.push_str(name);
        all.push_str(lua.text());
    }
    let hash = redis::Script::new(&all).get_hash().to_owned();
    let name = format!("dlock_{}", &hash[..16]);
    let mut text = format!("#!lua name={name}\n");
    for helper in HELPERS {
        if let Some(file) = super::helper(helper) {
            text.push_str(&super::compose(file));
        }
    }
    for (script, lua) in &scripts {
        let _ = write!(
            text,
            "redis.register_function{{function_name='{}', callback=function(KEYS, ARGV)\n{}end, flags={{{}}}}}\n",
            function_name(&name, script),
            lua.body(),
            lua.flags()
                .iter()
                .map(|f| format!("'{f}'"))
                .collect::<Vec<_>>()
                .join(", "),
        );
    }
    Library { name, text }
});

/// A script's `--@flags` line: its function's flags.
pub(super) fn flags(file: &str) -> Vec<String> {
    (file.lines())
        .filter_map(|line| line.trim_start().strip_prefix("--@flags "))
        .flat_map(|flags| flags.split_whitespace().map(str::to_owned))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{HELPERS, LIBRARY};
    use crate::protocol::{ALL, helper};

    /// Every helper a script includes is in the library, and every script is a function of it.
    #[test]
    fn the_library_has_every_helper_and_every_script() {
        for (name, _) in ALL {
            assert!(
                LIBRARY
                    .text()
                    .contains(&format!("function_name='{}'", LIBRARY.function(name))),
                "{name}"
            );
        }
        for helper_name in HELPERS {
            assert!(helper(helper_name).is_some(), "{helper_name}");
        }
        assert!(!LIBRARY.text().contains("--@include"));
        assert!(LIBRARY.text().starts_with("#!lua name=dlock_"));
    }

    /// A script's flags are the ones a function may have.
    #[test]
    fn flags_are_known() {
        for (name, lua) in ALL {
            for flag in lua.flags() {
                assert!(
                    ["no-writes", "allow-oom"].contains(&flag.as_str()),
                    "{name}: {flag}"
                );
            }
        }
    }
}
