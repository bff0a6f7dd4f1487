//! mirra's own CUDA kernels: the PTX that `cargo xtask kernels` compiles from
//! `kernels/*.cu` (committed under `ptx/`, so building needs no CUDA tools), the op codes
//! the kernels take, and [`Kernels`], which loads a module on a device and looks a kernel
//! up by name.
//!
//! Kernel names are `<kernel>_<dtype>` (`unary_f32`, `adam_bf16`, `reduce_into_i64`): one
//! template per kernel in the source, instantiated per dtype. Element-wise kernels are
//! compiled without FMA contraction, so they round as the CPU's Rust does.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, LaunchConfig};
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

modules!(
    "collective",
    "elementwise",
    "index",
    "optim",
    "reduce",
    "softmax",
    "window"
);

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

/// The module that defines kernel `name` (an index of every module's entries, read from
/// the PTX once).
pub fn module_of(name: &str) -> Option<&'static Module> {
    static INDEX: OnceLock<HashMap<&'static str, &'static Module>> = OnceLock::new();
    INDEX
        .get_or_init(|| {
            MODULES
                .iter()
                .flat_map(|m| m.entries().into_iter().map(move |e| (e, m)))
                .collect()
        })
        .get(name)
        .copied()
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
/// of `kernels/common.cuh`).
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

/// A sliding window's geometry for `im2col_*`, `col2im_*`, `max_pool_*` and
/// `max_pool_grad_*` (`struct WindowGeometry` of `kernels/window.cu`): channels-last
/// tensors `[images, d1, d2, d3, channels]`, spatial dims beyond the window's rank of size
/// 1 (kernel, stride and dilation 1, padding 0). Tap `k` of output position `o` reads input
/// coordinate `o * stride - pad + k * dilation` along each dim.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[allow(missing_docs)]
pub struct WindowGeometry {
    pub input: [u64; 3],
    pub output: [u64; 3],
    pub kernel: [u64; 3],
    pub stride: [u64; 3],
    pub dilation: [u64; 3],
    pub pad: [u64; 3],
    pub images: u64,
    pub channels: u64,
}

// SAFETY: `WindowGeometry` is `repr(C)` plain data of the kernel's `struct WindowGeometry`
// layout (u64 arrays and u64s: no padding), passed by value.
unsafe impl cudarc::driver::DeviceRepr for WindowGeometry {}

/// Threads per block of every launch (a multiple of the warp, at most `MIRRA_MAX_BLOCK`).
pub const BLOCK: u32 = 256;

/// The kernels of one device: modules loaded on first use, functions looked up by name.
pub struct Kernels {
    ctx: Arc<CudaContext>,
    capability: (i32, i32),
    multiprocessors: usize,
    loaded: Mutex<Loaded>,
}

