//! mirra's own CUDA kernels: the PTX that `cargo xtask kernels` compiles from
//! `kernels/*.cu` (committed under `ptx/`, so building needs no CUDA tools), the op codes
//! the kernels take, and [`Kernels`], which loads a module on a device and looks a kernel
//! up by name.
//!
//! Kernel names are `<kernel>_<dtype>` (`unary_f32`, `adam_bf16`, `reduce_into_i64`): one
//! template per kernel in the source, instantiated per dtype. Element-wise kernels are
//! compiled without FMA contraction, so they round as the CPU's Rust does.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::Ptx;

use crate::error::Context;
use crate::{CudaError, Result};

/// One source file's PTX, for each architecture `cargo xtask kernels` writes.
#[derive(Clone, Copy, Debug)]
pub struct Module {
    /// The source's stem (`kernels/<name>.cu`).
    pub name: &'static str,
    /// PTX for compute capability 8.x (`.target sm_80`).
    pub sm_80: &'static str,
    /// PTX for compute capability 9.0 and newer (`.target sm_90`; JIT-compiled by the
    /// driver for newer devices).
    pub sm_90: &'static str,
}

macro_rules! modules {
    ($($name:literal),*) => {
        /// Every kernel module, as committed under `ptx/`.
        pub const MODULES: &[Module] = &[$(Module {
            name: $name,
            sm_80: include_str!(concat!("../ptx/", $name, ".sm_80.ptx")),
            sm_90: include_str!(concat!("../ptx/", $name, ".sm_90.ptx")),
        }),*];
    };
}

modules!("collective", "elementwise", "optim", "reduce", "softmax");

impl Module {
    /// The PTX for a device of compute capability `major.minor`: sm_90's from 9.0 on, sm_80's
    /// for 8.x; an older device is an error (mirra's kernels need sm_80: bf16 and the
    /// asynchronous copies of Ampere).
    pub fn ptx_for(&self, major: i32, minor: i32) -> Result<&'static str> {
        match major {
            9.. => Ok(self.sm_90),
            8 => Ok(self.sm_80),
            _ => Err(CudaError::Unsupported {
                what: format!(
                    "compute capability {major}.{minor}: mirra's kernels need 8.0 (A100) or newer"
                ),
            }),
        }
    }

    /// The names of the kernels this module defines (its PTX's `.entry` lines).
    pub fn entries(&self) -> Vec<&'static str> {
        entries(self.sm_90)
    }
}

fn entries(ptx: &'static str) -> Vec<&'static str> {
    ptx.lines()
        .filter_map(|l| l.trim().strip_prefix(".visible .entry "))
        .map(|rest| rest.split('(').next().unwrap_or(rest).trim())
        .collect()
}

/// The module that defines kernel `name`.
pub fn module_of(name: &str) -> Option<&'static Module> {
    MODULES.iter().find(|m| m.entries().contains(&name))
}

/// The op codes of `unary_<dtype>` (`enum Unary` of `kernels/elementwise.cu`), in the order
/// of mirra-tensor's `UnaryOp`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(i32)]
#[allow(missing_docs)]
pub enum UnaryKernel {
    Relu = 0,
    Sigmoid = 1,
    Tanh = 2,
    Gelu = 3,
    Exp = 4,
    Log = 5,
    Sqrt = 6,
    Neg = 7,
    Abs = 8,
    Square = 9,
    Recip = 10,
    Sign = 11,
}

/// The op codes of `binary_<dtype>` and `binary_broadcast_<dtype>` (`enum Binary` of
/// `kernels/elementwise.cu`), in the order of mirra-tensor's `BinaryOp`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(i32)]
#[allow(missing_docs)]
pub enum BinaryKernel {
    Add = 0,
    Sub = 1,
    Mul = 2,
    Div = 3,
    Maximum = 4,
    Minimum = 5,
    EqMask = 6,
    ReluBackward = 7,
    SigmoidBackward = 8,
    TanhBackward = 9,
    GeluBackward = 10,
}

/// The op codes of `reduce_rows_*`, `reduce_strided_*` and `reduce_into_*` (`enum Reduce`
/// of `kernels/reduce.cu` and `kernels/collective.cu`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(i32)]
#[allow(missing_docs)]
pub enum ReduceKernel {
    Sum = 0,
    Mean = 1,
    Max = 2,
    Min = 3,
    Product = 4,
}

