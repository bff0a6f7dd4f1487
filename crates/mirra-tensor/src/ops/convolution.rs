//! A convolution as one operation, its two gradients, and the choice of how to compute
//! them:
//!
//! - `im2col`: the patches of the window times the kernel reshaped to a matrix, one
//!   product through the gemm path (any stride, dilation, dtype). The patches are `taps`
//!   times the input's size, written and read back: for a 3x3 window over few channels
//!   that copying costs as much as the product.
//! - `shifted`: stride 1 and dilation 1 only, f32 and f64 on the host: products of shifted
//!   views of the padded input, no patches (`conv_shifted`). Through gemm it computes the
//!   positions of the padded grid the output lacks and drops them, so it pays off when
//!   those are few and each product's inner dimension (`k_last · channels`) is wide
//!   enough to run at speed; on the CPU's own kernels (f32 on AVX-512, bf16 on AVX-512
//!   BF16, any stride for the output and the kernel gradient) it computes the kept
//!   positions only and always wins. bf16 takes this path in bf16 only on those kernels,
//!   and not under the bf16 accumulation ablation (a product of patches). The 16-bit
//!   floats the CPU has no kernels for (f16; bf16 where the CPU lacks AVX-512 BF16, and
//!   bf16 widths its bf16 kernels do not take but the f32 ones do, 8 or 24 channels)
//!   take it in f32, as their matrix products do: operands widened exactly, f32 sums,
//!   each result rounded once.
//!
//! `Auto` picks by those two figures; [`set_conv_algorithm`] (or
//! `MIRRA_CONV_ALGORITHM=im2col|shifted|auto`) forces one, for tests and benchmarks. A
//! forced `shifted` falls back to `im2col` where it does not apply.

use std::cell::Cell;
use std::sync::OnceLock;

use mirra_device::Buffer;

use super::conv::check_channels_last;
use super::conv_shifted::{Grid, Pass};
use crate::{DType, Result, Tensor, TensorError, Window};

/// How a convolution is computed (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConvAlgorithm {
    /// `Shifted` where it applies and is expected to win, `Im2col` otherwise.
    Auto,
    /// The patches times the kernel.
    Im2col,
    /// Products of shifted views of the padded input (stride 1, dilation 1, f32/f64 on
    /// the host, bf16 on AVX-512 BF16; `Im2col` elsewhere).
    Shifted,
}

/// The most grid rows per output position `Auto` accepts for `Shifted` through gemm: it
/// computes that many positions per one kept, against `im2col`'s `taps` copies of the
/// input. (On the CPU's own kernels, f32 on AVX-512 where what the pass writes is whole
/// vectors wide (filters for the output and the kernel gradient, channels for the input
/// gradient), it computes the kept positions only, and always wins.)
const MAX_GRID_OVERHEAD: f64 = 1.35;

/// The narrowest inner dimension (`k_last · channels`) `Auto` gives `Shifted`: narrower
/// products (a first layer over one channel) run far below the gemm's speed.
const MIN_INNER: usize = 16;

thread_local! {
    static CHOSEN: Cell<Option<ConvAlgorithm>> = const { Cell::new(None) };
}

/// Force how the convolutions called from this thread are computed (`Auto` restores
/// the default choice).
pub fn set_conv_algorithm(algorithm: ConvAlgorithm) {
    CHOSEN.with(|c| c.set(Some(algorithm)));
}

/// The algorithm asked for on this thread: [`set_conv_algorithm`], else
/// `MIRRA_CONV_ALGORITHM`, else `Auto`.
pub fn conv_algorithm() -> ConvAlgorithm {
    static FROM_ENV: OnceLock<ConvAlgorithm> = OnceLock::new();
    CHOSEN.with(Cell::get).unwrap_or_else(|| {
        *FROM_ENV.get_or_init(|| match std::env::var("MIRRA_CONV_ALGORITHM").as_deref() {
            Ok("im2col") => ConvAlgorithm::Im2col,
            Ok("shifted") => ConvAlgorithm::Shifted,
            _ => ConvAlgorithm::Auto,
        })
    })
}

/// What a convolution's kernel gradient can reuse of its forward pass: the patches the
/// im2col algorithm made, or the zero-padded input the shifted one made (a fraction of
/// the patches' size).
#[derive(Clone, Debug, Default)]
pub struct ConvSaved(Saved);

