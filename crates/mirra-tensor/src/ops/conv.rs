//! The patches of a convolution (`im2col`) and their adjoint (`col2im`): what turns a 1D,
//! 2D or 3D convolution, a pooling window and their gradients into the matrix product, the
//! max and the mean that the other families already have.
//!
//! Layout is channels-last, as Keras's: an input `[n, d1, .., dk, c]` (k spatial
//! dimensions, 1 to 3), the patch of each output position laid out `[k1, .., kk, c]` (so
//! that a kernel `[k1, .., kk, c, f]` reshaped to `[k1 * .. * kk * c, f]` multiplies them).
//! Geometry follows TensorFlow: `valid` padding keeps the windows inside the input; `same`
//! gives `ceil(size / stride)` outputs and pads the total that needs, its smaller half
//! before; padded elements read as zero.

use std::ops::Range;

use mirra_cuda::kernels::WindowGeometry;
use mirra_device::{vectorize, Buffer, Element, FloatElement};

use crate::dispatch::with_any;
use crate::threads::{split_row_pairs, split_rows, split_rows_by_work};
use crate::{match_float_dtype, Result, Tensor, TensorError};

/// How a window covers the input: Keras's `padding`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Padding {
    /// Windows inside the input only.
    Valid,
    /// `ceil(size / stride)` outputs, zeros around the input as needed.
    Same,
}

/// The most spatial dimensions a [`Window`] has (3D convolutions).
pub const MAX_SPATIAL: usize = 3;

/// A window over channels-last inputs `[n, d1, .., dk, c]` of 1 to [`MAX_SPATIAL`] spatial
/// dimensions: its size, stride, dilation and the geometry it gives an input of that size.
///
/// Stored with the unused leading dimensions as a window of 1 over an input of 1 (so one
/// three-deep walk serves every rank); the accessors return the `rank` dimensions only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    rank: usize,
    input: [usize; MAX_SPATIAL],
    kernel: [usize; MAX_SPATIAL],
    stride: [usize; MAX_SPATIAL],
    dilation: [usize; MAX_SPATIAL],
    pad: [usize; MAX_SPATIAL],
    output: [usize; MAX_SPATIAL],
}

impl Window {
    /// The geometry of `kernel` windows over an input of spatial size `input`, one entry per
    /// spatial dimension in each; an error when the ranks differ or are not 1 to 3, a size
    /// is zero or `valid` windows do not fit.
    pub fn new(
        input: &[usize],
        kernel: &[usize],
        stride: &[usize],
        dilation: &[usize],
        padding: Padding,
    ) -> std::result::Result<Window, String> {
        let rank = input.len();
        if !(1..=MAX_SPATIAL).contains(&rank)
            || [kernel.len(), stride.len(), dilation.len()] != [rank; 3]
        {
            return Err(format!(
                "a window needs 1 to {MAX_SPATIAL} spatial dimensions, the same number for \
                 input {input:?}, kernel {kernel:?}, stride {stride:?} and dilation {dilation:?}"
            ));
        }
        if kernel.contains(&0) || stride.contains(&0) || dilation.contains(&0) {
            return Err(format!(
                "kernel {kernel:?}, stride {stride:?} and dilation {dilation:?} must be at least 1"
            ));
        }
        let lead = MAX_SPATIAL - rank;
        let mut w = Window {
            rank,
            input: [1; MAX_SPATIAL],
            kernel: [1; MAX_SPATIAL],
            stride: [1; MAX_SPATIAL],
            dilation: [1; MAX_SPATIAL],
            pad: [0; MAX_SPATIAL],
            output: [1; MAX_SPATIAL],
        };
        for d in 0..rank {
            let (size, k, s, dil) = (input[d], kernel[d], stride[d], dilation[d]);
            let span = (k - 1) * dil + 1;
            let (out, pad) = match padding {
                Padding::Valid => {
                    if size < span {
                        return Err(format!(
                            "a window spanning {span} does not fit in an input of {size} \
                             (valid padding)"
                        ));
                    }
                    ((size - span) / s + 1, 0)
                }
                Padding::Same => {
                    let out = size.div_ceil(s);
                    let needed = ((out.max(1) - 1) * s + span).saturating_sub(size);
                    (out, needed / 2)
                }
            };
            let at = lead + d;
            w.input[at] = size;
            w.kernel[at] = k;
            w.stride[at] = s;
            w.dilation[at] = dil;
            w.pad[at] = pad;
            w.output[at] = out;
        }
        Ok(w)
    }

    /// Spatial dimensions (1 to 3).
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The input's spatial size.
    pub fn input(&self) -> &[usize] {
        &self.input[MAX_SPATIAL - self.rank..]
    }

    /// The window's size.
    pub fn kernel(&self) -> &[usize] {
        &self.kernel[MAX_SPATIAL - self.rank..]
    }

    /// Steps between windows.
    pub fn stride(&self) -> &[usize] {
        &self.stride[MAX_SPATIAL - self.rank..]
    }

    /// Steps between the window's taps (1: adjacent).
    pub fn dilation(&self) -> &[usize] {
        &self.dilation[MAX_SPATIAL - self.rank..]
    }

    /// Zeros before the input, per dimension.
    pub fn pad(&self) -> &[usize] {
        &self.pad[MAX_SPATIAL - self.rank..]
    }

    /// The output's spatial size.
    pub fn output(&self) -> &[usize] {
        &self.output[MAX_SPATIAL - self.rank..]
    }

    /// Output positions per image (the product of [`output`](Window::output)).
    pub fn positions(&self) -> usize {
        self.output.iter().product()
    }

    /// Input positions per image.
    fn input_positions(&self) -> usize {
        self.input.iter().product()
    }

    /// Elements of one patch per channel (the product of [`kernel`](Window::kernel)).
    pub fn taps(&self) -> usize {
        self.kernel.iter().product()
    }

