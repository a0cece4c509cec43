//! The module layering, checked: reads every file under `src/` and the
//! `crate::`, `super::` and `self::` paths in its code (comments and the
//! inline `#[cfg(test)] mod tests` are skipped), and fails when a core
//! module imports the SPANK front end (`spank`), anything of the library
//! reaches into `src/bin/`, a top-level module imports one above it in
//! [`LAYERS`], or modules (top-level ones, or files) import each other in a
//! circle that is not one of [`KNOWN_CIRCLES`] or [`KNOWN_FILE_CIRCLES`].
//! The allowed order is drawn in docs/ARCHITECTURE.md ("Layers"), which the
//! test reads too.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The known exceptions, all in one place: circles allowed to exist, each
/// as its sorted module names. Issue 15's circles are gone (the `src/step/`
/// extraction, the callback guard in a file of its own, `units.rs` and
/// `fsutil.rs` up to `src/`, the injection the holder applies moved into
/// `container::injection`), so both lists are empty: any circle fails.
///
/// Between top-level modules:
const KNOWN_CIRCLES: &[&[&str]] = &[];

/// Between files (module paths, `spank::remote`; a folder's `mod.rs` is the
/// folder's name):
const KNOWN_FILE_CIRCLES: &[&[&str]] = &[];

/// The allowed order of the top-level modules, top down, each layer with
/// its label in docs/ARCHITECTURE.md: a module imports only modules of its
/// own layer or of one below. A new top-level module must be given a layer.
const LAYERS: &[(&str, &[&str])] = &[
    ("front ends", &["spank"]),
    ("step", &["step"]),
    ("checks", &["doctor"]),
    ("node work", &["named", "fanout", "puller"]),
    ("helpers", &["helper"]),
    ("config", &["config", "enroot_site"]),
    ("injection", &["inject"]),
    ("containers", &["container"]),
    ("images", &["store", "image"]),
    ("registry", &["registry"]),
    (
        "base",
        &[
            "reference",
            "privilege",
            "interrupt",
            "stop_signal",
            "slurm_commands",
            "slurm_conf",
            "safepath",
            "seal",
            "test_support",
            "units",
            "fsutil",
            "root_files",
            "fdpass",
        ],
    ),
];

/// The front ends: nothing else may import them. (The scan skips `lib.rs`
/// and this file, whose strings name modules.)
const FRONT_ENDS: &[&str] = &["spank"];

/// Top-level module of each file, and the top-level modules its code names.
fn imports() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut stack = vec![src.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                if path != src.join("bin") {
                    stack.push(path);
                }
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let relative = path.strip_prefix(&src).unwrap();
            let first = relative.components().next().unwrap();
            let top = first.as_os_str().to_string_lossy();
            let top = top.strip_suffix(".rs").unwrap_or(&top).to_string();
            if top == "lib" || top == "layering" {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let names = graph.entry(top.clone()).or_default();
            for name in crate_paths(&code_of(&text)) {
                if name != top {
                    names.insert(name);
                }
            }
        }
    }
    graph
}

/// `text` without `//` comments (line, doc and module doc comments).
fn code_of(text: &str) -> String {
    text.lines()
        .map(|line| match line.find("//") {
            // A `//` inside a string ("http://...") is kept with its line.
            Some(at) if line[..at].matches('"').count() % 2 == 0 => &line[..at],
            _ => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The first segment after each `crate::` in `code`, including the names
/// inside `use crate::{a::x, b}`.
fn crate_paths(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let group = &group[..group.find('}').unwrap_or(group.len())];
            for item in group.split(',') {
                let name = ident(item.trim());
                if !name.is_empty() && name != "self" {
                    out.insert(name);
                }
            }
        } else {
            let name = ident(rest);
            if !name.is_empty() {
                out.insert(name);
            }
        }
    }
    out
}

/// The strongly connected groups of more than one module, each sorted.
fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> BTreeSet<Vec<String>> {
    let reaches = |from: &str, to: &str| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.to_string()];
        while let Some(node) = todo.pop() {
            if node == to {
                return true;
            }
            if seen.insert(node.clone()) {
                todo.extend(graph.get(&node).into_iter().flatten().cloned());
            }
        }
        false
    };
    graph
        .keys()
        .map(|a| {
            graph
                .keys()
                .filter(|b| reaches(a, b) && reaches(b, a))
                .cloned()
                .collect::<Vec<_>>()
        })
        .filter(|group| group.len() > 1)
        .collect()
}

