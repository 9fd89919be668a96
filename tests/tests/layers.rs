//! The layers of `dlock-core`, as ARCHITECTURE.md lists them, hold in its `use` lines: a
//! module imports only from modules in layers below its own, apart from the exceptions
//! ARCHITECTURE.md lists as work still to do — and an exception that no longer happens must be
//! struck from that list, so that it only ever shrinks.
//!
//! Imports are read from the text, not by the compiler: every `crate::<module>` path, every
//! `super::<module>` path of a file at the crate's top, and every `crate::<Item>` that the crate
//! root re-exports from a module (`pub use module::Item`) counts, in code and in `use` lines,
//! outside comments and outside the `#[cfg(test)]` module at a file's end. Imports between a
//! module and its own children are the module's business and are not read.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The workspace's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ sits in the workspace")
        .to_owned()
}

/// The lines of the fenced block of ARCHITECTURE.md whose info string is `tag`.
fn block(doc: &str, tag: &str) -> Vec<String> {
    let open = format!("```{tag}");
    let start = doc
        .lines()
        .position(|l| l.trim() == open)
        .unwrap_or_else(|| panic!("ARCHITECTURE.md has no ```{tag} block"));
    doc.lines()
        .skip(start + 1)
        .take_while(|l| l.trim() != "```")
        .map(|l| l.trim().to_owned())
        .filter(|l| !l.is_empty())
        .collect()
}

/// Each module's layer (0: the lowest), from the `layers` block: one layer a line, lowest first,
/// written `<layer name>: <module> <module> ...`.
fn layers(doc: &str) -> BTreeMap<String, usize> {
    let mut layer_of = BTreeMap::new();
    for (layer, line) in block(doc, "layers").iter().enumerate() {
        let (_, modules) = line
            .split_once(':')
            .unwrap_or_else(|| panic!("a layer line names its layer: `{line}`"));
        for module in modules.split_whitespace() {
            let before = layer_of.insert(module.to_owned(), layer);
            assert!(before.is_none(), "`{module}` is in two layers");
        }
    }
    layer_of
}

