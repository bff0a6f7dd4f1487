//! The patches of a convolution (`im2col`) and their adjoint (`col2im`): what turns a 2D
//! convolution, a pooling window and their gradients into the matrix product, the max and
//! the mean that the other families already have.
//!
//! Layout is channels-last, as Keras's: an input `[n, h, w, c]`, the patches of output
//! position `(oh, ow)` laid out `[kh, kw, c]` (so that a kernel `[kh, kw, c, f]` reshaped to
//! `[kh * kw * c, f]` multiplies them). Geometry follows TensorFlow: `valid` padding keeps
//! the windows inside the input; `same` gives `ceil(h / stride)` outputs and pads the total
//! that needs, its smaller half before (top, left); padded elements read as zero.

use mirra_device::{Buffer, Element, FloatElement};

use crate::{match_float_dtype, Result, Tensor, TensorError};

/// How a window covers the input: Keras's `padding`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Padding {
    /// Windows inside the input only.
    Valid,
    /// `ceil(size / stride)` outputs, zeros around the input as needed.
    Same,
}

/// A 2D window over `[n, h, w, c]` inputs: its size, stride, dilation and the geometry it
/// gives an input of `input` height and width.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window2d {
    /// The input's height and width.
    pub input: [usize; 2],
    /// The window's height and width.
    pub kernel: [usize; 2],
    /// Steps between windows.
    pub stride: [usize; 2],
    /// Steps between the window's taps (1: adjacent).
    pub dilation: [usize; 2],
    /// Zeros before the input (top, left).
    pub pad: [usize; 2],
    /// The output's height and width.
    pub output: [usize; 2],
}

impl Window2d {
    /// The geometry of `kernel` windows over an input of `input` height and width; an error
    /// when a size is zero or `valid` windows do not fit.
    pub fn new(
        input: [usize; 2],
        kernel: [usize; 2],
        stride: [usize; 2],
        dilation: [usize; 2],
        padding: Padding,
    ) -> std::result::Result<Window2d, String> {
        if kernel.contains(&0) || stride.contains(&0) || dilation.contains(&0) {
            return Err(format!(
                "kernel {kernel:?}, stride {stride:?} and dilation {dilation:?} must be at least 1"
            ));
        }
        let mut pad = [0; 2];
        let mut output = [0; 2];
        for d in 0..2 {
            let span = (kernel[d] - 1) * dilation[d] + 1;
            match padding {
                Padding::Valid => {
                    if input[d] < span {
                        return Err(format!(
                            "a window spanning {span} does not fit in an input of {} (valid \
                             padding)",
                            input[d]
                        ));
                    }
                    output[d] = (input[d] - span) / stride[d] + 1;
                }
                Padding::Same => {
                    output[d] = input[d].div_ceil(stride[d]);
                    let needed =
                        ((output[d].max(1) - 1) * stride[d] + span).saturating_sub(input[d]);
                    pad[d] = needed / 2;
                }
            }
        }
        Ok(Window2d {
            input,
            kernel,
            stride,
            dilation,
            pad,
            output,
        })
    }

    /// True when no tap of any window falls outside the input (no padding on either side).
    pub fn all_taps_inside(&self) -> bool {
        (0..2).all(|d| {
            self.pad[d] == 0
                && self.output[d] > 0
                && (self.output[d] - 1) * self.stride[d] + (self.kernel[d] - 1) * self.dilation[d]
                    < self.input[d]
        })
    }

    /// Elements of one patch per channel (`kh * kw`).
    pub fn taps(&self) -> usize {
        self.kernel[0] * self.kernel[1]
    }

    /// Calls `f(tap, iy, ix)` for every tap of output position `(y, x)` that falls inside
    /// the input, in patch order (`tap = ki * kw + kj`), with the input row and column it
    /// reads: the one walk of a window that im2col, col2im and max pooling share.
    #[inline]
    fn for_each_tap(&self, y: usize, x: usize, mut f: impl FnMut(usize, usize, usize)) {
        for ki in 0..self.kernel[0] {
            let Some(iy) = self.source(0, y, ki) else {
                continue;
            };
            for kj in 0..self.kernel[1] {
                if let Some(ix) = self.source(1, x, kj) {
                    f(ki * self.kernel[1] + kj, iy, ix);
                }
            }
        }
    }

    /// The input row (or column, `d = 1`) that tap `k` of output position `o` reads, if it
    /// is inside the input.
    fn source(&self, d: usize, o: usize, k: usize) -> Option<usize> {
        (o * self.stride[d] + k * self.dilation[d])
            .checked_sub(self.pad[d])
            .filter(|&i| i < self.input[d])
    }
}