#[derive(Clone, Debug, Default)]
enum Saved {
    #[default]
    Nothing,
    Patches(Tensor),
    PaddedInput(Tensor),
}

/// The grid of the shifted algorithm for `pass` of `window` over `n` images of `c`
/// channels to `f` filters, and the dtype it computes in, when this thread's
/// [`conv_algorithm`] picks it for operands of `dtype` (all on the host when `host`);
/// `None`: im2col.
fn shifted(
    window: &Window,
    [n, c, f]: [usize; 3],
    dtype: DType,
    host: bool,
    pass: Pass,
) -> Option<(Grid, DType)> {
    if !host {
        return None;
    }
    let grid = Grid::new(window, n, c, f)?;
    let compute = match dtype {
        DType::F32 | DType::F64 => dtype,
        // The bf16 accumulation ablation keeps bf16 running sums: a product of patches.
        DType::BF16 if super::bf16_accumulation::bf16_accumulation_ablation() => return None,
        // On 16-bit units, bf16 runs on the CPU's own bf16 kernels (gemm has none); where
        // a pass's width does not fit them (8 or 24 channels) but fits the f32 kernels, on
        // those, widened (the same products, f32 sums, one rounding); elsewhere its patches
        // go to the bf16 matrix product.
        DType::BF16 if super::bf16_gemm::native().is_some() => {
            if grid.runs_native(DType::BF16, pass) {
                DType::BF16
            } else if grid.runs_native(DType::F32, pass) {
                DType::F32
            } else {
                return None;
            }
        }
        // No 16-bit kernels for these: f32 products of the widened operands.
        DType::BF16 | DType::F16 => DType::F32,
        _ => return None,
    };
    let native = grid.runs_native(compute, pass);
    // Other strides run on the CPU's own kernels only, and not for the input gradient
    // (a transposed convolution: each input position gathers from a stride's phase).
    if !grid.unit_stride() && (!native || matches!(pass, Pass::InputGrad)) {
        return None;
    }
    // gemm's inner dimension: a tap row of what the pass reads.
    let read = if matches!(pass, Pass::InputGrad) {
        f
    } else {
        c
    };
    let inner = window.kernel().last().copied().unwrap_or(1) * read;
    let picked = match conv_algorithm() {
        ConvAlgorithm::Im2col => false,
        ConvAlgorithm::Shifted => true,
        ConvAlgorithm::Auto => {
            native || (grid.overhead() <= MAX_GRID_OVERHEAD && inner >= MIN_INNER)
        }
    };
    picked.then_some((grid, compute))
}

/// The filters of `kernel` (`[k1, .., kk, c, f]`, or any shape of those elements whose last
/// dimension is `f`) for `window` over `c` channels.
fn filters(op: &'static str, kernel: &Tensor, window: &Window, c: usize) -> Result<usize> {
    let f = kernel.dims().last().copied().unwrap_or(0);
    if kernel.rank() < 2 || kernel.elem_count() != window.taps() * c * f {
        return Err(TensorError::Invalid {
            op,
            msg: format!(
                "expected a kernel {:?} for a {:?} window over {c} channels",
                [window.kernel(), &[c, f]].concat(),
                window.kernel()
            ),
            shape: *kernel.shape(),
        });
    }
    Ok(f)
}

/// An error unless `a` and `b` have one dtype.
fn same_dtype(op: &'static str, a: &Tensor, b: &Tensor) -> Result<()> {
    if a.dtype() != b.dtype() {
        return Err(TensorError::DTypeMismatch {
            op,
            lhs: a.dtype(),
            rhs: b.dtype(),
        });
    }
    Ok(())
}

/// `[n, f]` of a gradient `[n, o1, .., ok, f]` of `window`'s output.
fn check_output_grad(op: &'static str, dy: &Tensor, window: &Window) -> Result<[usize; 2]> {
    let ones = vec![1; window.rank()];
    let output = Window::new(window.output(), &ones, &ones, &ones, crate::Padding::Valid)
        .expect("a window's output is a valid input of a 1-wide window");
    check_channels_last(op, dy, &output)
}

/// Whether every tensor is on the host.
fn on_host(tensors: &[&Tensor]) -> bool {
    tensors.iter().all(|t| t.device().is_cpu())
}

