//! The module layers of `docs/architecture.md`, checked from the source: every `crate::X` path
//! (before a file's `#[cfg(test)]` line; doc links and test files under `src/` included) names a
//! module in a lower layer (or its own), so data flows one way and there are no import cycles.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Layers, bottom first. A module may use its own layer's peers only where listed in
/// [`PEERS`]; anything in a lower layer is allowed.
const LAYERS: &[&[&str]] = &[
    &["sys", "values", "model"],
    &[
        "window", "alert", "trace", "record", "import", "sampler", "silence",
    ],
    &["rules"],
    &["engine"],
    &["notify", "action", "report", "exporter", "usage"],
    &["job"],
    &["config"],
    &["pipeline"],
    &["daemon"],
    &["top"],
    &["cli"],
];

/// Same-layer imports that are allowed (importer, imported).
const PEERS: &[(&str, &str)] = &[
    ("model", "values"),
    ("model", "sys"),
    ("values", "sys"),
    ("sampler", "record"),
    ("record", "trace"),
    ("trace", "record"),
    ("import", "trace"),
    ("alert", "window"),
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The top-level module a file belongs to (`src/notify/email.rs` → `notify`).
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_string_lossy();
    first.trim_end_matches(".rs").to_string()
}

/// The code of a file up to its first `#[cfg(test)]` line. Doc links and test files under
/// `src/` count (as `../shared/tools/layers.py` counts them): a test fixture that reaches up is
/// an import too.
fn production_text(file: &Path) -> Option<String> {
    let text = std::fs::read_to_string(file).ok()?;
    Some(match text.find("#[cfg(test)]") {
        Some(cut) => text[..cut].to_string(),
        None => text,
    })
}

/// Every `crate::NAME` in `text` (paths in `use` lines and inline alike).
fn crate_refs(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("crate::") {
        let before = rest[..i].chars().last();
        rest = &rest[i + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue; // e.g. `gpuwatch_crate::`
        }
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() {
            out.insert(name);
        }
    }
    // `use crate::{a, b::c}` groups: the first name of each top-level item.
    for (i, _) in text.match_indices("crate::{") {
        let group = &text[i + "crate::{".len()..];
        let (mut depth, mut item) = (0, String::new());
        for c in group.chars() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => break,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    push_first_name(&item, &mut out);
                    item.clear();
                    continue;
                }
                _ => {}
            }
            item.push(c);
        }
        push_first_name(&item, &mut out);
    }
    out
}

fn push_first_name(item: &str, out: &mut BTreeSet<String>) {
    let name: String = item
        .trim()
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    if !name.is_empty() && name != "self" {
        out.insert(name);
    }
}

fn graph() -> BTreeMap<String, BTreeMap<String, Vec<String>>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut edges: BTreeMap<String, BTreeMap<String, Vec<String>>> = BTreeMap::new();
    for f in files {
        let module = module_of(&src, &f);
        if module == "lib" || module == "main" {
            continue;
        }
        let Some(text) = production_text(&f) else {
            continue;
        };
        for target in crate_refs(&text) {
            if target != module && layer_of(&target).is_some() {
                edges
                    .entry(module.clone())
                    .or_default()
                    .entry(target)
                    .or_default()
                    .push(f.strip_prefix(&src).unwrap().display().to_string());
            }
        }
    }
    edges
}

#[test]
fn every_module_has_a_layer() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut missing = BTreeSet::new();
    for f in files {
        let m = module_of(&src, &f);
        if m != "lib" && m != "main" && layer_of(&m).is_none() {
            missing.insert(m);
        }
    }
    assert!(
        missing.is_empty(),
        "modules without a layer in tests/integration/layers.rs and docs/architecture.md: {missing:?}"
    );
}

#[test]
fn imports_only_point_down() {
    let mut bad = Vec::new();
    for (from, targets) in graph() {
        let lf = layer_of(&from).unwrap();
        for (to, files) in targets {
            let lt = layer_of(&to).unwrap();
            let ok = lt < lf || (lt == lf && PEERS.contains(&(from.as_str(), to.as_str())));
            if !ok {
                bad.push(format!("{from} → {to} (in {})", files.join(", ")));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "imports against the layers of docs/architecture.md:\n  {}",
        bad.join("\n  ")
    );
}

#[test]
fn no_import_cycles() {
    let g = graph();
    // Depth-first search for a back edge.
    fn visit(
        n: &str,
        g: &BTreeMap<String, BTreeMap<String, Vec<String>>>,
        state: &mut BTreeMap<String, u8>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(n.to_string(), 1);
        path.push(n.to_string());
        if let Some(ts) = g.get(n) {
            for t in ts.keys() {
                match state.get(t.as_str()).copied().unwrap_or(0) {
                    1 => {
                        let start = path.iter().position(|p| p == t).unwrap_or(0);
                        let mut cycle = path[start..].to_vec();
                        cycle.push(t.clone());
                        return Some(cycle);
                    }
                    0 => {
                        if let Some(c) = visit(t, g, state, path) {
                            return Some(c);
                        }
                    }
                    _ => {}
                }
            }
        }
        path.pop();
        state.insert(n.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in g.keys() {
        if state.get(n.as_str()).copied().unwrap_or(0) == 0 {
            let mut path = Vec::new();
            if let Some(cycle) = visit(n, &g, &mut state, &mut path) {
                panic!("import cycle: {}", cycle.join(" → "));
            }
        }
    }
}

#[test]
fn the_checker_sees_grouped_and_inline_paths() {
    let refs = crate_refs(
        "use crate::{model::X, sys};\nfn f() { crate::values::parse(); }\nuse crate::alert::{A, B};",
    );
    let want: BTreeSet<String> = ["model", "sys", "values", "alert"]
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(refs, want);
}
