//! Files stand in layers: inside each crate, no two modules import each other, directly
//! or around a circle. A module is a top-level file or folder of `src/` (`ops/` with all
//! it holds is one module); its imports are the `crate::` paths in its code, with names
//! that the crate root re-exports (`crate::Tensor`) traced to the module that defines
//! them. Left out: comments (a doc link is no import), test code (`#[cfg(test)]`: tests
//! may reach anywhere), and the crate's `error` module, which stands beside the layers:
//! every module returns the crate's error, and the error names the crate's types.
//! The test below checks every crate of the workspace and xtask itself.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

/// Top-level module -> the top-level modules it imports.
pub type Graph = BTreeMap<String, BTreeSet<String>>;

/// The module graph of the crate whose `src/` is `src`.
pub fn module_graph(src: &Path) -> std::io::Result<Graph> {
    let root = ["lib.rs", "main.rs"]
        .iter()
        .map(|f| src.join(f))
        .find(|p| p.is_file());
    let root_text = match &root {
        Some(p) => strip_tests(&fs::read_to_string(p)?),
        None => String::new(),
    };
    let reexports = reexports(&root_text);
    let mut modules: BTreeMap<String, String> = BTreeMap::new();
    for entry in fs::read_dir(src)? {
        let path = entry?.path();
        let name = match path.file_stem().and_then(|s| s.to_str()) {
            Some(n) => n.to_string(),
            None => continue,
        };
        if name == "lib" || name == "main" || name == "error" {
            continue;
        }
        let mut text = String::new();
        collect_rs(&path, &mut text)?;
        if !text.is_empty() {
            modules.entry(name).or_default().push_str(&text);
        }
    }
    let mut graph = Graph::new();
    for (name, text) in &modules {
        let mut deps = BTreeSet::new();
        for path in crate_paths(text) {
            let first = path.split("::").next().unwrap_or("");
            let target = if modules.contains_key(first) {
                Some(first.to_string())
            } else {
                reexports.get(first).cloned()
            };
            if let Some(t) = target.filter(|t| t != name && modules.contains_key(t)) {
                deps.insert(t);
            }
        }
        graph.insert(name.clone(), deps);
    }
    Ok(graph)
}

/// Every `.rs` file at or under `path`, test modules stripped, appended to `out`.
fn collect_rs(path: &Path, out: &mut String) -> std::io::Result<()> {
    if path.is_dir() {
        for entry in fs::read_dir(path)? {
            collect_rs(&entry?.path(), out)?;
        }
    } else if path.extension().is_some_and(|e| e == "rs") {
        out.push_str(&strip_tests(&strip_comments(&fs::read_to_string(path)?)));
        out.push('\n');
    }
    Ok(())
}

/// The text without `//` comments (doc comments included). A `//` inside a string
/// literal cuts the line short too, which can only hide imports after it on that line.
fn strip_comments(text: &str) -> String {
    text.lines()
        .map(|l| l.find("//").map_or(l, |at| &l[..at]))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The text without `#[cfg(test)]` items (a `mod tests { ... }` block or a single item).
fn strip_tests(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = &rest[at..];
        // Skip to the end of the item: its block if one opens before the next `;`.
        let brace = after.find('{');
        let semi = after.find(';');
        let end = match (brace, semi) {
            (Some(b), Some(s)) if s < b => s + 1,
            (Some(b), _) => match_brace(after, b),
            (None, Some(s)) => s + 1,
            (None, None) => after.len(),
        };
        rest = &after[end.min(after.len())..];
    }
    out.push_str(rest);
    out
}

/// The index after the brace that closes the one at `open`.
fn match_brace(text: &str, open: usize) -> usize {
    let mut depth = 0usize;
    for (i, c) in text[open..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return open + i + 1;
                }
            }
            _ => {}
        }
    }
    text.len()
}

/// Paths after `crate::`, with `crate::{a::X, b}` groups expanded to `a::X` and `b`.
fn crate_paths(text: &str) -> Vec<String> {
    let mut paths = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().last();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
            continue; // `mirra_crate::` or `$crate::`
        }
        if let Some(group) = rest.strip_prefix('{') {
            let end = match_brace(rest, 0);
            for item in split_top(&group[..end.saturating_sub(2).min(group.len())]) {
                paths.push(item.trim().to_string());
            }
        } else {
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(rest.len());
            paths.push(rest[..end].to_string());
        }
    }
    paths
}

