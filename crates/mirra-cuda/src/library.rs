//! Which CUDA libraries this machine has, checked before any call into them.
//!
//! cudarc loads each library the first time one of its functions is called and panics if
//! none of the file names it knows is found. [`ensure`] asks first and turns a missing
//! library into a [`CudaError`] that says what was looked for; [`loaded_from`] says which
//! file the dynamic loader picked, for logs.

use crate::{CudaError, Result};

/// A CUDA library mirra calls into.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Library {
    /// The driver API (`libcuda.so.1`, installed with the NVIDIA driver).
    Driver,
    /// cuBLAS (`libcublas.so.13`, from the toolkit or the `nvidia-cublas` wheel).
    Cublas,
    /// NVRTC, the run-time CUDA C++ compiler (`libnvrtc.so.13`).
    Nvrtc,
    /// NCCL (`libnccl.so`; its wheel ships `libnccl.so.2`, which cudarc does not look for).
    Nccl,
}

impl Library {
    /// Every library, in the order the probe checks them.
    pub const ALL: [Library; 4] = [
        Library::Driver,
        Library::Cublas,
        Library::Nvrtc,
        Library::Nccl,
    ];

    /// The name users know it by.
    pub fn name(self) -> &'static str {
        match self {
            Library::Driver => "CUDA driver",
            Library::Cublas => "cuBLAS",
            Library::Nvrtc => "NVRTC",
            Library::Nccl => "NCCL",
        }
    }

    /// The stem cudarc builds file names from (`cuda` -> `libcuda.so`, `libcuda.so.1`, ...).
    fn stem(self) -> &'static str {
        match self {
            Library::Driver => "cuda",
            Library::Cublas => "cublas",
            Library::Nvrtc => "nvrtc",
            Library::Nccl => "nccl",
        }
    }

    /// The file names cudarc tries, in its order (each once).
    pub fn candidates(self) -> Vec<String> {
        let mut names = cudarc::get_lib_name_candidates(self.stem());
        let mut seen = std::collections::HashSet::new();
        names.retain(|n| seen.insert(n.clone()));
        names
    }

    /// What helps when this library is missing, beyond the search path.
    fn hint(self) -> &'static str {
        match self {
            Library::Nccl => {
                "; NCCL's wheel (nvidia-nccl-cu13) ships only libnccl.so.2: link it as \
                 libnccl.so in a folder on LD_LIBRARY_PATH (ci/gpu-check.sh does)"
            }
            _ => "",
        }
    }
}

/// True when one of the library's file names loads on this machine.
pub fn present(lib: Library) -> bool {
    // SAFETY: each call only tries `dlopen` on the library's candidate file names (running
    // their initialisers, as any use of the library would) and closes what it opened.
    unsafe {
        match lib {
            Library::Driver => cudarc::driver::sys::is_culib_present(),
            Library::Cublas => cudarc::cublas::sys::is_culib_present(),
            Library::Nvrtc => cudarc::nvrtc::sys::is_culib_present(),
            Library::Nccl => cudarc::nccl::sys::is_culib_present(),
        }
    }
}

/// `Ok` when the library is present; otherwise the error that names it and what was tried.
pub fn ensure(lib: Library) -> Result<()> {
    if present(lib) {
        return Ok(());
    }
    let searched = lib.candidates().join(", ");
    Err(match lib {
        Library::Driver => CudaError::NoDriver { searched },
        _ => CudaError::LibraryMissing {
            library: lib.name(),
            searched,
            hint: lib.hint(),
        },
    })
}

/// The path the dynamic loader mapped for this library, once it is loaded (read from
/// `/proc/self/maps`); `None` before it is loaded or where that file does not exist.
pub fn loaded_from(lib: Library) -> Option<String> {
    mapped_file(&format!("lib{}.so", lib.stem()))
}

/// The first mapped file whose name starts with `prefix`.
fn mapped_file(prefix: &str) -> Option<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .find(|path| {
            path.rsplit('/')
                .next()
                .is_some_and(|file| file.starts_with(prefix))
        })
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_include_the_cuda_13_names_of_the_gpu_machine() {
        // The lent machine has libcublas.so.13 and libnvrtc.so.13 (CUDA 13.0): a cudarc
        // feature of another major version would not look for them.
        assert!(Library::Cublas
            .candidates()
            .contains(&"libcublas.so.13".to_string()));
        assert!(Library::Nvrtc
            .candidates()
            .contains(&"libnvrtc.so.13".to_string()));
        assert!(Library::Driver
            .candidates()
            .contains(&"libcuda.so.1".to_string()));
    }

    #[test]
    fn a_missing_library_is_an_error_naming_it_not_a_panic() {
        for lib in Library::ALL {
            match ensure(lib) {
                Ok(()) => assert!(present(lib)),
                Err(e) => {
                    let msg = e.to_string();
                    match lib {
                        Library::Driver => {
                            assert!(msg.starts_with("no CUDA driver found"), "{msg}")
                        }
                        _ => assert!(msg.starts_with(lib.name()), "{msg}"),
                    }
                    assert!(msg.contains(&lib.candidates()[0]), "{msg}");
                }
            }
        }
    }

    #[test]
    fn mapped_file_finds_a_library_this_process_has_loaded() {
        // Every test process maps libc (glibc names it libc.so.6).
        let libc = mapped_file("libc.so").expect("libc is mapped");
        assert!(libc.starts_with('/') && libc.contains("libc.so"), "{libc}");
        assert_eq!(mapped_file("libmirra-no-such-library.so"), None);
        if !present(Library::Nccl) {
            assert_eq!(loaded_from(Library::Nccl), None);
        }
    }
}