/// The broadcast of `binary_broadcast_<dtype>` (`struct Broadcast` of
/// `kernels/elementwise.cu`): the output's dims and each operand's strides in elements (0
/// along a broadcast dimension), the first `rank` entries used.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct Broadcast {
    /// The output's dims.
    pub dims: [u64; MAX_RANK],
    /// The left operand's strides.
    pub a_strides: [u64; MAX_RANK],
    /// The right operand's strides.
    pub b_strides: [u64; MAX_RANK],
    /// How many dims are used.
    pub rank: u64,
}

/// The most dims [`Broadcast`] holds (`MIRRA_MAX_RANK`).
pub const MAX_RANK: usize = 8;

// SAFETY: `Broadcast` is `repr(C)` plain data of the kernel's `struct Broadcast` layout
// (u64 arrays and a u64: no padding), passed by value.
unsafe impl cudarc::driver::DeviceRepr for Broadcast {}

/// The kernels of one device: modules loaded on first use, functions looked up by name.
pub struct Kernels {
    ctx: Arc<CudaContext>,
    capability: (i32, i32),
    loaded: Mutex<HashMap<&'static str, Arc<CudaModule>>>,
}

impl std::fmt::Debug for Kernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Kernels(cuda:{}, sm_{}{})",
            self.ctx.ordinal(),
            self.capability.0,
            self.capability.1
        )
    }
}

impl Kernels {
    /// The kernels of the device of `ctx`; an error for a device older than sm_80.
    pub fn new(ctx: Arc<CudaContext>) -> Result<Kernels> {
        let capability = ctx.compute_capability().op("cuDeviceGetAttribute")?;
        // Refuse an unsupported device now rather than at the first launch.
        MODULES[0].ptx_for(capability.0, capability.1)?;
        Ok(Kernels {
            ctx,
            capability,
            loaded: Mutex::new(HashMap::new()),
        })
    }