/// Every library file under `src/` (not `src/bin/`, `lib.rs` or this file)
/// as its module path (`spank::remote`; `mod.rs` is its folder's module),
/// with its code: comments and an inline `#[cfg(test)] mod tests { .. }`
/// (and all after it) removed. Paths a `mod.rs` writes relative to itself
/// (`hold::x` for its child `hold`) are not seen.
fn files() -> BTreeMap<String, String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = BTreeMap::new();
    let mut stack = vec![src.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                if path != src.join("bin") {
                    stack.push(path);
                }
                continue;
            }
            let relative = path.strip_prefix(&src).unwrap().to_string_lossy();
            let Some(relative) = relative.strip_suffix(".rs") else {
                continue;
            };
            if relative == "lib" || relative == "layering" {
                continue;
            }
            let module = relative.strip_suffix("/mod").unwrap_or(relative);
            let mut text = std::fs::read_to_string(&path).unwrap();
            if let Some(at) = text.find("#[cfg(test)]\nmod tests {") {
                text.truncate(at);
            }
            out.insert(module.replace('/', "::"), code_of(&text));
        }
    }
    out
}

/// The length of the identifier at the start of `s`.
fn ident_len(s: &str) -> usize {
    s.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len())
}

/// The segments of `a::b::c` at the start of `rest`, and what follows them
/// (`::{...}` of a group stays in what follows).
fn leading_path(mut rest: &str) -> (Vec<String>, &str) {
    let mut segments = Vec::new();
    loop {
        let n = ident_len(rest);
        if n == 0 {
            break;
        }
        segments.push(rest[..n].to_string());
        rest = &rest[n..];
        match rest.strip_prefix("::") {
            Some(more) if !more.starts_with('{') => rest = more,
            _ => break,
        }
    }
    (segments, rest)
}

/// The paths that `crate::`, `super::` and `self::` name in `code` of the
/// file for module `me`, as absolute segment lists (`use super::{a, b::c}`
/// gives two).
fn module_paths(code: &str, me: &[&str]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    for (at, _) in code.match_indices("::") {
        // The word before `::` must be crate, super or self, at a word start.
        let start = code[..at]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(0, |i| i + 1);
        let first = &code[start..at];
        if !matches!(first, "crate" | "super" | "self") {
            continue;
        }
        if start >= 2 && &bytes[start - 2..start] == b"::" {
            continue; // `super::super::x`: taken from the first `super`
        }
        let (mut segments, rest) = leading_path(&code[start..]);
        // Resolve the leading crate/super/self.
        let mut base: Vec<String> = Vec::new();
        let mut own: Vec<String> = me.iter().map(|s| s.to_string()).collect();
        while let Some(head) = segments.first().cloned() {
            match head.as_str() {
                "crate" => own.clear(),
                "self" => {}
                "super" => {
                    own.pop();
                }
                _ => break,
            }
            segments.remove(0);
        }
        base.extend(own);
        base.extend(segments);
        match rest.strip_prefix("::{") {
            Some(group) => {
                let group = &group[..group.find('}').unwrap_or(group.len())];
                for item in group.split(',') {
                    let (more, _) = leading_path(item.trim());
                    let mut full = base.clone();
                    full.extend(more.into_iter().filter(|s| s != "self"));
                    out.push(full);
                }
            }
            None => out.push(base),
        }
    }
    out
}

/// Which file imports which (module paths), each path resolved to the
/// longest module that exists.
fn file_imports() -> BTreeMap<String, BTreeSet<String>> {
    let files = files();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, code) in &files {
        let me: Vec<&str> = module.split("::").collect();
        let names = graph.entry(module.clone()).or_default();
        for path in module_paths(code, &me) {
            let found = (1..=path.len())
                .rev()
                .map(|n| path[..n].join("::"))
                .find(|m| files.contains_key(m));
            if let Some(found) = found.filter(|m| m != module) {
                names.insert(found);
            }
        }
    }
    graph
}

