//! `cargo xtask gpu-bundle`: everything a lent GPU machine needs, in one folder.
//!
//! The GPU machine has the NVIDIA driver, CUDA's libraries and PyTorch but no Rust
//! toolchain, and a session has minutes on it. So the binaries are built here: `mirra`,
//! this xtask (for `gpu-probe` and the GPU benchmarks), both in release, and the test
//! binaries of every crate with GPU tests (`#[ignore = "needs a CUDA device"]`, run there
//! with `--ignored`), beside `gpu-check.sh` (from `ci/`) and its Python helpers. The test
//! binaries are those of the README's test command (`cargo test --workspace`, dev profile),
//! which CI has just built, so the bundle compiles no test twice. The folder must stay
//! under 64 MiB, what the device tool carries: debug information is stripped and the test
//! binaries are gzipped (`tests/NAME.gz`; `gpu-check.sh` unpacks them).
//!
//! Run it there with the device tool: `run(command: "bash target/gpu-bundle/gpu-check.sh",
//! carry: ["target/gpu-bundle"])`.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use clap::Parser;
use flate2::write::GzEncoder;
use flate2::Compression;

use crate::paths::{target_dir, workspace_root};
use crate::{cli, Failure};

/// What the device tool carries at most.
pub const MAX_BUNDLE_BYTES: u64 = 64 << 20;

/// The packages whose tests include GPU tests. A test in `tests` checks that every crate
/// with a test ignored as "needs a CUDA device" is listed here.
pub const GPU_TEST_PACKAGES: &[&str] = &[
    "mirra-collectives",
    "mirra-cuda",
    "mirra-device",
    "mirra-optim",
    "mirra-strategy",
    "mirra-tensor",
    "mirra-train",
];

/// The files of `ci/` that the bundle carries, beside the binaries.
const SCRIPTS: &[&str] = &["gpu-check.sh", "gpu/torch_reference.py", "gpu/table.py"];

/// `cargo xtask gpu-bundle` flags.
#[derive(Debug, Parser)]
#[command(
    name = "xtask gpu-bundle",
    about = "Build the folder to run on a GPU machine: mirra, xtask, GPU test binaries, gpu-check.sh"
)]
struct Args {
    /// Where to put the bundle (emptied first).
    #[arg(long)]
    out: Option<PathBuf>,
}

pub fn run(args: &[String]) -> Result<(), Failure> {
    let Some(a) = cli::parse::<Args>("xtask gpu-bundle", args)? else {
        return Ok(());
    };
    let root = workspace_root();
    let target = target_dir(&root);
    let out = a.out.unwrap_or_else(|| target.join("gpu-bundle"));
    let fail = |what: &str, e: std::io::Error| Failure::run(format!("gpu-bundle: {what}: {e}"));

    if out.exists() {
        fs::remove_dir_all(&out)
            .map_err(|e| fail(&format!("cannot empty {}", out.display()), e))?;
    }
    fs::create_dir_all(out.join("tests")).map_err(|e| fail("cannot create the folder", e))?;

    println!("# building mirra and xtask (release)");
    cargo(
        &root,
        &[
            "build",
            "--release",
            "-p",
            "mirra",
            "--bin",
            "mirra",
            "-p",
            "xtask",
        ],
    )?;
    let release = target.join("release");
    for bin in ["mirra", "xtask"] {
        copy_binary(&release.join(bin), &out.join(bin))?;
    }

    // The README's test build (`cargo test --workspace`, dev profile): CI has just made it,
    // so nothing is compiled twice; a narrower package list would unify features
    // differently and rebuild. Only the GPU packages' binaries are kept.
    println!(
        "# the GPU test binaries (the test build of `cargo test --workspace`): {}",
        GPU_TEST_PACKAGES.join(", ")
    );
    let json = cargo(
        &root,
        &["test", "--workspace", "--no-run", "--message-format=json"],
    )?;
    let tests = test_executables(&json);
    if tests.is_empty() {
        return Err(Failure::run("gpu-bundle: cargo built no test binaries"));
    }
    for (name, path) in &tests {
        let plain = out.join("tests").join(name);
        copy_binary(path, &plain)?;
        gzip_file(&plain, &out.join("tests").join(format!("{name}.gz")))?;
    }

    for script in SCRIPTS {
        let to = out.join(script);
        if let Some(dir) = to.parent() {
            fs::create_dir_all(dir).map_err(|e| fail("cannot create a folder", e))?;
        }
        fs::copy(root.join("ci").join(script), &to)
            .map_err(|e| fail(&format!("cannot copy ci/{script}"), e))?;
    }
    let manifest = manifest(&root, &out)?;
    fs::write(out.join("MANIFEST.txt"), &manifest)
        .map_err(|e| fail("cannot write MANIFEST.txt", e))?;

    let total = folder_bytes(&out).map_err(|e| fail("cannot size the bundle", e))?;
    print!("{manifest}");
    if total > MAX_BUNDLE_BYTES {
        return Err(Failure::run(format!(
            "gpu-bundle: {} is {:.1} MiB, over the {} MiB the device tool carries",
            out.display(),
            total as f64 / (1 << 20) as f64,
            MAX_BUNDLE_BYTES >> 20
        )));
    }
    let rel = out
        .strip_prefix(&root)
        .unwrap_or(&out)
        .display()
        .to_string();
    println!(
        "# {rel}: {:.1} MiB (limit {} MiB)\n# run it on the GPU machine: command `bash {rel}/gpu-check.sh`, \
         carry [\"{rel}\"]",
        total as f64 / (1 << 20) as f64,
        MAX_BUNDLE_BYTES >> 20
    );
    Ok(())
}

