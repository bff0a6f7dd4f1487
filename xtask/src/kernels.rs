//! `cargo xtask kernels [--check]`: mirra's CUDA kernels, compiled from their sources
//! (`crates/mirra-cuda/kernels/*.cu`) to PTX for sm_80 and sm_90 by NVRTC, assembled by
//! `ptxas` for the same architectures (it catches what NVRTC lets through), and written to
//! `crates/mirra-cuda/ptx/`, which is committed: `cargo build` needs no CUDA tools.
//!
//! `--check` writes nothing: it fails when a kernel does not compile or assemble, and when
//! the committed PTX differs from what the sources compile to now (stale). CI runs it.
//!
//! The tools are NVIDIA's PyPI wheels of CUDA 12.9 (`ci/install-cuda-tools.sh`, which this
//! runs when `--tools` and `MIRRA_CUDA_TOOLS` name no folder): NVRTC, the runtime's headers
//! (`cuda_fp16.h`, `cuda_bf16.h`) and `ptxas`. No GPU is needed. PTX from CUDA 12 tools
//! loads on a CUDA 13.0 driver; a newer NVRTC than the driver would write PTX it refuses.

use std::ffi::{c_char, c_int, CStr, CString};
use std::path::{Path, PathBuf};
use std::process::Command;

use clap::Parser;

use crate::paths::workspace_root;
use crate::{cli, Failure};

/// `cargo xtask kernels` flags.
#[derive(Debug, Parser)]
#[command(
    name = "xtask kernels",
    about = "Compile the CUDA kernels to PTX (sm_80, sm_90) with NVRTC, assemble them with ptxas, \
             write crates/mirra-cuda/ptx/"
)]
struct Args {
    /// Write nothing: fail when a kernel does not compile or assemble, or when the committed
    /// PTX is stale.
    #[arg(long)]
    check: bool,
    /// The folder of NVIDIA's wheels (default: $MIRRA_CUDA_TOOLS, else what
    /// ci/install-cuda-tools.sh installs).
    #[arg(long)]
    tools: Option<PathBuf>,
}

/// The architectures the PTX is written for: the oldest mirra supports (A100) and Hopper.
/// A newer device JIT-compiles the sm_90 PTX.
pub const ARCHES: [&str; 2] = ["sm_80", "sm_90"];

/// The options every kernel is compiled with (besides the architecture and include paths):
/// no fused multiply-add contraction, so that a kernel rounds as the CPU's Rust does.
const NVRTC_OPTIONS: [&str; 2] = ["--fmad=false", "--std=c++17"];

/// Where the sources and the PTX live, relative to the workspace root.
const SOURCES: &str = "crates/mirra-cuda/kernels";
const PTX_DIR: &str = "crates/mirra-cuda/ptx";