    /// The kernel `name` (`<kernel>_<dtype>`), loading its module on first use.
    pub fn function(&self, name: &str) -> Result<CudaFunction> {
        let module = module_of(name).ok_or_else(|| CudaError::Unsupported {
            what: format!("no kernel named {name} in mirra's PTX"),
        })?;
        let loaded = {
            let mut map = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
            match map.get(module.name) {
                Some(m) => m.clone(),
                None => {
                    let ptx = module.ptx_for(self.capability.0, self.capability.1)?;
                    let m = self.ctx.load_module(Ptx::from_src(ptx)).map_err(|source| {
                        CudaError::Driver {
                            op: "cuModuleLoadData (mirra's PTX)",
                            source,
                        }
                    })?;
                    map.insert(module.name, m.clone());
                    m
                }
            }
        };
        loaded.load_function(name).op("cuModuleGetFunction")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `enum <name> { A = 0, ... }` of a kernel source, as (name, value) pairs.
    fn cuda_enum(source: &str, name: &str) -> Vec<(String, i32)> {
        let start = source
            .find(&format!("enum {name} {{"))
            .unwrap_or_else(|| panic!("enum {name} not in the source"));
        let body = &source[start..];
        let body = &body[body.find('{').unwrap() + 1..body.find('}').unwrap()];
        body.split(',')
            .filter_map(|item| item.split_once('='))
            .map(|(k, v)| (k.trim().to_string(), v.trim().parse().unwrap()))
            .collect()
    }

    /// CamelCase to the source's UPPER_SNAKE.
    fn snake(name: &str) -> String {
        let mut s = String::new();
        for (i, c) in name.chars().enumerate() {
            if c.is_uppercase() && i > 0 {
                s.push('_');
            }
            s.push(c.to_ascii_uppercase());
        }
        s
    }

    fn check<T: std::fmt::Debug + Copy>(
        source: &str,
        enum_name: &str,
        prefix: &str,
        all: &[(T, i32)],
    ) {
        let want: Vec<(String, i32)> = all
            .iter()
            .map(|(k, v)| (format!("{prefix}{}", snake(&format!("{k:?}"))), *v))
            .collect();
        assert_eq!(cuda_enum(source, enum_name), want, "enum {enum_name}");
    }

    #[test]
    fn op_codes_are_the_sources() {
        use BinaryKernel as B;
        use ReduceKernel as R;
        use UnaryKernel as U;
        let elementwise = include_str!("../kernels/elementwise.cu");
        let unary = [
            U::Relu,
            U::Sigmoid,
            U::Tanh,
            U::Gelu,
            U::Exp,
            U::Log,
            U::Sqrt,
            U::Neg,
            U::Abs,
            U::Square,
            U::Recip,
            U::Sign,
        ];
        check(
            elementwise,
            "Unary",
            "UNARY_",
            &unary.map(|u| (u, u as i32)),
        );
        let binary = [
            B::Add,
            B::Sub,
            B::Mul,
            B::Div,
            B::Maximum,
            B::Minimum,
            B::EqMask,
            B::ReluBackward,
            B::SigmoidBackward,
            B::TanhBackward,
            B::GeluBackward,
        ];
        check(
            elementwise,
            "Binary",
            "BINARY_",
            &binary.map(|b| (b, b as i32)),
        );
        let reduce = [R::Sum, R::Mean, R::Max, R::Min, R::Product];
        for source in [
            include_str!("../kernels/reduce.cu"),
            include_str!("../kernels/collective.cu"),
        ] {
            check(source, "Reduce", "REDUCE_", &reduce.map(|r| (r, r as i32)));
        }
    }

    #[test]
    fn a_mismatched_op_code_is_caught() {
        // The check above can fail: a source whose numbers differ is rejected.
        let source = "enum Unary { UNARY_RELU = 1, };";
        let got = cuda_enum(source, "Unary");
        assert_ne!(got, vec![("UNARY_RELU".to_string(), 0)]);
    }

    #[test]
    fn every_kernel_exists_for_every_dtype_and_architecture() {
        let floats = ["f32", "f64", "f16", "bf16"];
        let mut want: Vec<String> = vec![];
        for k in [
            "unary",
            "binary",
            "binary_broadcast",
            "affine",
            "fill",
            "reduce_rows",
            "reduce_strided",
            "sum_squares_partial",
            "softmax",
            "softmax_backward",
            "gather",
            "scatter_add",
            "sgd",
            "adam",
            "rmsprop",
            "scale_in_place",
        ] {
            want.extend(floats.map(|d| format!("{k}_{d}")));
        }
        for d in floats.iter().chain(&["i32", "i64", "u8"]) {
            want.push(format!("reduce_into_{d}"));
            want.push(format!("divide_{d}"));
        }
        for s in floats {
            want.extend(floats.map(|d| format!("cast_{s}_{d}")));
        }
        for m in MODULES {
            let (a, b) = (entries(m.sm_80), entries(m.sm_90));
            assert_eq!(a, b, "{}: sm_80 and sm_90 define different kernels", m.name);
            assert!(m.sm_80.contains(".target sm_80") && m.sm_90.contains(".target sm_90"));
        }
        let all: Vec<&str> = MODULES.iter().flat_map(|m| m.entries()).collect();
        for name in &want {
            assert!(all.contains(&name.as_str()), "{name} is in no module");
        }
        assert_eq!(all.len(), want.len(), "kernels nobody names: {all:?}");
        assert!(module_of("no_such_kernel").is_none());
    }

    #[test]
    fn the_ptx_loads_on_the_driver_of_the_lent_gpu() {
        // PTX ISA 8.8 is CUDA 12.9's; a CUDA 13.0 driver reads up to ISA 9.0. PTX from a
        // newer NVRTC than the driver (13.5: ISA 9.5) would be refused there.
        for m in MODULES {
            for ptx in [m.sm_80, m.sm_90] {
                let isa = ptx
                    .lines()
                    .find_map(|l| l.strip_prefix(".version "))
                    .expect("a .version line");
                let (major, minor) = isa.split_once('.').unwrap();
                let isa = (major.parse::<u32>().unwrap(), minor.parse::<u32>().unwrap());
                assert!(
                    isa <= (9, 0),
                    "{}: PTX ISA {isa:?} is newer than CUDA 13.0's",
                    m.name
                );
            }
        }
    }

    #[test]
    fn kernels_without_library_functions_do_not_fuse_multiply_add() {
        // Compiled with --fmad=false, the optimizers, reductions and the collectives'
        // kernels round every product and sum as the CPU does (compiled without it, Adam's
        // `m + (g - m) * (1 - b1)` becomes an fma). The modules that call exp, log, tanh or
        // erf hold the fma instructions of those library functions.
        for m in MODULES {
            let fmas = m.sm_90.matches("fma.rn").count();
            match m.name {
                "collective" | "optim" | "reduce" => assert_eq!(fmas, 0, "{}", m.name),
                _ => {}
            }
        }
    }

    #[test]
    fn old_devices_are_refused_by_name() {
        let e = MODULES[0].ptx_for(7, 5).unwrap_err().to_string();
        assert!(e.contains("compute capability 7.5"), "{e}");
        assert!(MODULES[0].ptx_for(8, 6).unwrap().contains("sm_80"));
        assert!(MODULES[0].ptx_for(10, 0).unwrap().contains("sm_90"));
    }
}