    /// This window over `images` images of `channels` channels, as the CUDA kernels read
    /// it (spatial dims beyond the rank of size 1).
    fn geometry(&self, images: usize, channels: usize) -> WindowGeometry {
        let wide = |a: &[usize; MAX_SPATIAL], unused: u64| {
            let mut out = [unused; 3];
            for (o, &v) in out.iter_mut().zip(&a[..self.rank]) {
                *o = v as u64;
            }
            out
        };
        WindowGeometry {
            input: wide(&self.input, 1),
            output: wide(&self.output, 1),
            kernel: wide(&self.kernel, 1),
            stride: wide(&self.stride, 1),
            dilation: wide(&self.dilation, 1),
            pad: wide(&self.pad, 0),
            images: images as u64,
            channels: channels as u64,
        }
    }

    /// True when no tap of any window falls outside the input (no padding on either side).
    pub fn all_taps_inside(&self) -> bool {
        (0..MAX_SPATIAL).all(|d| {
            self.pad[d] == 0
                && self.output[d] > 0
                && (self.output[d] - 1) * self.stride[d] + (self.kernel[d] - 1) * self.dilation[d]
                    < self.input[d]
        })
    }

    /// Calls `f(tap, at)` for every tap of the output position at coordinates `o` that
    /// falls inside the input, in patch order, with the flat input position it reads: the
    /// general walk of a window, which [`Walk`] takes at the border.
    #[inline]
    fn for_each_tap_at(&self, o: [usize; MAX_SPATIAL], mut f: impl FnMut(usize, usize)) {
        let [r0, r1, r2] = [0, 1, 2].map(|d| self.taps_inside(d, o[d]));
        let [_, k1, k2] = self.kernel;
        let [_, i1, i2] = self.input;
        for t0 in r0 {
            let s0 = self.source(0, o[0], t0);
            for t1 in r1.clone() {
                let s1 = s0 * i1 + self.source(1, o[1], t1);
                let tap1 = t0 * k1 + t1;
                for t2 in r2.clone() {
                    f(tap1 * k2 + t2, s1 * i2 + self.source(2, o[2], t2));
                }
            }
        }
    }

    /// The taps `k` of dimension `d` that output index `o` reads inside the input.
    #[inline]
    fn taps_inside(&self, d: usize, o: usize) -> Range<usize> {
        let start = o * self.stride[d];
        let dil = self.dilation[d];
        let first = self.pad[d].saturating_sub(start).div_ceil(dil);
        let end = (self.input[d] + self.pad[d])
            .saturating_sub(start)
            .div_ceil(dil)
            .min(self.kernel[d]);
        first..end.max(first)
    }

    /// The input index of dimension `d` that tap `k` of output index `o` reads (inside the
    /// input: `k` from [`taps_inside`](Window::taps_inside)).
    #[inline]
    fn source(&self, d: usize, o: usize, k: usize) -> usize {
        o * self.stride[d] + k * self.dilation[d] - self.pad[d]
    }

    /// `[n, d1, .., dk, c]` for spatial dimensions `spatial`.
    pub(super) fn dims(n: usize, spatial: &[usize], c: usize) -> Vec<usize> {
        let mut dims = Vec::with_capacity(spatial.len() + 2);
        dims.push(n);
        dims.extend_from_slice(spatial);
        dims.push(c);
        dims
    }
}

/// The taps of a [`Window`] over consecutive output positions, the one walk that im2col,
/// col2im and max pooling share, without a division per position: a position whose taps
/// all fall inside the input (most of them) reads at fixed offsets from its window's
/// origin; one at the border takes the general walk ([`Window::for_each_tap_at`]).
struct Walk<'w> {
    window: &'w Window,
    /// The flat input offset of each tap, in patch order, from its window's origin.
    offsets: Vec<usize>,
    /// Per dimension, the output indices whose taps all fall inside the input.
    interior: [Range<usize>; MAX_SPATIAL],
    /// Flat input positions per step of each dimension.
    strides: [usize; MAX_SPATIAL],
}

/// An output position of a [`Walk`]: its image and its coordinates in it.
#[derive(Clone, Copy, Debug)]
struct Position {
    image: usize,
    o: [usize; MAX_SPATIAL],
}

