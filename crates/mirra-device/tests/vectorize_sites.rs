//! Every call of `vectorize` in the workspace passes an `#[inline(always)]` closure: a
//! closure LLVM keeps out of line is compiled for baseline x86-64, and its loops run on
//! SSE2 however wide the CPU is (see `mirra_device::vectorize`).

use std::path::{Path, PathBuf};

/// The Rust sources under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `file:line` of each call `vectorize(` in `text` whose argument does not start with
/// `#[inline(always)]`.
fn bare_calls(name: &str, text: &str) -> Vec<String> {
    let mut bare = Vec::new();
    for (at, _) in text.match_indices("vectorize(") {
        let line = text[..at].lines().count().max(1);
        let before = text[..at].chars().last();
        let definition = text[..at].ends_with("fn ");
        let comment = text[..at]
            .rsplit('\n')
            .next()
            .is_some_and(|l| l.contains("//"));
        if definition || comment || before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let rest = text[at + "vectorize(".len()..].trim_start();
        if !rest.starts_with("#[inline(always)]") {
            bare.push(format!("{name}:{line}"));
        }
    }
    bare
}

#[test]
fn every_vectorize_call_inlines_its_closure() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    sources(&crates, &mut files);
    sources(&crates.join("../xtask"), &mut files);
    let bare: Vec<String> = files
        .iter()
        .filter(|f| !f.ends_with("tests/vectorize_sites.rs"))
        .flat_map(|f| {
            bare_calls(
                &f.display().to_string(),
                &std::fs::read_to_string(f).unwrap(),
            )
        })
        .collect();
    assert!(files.len() > 50, "found only {} sources", files.len());
    assert!(
        bare.is_empty(),
        "vectorize without #[inline(always)] at {bare:?}"
    );
}

#[test]
fn a_bare_closure_is_found() {
    // The check itself: a call without the attribute is reported, one with it is not.
    let text = "fn f() {\n    vectorize(|| 1);\n    mirra_device::vectorize(\n        #[inline(always)]\n        || 2,\n    );\n}\n";
    assert_eq!(bare_calls("x.rs", text), ["x.rs:2"]);
}