/// `x` zero-padded on the shifted algorithm's grid, in the dtype the algorithm computes
/// in (`compute`: f32, f64 or bf16; `x` widened to it where it is narrower).
fn padded_input(grid: &Grid, x: &Tensor, compute: DType) -> Result<Tensor> {
    let x = x.to_dtype(compute)?.contiguous()?;
    let padded = match compute {
        DType::F64 => grid.padded_input::<f64>(x.as_slice()?)?,
        DType::BF16 => grid.padded_input::<half::bf16>(x.as_slice()?)?,
        _ => grid.padded_input::<f32>(x.as_slice()?)?,
    };
    let len = padded.len();
    Tensor::from_buffer(padded, &[len])
}

/// `pass` of the shifted algorithm on `a` and `b` (on the host) in `compute` (f32, f64 or
/// bf16; operands of a narrower dtype widened to it) into a new tensor of `dims` in
/// `dtype` (the results rounded once where `compute` is wider).
fn shifted_pass(
    grid: &Grid,
    pass: Pass,
    (a, b): (&Tensor, &Tensor),
    compute: DType,
    (dims, dtype): (&[usize], DType),
) -> Result<Tensor> {
    let a = a.to_dtype(compute)?.contiguous()?;
    let b = b.to_dtype(compute)?.contiguous()?;
    let mut out = Buffer::alloc(compute, dims.iter().product(), a.device())?;
    match compute {
        DType::F64 => grid.run::<f64>(pass, a.as_slice()?, b.as_slice()?, out.as_mut_slice()?)?,
        #[cfg(target_arch = "x86_64")]
        DType::BF16 => grid.run_bf16(
            pass,
            bytemuck::cast_slice(a.as_slice::<half::bf16>()?),
            bytemuck::cast_slice(b.as_slice::<half::bf16>()?),
            bytemuck::cast_slice_mut(out.as_mut_slice::<half::bf16>()?),
        )?,
        _ => grid.run::<f32>(pass, a.as_slice()?, b.as_slice()?, out.as_mut_slice()?)?,
    }
    Tensor::from_buffer(out, dims)?.to_dtype(dtype)
}

impl Tensor {
    /// The convolution of this `[n, d1, .., dk, c]` input with `kernel` (`[k1, .., kk, c,
    /// f]`) over `window`: `[n, o1, .., ok, f]`, without bias. Also returns what
    /// [`conv_kernel_grad`](Tensor::conv_kernel_grad) can reuse.
    pub fn conv(&self, kernel: &Tensor, window: &Window) -> Result<(Tensor, ConvSaved)> {
        let op = "conv";
        let [n, c] = check_channels_last(op, self, window)?;
        let f = filters(op, kernel, window, c)?;
        same_dtype(op, self, kernel)?;
        let dims = Window::dims(n, window.output(), f);
        let host = on_host(&[self, kernel]);
        let Some((grid, compute)) = shifted(window, [n, c, f], self.dtype(), host, Pass::Forward)
        else {
            let rows = window.taps() * c;
            let patches = self
                .im2col(window)?
                .reshape(&[n * window.positions(), rows])?;
            let y = patches
                .matmul(&kernel.reshape(&[rows, f])?)?
                .reshape(&dims)?;
            return Ok((y, ConvSaved(Saved::Patches(patches))));
        };
        let padded = padded_input(&grid, self, compute)?;
        let y = shifted_pass(
            &grid,
            Pass::Forward,
            (&padded, kernel),
            compute,
            (&dims, self.dtype()),
        )?;
        Ok((y, ConvSaved(Saved::PaddedInput(padded))))
    }

    /// The gradient of a convolution's input from this gradient of its output (`[n, o1,
    /// .., ok, f]`), through `kernel` (`[k1, .., kk, c, f]`): `[n, d1, .., dk, c]`.
    pub fn conv_input_grad(&self, kernel: &Tensor, window: &Window) -> Result<Tensor> {
        let op = "conv_input_grad";
        let dy = self;
        let [n, f] = check_output_grad(op, dy, window)?;
        let c = kernel.elem_count() / (window.taps() * f).max(1);
        if filters(op, kernel, window, c)? != f {
            return Err(TensorError::Invalid {
                op,
                msg: format!("expected {f} filters, one per channel of the gradient"),
                shape: *kernel.shape(),
            });
        }
        same_dtype(op, dy, kernel)?;
        let dims = Window::dims(n, window.input(), c);
        let host = on_host(&[dy, kernel]);
        let Some((grid, compute)) = shifted(window, [n, c, f], dy.dtype(), host, Pass::InputGrad)
        else {
            let rows = window.taps() * c;
            return dy
                .reshape(&[n * window.positions(), f])?
                .matmul(&kernel.reshape(&[rows, f])?.t()?)?
                .reshape(&Window::dims(n, window.output(), rows))?
                .col2im(window, c);
        };
        shifted_pass(
            &grid,
            Pass::InputGrad,
            (dy, kernel),
            compute,
            (&dims, dy.dtype()),
        )
    }