impl Tensor {
    /// The patches of `window` over this `[n, h, w, c]` tensor: `[n, oh, ow, kh * kw * c]`,
    /// zeros where a tap falls outside the input. Any dtype (patches are copies).
    pub fn im2col(&self, window: &Window2d) -> Result<Tensor> {
        let op = "im2col";
        let [n, c] = check_nhwc(op, self, window.input)?;
        if !self.device().is_cpu() {
            return Err(on_device(op, self));
        }
        let x = self.contiguous()?;
        let size = x.dtype().size_in_bytes();
        let [oh, ow] = window.output;
        let row = window.taps() * c;
        // When every tap is inside the input, every byte gets written.
        let mut out = if window.all_taps_inside() {
            Buffer::alloc(x.dtype(), n * oh * ow * row, x.device())?
        } else {
            Buffer::zeros(x.dtype(), n * oh * ow * row, x.device())?
        };
        let src = &x.buffer().as_bytes()?[x.layout().offset() * size..];
        let dst = out.as_bytes_mut()?;
        let [h, w] = window.input;
        let run = c * size;
        let fill = |first: usize, patches: &mut [u8]| {
            for (q, patch) in patches.chunks_exact_mut(row * size).enumerate() {
                let p = first + q;
                let (b, rest) = (p / (oh * ow), p % (oh * ow));
                let (y, xo) = (rest / ow, rest % ow);
                window.for_each_tap(y, xo, |tap, iy, ix| {
                    let from = ((b * h + iy) * w + ix) * run;
                    let to = tap * run;
                    patch[to..to + run].copy_from_slice(&src[from..from + run]);
                });
            }
        };
        split_rows(dst, row * size, &fill);
        Tensor::from_buffer(out, &[n, oh, ow, row])
    }

    /// The adjoint of [`im2col`](Tensor::im2col): this `[n, oh, ow, kh * kw * c]` tensor of
    /// patch values summed back into an `[n, h, w, c]` input (float dtypes; 16-bit floats
    /// sum in f32 and round once).
    pub fn col2im(&self, window: &Window2d, channels: usize) -> Result<Tensor> {
        let op = "col2im";
        let [oh, ow] = window.output;
        let row = window.taps() * channels;
        let dims = self.dims();
        if dims.len() != 4 || dims[1..] != [oh, ow, row] {
            return Err(TensorError::Invalid {
                op,
                msg: format!(
                    "expected patches [n, {oh}, {ow}, {row}] of a {:?} window over {channels} \
                     channels",
                    window.kernel
                ),
                shape: *self.shape(),
            });
        }
        if !self.device().is_cpu() {
            return Err(on_device(op, self));
        }
        let n = dims[0];
        let cols = self.contiguous()?;
        match_float_dtype!(cols.dtype(), T => col2im_kernel::<T>(&cols, window, n, channels),
            dtype => Err(TensorError::UnsupportedDType { op, dtype }))
    }
}

impl Tensor {
    /// The largest tap of each `window` over this `[n, h, w, c]` tensor, per channel
    /// (`[n, oh, ow, c]`), and where it is: the flat index into this tensor of each output's
    /// winner (i64, the first of equal maxima; a NaN wins, as every max of mirra's), for the
    /// gradient (`g.scatter_add(0, argmax, ...)` over the flattened input). Taps outside the
    /// input (`same` padding) never win.
    pub fn max_pool2d(&self, window: &Window2d) -> Result<(Tensor, Tensor)> {
        let op = "max_pool2d";
        let [n, c] = check_nhwc(op, self, window.input)?;
        if !self.device().is_cpu() {
            return Err(on_device(op, self));
        }
        let x = self.contiguous()?;
        match_float_dtype!(x.dtype(), T => max_pool_kernel::<T>(&x, window, n, c),
            dtype => Err(TensorError::UnsupportedDType { op, dtype }))
    }
}