/// Splits a `use` group's items at commas outside nested braces.
fn split_top(group: &str) -> Vec<&str> {
    let (mut items, mut depth, mut start) = (Vec::new(), 0usize, 0usize);
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                items.push(&group[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&group[start..]);
    items
}

/// Names the crate root re-exports, mapped to the module they come from
/// (`pub use schedule::{Constant, ...}` -> Constant: schedule).
fn reexports(root: &str) -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    for stmt in root.split(';') {
        let Some(at) = stmt.find("pub use ") else {
            continue;
        };
        let path = stmt[at + "pub use ".len()..].trim();
        let Some((module, items)) = path.split_once("::") else {
            continue;
        };
        let items = items.trim().trim_start_matches('{').trim_end_matches('}');
        for item in split_top(items) {
            let item = item.trim();
            let name = match item.split_once(" as ") {
                Some((_, alias)) => alias.trim(),
                None => item.rsplit("::").next().unwrap_or(item).trim(),
            };
            if !name.is_empty() {
                map.insert(name.to_string(), module.to_string());
            }
        }
    }
    map
}

/// The circles of the graph, each as the modules on it (smallest first, sorted).
pub fn cycles(graph: &Graph) -> Vec<Vec<String>> {
    // Strongly connected components of more than one module (Tarjan).
    struct State<'a> {
        graph: &'a Graph,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        s.index.insert(v, s.next);
        s.low.insert(v, s.next);
        s.next += 1;
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.graph.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                comp.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                s.out.push(comp);
            }
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out.sort();
    s.out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(edges: &[(&str, &[&str])]) -> Graph {
        edges
            .iter()
            .map(|(m, deps)| (m.to_string(), deps.iter().map(|d| d.to_string()).collect()))
            .collect()
    }

    #[test]
    fn circles_are_found_and_layers_pass() {
        let layered = graph(&[("a", &["b", "c"]), ("b", &["c"]), ("c", &[])]);
        assert!(cycles(&layered).is_empty());
        let circle = graph(&[("a", &["b"]), ("b", &["c"]), ("c", &["a"]), ("d", &["a"])]);
        assert_eq!(cycles(&circle), vec![vec!["a", "b", "c"]]);
    }

    #[test]
    fn imports_are_read_through_groups_and_reexports() {
        let text = "use crate::{optimizer::{cast, Core}, Result, LearningRateSchedule};\n\
                    use crate::hyperparams::check;\nfn f() { $crate::x(); other_crate::y(); }\n\
                    #[cfg(test)]\nmod tests { use crate::testutil::*; }\n";
        let paths = crate_paths(&strip_tests(text));
        assert_eq!(
            paths,
            vec![
                "optimizer::{cast, Core}",
                "Result",
                "LearningRateSchedule",
                "hyperparams::check"
            ]
        );
        assert_eq!(
            strip_comments("use a; // see [`b`](crate::b)\n/// crate::c\nx"),
            "use a; \n\nx"
        );
        let root = "mod schedule;\npub use schedule::{Constant, LearningRateSchedule as Lrs};\n\
                    pub use error::OptimError;";
        let r = reexports(root);
        assert_eq!(r["Lrs"], "schedule");
        assert_eq!(r["Constant"], "schedule");
        assert_eq!(r["OptimError"], "error");
    }

    #[test]
    fn every_crate_stands_in_layers() {
        let root = crate::paths::workspace_root();
        let mut dirs: Vec<_> = fs::read_dir(root.join("crates"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        dirs.push(root.join("xtask"));
        dirs.sort();
        let mut found = Vec::new();
        for dir in dirs {
            let graph = module_graph(&dir.join("src")).unwrap();
            for circle in cycles(&graph) {
                found.push(format!("{}: {}", dir.display(), circle.join(" <-> ")));
            }
        }
        assert!(
            found.is_empty(),
            "modules that import each other:\n{}",
            found.join("\n")
        );
    }
}