/// The modules loaded so far, and the functions looked up in them (a launch looks its
/// kernel up here, not in the driver).
#[derive(Default)]
struct Loaded {
    modules: HashMap<&'static str, Arc<CudaModule>>,
    functions: HashMap<String, CudaFunction>,
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
        let multiprocessors = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .op("cuDeviceGetAttribute")?
            .max(1) as usize;
        Ok(Kernels {
            ctx,
            capability,
            multiprocessors,
            loaded: Mutex::new(Loaded::default()),
        })
    }

    /// The launch of a grid-stride kernel over `n` elements: blocks of [`BLOCK`] threads, as
    /// many as cover `n` up to 32 per multiprocessor (each thread then loops).
    pub fn grid(&self, n: usize) -> LaunchConfig {
        let blocks = n
            .div_ceil(BLOCK as usize)
            .clamp(1, 32 * self.multiprocessors);
        LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// The launch of a kernel with one block per line (`reduce_rows_*`, `softmax_*`):
    /// `lines` blocks up to 65535 (each block then loops over lines).
    pub fn per_line(&self, lines: usize) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (lines.clamp(1, 65535) as u32, 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// The kernel `name` (`<kernel>_<dtype>`), loading its module on first use.
    pub fn function(&self, name: &str) -> Result<CudaFunction> {
        let mut loaded = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = loaded.functions.get(name) {
            return Ok(f.clone());
        }
        let module = module_of(name).ok_or_else(|| CudaError::Unsupported {
            what: format!("no kernel named {name} in mirra's PTX"),
        })?;
        let m = match loaded.modules.get(module.name) {
            Some(m) => m.clone(),
            None => {
                let ptx = module.ptx_for(self.capability.0, self.capability.1)?;
                let m = self.ctx.load_module(Ptx::from_src(ptx)).map_err(|source| {
                    CudaError::Driver {
                        op: "cuModuleLoadData (mirra's PTX)",
                        source,
                    }
                })?;
                loaded.modules.insert(module.name, m.clone());
                m
            }
        };
        let f = m.load_function(name).op("cuModuleGetFunction")?;
        loaded.functions.insert(name.to_string(), f.clone());
        Ok(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What lies between the braces of `head { ... }` (an enum or a struct) in a kernel
    /// source.
    fn declaration_body<'s>(source: &'s str, head: &str) -> &'s str {
        let start = source
            .find(&format!("{head} {{"))
            .unwrap_or_else(|| panic!("{head} not in the source"));
        let body = &source[start..];
        &body[body.find('{').unwrap() + 1..body.find('}').unwrap()]
    }

    /// `enum <name> { A = 0, ... }` of a kernel source, as (name, value) pairs.
    fn cuda_enum(source: &str, name: &str) -> Vec<(String, i32)> {
        declaration_body(source, &format!("enum {name}"))
            .split(',')
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
        let common = include_str!("../kernels/common.cuh");
        check(common, "Reduce", "REDUCE_", &reduce.map(|r| (r, r as i32)));
    }

    /// The fields of `struct name` in a CUDA source, each as `(field, elements)`, in order
    /// (every field a u64 or an array of them).
    fn cuda_struct(source: &str, name: &str) -> Vec<(String, usize)> {
        declaration_body(source, &format!("struct {name}"))
            .split(';')
            .map(str::trim)
            .filter(|f| !f.is_empty())
            .map(|f| {
                let f = f
                    .strip_prefix("u64 ")
                    .unwrap_or_else(|| panic!("{f}: not u64"));
                match f.split_once('[') {
                    Some((field, n)) => {
                        let n = n.trim_end_matches(']').replace("MIRRA_MAX_RANK", "8");
                        (field.to_string(), n.parse().unwrap())
                    }
                    None => (f.to_string(), 1),
                }
            })
            .collect()
    }

    /// The fields of a Rust struct of u64s and u64 arrays, from its `Debug` of all zeros.
    fn rust_struct(debug: &str) -> Vec<(String, usize)> {
        let body = &debug[debug.find('{').unwrap() + 1..debug.rfind('}').unwrap()];
        let mut fields = Vec::new();
        let mut rest = body.trim();
        while let Some((field, after)) = rest.split_once(':') {
            let after = after.trim_start();
            let (n, next) = if let Some(array) = after.strip_prefix('[') {
                let (inside, next) = array.split_once(']').unwrap();
                (inside.split(',').count(), next)
            } else {
                (1, after.split_once(',').map_or("", |(_, n)| n))
            };
            fields.push((field.trim().to_string(), n));
            rest = next.trim_start_matches(',').trim();
        }
        fields
    }

    #[test]
    fn structs_passed_by_value_have_the_sources_layout() {
        let window = include_str!("../kernels/window.cu");
        let geometry = rust_struct(&format!("{:?}", WindowGeometry::default()));
        assert_eq!(cuda_struct(window, "WindowGeometry"), geometry);
        let elements: usize = geometry.iter().map(|(_, n)| n).sum();
        assert_eq!(std::mem::size_of::<WindowGeometry>(), elements * 8);
        let elementwise = include_str!("../kernels/elementwise.cu");
        let broadcast = rust_struct(&format!("{:?}", Broadcast::default()));
        assert_eq!(cuda_struct(elementwise, "Broadcast"), broadcast);
        // The check can fail: two fields out of order are caught.
        let swapped = "struct WindowGeometry { u64 output[3]; u64 input[3]; };";
        assert_ne!(cuda_struct(swapped, "WindowGeometry")[..], geometry[..2]);
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
            "unscale_check",
            "argmax",
            "one_hot",
            "im2col",
            "col2im",
            "max_pool",
            "max_pool_grad",
        ] {
            want.extend(floats.map(|d| format!("{k}_{d}")));
        }
        for d in floats.iter().chain(&["i32", "i64", "u8"]) {
            want.push(format!("reduce_into_{d}"));
            want.push(format!("divide_{d}"));
            want.push(format!("copy_strided_{d}"));
            want.push(format!("index_select_{d}"));
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
        // Compiled with --fmad=false, the optimizers', reductions', window sums' and the
        // collectives' kernels round every product and sum as the CPU does (compiled
        // without it, Adam's `m + (g - m) * (1 - b1)` becomes an fma). The modules that call exp, log, tanh or
        // erf hold the fma instructions of those library functions.
        for m in MODULES {
            let fmas = m.sm_90.matches("fma.rn").count();
            match m.name {
                "collective" | "optim" | "reduce" | "window" => assert_eq!(fmas, 0, "{}", m.name),
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

/// The kernels run on a GPU against the CPU's formulas, written out here on the host
/// (`#[ignore]`d without a device; the GPU bundle runs them). Bitwise where the kernel and
/// the CPU do the same IEEE operations in the same order (no FMA contraction); a stated ulp
/// bound where a library function (exp, log) or a different order of additions is involved.
#[cfg(test)]
mod gpu {
    use super::*;
    use cudarc::driver::{CudaSlice, CudaStream, PushKernelArg};
    use half::bf16;

    fn gpu() -> (Arc<CudaContext>, Arc<CudaStream>, Kernels) {
        crate::check_device(0).expect("needs a CUDA device");
        let ctx = CudaContext::new(0).unwrap();
        let stream = ctx.default_stream();
        let k = Kernels::new(ctx.clone()).unwrap();
        (ctx, stream, k)
    }

    /// Values spread over about [-4, 4], some exactly 0, from a fixed seed.
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..n)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                if i % 17 == 0 {
                    0.0
                } else {
                    ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 8.0
                }
            })
            .collect()
    }

    fn ulps(a: f32, b: f32) -> u32 {
        if a.is_nan() && b.is_nan() {
            return 0;
        }
        let key = |x: f32| {
            let b = x.to_bits() as i32;
            if b < 0 {
                i32::MIN - b
            } else {
                b
            }
        };
        key(a).abs_diff(key(b))
    }

    fn download<T: cudarc::driver::DeviceRepr + Default + Clone>(
        stream: &Arc<CudaStream>,
        d: &CudaSlice<T>,
    ) -> Vec<T> {
        stream.clone_dtoh(d).unwrap()
    }

    #[test]
    #[ignore = "needs a CUDA device"]
    fn every_kernel_loads_on_the_device() {
        let (_ctx, _s, k) = gpu();
        for m in MODULES {
            for name in m.entries() {
                k.function(name).unwrap_or_else(|e| panic!("{name}: {e}"));
            }
        }
    }

    #[test]
    #[ignore = "needs a CUDA device"]
    fn unary_and_binary_kernels_match_the_cpu_formulas() {
        let (_ctx, stream, k) = gpu();
        let n = 100_003;
        let (xa, xb) = (values(n, 1), values(n, 2));
        let (a, b) = (
            stream.clone_htod(&xa).unwrap(),
            stream.clone_htod(&xb).unwrap(),
        );
        let mut y = stream.alloc_zeros::<f32>(n).unwrap();
        let len = n as u64;
        // (op, host formula, ulp bound): IEEE operations are exact to the bit.
        type Host = fn(f32) -> f32;
        let unary: [(UnaryKernel, Host, u32); 6] = [
            (UnaryKernel::Relu, |x| if x < 0.0 { 0.0 } else { x }, 0),
            (UnaryKernel::Neg, |x| -x, 0),
            (UnaryKernel::Square, |x| x * x, 0),
            (UnaryKernel::Recip, |x| 1.0 / x, 0),
            (UnaryKernel::Sqrt, |x| x.sqrt(), 0),
            (UnaryKernel::Exp, |x| x.exp(), 2),
        ];
        let f = k.function("unary_f32").unwrap();
        for (op, host, bound) in unary {
            let mut l = stream.launch_builder(&f);
            let code = op as i32;
            l.arg(&code).arg(&a).arg(&mut y).arg(&len);
            // SAFETY: unary_f32(int, const float*, float*, u64), both arrays of n elements.
            unsafe { l.launch(k.grid(n)) }.unwrap();
            let got = download(&stream, &y);
            for (i, (&g, &x)) in got.iter().zip(&xa).enumerate() {
                let want = host(x);
                assert!(ulps(g, want) <= bound, "{op:?}({x}) at {i}: {g} vs {want}");
            }
        }
        type Host2 = fn(f32, f32) -> f32;
        let binary: [(BinaryKernel, Host2); 5] = [
            (BinaryKernel::Add, |a, b| a + b),
            (BinaryKernel::Sub, |a, b| a - b),
            (BinaryKernel::Mul, |a, b| a * b),
            (BinaryKernel::Div, |a, b| a / b),
            (BinaryKernel::Maximum, |a, b| {
                if a > b || a.is_nan() {
                    a
                } else {
                    b
                }
            }),
        ];
        let f = k.function("binary_f32").unwrap();
        for (op, host) in binary {
            let mut l = stream.launch_builder(&f);
            let code = op as i32;
            l.arg(&code).arg(&a).arg(&b).arg(&mut y).arg(&len);
            // SAFETY: binary_f32(int, const float*, const float*, float*, u64).
            unsafe { l.launch(k.grid(n)) }.unwrap();
            let got = download(&stream, &y);
            for i in 0..n {
                let want = host(xa[i], xb[i]);
                assert!(
                    ulps(got[i], want) == 0,
                    "{op:?} at {i}: {} vs {want}",
                    got[i]
                );
            }
        }
    }

    #[test]
    #[ignore = "needs a CUDA device"]
    fn broadcasting_reads_each_operand_by_its_strides() {
        let (_ctx, stream, k) = gpu();
        // [3, 4] + [4]: the row vector broadcast along dim 0.
        let (xa, xb) = (values(12, 3), values(4, 4));
        let (a, b) = (
            stream.clone_htod(&xa).unwrap(),
            stream.clone_htod(&xb).unwrap(),
        );
        let mut y = stream.alloc_zeros::<f32>(12).unwrap();
        let mut s = Broadcast {
            rank: 2,
            ..Broadcast::default()
        };
        s.dims[..2].copy_from_slice(&[3, 4]);
        s.a_strides[..2].copy_from_slice(&[4, 1]);
        s.b_strides[..2].copy_from_slice(&[0, 1]);
        let f = k.function("binary_broadcast_f32").unwrap();
        let (code, len) = (BinaryKernel::Add as i32, 12u64);
        let mut l = stream.launch_builder(&f);
        l.arg(&code).arg(&a).arg(&b).arg(&mut y).arg(&len).arg(&s);
        // SAFETY: binary_broadcast_f32(int, a, b, y, u64, Broadcast): a has 12, b 4, y 12.
        unsafe { l.launch(k.grid(12)) }.unwrap();
        let got = download(&stream, &y);
        for i in 0..12 {
            assert_eq!(got[i].to_bits(), (xa[i] + xb[i % 4]).to_bits(), "at {i}");
        }
    }

    #[test]
    #[ignore = "needs a CUDA device"]
    fn adam_matches_the_cpu_update_bit_for_bit() {
        let (_ctx, stream, k) = gpu();
        let n = 65_537;
        let (p0, g) = (values(n, 5), values(n, 6));
        let mut p = stream.clone_htod(&p0).unwrap();
        let gd = stream.clone_htod(&g).unwrap();
        let mut m = stream.alloc_zeros::<f32>(n).unwrap();
        let mut v = stream.alloc_zeros::<f32>(n).unwrap();
        let (alpha, b1, b2, eps, decay) = (1e-3f64, 0.1f64, 0.001f64, 1e-7f64, 1.0f64);
        let f = k.function("adam_f32").unwrap();
        let (null, len) = (0u64, n as u64);
        let mut l = stream.launch_builder(&f);
        l.arg(&mut p)
            .arg(&gd)
            .arg(&mut m)
            .arg(&mut v)
            .arg(&null)
            .arg(&len);
        l.arg(&alpha).arg(&b1).arg(&b2).arg(&eps).arg(&decay);
        // SAFETY: adam_f32(p, g, m, v, vhat = null, n, alpha, 1-b1, 1-b2, eps, decay).
        unsafe { l.launch(k.grid(n)) }.unwrap();
        let got = download(&stream, &p);
        let (alpha, b1, b2, eps, decay) =
            (alpha as f32, b1 as f32, b2 as f32, eps as f32, decay as f32);
        for i in 0..n {
            let gi = g[i];
            let mi = 0.0 + (gi - 0.0) * b1;
            let vi = 0.0 + (gi * gi - 0.0) * b2;
            let want = p0[i] * decay - mi * alpha / (vi.sqrt() + eps);
            assert_eq!(
                got[i].to_bits(),
                want.to_bits(),
                "p[{i}]: {} vs {want}",
                got[i]
            );
        }
    }

    #[test]
    #[ignore = "needs a CUDA device"]
    fn row_reductions_and_softmax_match_the_host() {
        let (_ctx, stream, k) = gpu();
        let (rows, n) = (257, 1000);
        let x = values(rows * n, 7);
        let xd = stream.clone_htod(&x).unwrap();
        let mut y = stream.alloc_zeros::<f32>(rows).unwrap();
        let f = k.function("reduce_rows_f32").unwrap();
        for op in [ReduceKernel::Sum, ReduceKernel::Max] {
            let (code, r, len) = (op as i32, rows as u64, n as u64);
            let mut l = stream.launch_builder(&f);
            l.arg(&code).arg(&xd).arg(&mut y).arg(&r).arg(&len);
            // SAFETY: reduce_rows_f32(int, x [rows, n], y [rows], rows, n).
            unsafe { l.launch(k.per_line(rows)) }.unwrap();
            let got = download(&stream, &y);
            for (i, row) in x.chunks(n).enumerate() {
                let want = match op {
                    ReduceKernel::Max => row.iter().copied().fold(f32::MIN, f32::max),
                    _ => row.iter().map(|&v| v as f64).sum::<f64>() as f32,
                };
                // A sum in another order: within 1e-5 of the row's absolute sum.
                let scale: f32 = row.iter().map(|v| v.abs()).sum();
                assert!(
                    (got[i] - want).abs() <= 1e-5 * scale,
                    "{op:?} row {i}: {} vs {want}",
                    got[i]
                );
            }
        }
        let mut s = stream.alloc_zeros::<f32>(rows * n).unwrap();
        let f = k.function("softmax_f32").unwrap();
        let (outer, len, inner, log) = (rows as u64, n as u64, 1u64, 1i32);
        let mut l = stream.launch_builder(&f);
        l.arg(&xd)
            .arg(&mut s)
            .arg(&outer)
            .arg(&len)
            .arg(&inner)
            .arg(&log);
        // SAFETY: softmax_f32(x, y, outer, n, inner, log), both [rows, n].
        unsafe { l.launch(k.per_line(rows)) }.unwrap();
        let got = download(&stream, &s);
        for (row, out) in x.chunks(n).zip(got.chunks(n)) {
            let m = row.iter().copied().fold(f32::MIN, f32::max) as f64;
            let lse = row.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln();
            for (&v, &o) in row.iter().zip(out) {
                let want = (v as f64 - m - lse) as f32;
                assert!(
                    (o - want).abs() <= 1e-5 * (1.0 + want.abs()),
                    "{o} vs {want}"
                );
            }
        }
    }

    #[test]
    #[ignore = "needs a CUDA device"]
    fn casts_round_as_the_cpu_and_the_collective_reduction_wraps_integers() {
        let (_ctx, stream, k) = gpu();
        let n = 4099;
        let x = values(n, 8);
        let xd = stream.clone_htod(&x).unwrap();
        let mut y = stream.alloc_zeros::<bf16>(n).unwrap();
        let f = k.function("cast_f32_bf16").unwrap();
        let len = n as u64;
        let mut l = stream.launch_builder(&f);
        l.arg(&xd).arg(&mut y).arg(&len);
        // SAFETY: cast_f32_bf16(const float*, bf16*, u64).
        unsafe { l.launch(k.grid(n)) }.unwrap();
        let got = download(&stream, &y);
        for i in 0..n {
            assert_eq!(got[i].to_bits(), bf16::from_f32(x[i]).to_bits(), "at {i}");
        }
        let a: Vec<i32> = vec![i32::MAX, -5, 7, i32::MIN];
        let b: Vec<i32> = vec![1, -6, 8, -1];
        let mut ad = stream.clone_htod(&a).unwrap();
        let bd = stream.clone_htod(&b).unwrap();
        let f = k.function("reduce_into_i32").unwrap();
        let (code, len) = (ReduceKernel::Sum as i32, 4u64);
        let mut l = stream.launch_builder(&f);
        l.arg(&code).arg(&mut ad).arg(&bd).arg(&len);
        // SAFETY: reduce_into_i32(int, int* dst, const int* src, u64), 4 each.
        unsafe { l.launch(k.grid(4)) }.unwrap();
        let got = download(&stream, &ad);
        let want: Vec<i32> = a.iter().zip(&b).map(|(x, y)| x.wrapping_add(*y)).collect();
        assert_eq!(got, want);
    }
}