/// Runs cargo in the workspace; its stdout, or a failure with its stderr's end.
fn cargo(root: &Path, args: &[&str]) -> Result<String, Failure> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .args(args)
        .current_dir(root)
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| Failure::run(format!("gpu-bundle: cannot run cargo: {e}")))?;
    if !out.status.success() {
        return Err(Failure::run(format!(
            "gpu-bundle: `cargo {}` failed ({})",
            args.join(" "),
            out.status
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The test executables in cargo's JSON messages: (bundle name, path). The bundle name is
/// the target's name and kind (`mirra_cuda-lib`, `mirra-cli-test`), without cargo's hash.
fn test_executables(json: &str) -> Vec<(String, PathBuf)> {
    json.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["profile"]["test"] == true)
        .filter(|m| {
            m["package_id"]
                .as_str()
                .is_some_and(|id| GPU_TEST_PACKAGES.iter().any(|p| names_package(id, p)))
        })
        .filter(|m| {
            m["target"]["src_path"]
                .as_str()
                .is_none_or(|src| holds_gpu_tests(Path::new(src)))
        })
        .filter_map(|m| {
            let exe = m["executable"].as_str()?;
            let name = m["target"]["name"].as_str()?;
            let kind = m["target"]["kind"][0].as_str().unwrap_or("test");
            Some((format!("{name}-{kind}"), PathBuf::from(exe)))
        })
        .collect()
}

/// Whether cargo's package id names `package`: `path+file:///w/crates/mirra-cuda#0.1.0`
/// (the folder is the package's name), or `path+file:///w/crates/x#mirra-cuda@0.1.0`.
fn names_package(id: &str, package: &str) -> bool {
    let Some((url, fragment)) = id.rsplit_once('#') else {
        return false;
    };
    match fragment.split_once('@') {
        Some((name, _)) => name == package,
        None => url.rsplit('/').next() == Some(package),
    }
}

/// What marks a GPU test: `#[ignore = "needs a CUDA device"]`.
const GPU_TEST_MARK: &str = "needs a CUDA device\"]";

/// Whether the test target rooted at `src` holds a GPU test: an integration test's file,
/// or any file of a library's folder. Test binaries without one stay out of the bundle
/// (the device tool carries 64 MiB).
fn holds_gpu_tests(src: &Path) -> bool {
    let mut files = vec![];
    let is_lib_root = src.file_name().is_some_and(|n| n == "lib.rs");
    match src.parent() {
        Some(dir) if is_lib_root => {
            let _ = list_files(dir, &mut files);
        }
        _ => files.push((src.to_path_buf(), 0)),
    }
    files.iter().any(|(path, _)| {
        path.extension().is_some_and(|e| e == "rs")
            && fs::read_to_string(path).is_ok_and(|t| t.contains(GPU_TEST_MARK))
    })
}

/// Copies an executable and strips its debug information when `strip` is on the machine
/// (a test binary shrinks about 5x; panics still name the test).
fn copy_binary(from: &Path, to: &Path) -> Result<(), Failure> {
    fs::copy(from, to).map_err(|e| {
        Failure::run(format!(
            "gpu-bundle: cannot copy {} to {}: {e}",
            from.display(),
            to.display()
        ))
    })?;
    let stripped = Command::new("strip")
        .arg("--strip-debug")
        .arg(to)
        .status()
        .is_ok_and(|s| s.success());
    if !stripped {
        eprintln!(
            "# note: `strip` did not run; {} keeps its debug info",
            to.display()
        );
    }
    Ok(())
}

/// Replaces `plain` by its gzip, `gz`.
fn gzip_file(plain: &Path, gz: &Path) -> Result<(), Failure> {
    let fail = |e: std::io::Error| {
        Failure::run(format!(
            "gpu-bundle: cannot gzip {} into {}: {e}",
            plain.display(),
            gz.display()
        ))
    };
    let data = fs::read(plain).map_err(fail)?;
    let mut enc = GzEncoder::new(fs::File::create(gz).map_err(fail)?, Compression::default());
    enc.write_all(&data).map_err(fail)?;
    enc.finish().map_err(fail)?;
    fs::remove_file(plain).map_err(fail)
}

/// What is in the bundle and what it was built from.
fn manifest(root: &Path, out: &Path) -> Result<String, Failure> {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(root)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let commit = git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let dirty = git(&["status", "--porcelain"]).is_some_and(|s| !s.is_empty());
    let mut files = Vec::new();
    list_files(out, &mut files).map_err(|e| Failure::run(format!("gpu-bundle: {e}")))?;
    files.sort();
    let mut s = format!(
        "# mirra GPU bundle: commit {commit}{}, built {}\n",
        if dirty {
            " with uncommitted changes"
        } else {
            ""
        },
        crate::machine::utc_now()
    );
    for (path, bytes) in files {
        let rel = path
            .strip_prefix(out)
            .unwrap_or(&path)
            .display()
            .to_string();
        s.push_str(&format!(
            "{:>10.2} MiB  {rel}\n",
            bytes as f64 / (1 << 20) as f64
        ));
    }
    Ok(s)
}

/// Every file under `dir`, with its size.
fn list_files(dir: &Path, out: &mut Vec<(PathBuf, u64)>) -> std::io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            list_files(&entry.path(), out)?;
        } else {
            out.push((entry.path(), entry.metadata()?.len()));
        }
    }
    Ok(())
}