fn max_pool_kernel<T: FloatElement>(
    x: &Tensor,
    window: &Window2d,
    n: usize,
    c: usize,
) -> Result<(Tensor, Tensor)> {
    let [h, w] = window.input;
    let [oh, ow] = window.output;
    let src = x.as_slice::<T>()?;
    let mut argmax = vec![-1i64; n * oh * ow * c];
    // Images split between threads; per output position, the winner of each channel.
    split_rows(&mut argmax, oh * ow * c, &|first, images: &mut [i64]| {
        let mut best = vec![<T::Acc as Element>::from_f64(0.0); c];
        for (q, out) in images.chunks_exact_mut(c.max(1)).enumerate() {
            let p = first * oh * ow + q;
            let (b, rest) = (p / (oh * ow), p % (oh * ow));
            let (y, xo) = (rest / ow, rest % ow);
            let mut seen = false;
            window.for_each_tap(y, xo, |_, iy, ix| {
                let base = ((b * h + iy) * w + ix) * c;
                let taps = &src[base..base + c];
                if !seen {
                    for (ch, (bv, o)) in best.iter_mut().zip(out.iter_mut()).enumerate() {
                        *bv = taps[ch].to_acc();
                        *o = (base + ch) as i64;
                    }
                    seen = true;
                    return;
                }
                let at = base as i64;
                for (ch, ((bv, o), t)) in best.iter_mut().zip(out.iter_mut()).zip(taps).enumerate()
                {
                    let v = t.to_acc();
                    // Larger wins; a NaN wins unless a NaN already did (NaN alone is
                    // unequal to itself); the first of equal maxima stays. Selects, not
                    // branches, so that the loop vectorises.
                    #[allow(clippy::eq_op)]
                    let take = (v > *bv) | ((v != v) & (*bv == *bv));
                    *bv = if take { v } else { *bv };
                    *o = if take { at + ch as i64 } else { *o };
                }
            });
        }
    });
    if argmax.contains(&-1) {
        return Err(TensorError::Invalid {
            op: "max_pool2d",
            msg: "a window with no tap inside the input".into(),
            shape: *x.shape(),
        });
    }
    let values: Vec<T> = argmax.iter().map(|&i| src[i as usize]).collect();
    Ok((
        Tensor::from_vec(values, &[n, oh, ow, c], x.device())?,
        Tensor::from_vec(argmax, &[n, oh, ow, c], x.device())?,
    ))
}

fn col2im_kernel<T: FloatElement>(
    cols: &Tensor,
    window: &Window2d,
    n: usize,
    c: usize,
) -> Result<Tensor> {
    let [h, w] = window.input;
    let [oh, ow] = window.output;
    let row = window.taps() * c;
    let src = cols.as_slice::<T>()?;
    let mut acc = vec![<T::Acc as Element>::from_f64(0.0); n * h * w * c];
    // One image's patches add into that image alone: images split between threads.
    let image = |b: usize, acc: &mut [T::Acc]| {
        let patches = &src[b * oh * ow * row..(b + 1) * oh * ow * row];
        for (rest, patch) in patches.chunks_exact(row).enumerate() {
            let (y, xo) = (rest / ow, rest % ow);
            window.for_each_tap(y, xo, |tap, iy, ix| {
                let at = (iy * w + ix) * c;
                let from = tap * c;
                for (a, &v) in acc[at..at + c].iter_mut().zip(&patch[from..from + c]) {
                    *a = *a + v.to_acc();
                }
            });
        }
    };
    split_rows(&mut acc, h * w * c, &|first, images: &mut [T::Acc]| {
        for (i, one) in images.chunks_exact_mut((h * w * c).max(1)).enumerate() {
            image(first + i, one);
        }
    });
    let out: Vec<T> = acc.into_iter().map(T::from_acc).collect();
    Tensor::from_vec(out, &[n, h, w, c], cols.device())
}

/// Elements moved below which a loop stays on the calling thread (waking a parked pool
/// thread costs 0.1-0.8 ms on the development machines).
const PARALLEL_MIN: usize = 1 << 20;

/// Runs `f(first_row, rows)` over `data` cut into rows of `row` elements, on this thread's
/// kernel threads ([`num_threads`](crate::num_threads)) when there is enough to move, each
/// call with a run of whole rows and the index of its first.
fn split_rows<E: Send>(data: &mut [E], row: usize, f: &(dyn Fn(usize, &mut [E]) + Sync)) {
    let threads = crate::num_threads();
    let rows = data.len() / row.max(1);
    if threads <= 1 || data.len() < PARALLEL_MIN || rows < 2 {
        f(0, data);
        return;
    }
    crate::threads::ensure_rayon_pool();
    let per = rows.div_ceil(threads);
    rayon::scope(|s| {
        for (i, part) in data.chunks_mut(per * row).enumerate() {
            s.spawn(move |_| f(i * per, part));
        }
    });
}

/// `[n, c]` of an `[n, h, w, c]` tensor whose height and width are `hw`.
fn check_nhwc(op: &'static str, x: &Tensor, hw: [usize; 2]) -> Result<[usize; 2]> {
    let d = x.dims();
    if d.len() != 4 || d[1..3] != hw {
        return Err(TensorError::Invalid {
            op,
            msg: format!("expected [n, {}, {}, c] (channels last)", hw[0], hw[1]),
            shape: *x.shape(),
        });
    }
    Ok([d[0], d[3]])
}

