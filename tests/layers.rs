//! kiln's layers go one way: every `crate::` path in a module of `src/` names its own module or
//! one in a lower row of ARCHITECTURE.md's layer table. The table is read from ARCHITECTURE.md
//! itself, so the document and the code cannot drift apart: a new top-level module must get a
//! row, and an import that climbs (or crosses to a peer in the same row) fails here, naming the
//! file and the path. Root re-exports (`crate::no_grad`, `crate::Device`) count as the module
//! that defines them, read from `src/lib.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Upward imports that ARCHITECTURE.md justifies: (from module, to module). None today.
const ALLOWED: &[(&str, &str)] = &[];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The rows of the layer table, bottom first: each row's `src/` modules.
fn layer_rows(architecture: &str) -> Vec<BTreeSet<String>> {
    let mut rows = Vec::new();
    let mut in_table = false;
    for line in architecture.lines() {
        if line.starts_with("| layer |") {
            in_table = true;
            continue;
        }
        if !in_table {
            continue;
        }
        if !line.starts_with('|') {
            break;
        }
        let cells: Vec<&str> = line.split('|').collect();
        let Some(place) = cells.get(2) else { continue };
        let modules: BTreeSet<String> = place
            .split('`')
            .filter_map(|p| p.strip_prefix("src/"))
            .filter_map(|p| p.split(['/', '.']).next())
            .filter(|m| !m.is_empty())
            .map(str::to_string)
            .collect();
        if !modules.is_empty() {
            rows.push(modules);
        }
    }
    rows
}

/// Drops `//` comments (doc comments included) and string literals' contents, so that prose
/// and messages mentioning `crate::x` do not count.
fn code_only(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let mut in_str = false;
        let mut prev = ' ';
        let mut chars = line.chars().peekable();
        while let Some(c) = chars.next() {
            if !in_str && c == '/' && chars.peek() == Some(&'/') {
                break;
            }
            if c == '"' && prev != '\\' && prev != '\'' {
                in_str = !in_str;
            } else if !in_str {
                out.push(c);
            }
            prev = if prev == '\\' && c == '\\' { ' ' } else { c };
        }
        out.push('\n');
    }
    out
}

/// The first segment of every `crate::` path: `crate::a::b` gives `a`; a group
/// `crate::{a::b, c, d::{e}}` gives `a`, `c` and `d`.
fn crate_heads(code: &str) -> Vec<String> {
    let mut heads = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        let before = rest[..i].chars().next_back();
        rest = &rest[i + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
            continue; // `$crate::` or a longer identifier
        }
        let rest_trim = rest.trim_start();
        if let Some(group) = rest_trim.strip_prefix('{') {
            // Top-level items of the group, up to its closing brace.
            let mut depth = 0;
            let mut item = String::new();
            let mut items = Vec::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        items.push(std::mem::take(&mut item));
                        continue;
                    }
                    _ => {}
                }
                if depth == 0 || c != '{' {
                    item.push(c);
                }
            }
            items.push(item);
            for it in items {
                let head: String = it
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !head.is_empty() && head != "self" {
                    heads.push(head);
                }
            }
        } else {
            let head: String = rest_trim
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !head.is_empty() {
                heads.push(head);
            }
        }
    }
    heads
}

/// Names the crate root re-exports, mapped to the module that provides them
/// (`pub use tensor::{no_grad, Tensor}` maps both to `tensor`).
fn root_reexports(lib: &str) -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    let code = code_only(lib);
    for stmt in code.split(';') {
        let stmt = stmt.trim();
        let Some(path) = stmt.strip_prefix("pub use ") else {
            continue;
        };
        let Some((module, names)) = path.split_once("::") else {
            continue;
        };
        for name in names.trim_matches(|c| c == '{' || c == '}').split(',') {
            let name = name.trim().rsplit("::").next().unwrap_or("").trim();
            if !name.is_empty() {
                map.insert(name.to_string(), module.trim().to_string());
            }
        }
    }
    map
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src/ is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file of `src/` belongs to (`None` for lib.rs).
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?.to_string();
    match first.strip_suffix(".rs") {
        Some("lib") => None,
        Some(m) => Some(m.to_string()),
        None => Some(first),
    }
}