pub fn run(args: &[String]) -> Result<(), Failure> {
    let Some(a) = cli::parse::<Args>("xtask kernels", args)? else {
        return Ok(());
    };
    let root = workspace_root();
    let tools = Tools::find(&root, a.tools.as_deref())?;
    let nvrtc = Nvrtc::load(&tools.nvrtc_lib)?;
    let (major, minor) = nvrtc.version()?;
    println!(
        "NVRTC {major}.{minor} ({}), ptxas {}",
        tools.nvrtc_lib.display(),
        tools.ptxas.display()
    );
    let sources = kernel_sources(&root.join(SOURCES))?;
    let scratch = root.join("target/kernels");
    std::fs::create_dir_all(&scratch).map_err(|e| io_failure(&scratch, e))?;
    let (mut stale, mut failed) = (vec![], vec![]);
    for source in &sources {
        let stem = file_stem(source);
        for arch in ARCHES {
            let name = format!("{stem}.{arch}.ptx");
            let ptx = match nvrtc.compile(source, arch, &[&root.join(SOURCES), &tools.include]) {
                Ok(ptx) => ptx,
                Err(log) => {
                    failed.push(format!("{name}: NVRTC:\n{log}"));
                    continue;
                }
            };
            let fresh = scratch.join(&name);
            std::fs::write(&fresh, &ptx).map_err(|e| io_failure(&fresh, e))?;
            if let Err(log) = tools.assemble(&fresh, arch) {
                failed.push(format!("{name}: ptxas:\n{log}"));
                continue;
            }
            let committed = root.join(PTX_DIR).join(&name);
            let same = std::fs::read(&committed).is_ok_and(|c| c == ptx.as_bytes());
            let entries = ptx.lines().filter(|l| l.contains(".entry ")).count();
            if a.check {
                println!(
                    "  {name}: {entries} kernels, compiles and assembles; {}",
                    if same {
                        "committed PTX up to date"
                    } else {
                        "STALE"
                    }
                );
                if !same {
                    stale.push(name);
                }
            } else {
                if !same {
                    let dir = root.join(PTX_DIR);
                    std::fs::create_dir_all(&dir).map_err(|e| io_failure(&dir, e))?;
                    std::fs::write(&committed, &ptx).map_err(|e| io_failure(&committed, e))?;
                }
                println!(
                    "  {name}: {entries} kernels{}",
                    if same { ", unchanged" } else { ", written" }
                );
            }
        }
    }
    // PTX whose source is gone is stale too.
    let expected: Vec<String> = sources
        .iter()
        .flat_map(|s| ARCHES.map(|arch| format!("{}.{arch}.ptx", file_stem(s))))
        .collect();
    for orphan in ptx_files(&root.join(PTX_DIR))? {
        if !expected.contains(&orphan) {
            if a.check {
                stale.push(format!("{orphan} (no source)"));
            } else {
                let p = root.join(PTX_DIR).join(&orphan);
                std::fs::remove_file(&p).map_err(|e| io_failure(&p, e))?;
                println!("  {orphan}: removed (no source)");
            }
        }
    }
    if !failed.is_empty() {
        return Err(Failure::run(format!(
            "xtask kernels: {} of {} kernel files do not build:\n{}",
            failed.len(),
            expected.len(),
            failed.join("\n")
        )));
    }
    if !stale.is_empty() {
        return Err(Failure::run(format!(
            "xtask kernels --check: the committed PTX is stale ({}): run `cargo xtask kernels` \
             and commit {PTX_DIR}",
            stale.join(", ")
        )));
    }
    Ok(())
}

fn io_failure(path: &Path, e: std::io::Error) -> Failure {
    Failure::run(format!("xtask kernels: {}: {e}", path.display()))
}

fn file_stem(p: &Path) -> String {
    p.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The `.cu` files of `dir`, sorted.
fn kernel_sources(dir: &Path) -> Result<Vec<PathBuf>, Failure> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| io_failure(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "cu"))
        .collect();
    v.sort();
    if v.is_empty() {
        return Err(Failure::run(format!(
            "xtask kernels: no .cu file in {}",
            dir.display()
        )));
    }
    Ok(v)
}

/// The names of the `.ptx` files in `dir` (none when it does not exist).
fn ptx_files(dir: &Path) -> Result<Vec<String>, Failure> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
        Err(e) => return Err(io_failure(dir, e)),
    };
    let mut v: Vec<String> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".ptx"))
        .collect();
    v.sort();
    Ok(v)
}

/// Where NVRTC, the runtime's headers and ptxas are.
struct Tools {
    nvrtc_lib: PathBuf,
    include: PathBuf,
    ptxas: PathBuf,
}

impl Tools {
    fn find(root: &Path, tools: Option<&Path>) -> Result<Tools, Failure> {
        let dir = match tools
            .map(Path::to_path_buf)
            .or_else(|| std::env::var_os("MIRRA_CUDA_TOOLS").map(PathBuf::from))
        {
            Some(dir) => dir,
            None => install(root)?,
        };
        let nvidia = dir.join("nvidia");
        let t = Tools {
            nvrtc_lib: nvidia.join("cuda_nvrtc/lib/libnvrtc.so.12"),
            include: nvidia.join("cuda_runtime/include"),
            ptxas: nvidia.join("cuda_nvcc/bin/ptxas"),
        };
        for (what, p) in [
            ("NVRTC", &t.nvrtc_lib),
            ("the CUDA runtime's headers", &t.include),
            ("ptxas", &t.ptxas),
        ] {
            if !p.exists() {
                return Err(Failure::run(format!(
                    "xtask kernels: {what} not found at {} (install the tools with \
                     ci/install-cuda-tools.sh, or name their folder with --tools)",
                    p.display()
                )));
            }
        }
        Ok(t)
    }