fn on_device(op: &'static str, x: &Tensor) -> TensorError {
    TensorError::Invalid {
        op,
        msg: format!(
            "on {}: convolutions and pooling run on the host in this build",
            x.device()
        ),
        shape: *x.shape(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Device;

    fn window(input: [usize; 2], k: usize, s: usize, d: usize, p: Padding) -> Window2d {
        Window2d::new(input, [k, k], [s, s], [d, d], p).unwrap()
    }

    #[test]
    fn geometry_follows_tensorflow() {
        // valid: floor((h - span) / s) + 1; same: ceil(h / s), the smaller half of the
        // padding first.
        let w = window([28, 28], 3, 1, 1, Padding::Valid);
        assert_eq!((w.output, w.pad), ([26, 26], [0, 0]));
        assert!(w.all_taps_inside());
        // Padding only after the input (bottom, right): no padding before, yet taps outside.
        let w = window([4, 2], 2, 1, 1, Padding::Same);
        assert_eq!((w.output, w.pad), ([4, 2], [0, 0]));
        assert!(!w.all_taps_inside());
        let w = window([28, 28], 3, 2, 1, Padding::Same);
        assert_eq!((w.output, w.pad), ([14, 14], [0, 0]));
        let w = window([7, 7], 3, 1, 1, Padding::Same);
        assert_eq!((w.output, w.pad), ([7, 7], [1, 1]));
        let w = window([8, 8], 4, 1, 1, Padding::Same);
        assert_eq!((w.output, w.pad), ([8, 8], [1, 1]));
        let w = window([9, 9], 3, 1, 2, Padding::Valid);
        assert_eq!(w.output, [5, 5]);
        assert!(
            Window2d::new([2, 2], [3, 3], [1, 1], [1, 1], Padding::Valid)
                .unwrap_err()
                .contains("does not fit")
        );
        assert!(Window2d::new([2, 2], [0, 3], [1, 1], [1, 1], Padding::Same).is_err());
    }

    /// A direct convolution of `[n, h, w, c]` by `[kh, kw, c, f]`, element by element.
    fn direct(x: &[f64], xd: [usize; 4], k: &[f64], kd: [usize; 4], win: &Window2d) -> Vec<f64> {
        let [n, h, w, c] = xd;
        let [kh, kw, _, f] = kd;
        let [oh, ow] = win.output;
        let mut out = vec![0.0; n * oh * ow * f];
        for b in 0..n {
            for y in 0..oh {
                for xo in 0..ow {
                    for o in 0..f {
                        let mut s = 0.0;
                        for i in 0..kh {
                            for j in 0..kw {
                                let iy = (y * win.stride[0] + i * win.dilation[0]) as isize
                                    - win.pad[0] as isize;
                                let ix = (xo * win.stride[1] + j * win.dilation[1]) as isize
                                    - win.pad[1] as isize;
                                if iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
                                    continue;
                                }
                                for ci in 0..c {
                                    let xv = x[((b * h + iy as usize) * w + ix as usize) * c + ci];
                                    s += xv * k[((i * kw + j) * c + ci) * f + o];
                                }
                            }
                        }
                        out[((b * oh + y) * ow + xo) * f + o] = s;
                    }
                }
            }
        }
        out
    }

    #[test]
    fn patches_times_the_kernel_are_the_direct_convolution() {
        for (hw, k, s, d, p) in [
            ([5, 6], 3, 1, 1, Padding::Valid),
            ([5, 6], 3, 2, 1, Padding::Same),
            ([7, 7], 3, 1, 2, Padding::Same),
            ([6, 5], 2, 2, 1, Padding::Valid),
            ([4, 4], 4, 1, 1, Padding::Same),
            // Padding after the input only (none before): the patches' tail must be zeros.
            ([5, 6], 2, 1, 1, Padding::Same),
        ] {
            let (n, c, f) = (2, 3, 4);
            let x: Vec<f64> = (0..n * hw[0] * hw[1] * c)
                .map(|i| ((i * 37) % 11) as f64 - 5.0)
                .collect();
            let kv: Vec<f64> = (0..k * k * c * f)
                .map(|i| ((i * 13) % 7) as f64 - 3.0)
                .collect();
            let win = window(hw, k, s, d, p);
            let xt = Tensor::from_slice(&x, &[n, hw[0], hw[1], c], Device::Cpu).unwrap();
            let kt = Tensor::from_slice(&kv, &[k * k * c, f], Device::Cpu).unwrap();
            let [oh, ow] = win.output;
            // Recycled memory full of NaN: patches must not depend on what a buffer held.
            let mut junk =
                Buffer::alloc(crate::DType::F64, n * oh * ow * k * k * c, Device::Cpu).unwrap();
            junk.as_mut_slice::<f64>().unwrap().fill(f64::NAN);
            drop(junk);
            let cols = xt.im2col(&win).unwrap();
            let got = cols
                .reshape(&[n * oh * ow, k * k * c])
                .unwrap()
                .matmul(&kt)
                .unwrap()
                .to_vec::<f64>()
                .unwrap();
            let want = direct(&x, [n, hw[0], hw[1], c], &kv, [k, k, c, f], &win);
            assert_eq!(got, want, "{hw:?} k{k} s{s} d{d} {p:?}");
        }
    }

    #[test]
    fn col2im_is_the_adjoint_of_im2col() {
        // <im2col(x), y> = <x, col2im(y)> for every x, y: the gradient's defining property.
        for (hw, k, s, d, p) in [
            ([5, 6], 3, 1, 1, Padding::Same),
            ([7, 5], 3, 2, 2, Padding::Same),
            ([6, 6], 2, 2, 1, Padding::Valid),
        ] {
            let (n, c) = (2, 3);
            let win = window(hw, k, s, d, p);
            let x: Vec<f64> = (0..n * hw[0] * hw[1] * c)
                .map(|i| ((i * 7) % 5) as f64 - 2.0)
                .collect();
            let [oh, ow] = win.output;
            let y: Vec<f64> = (0..n * oh * ow * k * k * c)
                .map(|i| ((i * 3) % 7) as f64 - 3.0)
                .collect();
            let xt = Tensor::from_slice(&x, &[n, hw[0], hw[1], c], Device::Cpu).unwrap();
            let yt = Tensor::from_slice(&y, &[n, oh, ow, k * k * c], Device::Cpu).unwrap();
            let lhs: f64 = xt
                .im2col(&win)
                .unwrap()
                .to_vec::<f64>()
                .unwrap()
                .iter()
                .zip(&y)
                .map(|(a, b)| a * b)
                .sum();
            let rhs: f64 = yt
                .col2im(&win, c)
                .unwrap()
                .to_vec::<f64>()
                .unwrap()
                .iter()
                .zip(&x)
                .map(|(a, b)| a * b)
                .sum();
            assert_eq!(lhs, rhs, "{hw:?} k{k} s{s} d{d} {p:?}");
        }
    }

    #[test]
    fn max_pooling_picks_the_first_largest_tap_and_lets_nan_win() {
        // One 4x4 channel and its negation, windows 2x2 stride 2.
        let x: Vec<f32> = (0..16).flat_map(|i| [i as f32, -(i as f32)]).collect();
        let t = Tensor::from_slice(&x, &[1, 4, 4, 2], Device::Cpu).unwrap();
        let win = window([4, 4], 2, 2, 1, Padding::Valid);
        let (v, at) = t.max_pool2d(&win).unwrap();
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
            .max_pool2d(&window([2, 2], 2, 2, 1, Padding::Valid))
            .unwrap();
        assert_eq!(at.to_vec::<i64>().unwrap(), [0]);
        let nan =
            Tensor::from_slice(&[1.0f32, f32::NAN, 3.0, 0.0], &[1, 2, 2, 1], Device::Cpu).unwrap();
        let (v, at) = nan
            .max_pool2d(&window([2, 2], 2, 2, 1, Padding::Valid))
            .unwrap();
        assert!(v.to_vec::<f32>().unwrap()[0].is_nan());
        assert_eq!(at.to_vec::<i64>().unwrap(), [1]);
        // `same` padding: padded taps never win, even over negative values.
        let neg = Tensor::from_slice(&[-3.0f32, -1.0, -2.0], &[1, 1, 3, 1], Device::Cpu).unwrap();
        let win = Window2d::new([1, 3], [1, 2], [1, 2], [1, 1], Padding::Same).unwrap();
        let (v, _) = neg.max_pool2d(&win).unwrap();
        assert_eq!(v.to_vec::<f32>().unwrap(), [-1.0, -2.0]);
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
            (cols.to_vec::<f32>().unwrap(), back.to_vec::<f32>().unwrap())
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
        let cols = Tensor::zeros(&[2, 3, 3, 8], crate::DType::F32, Device::Cpu).unwrap();
        let e = cols.col2im(&win, 1).unwrap_err().to_string();
        assert!(e.contains("expected patches [n, 3, 3, 9]"), "{e}");
    }
}