/// The exceptions, from the `upward` block: `<module> -> <module>` a line.
fn exceptions(doc: &str) -> BTreeSet<(String, String)> {
    block(doc, "upward")
        .iter()
        .map(|line| {
            let (from, to) = line
                .split_once("->")
                .unwrap_or_else(|| panic!("an exception reads `a -> b`: `{line}`"));
            (from.trim().to_owned(), to.trim().to_owned())
        })
        .collect()
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("read the source folder") {
        let path = entry.expect("a folder entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The identifier at the start of `text`.
fn ident(text: &str) -> &str {
    let end = text
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(text.len());
    &text[..end]
}

/// Which module the crate root re-exports each item from (`pub use module::{A, B}`).
fn re_exports(lib: &str) -> BTreeMap<String, String> {
    let mut from = BTreeMap::new();
    let mut statement = String::new();
    for line in lib.lines() {
        if statement.is_empty() && !line.starts_with("pub use ") {
            continue;
        }
        statement.push_str(line);
        if !line.trim_end().ends_with(';') {
            continue;
        }
        let body = statement
            .trim_start_matches("pub use ")
            .trim_end_matches(';');
        if let Some((module, items)) = body.split_once("::") {
            let items = items.trim_matches(|c| c == '{' || c == '}' || c == ' ');
            for item in items.split(',') {
                let item = ident(item.trim());
                if !item.is_empty() {
                    from.insert(item.to_owned(), module.trim().to_owned());
                }
            }
        }
        statement.clear();
    }
    from
}

/// The top modules each top module imports from, with one place each import is made.
fn imports(src: &Path, modules: &BTreeSet<String>) -> BTreeMap<(String, String), String> {
    let lib = fs::read_to_string(src.join("lib.rs")).expect("read lib.rs");
    let items = re_exports(&lib);
    let mut files = Vec::new();
    sources(src, &mut files);
    let mut edges = BTreeMap::new();
    for file in files {
        let rel = file.strip_prefix(src).expect("under src");
        let first = rel.components().next().expect("a path");
        let top = first
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_owned();
        if top == "lib" {
            continue;
        }
        // `super::` of a file at the top names the crate root; deeper, it stays in `top`.
        let at_top = rel.components().count() == 1;
        let text = fs::read_to_string(&file).expect("read a source file");
        for (n, line) in text.lines().enumerate() {
            if line.starts_with("#[cfg(test)]") {
                break;
            }
            let code = line.trim_start();
            if code.starts_with("//") {
                continue;
            }
            let mut roots = vec!["crate::"];
            if at_top {
                roots.push("super::");
            }
            for root in roots {
                for (at, _) in code.match_indices(root) {
                    // `super::` at the end of `super::super::` was counted with the first.
                    let before = &code[..at];
                    if before.ends_with(':') || before.ends_with(|c: char| c.is_alphanumeric()) {
                        continue;
                    }
                    let rest = &code[at + root.len()..];
                    let mut named = vec![ident(rest).to_owned()];
                    // `use crate::{a::X, b::Y}`.
                    if let Some(group) = rest.strip_prefix('{') {
                        let group = group.split('}').next().unwrap_or("");
                        named = group
                            .split(',')
                            .map(|p| ident(p.trim()).to_owned())
                            .collect();
                    }
                    for name in named {
                        let module = if modules.contains(&name) {
                            name
                        } else if let Some(module) = items.get(&name) {
                            module.clone()
                        } else {
                            continue;
                        };
                        if module != top {
                            let place = format!("{}:{}", rel.display(), n + 1);
                            edges.entry((top.clone(), module)).or_insert(place);
                        }
                    }
                }
            }
        }
    }
    edges
}

#[test]
fn dlock_core_imports_point_down_its_layers() {
    let root = root();
    let doc = fs::read_to_string(root.join("ARCHITECTURE.md")).expect("read ARCHITECTURE.md");
    let layer_of = layers(&doc);
    let allowed = exceptions(&doc);
    let src = root.join("dlock-core/src");
    let lib = fs::read_to_string(src.join("lib.rs")).expect("read lib.rs");
    let declared: BTreeSet<String> = lib
        .lines()
        .filter_map(|l| {
            let l = l.trim_start_matches("pub ");
            l.strip_prefix("mod ")
                .map(|m| m.trim_end_matches(';').to_owned())
        })
        .collect();
    let listed: BTreeSet<String> = layer_of.keys().cloned().collect();
    assert_eq!(
        declared, listed,
        "ARCHITECTURE.md's layers list every top module of dlock-core, and only those"
    );
    let edges = imports(&src, &declared);
    let mut upward = Vec::new();
    let mut seen = BTreeSet::new();
    for ((from, to), place) in &edges {
        if layer_of[to] < layer_of[from] {
            continue;
        }
        seen.insert((from.clone(), to.clone()));
        if !allowed.contains(&(from.clone(), to.clone())) {
            upward.push(format!("{from} -> {to} (at {place})"));
        }
    }
    assert!(
        upward.is_empty(),
        "dlock-core imports against its layers (ARCHITECTURE.md): {upward:#?}"
    );
    let struck: Vec<_> = allowed.difference(&seen).collect();
    assert!(
        struck.is_empty(),
        "exceptions ARCHITECTURE.md lists that no longer happen (strike them): {struck:?}"
    );
}

#[test]
fn the_import_reader_sees_paths_groups_and_re_exports() {
    let items = re_exports("pub use error::{BackendError, LockError};\npub use guard::Lost;\n");
    assert_eq!(items["LockError"], "error");
    assert_eq!(items["Lost"], "guard");
    assert_eq!(ident("guard::Lost"), "guard");
}