    /// The gradient of a convolution's kernel, `[k1 · .. · kk · c, f]`, from its input (this
    /// tensor), the gradient of its output `dy`, and what its forward pass saved.
    pub fn conv_kernel_grad(
        &self,
        dy: &Tensor,
        window: &Window,
        saved: &ConvSaved,
    ) -> Result<Tensor> {
        let op = "conv_kernel_grad";
        let [n, c] = check_channels_last(op, self, window)?;
        let [dn, f] = check_output_grad(op, dy, window)?;
        if dn != n {
            return Err(TensorError::ShapeMismatch {
                op,
                lhs: *self.shape(),
                rhs: *dy.shape(),
            });
        }
        same_dtype(op, self, dy)?;
        let rows = window.taps() * c;
        let dy2 = || dy.reshape(&[n * window.positions(), f]);
        if let Saved::Patches(patches) = &saved.0 {
            return patches.t()?.matmul(&dy2()?);
        }
        let host = on_host(&[self, dy]);
        let Some((grid, compute)) =
            shifted(window, [n, c, f], self.dtype(), host, Pass::KernelGrad)
        else {
            let patches = self
                .im2col(window)?
                .reshape(&[n * window.positions(), rows])?;
            return patches.t()?.matmul(&dy2()?);
        };
        let padded = match &saved.0 {
            Saved::PaddedInput(padded) => padded.clone(),
            _ => padded_input(&grid, self, compute)?,
        };
        shifted_pass(
            &grid,
            Pass::KernelGrad,
            (&padded, dy),
            compute,
            (&[rows, f], self.dtype()),
        )
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::{Device, Padding};

    /// Calls `visit(image, position, tap, input)` for every tap of every output position
    /// of `window` over `n` images, `input` the flat spatial index the tap reads (`None`
    /// in the padding): the definition of a convolution, one tap at a time.
    fn each_tap(
        window: &Window,
        n: usize,
        mut visit: impl FnMut(usize, usize, usize, Option<usize>),
    ) {
        let r = window.rank();
        let (input, output, kernel) = (window.input(), window.output(), window.kernel());
        let (stride, dilation, pad) = (window.stride(), window.dilation(), window.pad());
        let index = |size: &[usize], mut flat: usize| -> Vec<usize> {
            let mut at = vec![0; r];
            for d in (0..r).rev() {
                at[d] = flat % size[d];
                flat /= size[d];
            }
            at
        };
        for b in 0..n {
            for o in 0..window.positions() {
                let oi = index(output, o);
                for t in 0..window.taps() {
                    let ti = index(kernel, t);
                    let mut flat = Some(0);
                    for d in 0..r {
                        let at =
                            (oi[d] * stride[d] + ti[d] * dilation[d]) as isize - pad[d] as isize;
                        flat = flat
                            .filter(|_| at >= 0 && (at as usize) < input[d])
                            .map(|f| f * input[d] + at as usize);
                    }
                    visit(b, o, t, flat);
                }
            }
        }
    }

    /// The convolution, its input gradient and its kernel gradient, summed tap by tap.
    fn reference(
        window: &Window,
        x: &[f64],
        k: &[f64],
        dy: &[f64],
        [n, c, f]: [usize; 3],
    ) -> [Vec<f64>; 3] {
        let (image, positions) = (window.input().iter().product::<usize>(), window.positions());
        let mut y = vec![0.0; n * positions * f];
        let mut dx = vec![0.0; n * image * c];
        let mut dk = vec![0.0; window.taps() * c * f];
        each_tap(window, n, |b, o, t, i| {
            let Some(i) = i else { return };
            for ci in 0..c {
                for fi in 0..f {
                    let (xv, kv, g) = (
                        x[(b * image + i) * c + ci],
                        k[(t * c + ci) * f + fi],
                        dy[(b * positions + o) * f + fi],
                    );
                    y[(b * positions + o) * f + fi] += xv * kv;
                    dx[(b * image + i) * c + ci] += g * kv;
                    dk[(t * c + ci) * f + fi] += g * xv;
                }
            }
        });
        [y, dx, dk]
    }

    fn values(len: usize, seed: u64) -> Vec<f64> {
        (0..len as u64)
            .map(|i| ((i * 2_654_435_761 + seed * 40_503) % 2001) as f64 / 1000.0 - 1.0)
            .collect()
    }

    /// The three results of `algorithm` on this thread, and whether the forward pass
    /// kept patches (im2col ran).
    fn run(
        algorithm: ConvAlgorithm,
        window: &Window,
        x: &Tensor,
        k: &Tensor,
        dy: &Tensor,
    ) -> ([Vec<f64>; 3], bool) {
        set_conv_algorithm(algorithm);
        let (y, saved) = x.conv(k, window).unwrap();
        let dx = dy.conv_input_grad(k, window).unwrap();
        let dk = x
            .conv_kernel_grad(dy, window, &ConvSaved::default())
            .unwrap();
        let dk_saved = x.conv_kernel_grad(dy, window, &saved).unwrap();
        set_conv_algorithm(ConvAlgorithm::Auto);
        let dk_saved = dk_saved.to_vec::<f64>().unwrap();
        let dk = dk.to_vec::<f64>().unwrap();
        assert_eq!(dk.len(), dk_saved.len());
        for (a, b) in dk.iter().zip(&dk_saved) {
            assert!(
                (a - b).abs() <= 1e-12 * (1.0 + b.abs()),
                "saved patches give {b}, recomputed {a}"
            );
        }
        let vec = |t: Tensor| t.to_vec::<f64>().unwrap();
        ([vec(y), vec(dx), dk], matches!(saved.0, Saved::Patches(_)))
    }

    fn window_operands() -> impl Strategy<Value = (Window, [usize; 3])> {
        (
            1usize..=3,
            1usize..=3,
            1usize..=5,
            1usize..=4,
            any::<bool>(),
            1usize..=2,
            1usize..=2,
        )
            .prop_flat_map(|(rank, n, c, f, same, stride, dilation)| {
                (
                    prop::collection::vec((1usize..=7, 1usize..=3), rank),
                    Just((n, c, f, same, stride, dilation)),
                )
            })
            .prop_filter_map(
                "window fits",
                |(dims, (n, c, f, same, stride, dilation))| {
                    let (size, kernel): (Vec<usize>, Vec<usize>) = dims.into_iter().unzip();
                    let r = size.len();
                    let padding = if same { Padding::Same } else { Padding::Valid };
                    let w = Window::new(
                        &size,
                        &kernel,
                        &vec![stride; r],
                        &vec![dilation; r],
                        padding,
                    )
                    .ok()?;
                    Some((w, [n, c, f]))
                },
            )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]

        /// Both algorithms give the tap-by-tap sums, for any rank, padding, stride and
        /// dilation; the shifted one runs (keeps no patches) wherever stride and dilation
        /// are 1.
        #[test]
        fn both_algorithms_match_the_definition((window, [n, c, f]) in window_operands(), seed: u64) {
            let seed = seed % 1000;
            let k_len = window.taps() * c * f;
            let x = values(n * window.input().iter().product::<usize>() * c, seed);
            let k = values(k_len, seed + 1);
            let dy = values(n * window.positions() * f, seed + 2);
            let expected = reference(&window, &x, &k, &dy, [n, c, f]);
            let mut kernel_dims = window.kernel().to_vec();
            kernel_dims.extend([c, f]);
            let xt = Tensor::from_slice(&x, &Window::dims(n, window.input(), c), Device::Cpu).unwrap();
            let kt = Tensor::from_slice(&k, &kernel_dims, Device::Cpu).unwrap();
            let dyt = Tensor::from_slice(&dy, &Window::dims(n, window.output(), f), Device::Cpu).unwrap();
            let unit = window.stride().iter().chain(window.dilation()).all(|&s| s == 1);
            for algorithm in [ConvAlgorithm::Im2col, ConvAlgorithm::Shifted] {
                let (got, patches) = run(algorithm, &window, &xt, &kt, &dyt);
                prop_assert_eq!(patches, algorithm == ConvAlgorithm::Im2col || !unit);
                for (what, (got, want)) in ["output", "input gradient", "kernel gradient"].iter().zip(got.iter().zip(&expected)) {
                    prop_assert_eq!(got.len(), want.len());
                    for (i, (a, b)) in got.iter().zip(want).enumerate() {
                        prop_assert!((a - b).abs() <= 1e-12 * (1.0 + b.abs()), "{:?} {} [{}]: {} against {}", algorithm, what, i, a, b);
                    }
                }
            }
        }
    }