fn folder_bytes(dir: &Path) -> std::io::Result<u64> {
    let mut files = Vec::new();
    list_files(dir, &mut files)?;
    Ok(files.iter().map(|(_, b)| b).sum())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_crate_with_gpu_tests_is_bundled() {
        // A GPU test in a crate missing from GPU_TEST_PACKAGES would never run anywhere.
        let root = workspace_root();
        let mut with_gpu_tests = Vec::new();
        for entry in fs::read_dir(root.join("crates")).unwrap() {
            let dir = entry.unwrap().path();
            let mut files = vec![(dir.join("src/lib.rs"), 0)];
            let _ = list_files(&dir.join("tests"), &mut files);
            if files.iter().any(|(path, _)| holds_gpu_tests(path)) {
                with_gpu_tests.push(dir.file_name().unwrap().to_string_lossy().into_owned());
            }
        }
        with_gpu_tests.sort();
        let mut listed: Vec<String> = GPU_TEST_PACKAGES.iter().map(|s| s.to_string()).collect();
        listed.sort();
        assert_eq!(with_gpu_tests, listed);
    }

    #[test]
    fn test_executables_are_read_from_cargo_messages() {
        let json = r#"{"reason":"compiler-artifact","package_id":"path+file:///w/crates/mirra-cuda#0.1.0","profile":{"test":true},"target":{"name":"mirra_cuda","kind":["lib"]},"executable":"/t/debug/deps/mirra_cuda-abc"}
{"reason":"compiler-artifact","package_id":"registry+https://github.com/rust-lang/crates.io-index#half@2.4.1","profile":{"test":false},"target":{"name":"half","kind":["lib"]},"executable":null}
{"reason":"compiler-artifact","package_id":"path+file:///w/crates/mirra-cuda#0.1.0","profile":{"test":true},"target":{"name":"no_gpu","kind":["test"],"src_path":"/nonexistent/tests/no_gpu.rs"},"executable":"/t/debug/deps/no_gpu-abc"}
{"reason":"compiler-artifact","package_id":"path+file:///w/crates/mirra-data#0.1.0","profile":{"test":true},"target":{"name":"mirra_data","kind":["lib"]},"executable":"/t/debug/deps/mirra_data-abc"}
{"reason":"compiler-artifact","package_id":"path+file:///w/crates/x#mirra-tensor@0.1.0","profile":{"test":true},"target":{"name":"mirra_tensor","kind":["lib"]},"executable":"/t/debug/deps/mirra_tensor-abc"}
{"reason":"build-finished","success":true}"#;
        // mirra-data is not a GPU package: left out whatever its sources say.
        assert_eq!(
            test_executables(json),
            vec![
                (
                    "mirra_cuda-lib".to_string(),
                    PathBuf::from("/t/debug/deps/mirra_cuda-abc")
                ),
                (
                    "mirra_tensor-lib".to_string(),
                    PathBuf::from("/t/debug/deps/mirra_tensor-abc")
                )
            ]
        );
    }

    #[test]
    fn only_targets_holding_gpu_tests_are_bundled() {
        let root = workspace_root();
        assert!(holds_gpu_tests(&root.join("crates/mirra-cuda/src/lib.rs")));
        assert!(holds_gpu_tests(
            &root.join("crates/mirra-optim/tests/cuda_updates.rs")
        ));
        assert!(!holds_gpu_tests(
            &root.join("crates/mirra-train/tests/checkpoint_mutation.rs")
        ));
        assert!(!holds_gpu_tests(&root.join("crates/mirra-data/src/lib.rs")));
    }

    #[test]
    fn the_bundled_scripts_exist() {
        let ci = workspace_root().join("ci");
        for s in SCRIPTS {
            assert!(ci.join(s).is_file(), "ci/{s}");
        }
    }
}
