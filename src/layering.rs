//! The module layering, checked: reads every file under `src/` and the
//! `crate::MODULE` paths in its code (comments are skipped), and fails when
//! a core module imports the SPANK front end (`spank`), anything of the
//! library reaches into `src/bin/`, or top-level modules import each other
//! in a circle that is not one of [`KNOWN_CIRCLES`]. The allowed order is
//! drawn in docs/ARCHITECTURE.md ("Layers").

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Circles between top-level modules that exist today, each as its sorted
/// module names. They go with the `src/step/` extraction and the moves it
/// brings (`store/units.rs` up to `src/`; the holder applying injections
/// through the container's mount plan); until then a circle that changes,
/// or any new one, fails the test. Remove an entry when its circle is gone.
const KNOWN_CIRCLES: &[&[&str]] = &[
    // container/spec.rs carries inject::Injection and the holder applies it;
    // inject builds container::spec::MountSpec and mounts through container.
    &["container", "inject"],
    // image/squashfs.rs formats its size limit with store::units.
    &["image", "store"],
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
    let found = circles(&imports());
    let known: BTreeSet<Vec<String>> = KNOWN_CIRCLES
        .iter()
        .map(|c| c.iter().map(|s| s.to_string()).collect())
        .collect();
    let new: Vec<_> = found.difference(&known).collect();
    assert!(
        new.is_empty(),
        "modules that import each other in a circle: {new:?} (see docs/ARCHITECTURE.md, \
         Layers)"
    );
    let gone: Vec<_> = known.difference(&found).collect();
    assert!(
        gone.is_empty(),
        "circles in KNOWN_CIRCLES that are gone (remove them from the list): {gone:?}"
    );
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
}