    /// In f32 the shifted algorithm runs the CPU's own kernels where it has them (8 to
    /// 64 channels or filters in steps of 8, wider ones in groups of 64, row blocks with
    /// a remainder) and gemm elsewhere; both give the tap-by-tap sums to f32's rounding.
    #[test]
    fn shifted_f32_matches_the_definition_at_every_width() {
        shifted_matches_the_definition_at_every_width(DType::F32);
    }

    /// In bf16 the shifted algorithm runs on `vdpbf16ps` where the CPU has it (16 to 64
    /// channels or filters; odd inner sizes and run lengths) and im2col elsewhere; both
    /// give the tap-by-tap sums of the bf16 operands to f32's rounding and one bf16
    /// rounding of the result.
    #[test]
    fn shifted_bf16_matches_the_definition_at_every_width() {
        shifted_matches_the_definition_at_every_width(DType::BF16);
    }

    /// f16, for which the CPU has no kernels, runs the shifted algorithm in f32 (as its
    /// matrix products do): the operands widened exactly, f32 sums, one f16 rounding of
    /// each result, on the f32 kernels or gemm.
    #[test]
    fn shifted_f16_matches_the_definition_at_every_width() {
        shifted_matches_the_definition_at_every_width(DType::F16);
    }

    /// The widths, strides and paddings of the three tests above, in `dtype`.
    fn shifted_matches_the_definition_at_every_width(dtype: DType) {
        let native = Grid::new(
            &Window::new(&[4, 4], &[3, 3], &[1, 1], &[1, 1], Padding::Same).unwrap(),
            1,
            16,
            16,
        )
        .unwrap()
        .runs_native(dtype, Pass::Forward);
        // 28x29 over 6 images: more grid rows than one chunk, so a chunk ends in a block of
        // rows whose outputs are kept.
        // Strides of 2 (the forward pass and the kernel gradient) and a valid window that
        // leaves input unread.
        let unit = [1, 1];
        for (size, c, f, n, stride, padding) in [
            (28, 16, 16, 6, unit, Padding::Same),
            (7, 16, 16, 3, unit, Padding::Same),
            (5, 32, 48, 2, unit, Padding::Same),
            (6, 64, 16, 1, unit, Padding::Same),
            (5, 16, 64, 2, unit, Padding::Same),
            (4, 8, 24, 2, unit, Padding::Same),
            (28, 16, 32, 3, [2, 2], Padding::Same),
            (14, 32, 64, 2, [2, 1], Padding::Same),
            (8, 16, 16, 2, [2, 3], Padding::Valid),
            // Wider than one group of 64 columns, one input channel, and a pass that runs
            // natively beside one that does not.
            (5, 16, 80, 1, unit, Padding::Same),
            (4, 96, 128, 1, unit, Padding::Same),
            (7, 1, 16, 2, unit, Padding::Valid),
            // Valid windows of stride 1, whose input gradient's runs (an image's rows, then
            // the next image's) continue one another and run as one: over three images,
            // and over 30 images of 12x13, where a chunk of runs ends inside an image.
            (13, 32, 64, 3, unit, Padding::Valid),
            (12, 16, 16, 30, unit, Padding::Valid),
            (6, 80, 8, 1, unit, Padding::Same),
            // Widths ending in 8 columns (f32's half-width vectors; bf16's im2col): alone,
            // after whole vectors, after a whole group, and strided.
            (6, 8, 8, 2, unit, Padding::Same),
            (5, 24, 40, 1, unit, Padding::Same),
            (4, 8, 72, 1, unit, Padding::Same),
            (9, 8, 24, 2, [2, 2], Padding::Same),
        ] {
            let window = Window::new(&[size, size + 1], &[3, 2], &stride, &unit, padding).unwrap();
            // The operands as `dtype` holds them, and the sums of those values.
            let rounded = |v: Vec<f64>| -> Vec<f64> {
                let t = Tensor::from_slice(&v, &[v.len()], Device::Cpu).unwrap();
                t.to_dtype(dtype)
                    .unwrap()
                    .to_dtype(DType::F64)
                    .unwrap()
                    .to_vec::<f64>()
                    .unwrap()
            };
            let x = rounded(values(n * size * (size + 1) * c, 4));
            let k = rounded(values(window.taps() * c * f, 5));
            let dy = rounded(values(n * window.positions() * f, 6));
            let expected = reference(&window, &x, &k, &dy, [n, c, f]);
            let tensor = |v: &[f64], dims: &[usize]| {
                Tensor::from_slice(v, dims, Device::Cpu)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap()
            };
            let xt = tensor(&x, &[n, size, size + 1, c]);
            let kt = tensor(&k, &[3, 2, c, f]);
            let dyt = tensor(&dy, &Window::dims(n, window.output(), f));
            set_conv_algorithm(ConvAlgorithm::Shifted);
            let (y, saved) = xt.conv(&kt, &window).unwrap();
            let got = [
                y,
                dyt.conv_input_grad(&kt, &window).unwrap(),
                xt.conv_kernel_grad(&dyt, &window, &saved).unwrap(),
            ];
            set_conv_algorithm(ConvAlgorithm::Auto);
            // The widths the CPU's own kernels take: 8 lanes in f32, 16 in bf16; bf16
            // widths of 8 lanes run widened on the f32 ones.
            let lanes = if dtype == DType::BF16 { 16 } else { 8 };
            let native_forward = native && f % lanes == 0;
            let f32_kernels = Grid::new(
                &Window::new(&[4, 4], &[3, 3], &[1, 1], &[1, 1], Padding::Same).unwrap(),
                1,
                8,
                8,
            )
            .unwrap()
            .runs_native(DType::F32, Pass::Forward);
            assert_eq!(
                matches!(saved.0, Saved::PaddedInput(_)),
                dtype != DType::BF16 || !native || native_forward || (f32_kernels && f % 8 == 0),
                "the shifted algorithm ran in f32 and f16, and in bf16 where the CPU has its \
                 kernel or the f32 one"
            );
            // One rounding of the result to `dtype` (half a unit: 2^-8 of it in bf16,
            // 2^-11 in f16) where the shifted algorithm ran (f16: in f32); im2col's
            // 16-bit input gradient also rounds each tap's part before col2im sums them:
            // half a unit of the sum of magnitudes more.
            let half_unit = match dtype {
                DType::BF16 => 2f64.powi(-8),
                DType::F16 => 2f64.powi(-11),
                _ => 0.0,
            };
            let abs = |v: &[f64]| v.iter().map(|v| v.abs()).collect::<Vec<f64>>();
            let magnitudes = reference(&window, &abs(&x), &abs(&k), &abs(&dy), [n, c, f]);
            let rounded_once = match dtype {
                DType::F16 => [true, stride == unit, true],
                _ => [
                    native_forward,
                    native && c % lanes == 0 && stride == unit,
                    native_forward,
                ],
            };
            let terms = [window.taps() * c, window.taps() * f, n * window.positions()];
            for (p, (got, want)) in got.iter().zip(&expected).enumerate() {
                assert_eq!(got.dtype(), dtype);
                let got = got.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap();
                assert_eq!(got.len(), want.len());
                let terms = terms[p];
                for ((a, b), m) in got.iter().zip(want).zip(&magnitudes[p]) {
                    let rounded = if rounded_once[p] {
                        b.abs()
                    } else {
                        m + b.abs()
                    };
                    let tolerance = 1e-6 * terms as f64 * (1.0 + b.abs()) + half_unit * rounded;
                    assert!(
                        (a - b).abs() <= tolerance,
                        "{dtype:?} {c} -> {f}, {terms} terms: {a} against {b}"
                    );
                }
            }
        }
    }

