//! Where things are: the workspace, cargo's target directory, the benchmarks' JSON.

use std::path::{Path, PathBuf};

/// The workspace root (this package's parent directory).
pub fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

/// Cargo's target directory: `CARGO_TARGET_DIR` when set, else `<root>/target`.
pub fn target_dir(root: &Path) -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => root.join(dir),
        None => root.join("target"),
    }
}

/// Where a command writes its JSON: `out` when the user gave `--out`, else
/// `<target>/bench/<file>`.
pub fn bench_file(out: Option<&Path>, file: &str) -> PathBuf {
    out.map_or_else(
        || target_dir(&workspace_root()).join("bench").join(file),
        Path::to_path_buf,
    )
}