    /// `ptxas -arch=<arch>` on `ptx`: Err with its output when it refuses.
    fn assemble(&self, ptx: &Path, arch: &str) -> Result<(), String> {
        let out = Command::new(&self.ptxas)
            .arg(format!("-arch={arch}"))
            .arg(ptx)
            .args(["-o", "/dev/null"])
            .output()
            .map_err(|e| format!("cannot run {}: {e}", self.ptxas.display()))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }
}

/// Run `ci/install-cuda-tools.sh` (idempotent) and return the folder it prints.
fn install(root: &Path) -> Result<PathBuf, Failure> {
    let script = root.join("ci/install-cuda-tools.sh");
    let out = Command::new("bash")
        .arg(&script)
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| Failure::run(format!("xtask kernels: {}: {e}", script.display())))?;
    if !out.status.success() {
        return Err(Failure::run(format!(
            "xtask kernels: {} failed ({}); name the tools' folder with --tools",
            script.display(),
            out.status
        )));
    }
    let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
    Ok(PathBuf::from(dir))
}

type NvrtcProgram = *mut std::ffi::c_void;

/// The NVRTC calls this needs, loaded from the wheel's `libnvrtc.so.12` (cudarc's NVRTC
/// bindings look for the library of the CUDA version mirra-cuda is built for, 13, whose
/// PTX the lent GPU's driver would refuse).
struct Nvrtc {
    _lib: libloading::Library,
    version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int,
    create: unsafe extern "C" fn(
        *mut NvrtcProgram,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> c_int,
    compile: unsafe extern "C" fn(NvrtcProgram, c_int, *const *const c_char) -> c_int,
    log_size: unsafe extern "C" fn(NvrtcProgram, *mut usize) -> c_int,
    log: unsafe extern "C" fn(NvrtcProgram, *mut c_char) -> c_int,
    ptx_size: unsafe extern "C" fn(NvrtcProgram, *mut usize) -> c_int,
    ptx: unsafe extern "C" fn(NvrtcProgram, *mut c_char) -> c_int,
    destroy: unsafe extern "C" fn(*mut NvrtcProgram) -> c_int,
}

impl Nvrtc {
    fn load(path: &Path) -> Result<Nvrtc, Failure> {
        let fail = |e: libloading::Error| {
            Failure::run(format!("xtask kernels: loading {}: {e}", path.display()))
        };
        // SAFETY: loading NVIDIA's NVRTC runs its initialisers, which have no preconditions.
        let lib = unsafe { libloading::Library::new(path) }.map_err(fail)?;
        // SAFETY: each symbol is looked up by its documented name and given its documented
        // C signature (nvrtc.h of CUDA 12.9).
        unsafe {
            Ok(Nvrtc {
                version: *lib.get(b"nvrtcVersion\0").map_err(fail)?,
                create: *lib.get(b"nvrtcCreateProgram\0").map_err(fail)?,
                compile: *lib.get(b"nvrtcCompileProgram\0").map_err(fail)?,
                log_size: *lib.get(b"nvrtcGetProgramLogSize\0").map_err(fail)?,
                log: *lib.get(b"nvrtcGetProgramLog\0").map_err(fail)?,
                ptx_size: *lib.get(b"nvrtcGetPTXSize\0").map_err(fail)?,
                ptx: *lib.get(b"nvrtcGetPTX\0").map_err(fail)?,
                destroy: *lib.get(b"nvrtcDestroyProgram\0").map_err(fail)?,
                _lib: lib,
            })
        }
    }