impl<'w> Walk<'w> {
    fn new(window: &'w Window) -> Walk<'w> {
        let [_, i1, i2] = window.input;
        let strides = [i1 * i2, i2, 1];
        let interior = [0, 1, 2].map(|d| {
            let (s, pad) = (window.stride[d], window.pad[d]);
            let first = pad.div_ceil(s);
            // The last tap of output `o` reads `o * s - pad + (k - 1) * dil`.
            let reach = (window.kernel[d] - 1) * window.dilation[d];
            let end = (window.input[d] + pad)
                .checked_sub(reach + 1)
                .map_or(0, |last| (last / s + 1).min(window.output[d]));
            first..end.max(first)
        });
        let [k0, k1, k2] = window.kernel;
        let mut offsets = Vec::with_capacity(k0 * k1 * k2);
        for t0 in 0..k0 {
            for t1 in 0..k1 {
                for t2 in 0..k2 {
                    offsets.push(
                        t0 * window.dilation[0] * strides[0]
                            + t1 * window.dilation[1] * strides[1]
                            + t2 * window.dilation[2],
                    );
                }
            }
        }
        Walk {
            window,
            offsets,
            interior,
            strides,
        }
    }

    /// Flat output position `p` (images one after another).
    fn at(&self, p: usize) -> Position {
        let [_, o1, o2] = self.window.output;
        let positions = self.window.positions();
        let q = p % positions.max(1);
        Position {
            image: p / positions.max(1),
            o: [q / (o1 * o2), q / o2 % o1, q % o2],
        }
    }

    /// The position after `at`, in row-major order, into the next image after the last.
    #[inline(always)]
    fn advance(&self, at: &mut Position) {
        let out = self.window.output;
        for d in (0..MAX_SPATIAL).rev() {
            at.o[d] += 1;
            if at.o[d] < out[d] {
                return;
            }
            at.o[d] = 0;
        }
        at.image += 1;
    }

    /// Calls `f(tap, at)` for every tap of position `at` that falls inside the input, in
    /// patch order, with the flat input position (within its image) it reads.
    #[inline(always)]
    fn taps(&self, at: &Position, mut f: impl FnMut(usize, usize)) {
        let o = at.o;
        if (0..MAX_SPATIAL).all(|d| self.interior[d].contains(&o[d])) {
            let origin: usize = (0..MAX_SPATIAL)
                .map(|d| (o[d] * self.window.stride[d] - self.window.pad[d]) * self.strides[d])
                .sum();
            for (tap, &off) in self.offsets.iter().enumerate() {
                f(tap, origin + off);
            }
        } else {
            self.window.for_each_tap_at(o, f);
        }
    }
}

impl Tensor {
    /// The patches of `window` over this `[n, d1, .., dk, c]` tensor: `[n, o1, .., ok,
    /// taps * c]`, zeros where a tap falls outside the input. Any dtype (patches are
    /// copies).
    pub fn im2col(&self, window: &Window) -> Result<Tensor> {
        let op = "im2col";
        let [n, c] = check_channels_last(op, self, window)?;
        if !self.device().is_cpu() {
            let dims = Window::dims(n, window.output(), window.taps() * c);
            return super::cuda::window_map(op, self, window.geometry(n, c), &dims);
        }
        let x = self.contiguous()?;
        let positions = window.positions();
        let row = window.taps() * c;
        // Recycled memory: when a window has taps outside the input, its patch is zeroed
        // first, in cache, by the thread that fills it (not the whole buffer up front).
        let mut out = Buffer::alloc(x.dtype(), n * positions * row, x.device())?;
        let padded = !window.all_taps_inside();
        let image = window.input_positions();
        let walk = Walk::new(window);
        with_any!(x.dtype(), T => {
            let src = x.as_slice::<T>()?;
            let fill = |first: usize, patches: &mut [T]| {
                let mut at = walk.at(first);
                for patch in patches.chunks_exact_mut(row.max(1)) {
                    if padded {
                        patch.fill(T::default());
                    }
                    let base = at.image * image;
                    if c == 1 {
                        walk.taps(&at, |tap, i| patch[tap] = src[base + i]);
                    } else {
                        walk.taps(&at, |tap, i| {
                            let from = (base + i) * c;
                            copy_channels(&mut patch[tap * c..(tap + 1) * c], &src[from..from + c]);
                        });
                    }
                    walk.advance(&mut at);
                }
            };
            split_rows(out.as_mut_slice::<T>()?, row, &fill);
        });
        Tensor::from_buffer(out, &Window::dims(n, window.output(), row))
    }

    /// The adjoint of [`im2col`](Tensor::im2col): this `[n, o1, .., ok, taps * c]` tensor of
    /// patch values summed back into an `[n, d1, .., dk, c]` input (float dtypes; 16-bit
    /// floats sum in f32 and round once).
    pub fn col2im(&self, window: &Window, channels: usize) -> Result<Tensor> {
        let op = "col2im";
        let row = window.taps() * channels;
        let dims = self.dims();
        if dims.len() != window.rank() + 2
            || dims[1..=window.rank()] != *window.output()
            || dims[dims.len() - 1] != row
        {
            return Err(TensorError::Invalid {
                op,
                msg: format!(
                    "expected patches {:?} with n first of a {:?} window over {channels} \
                     channels",
                    Window::dims(0, window.output(), row)[1..].to_vec(),
                    window.kernel()
                ),
                shape: *self.shape(),
            });
        }
        let n = dims[0];
        if !self.device().is_cpu() {
            let dims = Window::dims(n, window.input(), channels);
            return super::cuda::window_map(op, self, window.geometry(n, channels), &dims);
        }
        let cols = self.contiguous()?;
        match_float_dtype!(cols.dtype(), T => col2im_kernel::<T>(&cols, window, n, channels),
            dtype => Err(TensorError::UnsupportedDType { op, dtype }))
    }
}

impl Tensor {
    /// The largest tap of each `window` over this `[n, d1, .., dk, c]` tensor, per channel
    /// (`[n, o1, .., ok, c]`), and where it is: the flat index into this tensor of each
    /// output's winner (i64, the first of equal maxima; a NaN wins, as every max of
    /// mirra's), for the gradient (`g.scatter_add(0, argmax, ...)` over the flattened
    /// input). Taps outside the input (`same` padding) never win.
    pub fn max_pool(&self, window: &Window) -> Result<(Tensor, Tensor)> {
        let op = "max_pool";
        let [n, c] = check_channels_last(op, self, window)?;
        if !self.device().is_cpu() {
            let dims = Window::dims(n, window.output(), c);
            return super::cuda::max_pool(self, window.geometry(n, c), &dims);
        }
        let x = self.contiguous()?;
        match_float_dtype!(x.dtype(), T => max_pool_kernel::<T>(&x, window, n, c),
            dtype => Err(TensorError::UnsupportedDType { op, dtype }))
    }