    /// The shifted algorithm's bits do not depend on the thread count: its chunks are
    /// fixed, and the kernel gradient sums them in order (f32, f16 in f32, and bf16 where
    /// the CPU has its kernel).
    #[test]
    fn shifted_results_keep_their_bits_for_any_thread_count() {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            // Whole vectors, and a width ending in f32's half-width ones.
            for (c, f) in [(16, 16), (8, 24)] {
                shifted_results_keep_their_bits(dtype, c, f, Padding::Same);
            }
            // A valid window: the input gradient's runs continue one another and run as
            // one, across the chunks the threads share.
            shifted_results_keep_their_bits(dtype, 32, 16, Padding::Valid);
        }
    }

    fn shifted_results_keep_their_bits(dtype: DType, c: usize, f: usize, padding: Padding) {
        let window = Window::new(&[28, 28], &[3, 3], &[1, 1], &[1, 1], padding).unwrap();
        let n = 8;
        let tensor = |len: usize, seed: u64, dims: &[usize]| {
            let v: Vec<f32> = values(len, seed).into_iter().map(|v| v as f32).collect();
            Tensor::from_slice(&v, dims, Device::Cpu)
                .unwrap()
                .to_dtype(dtype)
                .unwrap()
        };
        let x = tensor(n * 784 * c, 1, &[n, 28, 28, c]);
        let k = tensor(9 * c * f, 2, &[3, 3, c, f]);
        let dy = tensor(
            n * window.positions() * f,
            3,
            &Window::dims(n, window.output(), f),
        );
        let results = |threads: usize| {
            std::thread::spawn({
                let (x, k, dy) = (x.clone(), k.clone(), dy.clone());
                move || {
                    crate::set_num_threads(threads);
                    set_conv_algorithm(ConvAlgorithm::Shifted);
                    let (y, saved) = x.conv(&k, &window).unwrap();
                    let grid = Grid::new(&window, n, c, f).unwrap();
                    let native = dtype != DType::BF16
                        || grid.runs_native(dtype, Pass::Forward)
                        || grid.runs_native(DType::F32, Pass::Forward);
                    assert_eq!(
                        matches!(saved.0, Saved::PaddedInput(_)),
                        native,
                        "the shifted algorithm ran"
                    );
                    let dx = dy.conv_input_grad(&k, &window).unwrap();
                    let dk = x.conv_kernel_grad(&dy, &window, &saved).unwrap();
                    [y, dx, dk].map(|t| {
                        t.to_dtype(DType::F32)
                            .unwrap()
                            .to_vec::<f32>()
                            .unwrap()
                            .iter()
                            .map(|v| v.to_bits())
                            .collect::<Vec<u32>>()
                    })
                }
            })
            .join()
            .unwrap()
        };
        let one = results(1);
        assert_eq!(one, results(2));
        assert_eq!(one, results(3));
    }

    #[test]
    fn bad_operands_get_one_clear_error() {
        let window = Window::new(&[5, 5], &[3, 3], &[1, 1], &[1, 1], Padding::Same).unwrap();
        let x = Tensor::zeros(&[2, 5, 5, 3], DType::F32, Device::Cpu).unwrap();
        let k = Tensor::zeros(&[3, 3, 4, 8], DType::F32, Device::Cpu).unwrap();
        let err = x.conv(&k, &window).unwrap_err().to_string();
        assert!(err.contains("expected a kernel [3, 3, 3, 8]"), "{err}");
        let k64 = Tensor::zeros(&[3, 3, 3, 8], DType::F64, Device::Cpu).unwrap();
        assert!(matches!(
            x.conv(&k64, &window),
            Err(TensorError::DTypeMismatch { .. })
        ));
        let k = Tensor::zeros(&[3, 3, 3, 8], DType::F32, Device::Cpu).unwrap();
        let dy = Tensor::zeros(&[2, 5, 5, 7], DType::F32, Device::Cpu).unwrap();
        let err = dy.conv_input_grad(&k, &window).unwrap_err().to_string();
        assert!(err.contains("expected 7 filters"), "{err}");
        let dy = Tensor::zeros(&[3, 5, 5, 8], DType::F32, Device::Cpu).unwrap();
        let err = x
            .conv_kernel_grad(&dy, &window, &ConvSaved::default())
            .unwrap_err();
        assert!(matches!(err, TensorError::ShapeMismatch { .. }), "{err}");
    }
}