/// Checks `found` circles against the `known` list.
fn check_circles(found: BTreeSet<Vec<String>>, known: &[&[&str]], list: &str) {
    let known: BTreeSet<Vec<String>> = known
        .iter()
        .map(|c| c.iter().map(|s| s.to_string()).collect())
        .collect();
    let new: Vec<_> = found.difference(&known).collect();
    assert!(
        new.is_empty(),
        "modules that import each other in a circle: {new:?} (see docs/ARCHITECTURE.md, \
         Layers; a circle that grew or shrank shows here and below: update {list} in \
         src/layering.rs only when it shrank)"
    );
    let gone: Vec<_> = known.difference(&found).collect();
    assert!(
        gone.is_empty(),
        "circles in {list} that are gone (remove them from the list): {gone:?}"
    );
}

#[test]
fn no_core_module_imports_a_front_end() {
    let graph = imports();
    assert!(graph.contains_key("spank") && graph.contains_key("store"));
    for (module, names) in &graph {
        for front in FRONT_ENDS {
            assert!(
                module == front || !names.contains(*front),
                "src/{module} imports crate::{front}: core modules must not know the plugin \
                 (see docs/ARCHITECTURE.md, Layers)"
            );
        }
        assert!(
            !names.contains("bin"),
            "src/{module} names crate::bin: the CLI is a front end"
        );
    }
    // Nor may a library file pull a file of the CLI in by path.
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs");
    let lib = std::fs::read_to_string(src).unwrap();
    assert!(
        !code_of(&lib).contains("bin/"),
        "src/lib.rs includes src/bin"
    );
}

#[test]
fn top_level_modules_form_no_new_circle() {
    check_circles(circles(&imports()), KNOWN_CIRCLES, "KNOWN_CIRCLES");
}

#[test]
fn files_form_no_new_circle() {
    let graph = file_imports();
    assert!(graph["spank::plugin"].contains("spank::remote"));
    check_circles(circles(&graph), KNOWN_FILE_CIRCLES, "KNOWN_FILE_CIRCLES");
}

/// Imports go down [`LAYERS`] (or stay in a layer), every top-level module
/// has a layer, and docs/ARCHITECTURE.md draws the same layers.
#[test]
fn imports_go_down_the_layers() {
    let graph = imports();
    let layer_of = |module: &str| LAYERS.iter().position(|(_, m)| m.contains(&module));
    for (module, names) in &graph {
        let Some(mine) = layer_of(module) else {
            panic!(
                "src/{module} has no layer: add it to LAYERS in src/layering.rs and to \
                    the picture in docs/ARCHITECTURE.md (Layers)"
            );
        };
        for name in names {
            if let Some(theirs) = layer_of(name) {
                assert!(
                    theirs >= mine,
                    "src/{module} ({}) imports crate::{name} ({}), a layer above it: move \
                     the code down, or the module (docs/ARCHITECTURE.md, Layers)",
                    LAYERS[mine].0,
                    LAYERS[theirs].0
                );
            }
        }
    }
    let docs = include_str!("../docs/ARCHITECTURE.md");
    let section = &docs[docs
        .find("## Layers")
        .expect("docs/ARCHITECTURE.md has ## Layers")..];
    let block = section.split("```").nth(1).expect("a picture in ```");
    for (label, modules) in LAYERS {
        let line = block
            .lines()
            .find(|l| l.starts_with(label))
            .unwrap_or_else(|| panic!("docs/ARCHITECTURE.md's Layers have no line `{label}`"));
        for module in *modules {
            let words: Vec<&str> = line
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .collect();
            assert!(
                words.contains(module),
                "docs/ARCHITECTURE.md's Layers line `{label}` does not name {module}"
            );
        }
    }
}

#[test]
fn the_scanner_sees_paths_groups_and_circles() {
    let code = code_of("use crate::{a::x, b}; // crate::c\nlet u = \"http://x\"; crate::d::f();");
    assert_eq!(
        crate_paths(&code),
        ["a", "b", "d"].iter().map(|s| s.to_string()).collect()
    );
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec!["a"]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.into_iter().map(String::from).collect()))
    .collect();
    let expected: BTreeSet<Vec<String>> = [vec!["a".to_string(), "b".into(), "c".into()]]
        .into_iter()
        .collect();
    assert_eq!(circles(&graph), expected);
    let code = code_of("use super::{a, b::c};\nuse crate::x::y::{self, z};\nsuper::super::q();");
    let paths: Vec<String> = module_paths(&code, &["m", "n"])
        .into_iter()
        .map(|p| p.join("::"))
        .collect();
    assert_eq!(paths, ["m::a", "m::b::c", "x::y", "x::y::z", "q"]);
}