    fn version(&self) -> Result<(i32, i32), Failure> {
        let (mut major, mut minor) = (0, 0);
        // SAFETY: writes two ints.
        let rc = unsafe { (self.version)(&mut major, &mut minor) };
        if rc != 0 {
            return Err(Failure::run(format!(
                "xtask kernels: nvrtcVersion failed ({rc})"
            )));
        }
        Ok((major, minor))
    }

    /// Compile `source` for `arch` (sm_XX: PTX for compute_XX); Err with NVRTC's log.
    fn compile(&self, source: &Path, arch: &str, includes: &[&Path]) -> Result<String, String> {
        let text = std::fs::read_to_string(source).map_err(|e| format!("{e}"))?;
        let cstr = |s: String| CString::new(s).map_err(|_| "a NUL byte in the source".to_string());
        let src = cstr(text)?;
        // The program's name, without the folder: PTX that does not depend on the checkout.
        let name = cstr(
            source
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
        )?;
        let mut options = vec![format!(
            "--gpu-architecture={}",
            arch.replace("sm_", "compute_")
        )];
        options.extend(NVRTC_OPTIONS.iter().map(|o| o.to_string()));
        options.extend(includes.iter().map(|i| format!("-I{}", i.display())));
        let options: Vec<CString> = options.into_iter().map(cstr).collect::<Result<_, _>>()?;
        let pointers: Vec<*const c_char> = options.iter().map(|o| o.as_ptr()).collect();
        let mut program: NvrtcProgram = std::ptr::null_mut();
        // SAFETY: every pointer is a live NUL-terminated string; no headers are passed.
        let rc = unsafe {
            (self.create)(
                &mut program,
                src.as_ptr(),
                name.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        if rc != 0 {
            return Err(format!("nvrtcCreateProgram failed ({rc})"));
        }
        // SAFETY: `program` was created above; `pointers` outlive the call.
        let rc = unsafe { (self.compile)(program, pointers.len() as c_int, pointers.as_ptr()) };
        let result = if rc == 0 {
            self.read(program, self.ptx_size, self.ptx)
        } else {
            Err(self
                .read(program, self.log_size, self.log)
                .unwrap_or_else(|e| e))
        };
        // SAFETY: destroys the program created above, once.
        unsafe { (self.destroy)(&mut program) };
        let text = result?;
        if rc == 0 {
            Ok(text)
        } else {
            Err(text)
        }
    }

    /// NVRTC's two-call pattern: the size, then the text into a buffer of that size.
    fn read(
        &self,
        program: NvrtcProgram,
        size: unsafe extern "C" fn(NvrtcProgram, *mut usize) -> c_int,
        get: unsafe extern "C" fn(NvrtcProgram, *mut c_char) -> c_int,
    ) -> Result<String, String> {
        let mut n = 0usize;
        // SAFETY: `program` is live; the call writes one usize.
        if unsafe { size(program, &mut n) } != 0 {
            return Err("NVRTC could not say the size of its output".into());
        }
        let mut buf = vec![0u8; n.max(1)];
        // SAFETY: `buf` holds the `n` bytes (NUL included) NVRTC said it writes.
        if unsafe { get(program, buf.as_mut_ptr().cast()) } != 0 {
            return Err("NVRTC could not return its output".into());
        }
        Ok(CStr::from_bytes_until_nul(&buf)
            .map(|c| c.to_string_lossy().into_owned())
            .unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_source_has_committed_ptx_for_every_architecture() {
        let root = workspace_root();
        let committed = ptx_files(&root.join(PTX_DIR)).unwrap();
        for source in kernel_sources(&root.join(SOURCES)).unwrap() {
            for arch in ARCHES {
                let name = format!("{}.{arch}.ptx", file_stem(&source));
                assert!(committed.contains(&name), "{name} is not committed");
            }
        }
    }

    #[test]
    fn tools_that_are_missing_are_named() {
        let dir = std::env::temp_dir().join("mirra-no-cuda-tools");
        let err = match Tools::find(&workspace_root(), Some(&dir)) {
            Err(e) => e.message,
            Ok(_) => panic!("an empty folder holds no tools"),
        };
        assert!(
            err.contains("NVRTC not found at") && err.contains("ci/install-cuda-tools.sh"),
            "{err}"
        );
    }
}