/// Every import that does not go down the table: (file, from, to).
fn violations(root: &Path) -> (Vec<String>, Vec<(String, String, String)>) {
    let architecture =
        std::fs::read_to_string(root.join("ARCHITECTURE.md")).expect("ARCHITECTURE.md exists");
    let rows = layer_rows(&architecture);
    let rank: BTreeMap<String, usize> = rows
        .iter()
        .enumerate()
        .flat_map(|(i, row)| row.iter().map(move |m| (m.clone(), i)))
        .collect();
    let src = root.join("src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("src/lib.rs exists");
    let reexports = root_reexports(&lib);
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut unplaced = BTreeSet::new();
    let mut bad = Vec::new();
    for file in &files {
        let Some(from) = module_of(&src, file) else {
            continue;
        };
        let Some(&from_rank) = rank.get(&from) else {
            unplaced.insert(from);
            continue;
        };
        let text = std::fs::read_to_string(file).expect("a source file is readable");
        for head in crate_heads(&code_only(&text)) {
            let to = reexports.get(&head).cloned().unwrap_or(head);
            // A module without a row is reported as unplaced when its own files are read.
            let Some(&to_rank) = rank.get(&to) else {
                continue;
            };
            if to == from {
                continue;
            }
            let allowed = ALLOWED.iter().any(|&(a, b)| a == from && b == to);
            if to_rank >= from_rank && !allowed {
                let file = file
                    .strip_prefix(root)
                    .unwrap_or(file)
                    .display()
                    .to_string();
                bad.push((file, from.clone(), to));
            }
        }
    }
    (unplaced.into_iter().collect(), bad)
}

#[test]
fn every_import_goes_down_the_layer_table() {
    let (unplaced, bad) = violations(&root());
    assert!(
        unplaced.is_empty(),
        "modules without a row in ARCHITECTURE.md's layer table: {unplaced:?}"
    );
    let listed: Vec<String> = bad
        .iter()
        .map(|(file, from, to)| format!("{file}: {from} -> {to}"))
        .collect();
    assert!(
        bad.is_empty(),
        "imports that do not go down ARCHITECTURE.md's layer table:\n{}",
        listed.join("\n")
    );
}

#[test]
fn the_table_places_every_module_once_and_bottom_first() {
    let architecture = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let rows = layer_rows(&architecture);
    let mut seen = BTreeSet::new();
    for row in &rows {
        for m in row {
            assert!(
                seen.insert(m.clone()),
                "{m} has two rows in the layer table"
            );
        }
    }
    let position = |m: &str| rows.iter().position(|r| r.contains(m));
    // The shared vocabulary at the bottom, the tools on top.
    assert_eq!(position("base"), Some(0));
    assert!(position("alloc") < position("device"));
    assert!(position("device") < position("kernels"));
    assert!(position("graph") < position("ops"));
    assert!(position("ops") < position("autograd"));
    assert_eq!(position("debug"), Some(rows.len() - 1));
}

/// The checker itself catches what it must: grouped paths, root re-exports, comments ignored.
#[test]
fn the_checker_reads_grouped_paths_and_root_reexports() {
    let code = code_only(
        "use crate::{alloc::Stat, no_grad, ops::{copy, sum_to}};\n\
         // crate::debug is only mentioned here\n\
         let s = \"crate::viz in a string\";\n\
         fn f() { crate::kernels::launch(); $crate::x(); }\n",
    );
    assert_eq!(
        crate_heads(&code),
        vec!["alloc", "no_grad", "ops", "kernels"],
        "{code}"
    );
    let map = root_reexports(
        "pub use autograd::checkpoint;\npub use tensor::{enable_grad, no_grad};\n// pub use x::y;",
    );
    assert_eq!(map.get("no_grad").map(String::as_str), Some("tensor"));
    assert_eq!(map.get("checkpoint").map(String::as_str), Some("autograd"));
    assert_eq!(map.get("y"), None);
    // A climbing import in a scratch tree is reported with its file.
    let dir = std::env::temp_dir().join(format!("kiln-layers-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("src/low")).unwrap();
    std::fs::write(
        dir.join("ARCHITECTURE.md"),
        "| layer | where | what |\n|---|---|---|\n| low | `src/low/` | x |\n| high | `src/high.rs` | y |\n",
    )
    .unwrap();
    std::fs::write(dir.join("src/lib.rs"), "mod low;\nmod high;\n").unwrap();
    std::fs::write(dir.join("src/low/mod.rs"), "use crate::high::Thing;\n").unwrap();
    std::fs::write(dir.join("src/high.rs"), "use crate::low::Other;\n").unwrap();
    let (unplaced, bad) = violations(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(unplaced.is_empty());
    assert_eq!(
        bad,
        vec![(
            "src/low/mod.rs".to_string(),
            "low".to_string(),
            "high".to_string()
        )]
    );
}