    /// The gradient of [`max_pool`](Tensor::max_pool) for this output gradient (the
    /// pooled shape): each element added into its window's winner `argmax` (from
    /// `max_pool`), zeros elsewhere, in an `input`-shaped tensor (the pooled tensor's
    /// shape before pooling). Float dtypes; 16-bit floats sum in f32 and round once.
    pub fn max_pool_grad(&self, argmax: &Tensor, input: &[usize]) -> Result<Tensor> {
        let op = "max_pool_grad";
        if argmax.dims() != self.dims()
            || argmax.dtype() != crate::DType::I64
            || input.len() != self.rank()
            || input.first() != self.dims().first()
        {
            return Err(TensorError::Invalid {
                op,
                msg: format!(
                    "expected i64 winners of the gradient's shape and an input of its rank \
                     and batch, got {} winners {:?} and input {input:?}",
                    argmax.dtype(),
                    argmax.dims()
                ),
                shape: *self.shape(),
            });
        }
        if !self.device().is_cpu() {
            return super::cuda::max_pool_grad(self, argmax, input);
        }
        let (g, winners) = (self.contiguous()?, argmax.contiguous()?);
        let winners = winners.as_slice::<i64>()?;
        match_float_dtype!(g.dtype(), T => max_pool_grad_kernel::<T>(&g, winners, input),
            dtype => Err(TensorError::UnsupportedDType { op, dtype }))
    }
}

fn max_pool_kernel<T: FloatElement>(
    x: &Tensor,
    window: &Window,
    n: usize,
    c: usize,
) -> Result<(Tensor, Tensor)> {
    let positions = window.positions();
    // A winner is named by its offset from the window's first tap, in 32 bits.
    if window.input_positions() * c > u32::MAX as usize {
        return Err(TensorError::Invalid {
            op: "max_pool",
            msg: format!("an image of more than {} elements", u32::MAX),
            shape: *x.shape(),
        });
    }
    let src = x.as_slice::<T>()?;
    let mut winners = Buffer::alloc(crate::DType::I64, n * positions * c, x.device())?;
    let mut values = Buffer::alloc(T::DTYPE, n * positions * c, x.device())?;
    let walk = Walk::new(window);
    let work = n * positions * c * window.taps();
    let none = std::sync::atomic::AtomicBool::new(false);
    // Output positions split between threads.
    split_row_pairs(
        (values.as_mut_slice::<T>()?, c),
        (winners.as_mut_slice::<i64>()?, c),
        work,
        &|first, values, argmax| {
            if !vectorize(
                #[inline(always)]
                || pool_rows(&walk, src, c, first, values, argmax),
            ) {
                none.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        },
    );
    if none.into_inner() {
        return Err(TensorError::Invalid {
            op: "max_pool",
            msg: "a window with no tap inside the input".into(),
            shape: *x.shape(),
        });
    }
    let dims = Window::dims(n, window.output(), c);
    Ok((
        Tensor::from_buffer(values, &dims)?,
        Tensor::from_buffer(winners, &dims)?,
    ))
}

/// Max pooling of the output positions from `first` on (`values` and `argmax` rows of
/// `c` channels) over `src`: per position, the largest tap of each channel and the flat
/// index of its element. False when a position has no tap inside the input. Inlined into
/// [`vectorize`]'s closure so that [`fold_max`] runs on the widest vectors.
#[inline(always)]
fn pool_rows<T: FloatElement>(
    walk: &Walk<'_>,
    src: &[T],
    c: usize,
    first: usize,
    values: &mut [T],
    argmax: &mut [i64],
) -> bool {
    let image = walk.window.input_positions();
    let mut best = vec![<T::Acc as Element>::from_f64(0.0); c];
    let mut from = vec![0u32; c];
    // The first element of each tap inside the input, in patch order.
    let mut bases = Vec::with_capacity(walk.offsets.len());
    let mut at = walk.at(first);
    let rows = values
        .chunks_exact_mut(c.max(1))
        .zip(argmax.chunks_exact_mut(c.max(1)));
    for (values, out) in rows {
        bases.clear();
        let start = at.image * image;
        walk.taps(&at, |_, i| bases.push((start + i) * c));
        let Some((&base, rest)) = bases.split_first() else {
            return false;
        };
        for (b, t) in best.iter_mut().zip(&src[base..base + c]) {
            *b = t.to_acc();
        }
        // The winners' taps as offsets from the first tap's element, so that the flat
        // index is a sum, not a lookup per channel.
        from.fill(0);
        for &tap in rest {
            fold_max(
                &mut best,
                &mut from,
                &src[tap..tap + c],
                (tap - base) as u32,
            );
        }
        for (ch, ((v, o), (&b, &off))) in values
            .iter_mut()
            .zip(out)
            .zip(best.iter().zip(&from))
            .enumerate()
        {
            *v = T::from_acc(b);
            *o = (base + ch) as i64 + i64::from(off);
        }
        walk.advance(&mut at);
    }
    true
}

/// Folds a tap's channels into the running maxima `best` and the taps `from` they came
/// from (`k` names the tap): larger wins; a NaN wins unless a NaN already did (NaN alone
/// is unequal to itself); the first of equal maxima stays. Selects on values and tap
/// names of one width, not branches, so that the loop vectorises.
#[inline(always)]
fn fold_max<T: FloatElement>(best: &mut [T::Acc], from: &mut [u32], tap: &[T], k: u32) {
    for ((b, f), t) in best.iter_mut().zip(from.iter_mut()).zip(tap) {
        let v = t.to_acc();
        #[allow(clippy::eq_op)]
        let take = (v > *b) | ((v != v) & (*b == *b));
        *b = if take { v } else { *b };
        *f = if take { k } else { *f };
    }
}

/// The gradient of [`Tensor::max_pool`]: `grad` (the pooled shape) added into a zero
/// tensor of `input` dimensions at the flat positions `argmax` names, output by output in
/// order (a scatter-add, images split between threads: a winner lies in its own image).
/// Each image is summed in the accumulation type: in place where that is `T`, else in a
/// scratch image of its thread, in cache, then written once in `T`.
fn max_pool_grad_kernel<T: FloatElement>(
    grad: &Tensor,
    argmax: &[i64],
    input: &[usize],
) -> Result<Tensor> {
    let n = input[0];
    let image: usize = input[1..].iter().product();
    let per = argmax.len() / n.max(1);
    let g = grad.as_slice::<T>()?;
    let mut out = Buffer::alloc(T::DTYPE, n * image, grad.device())?;
    let stray = std::sync::atomic::AtomicBool::new(false);
    let zero = <T::Acc as Element>::from_f64(0.0);
    let dst = out.as_mut_slice::<T>()?;
    let in_place = T::DTYPE == <T::Acc as Element>::DTYPE;
    split_rows_by_work(dst, image, argmax.len() + n * image, &|first, images| {
        let mut scratch = vec![zero; if in_place { 0 } else { image }];
        for (k, one) in images.chunks_exact_mut(image.max(1)).enumerate() {
            let sums: &mut [T::Acc] = if in_place {
                bytemuck::cast_slice_mut(one)
            } else {
                &mut scratch
            };
            sums.fill(zero);
            let (b, from) = (first + k, (first + k) * per);
            let base = (b * image) as i64;
            for (&w, v) in argmax[from..from + per].iter().zip(&g[from..from + per]) {
                match sums.get_mut(w.wrapping_sub(base) as usize) {
                    Some(a) => *a = *a + v.to_acc(),
                    None => stray.store(true, std::sync::atomic::Ordering::Relaxed),
                }
            }
            if !in_place {
                vectorize(
                    #[inline(always)]
                    || {
                        for (d, &s) in one.iter_mut().zip(&scratch) {
                            *d = T::from_acc(s);
                        }
                    },
                );
            }
        }
    });
    if stray.into_inner() {
        return Err(TensorError::Invalid {
            op: "max_pool_grad",
            msg: "a winner outside its own image".into(),
            shape: *grad.shape(),
        });
    }
    Tensor::from_buffer(out, input)
}

fn col2im_kernel<T: FloatElement>(
    cols: &Tensor,
    window: &Window,
    n: usize,
    c: usize,
) -> Result<Tensor> {
    let image = window.input_positions() * c;
    let positions = window.positions();
    let row = window.taps() * c;
    let src = cols.as_slice::<T>()?;
    // Sums in the accumulation type (the output itself for f32 and f64), each image's
    // zeroed by the thread that sums it.
    let mut sums = Buffer::alloc(<T::Acc as Element>::DTYPE, n * image, cols.device())?;
    let acc = sums.as_mut_slice::<T::Acc>()?;
    let walk = Walk::new(window);
    // One image's patches add into that image alone: images split between threads.
    split_rows_by_work(acc, image, src.len(), &|first, images: &mut [T::Acc]| {
        vectorize(
            #[inline(always)]
            || {
                for (i, acc) in images.chunks_exact_mut(image.max(1)).enumerate() {
                    acc.fill(<T::Acc as Element>::from_f64(0.0));
                    let b = first + i;
                    let patches = &src[b * positions * row..(b + 1) * positions * row];
                    let mut at = walk.at(b * positions);
                    for patch in patches.chunks_exact(row.max(1)) {
                        walk.taps(&at, |tap, i| {
                            let (to, from) = (i * c, tap * c);
                            let sums = acc[to..to + c].iter_mut().zip(&patch[from..from + c]);
                            for (a, &v) in sums {
                                *a = *a + v.to_acc();
                            }
                        });
                        walk.advance(&mut at);
                    }
                }
            },
        )
    });
    Tensor::from_buffer(sums, &Window::dims(n, window.input(), c))?.to_dtype(T::DTYPE)
}

/// `dst = src` for one tap's channels: in blocks of 16 elements moved as values, since
/// a call to `memmove` per tap (what `copy_from_slice` becomes) costs more than copying
/// the few dozen channels of a convolution.
#[inline(always)]
fn copy_channels<T: Copy>(dst: &mut [T], src: &[T]) {
    let ((blocks, rest), (from, tail)) = (dst.as_chunks_mut::<16>(), src.as_chunks::<16>());
    for (d, s) in blocks.iter_mut().zip(from) {
        *d = *s;
    }
    for (d, s) in rest.iter_mut().zip(tail) {
        *d = *s;
    }
}

/// `[n, c]` of an `[n, d1, .., dk, c]` tensor whose spatial size is `window`'s input.
pub(super) fn check_channels_last(
    op: &'static str,
    x: &Tensor,
    window: &Window,
) -> Result<[usize; 2]> {
    let d = x.dims();
    let spatial = window.input();
    if d.len() != spatial.len() + 2 || d[1..=spatial.len()] != *spatial {
        let sizes: Vec<String> = spatial.iter().map(|s| s.to_string()).collect();
        return Err(TensorError::Invalid {
            op,
            msg: format!("expected [n, {}, c] (channels last)", sizes.join(", ")),
            shape: *x.shape(),
        });
    }
    Ok([d[0], d[d.len() - 1]])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::threads::PARALLEL_MIN;
    use crate::Device;

    fn window(input: [usize; 2], k: usize, s: usize, d: usize, p: Padding) -> Window {
        Window::new(&input, &[k, k], &[s, s], &[d, d], p).unwrap()
    }

    fn geometry(w: &Window) -> (Vec<usize>, Vec<usize>) {
        (w.output().to_vec(), w.pad().to_vec())
    }

    #[test]
    fn geometry_follows_tensorflow() {
        // valid: floor((h - span) / s) + 1; same: ceil(h / s), the smaller half of the
        // padding first.
        let w = window([28, 28], 3, 1, 1, Padding::Valid);
        assert_eq!(geometry(&w), (vec![26, 26], vec![0, 0]));
        assert!(w.all_taps_inside());
        // Padding only after the input (bottom, right): no padding before, yet taps outside.
        let w = window([4, 2], 2, 1, 1, Padding::Same);
        assert_eq!(geometry(&w), (vec![4, 2], vec![0, 0]));
        assert!(!w.all_taps_inside());
        let w = window([28, 28], 3, 2, 1, Padding::Same);
        assert_eq!(geometry(&w), (vec![14, 14], vec![0, 0]));
        let w = window([7, 7], 3, 1, 1, Padding::Same);
        assert_eq!(geometry(&w), (vec![7, 7], vec![1, 1]));
        let w = window([8, 8], 4, 1, 1, Padding::Same);
        assert_eq!(geometry(&w), (vec![8, 8], vec![1, 1]));
        let w = window([9, 9], 3, 1, 2, Padding::Valid);
        assert_eq!(w.output(), [5, 5]);
        // One and three spatial dimensions.
        let w = Window::new(&[10], &[3], &[2], &[1], Padding::Same).unwrap();
        assert_eq!((w.rank(), geometry(&w)), (1, (vec![5], vec![0])));
        let w = Window::new(&[8, 6, 5], &[3, 3, 3], &[1, 2, 1], &[1; 3], Padding::Same).unwrap();
        assert_eq!(geometry(&w), (vec![8, 3, 5], vec![1, 0, 1]));
        assert_eq!((w.taps(), w.positions()), (27, 120));
        assert!(
            Window::new(&[2, 2], &[3, 3], &[1, 1], &[1, 1], Padding::Valid)
                .unwrap_err()
                .contains("does not fit")
        );
        assert!(Window::new(&[2, 2], &[0, 3], &[1, 1], &[1, 1], Padding::Same).is_err());
        for bad in [
            Window::new(&[], &[], &[], &[], Padding::Same),
            Window::new(&[2; 4], &[1; 4], &[1; 4], &[1; 4], Padding::Same),
            Window::new(&[4, 4], &[2], &[1, 1], &[1, 1], Padding::Same),
        ] {
            assert!(bad.unwrap_err().contains("1 to 3 spatial dimensions"));
        }
    }

    /// A direct convolution of `[n, d, h, w, c]` by `[kd, kh, kw, c, f]`, element by
    /// element, for windows of 1 to 3 dimensions (fewer: the leading sizes are 1).
    fn direct(x: &[f64], xd: [usize; 5], k: &[f64], kd: [usize; 5], win: &Window) -> Vec<f64> {
        let [n, d, h, w, c] = xd;
        let [k0, k1, k2, _, f] = kd;
        let lead = 3 - win.rank();
        let at = |v: &[usize], i: usize, default: usize| {
            if i < lead {
                default
            } else {
                v[i - lead]
            }
        };
        let (o, s, dil, pad) = (win.output(), win.stride(), win.dilation(), win.pad());
        let out_dims = [at(o, 0, 1), at(o, 1, 1), at(o, 2, 1)];
        let mut out = vec![0.0; n * out_dims.iter().product::<usize>() * f];
        let mut q = 0;
        for b in 0..n {
            for z in 0..out_dims[0] {
                for y in 0..out_dims[1] {
                    for xo in 0..out_dims[2] {
                        for fo in 0..f {
                            let mut sum = 0.0;
                            for i in 0..k0 {
                                for j in 0..k1 {
                                    for l in 0..k2 {
                                        let src = |p: usize, kk: usize, dim: usize| {
                                            (p * at(s, dim, 1) + kk * at(dil, dim, 1)) as isize
                                                - at(pad, dim, 0) as isize
                                        };
                                        let (iz, iy, ix) =
                                            (src(z, i, 0), src(y, j, 1), src(xo, l, 2));
                                        if iz < 0
                                            || iy < 0
                                            || ix < 0
                                            || iz >= d as isize
                                            || iy >= h as isize
                                            || ix >= w as isize
                                        {
                                            continue;
                                        }
                                        let (iz, iy, ix) = (iz as usize, iy as usize, ix as usize);
                                        for ci in 0..c {
                                            let xv = x[(((b * d + iz) * h + iy) * w + ix) * c + ci];
                                            sum +=
                                                xv * k[(((i * k1 + j) * k2 + l) * c + ci) * f + fo];
                                        }
                                    }
                                }
                            }
                            out[q] = sum;
                            q += 1;
                        }
                    }
                }
            }
        }
        out
    }

    /// `(spatial input, kernel, stride, dilation, padding)` cases of 1, 2 and 3 dimensions.
    type Case = (Vec<usize>, Vec<usize>, Vec<usize>, Vec<usize>, Padding);

    fn cases() -> Vec<Case> {
        let sq = |hw: [usize; 2], k: usize, s: usize, d: usize, p: Padding| -> Case {
            (hw.to_vec(), vec![k, k], vec![s, s], vec![d, d], p)
        };
        vec![
            sq([5, 6], 3, 1, 1, Padding::Valid),
            sq([5, 6], 3, 2, 1, Padding::Same),
            sq([7, 7], 3, 1, 2, Padding::Same),
            sq([6, 5], 2, 2, 1, Padding::Valid),
            sq([4, 4], 4, 1, 1, Padding::Same),
            // Padding after the input only (none before): the patches' tail must be zeros.
            sq([5, 6], 2, 1, 1, Padding::Same),
            (vec![9], vec![3], vec![2], vec![1], Padding::Same),
            (
                vec![4, 5, 3],
                vec![3, 3, 3],
                vec![1; 3],
                vec![1; 3],
                Padding::Same,
            ),
            (
                vec![5, 4, 6],
                vec![2, 3, 2],
                vec![2, 1, 2],
                vec![1, 1, 2],
                Padding::Valid,
            ),
            (
                vec![3, 6, 5],
                vec![1, 3, 3],
                vec![1, 2, 2],
                vec![1; 3],
                Padding::Same,
            ),
        ]
    }

    /// Pads `v` (1 to 3 sizes) to three with leading ones.
    fn three(v: &[usize]) -> [usize; 3] {
        let mut out = [1; 3];
        out[3 - v.len()..].copy_from_slice(v);
        out
    }

    #[test]
    fn patches_times_the_kernel_are_the_direct_convolution() {
        for (input, k, s, d, p) in cases() {
            let (n, c, f) = (2, 3, 4);
            let win = Window::new(&input, &k, &s, &d, p).unwrap();
            let spatial: usize = input.iter().product();
            let x: Vec<f64> = (0..n * spatial * c)
                .map(|i| ((i * 37) % 11) as f64 - 5.0)
                .collect();
            let taps = win.taps();
            let kv: Vec<f64> = (0..taps * c * f)
                .map(|i| ((i * 13) % 7) as f64 - 3.0)
                .collect();
            let xt = Tensor::from_slice(&x, &Window::dims(n, &input, c), Device::Cpu).unwrap();
            let kt = Tensor::from_slice(&kv, &[taps * c, f], Device::Cpu).unwrap();
            let positions = win.positions();
            // Recycled memory full of NaN: patches must not depend on what a buffer held.
            let mut junk =
                Buffer::alloc(crate::DType::F64, n * positions * taps * c, Device::Cpu).unwrap();
            junk.as_mut_slice::<f64>().unwrap().fill(f64::NAN);
            drop(junk);
            let cols = xt.im2col(&win).unwrap();
            assert_eq!(cols.dims(), Window::dims(n, win.output(), taps * c));
            let got = cols
                .reshape(&[n * positions, taps * c])
                .unwrap()
                .matmul(&kt)
                .unwrap()
                .to_vec::<f64>()
                .unwrap();
            let [d0, d1, d2] = three(&input);
            let [k0, k1, k2] = three(&k);
            let want = direct(&x, [n, d0, d1, d2, c], &kv, [k0, k1, k2, c, f], &win);
            assert_eq!(got, want, "{input:?} k{k:?} s{s:?} d{d:?} {p:?}");
        }
    }

    #[test]
    fn col2im_is_the_adjoint_of_im2col() {
        // <im2col(x), y> = <x, col2im(y)> for every x, y: the gradient's defining property.
        for (input, k, s, d, p) in cases() {
            let (n, c) = (2, 3);
            let win = Window::new(&input, &k, &s, &d, p).unwrap();
            let spatial: usize = input.iter().product();
            let x: Vec<f64> = (0..n * spatial * c)
                .map(|i| ((i * 7) % 5) as f64 - 2.0)
                .collect();
            let row = win.taps() * c;
            let y: Vec<f64> = (0..n * win.positions() * row)
                .map(|i| ((i * 3) % 7) as f64 - 3.0)
                .collect();
            let xt = Tensor::from_slice(&x, &Window::dims(n, &input, c), Device::Cpu).unwrap();
            let yt =
                Tensor::from_slice(&y, &Window::dims(n, win.output(), row), Device::Cpu).unwrap();
            let lhs: f64 = xt
                .im2col(&win)
                .unwrap()
                .to_vec::<f64>()
                .unwrap()
                .iter()
                .zip(&y)
                .map(|(a, b)| a * b)
                .sum();
            let back = yt.col2im(&win, c).unwrap();
            assert_eq!(back.dims(), xt.dims());
            let rhs: f64 = back
                .to_vec::<f64>()
                .unwrap()
                .iter()
                .zip(&x)
                .map(|(a, b)| a * b)
                .sum();
            assert_eq!(lhs, rhs, "{input:?} k{k:?} s{s:?} d{d:?} {p:?}");
        }
    }

    #[test]
    fn max_pooling_picks_the_first_largest_tap_and_lets_nan_win() {
        // One 4x4 channel and its negation, windows 2x2 stride 2.
        let x: Vec<f32> = (0..16).flat_map(|i| [i as f32, -(i as f32)]).collect();
        let t = Tensor::from_slice(&x, &[1, 4, 4, 2], Device::Cpu).unwrap();
        let win = window([4, 4], 2, 2, 1, Padding::Valid);
        let (v, at) = t.max_pool(&win).unwrap();
        assert_eq!(
            v.to_vec::<f32>().unwrap(),
            [5., 0., 7., -2., 13., -8., 15., -10.]
        );
        // Flat indices into the input: element 5 of channel 0 is at 10, element 0 of
        // channel 1 at 1, ...
        assert_eq!(at.to_vec::<i64>().unwrap(), [10, 1, 14, 5, 26, 17, 30, 21]);
        // Ties: the first tap wins; a NaN wins and stays.
        let ties =
            Tensor::from_slice(&[1.0f32, 1.0, 1.0, 0.0], &[1, 2, 2, 1], Device::Cpu).unwrap();
        let (_, at) = ties
            .max_pool(&window([2, 2], 2, 2, 1, Padding::Valid))
            .unwrap();
        assert_eq!(at.to_vec::<i64>().unwrap(), [0]);
        let nan =
            Tensor::from_slice(&[1.0f32, f32::NAN, 3.0, 0.0], &[1, 2, 2, 1], Device::Cpu).unwrap();
        let (v, at) = nan
            .max_pool(&window([2, 2], 2, 2, 1, Padding::Valid))
            .unwrap();
        assert!(v.to_vec::<f32>().unwrap()[0].is_nan());
        assert_eq!(at.to_vec::<i64>().unwrap(), [1]);
        // `same` padding: padded taps never win, even over negative values.
        let neg = Tensor::from_slice(&[-3.0f32, -1.0, -2.0], &[1, 1, 3, 1], Device::Cpu).unwrap();
        let win = Window::new(&[1, 3], &[1, 2], &[1, 2], &[1, 1], Padding::Same).unwrap();
        let (v, _) = neg.max_pool(&win).unwrap();
        assert_eq!(v.to_vec::<f32>().unwrap(), [-1.0, -2.0]);
        // 3D: a 2x2x2 cube of 0..8 and its negation; the winner is the last corner.
        let x: Vec<f32> = (0..8).flat_map(|i| [i as f32, -(i as f32)]).collect();
        let cube = Tensor::from_slice(&x, &[1, 2, 2, 2, 2], Device::Cpu).unwrap();
        let win = Window::new(&[2, 2, 2], &[2; 3], &[2; 3], &[1; 3], Padding::Valid).unwrap();
        let (v, at) = cube.max_pool(&win).unwrap();
        assert_eq!(v.dims(), &[1, 1, 1, 1, 2]);
        assert_eq!(v.to_vec::<f32>().unwrap(), [7.0, 0.0]);
        assert_eq!(at.to_vec::<i64>().unwrap(), [14, 1]);
    }

    #[test]
    fn max_pool_grad_is_the_scatter_add_of_the_winners() {
        // Overlapping windows (3 wide, stride 2, `same`): an input element can win for
        // several outputs, and the sums must follow the flat scatter-add's order.
        for (input, p) in [([9, 7], Padding::Same), ([8, 8], Padding::Valid)] {
            let (n, c) = (3, 5);
            let win = Window::new(&input, &[3, 3], &[2, 2], &[1, 1], p).unwrap();
            let len = n * input[0] * input[1] * c;
            // Few distinct values: many ties.
            let x: Vec<f32> = (0..len).map(|i| ((i * 7) % 5) as f32).collect();
            let dims = Window::dims(n, &input, c);
            let xt = Tensor::from_slice(&x, &dims, Device::Cpu).unwrap();
            let (pooled, at) = xt.max_pool(&win).unwrap();
            let m = pooled.elem_count();
            let g: Vec<f32> = (0..m).map(|i| 0.1 + i as f32 * 0.37).collect();
            // In bf16: the f32 sums of the bf16 values, rounded once.
            for dtype in [crate::DType::F32, crate::DType::BF16] {
                let gt = Tensor::from_slice(&g, pooled.dims(), Device::Cpu)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap();
                let want = gt
                    .to_dtype(crate::DType::F32)
                    .unwrap()
                    .reshape(&[m])
                    .unwrap()
                    .scatter_add(0, &at.reshape(&[m]).unwrap(), &[len])
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap();
                let got = gt.max_pool_grad(&at, &dims).unwrap();
                assert_eq!((got.dims(), got.dtype()), (dims.as_slice(), dtype));
                let bits = |t: &Tensor| {
                    t.to_dtype(crate::DType::F32)
                        .unwrap()
                        .to_vec::<f32>()
                        .unwrap()
                };
                assert_eq!(bits(&got), bits(&want), "{dtype:?}");
            }
        }
        // A winner outside its own image (image 1's winner pointing into image 0), and
        // winners of another shape, are errors naming them.
        let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 1, 2, 1], Device::Cpu).unwrap();
        let win = Window::new(&[1, 2], &[1, 2], &[1, 2], &[1, 1], Padding::Valid).unwrap();
        let (pooled, _) = x.max_pool(&win).unwrap();
        let bad = Tensor::from_slice(&[1i64, 0], &[2, 1, 1, 1], Device::Cpu).unwrap();
        let e = pooled
            .max_pool_grad(&bad, &[2, 1, 2, 1])
            .unwrap_err()
            .to_string();
        assert!(e.contains("outside its own image"), "{e}");
        let short = Tensor::from_slice(&[1i64], &[1, 1, 1, 1], Device::Cpu).unwrap();
        assert!(pooled.max_pool_grad(&short, &[2, 1, 2, 1]).is_err());
    }

    #[test]
    fn threads_do_not_change_a_bit() {
        // Large enough for the parallel paths (more than PARALLEL_MIN elements moved).
        let (n, h, w, c) = (16, 64, 64, 16);
        assert!(n * h * w * c >= PARALLEL_MIN);
        let x: Vec<f32> = (0..n * h * w * c)
            .map(|i| ((i * 7919) % 1013) as f32 * 0.01)
            .collect();
        let xt = Tensor::from_slice(&x, &[n, h, w, c], Device::Cpu).unwrap();
        let win = window([h, w], 3, 1, 1, Padding::Same);
        let run = |threads: usize| {
            crate::set_num_threads(threads);
            let cols = xt.im2col(&win).unwrap();
            let back = cols.col2im(&win, c).unwrap();
            let (pooled, at) = xt.max_pool(&win).unwrap();
            let unpooled = pooled.max_pool_grad(&at, xt.dims()).unwrap();
            (
                cols.to_vec::<f32>().unwrap(),
                back.to_vec::<f32>().unwrap(),
                pooled.to_vec::<f32>().unwrap(),
                unpooled.to_vec::<f32>().unwrap(),
            )
        };
        let one = run(1);
        let two = run(2);
        assert!(one == two, "1 and 2 threads differ");
    }

    #[test]
    fn bad_shapes_are_errors_naming_them() {
        let win = window([5, 5], 3, 1, 1, Padding::Valid);
        let x = Tensor::zeros(&[2, 4, 5, 1], crate::DType::F32, Device::Cpu).unwrap();
        let e = x.im2col(&win).unwrap_err().to_string();
        assert!(
            e.contains("expected [n, 5, 5, c]") && e.contains("[2, 4, 5, 1]"),
            "{e}"
        );
        // A 2D window over a 3D input.
        let x = Tensor::zeros(&[2, 5, 5, 5, 1], crate::DType::F32, Device::Cpu).unwrap();
        assert!(x.max_pool(&win).is_err());
        let cols = Tensor::zeros(&[2, 3, 3, 8], crate::DType::F32, Device::Cpu).unwrap();
        let e = cols.col2im(&win, 1).unwrap_err().to_string();
        assert!(e.contains("expected patches [3, 3, 9]"), "{e}");
    }
}
