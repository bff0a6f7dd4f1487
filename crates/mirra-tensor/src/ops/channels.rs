//! Per-channel moments and affine maps of channels-last tensors `[.., c]`: what batch
//! normalization is made of. Forward it reads its input twice (the moments, then the
//! affine map) and backward twice (the affine map's gradients, then the moments'), where
//! the same layer composed of element-wise ops and reductions makes some fourteen passes
//! and as many full-size temporaries.
//!
//! Sums over the rows (every axis but the last) are taken in blocks of a fixed number of
//! rows and the blocks' partial sums added in block order, so the result has the same
//! bits on any number of threads.
//!
//! Every loop runs over tiles of whole rows (about [`TILE_ELEMENTS`] elements) against
//! the per-channel values repeated over a tile: one flat loop over equal-length slices,
//! which compiles to full-width vector code for any channel count, where a loop per row
//! of a few channels did not. Within a block, sums gather into one running sum per
//! element of the tile, folded to the channels at the end of the block.

use std::ops::Range;

use mirra_device::{vectorize, Buffer, Element, FloatElement};

use crate::threads::{for_each_split, split_rows};
use crate::{match_float_dtype, DType, Result, Tensor, TensorError};

/// Elements per block of a per-channel sum (whole rows; at least one row).
const BLOCK_ELEMENTS: usize = 1 << 14;

/// Elements per tile (whole rows; at least one row).
const TILE_ELEMENTS: usize = 256;

/// Elements of a tile of rows of `c`.
fn tile_len(c: usize) -> usize {
    c * (TILE_ELEMENTS / c).max(1)
}

/// Per-channel values repeated over a tile of rows of `c`.
fn tiled<A: Copy>(per_channel: &[A], c: usize) -> Vec<A> {
    per_channel
        .iter()
        .copied()
        .cycle()
        .take(tile_len(c))
        .collect()
}

impl Tensor {
    /// `[Σx, Σx²]` per channel of this `[.., c]` tensor over every axis but the last:
    /// `[2c]`, the `c` sums, then the `c` sums of squares. Float dtypes; summed in f64 and
    /// rounded once to this dtype.
    pub fn channel_moments(&self) -> Result<Tensor> {
        let (rows, c) = self.rows_by_channels("channel_moments")?;
        if !self.device().is_cpu() {
            let axes: Vec<isize> = (0..self.shape().rank() as isize - 1).collect();
            let sums = self.sum(&axes, false)?;
            let squares = self.square()?.sum(&axes, false)?;
            return Tensor::concat(&[&sums, &squares], 0);
        }
        let x = self.contiguous()?;
        let sums = match_float_dtype!(x.dtype(), T => {
            let xs = x.as_slice::<T>()?;
            let blocks = rows.div_ceil(rows_per_block(c));
            block_sums(rows, c, 2, vec![(); blocks], #[inline(always)] |at, (), acc| {
                let (sums, squares) = acc.split_at_mut(acc.len() / 2);
                for tile in xs[at].chunks(sums.len()) {
                    for ((s, q), &v) in sums.iter_mut().zip(squares.iter_mut()).zip(tile) {
                        let v = v.to_f64();
                        *s += v;
                        *q += v * v;
                    }
                }
            })
        }, dtype => return Err(unsupported("channel_moments", dtype)));
        Tensor::from_vec(sums, &[2 * c], self.device())?.to_dtype(self.dtype())
    }

    /// The gradient of this tensor `x` (`[.., c]`) from the gradient `g` (`[2c]`) of its
    /// [`channel_moments`](Tensor::channel_moments): `g[ch] + 2 x g[c + ch]`.
    pub fn channel_moments_backward(&self, g: &Tensor) -> Result<Tensor> {
        let op = "channel_moments_backward";
        let (_, c) = self.rows_by_channels(op)?;
        check_per_channel(op, g, 2 * c, self)?;
        if !self.device().is_cpu() {
            let (g_sum, g_square) = (g.narrow(0, 0, c)?, g.narrow(0, c, c)?);
            return self.mul(&g_square)?.scale(2.0)?.add(&g_sum);
        }
        let x = self.contiguous()?;
        match_float_dtype!(x.dtype(), T => {
            let g = acc_vec::<T>(g)?;
            let two = <<T as FloatElement>::Acc as Element>::from_f64(2.0);
            let (sum, square) = (tiled(&g[..c], c), tiled(&g[c..], c));
            map_tiles::<T>(&x, c, #[inline(always)] |xs, out| {
                for ((o, &v), (&gs, &gq)) in out.iter_mut().zip(xs).zip(sum.iter().zip(&square)) {
                    *o = T::from_acc(gs + two * v.to_acc() * gq);
                }
            })
        }, dtype => Err(unsupported(op, dtype)))
    }

    /// This gradient plus `x`'s gradient from the gradient `g` (`[2c]`) of `x`'s
    /// [`channel_moments`](Tensor::channel_moments), added in place in one pass where this
    /// tensor's buffer is its own (what backward does with a gradient it already holds):
    /// the bits of `self.accumulate(&x.channel_moments_backward(g)?)`, without that
    /// tensor.
    pub fn channel_moments_backward_add(mut self, x: &Tensor, g: &Tensor) -> Result<Tensor> {
        let op = "channel_moments_backward_add";
        let (_, c) = x.rows_by_channels(op)?;
        check_per_channel(op, g, 2 * c, x)?;
        let fits = self.dims() == x.dims()
            && self.dtype() == x.dtype()
            && self.is_contiguous()
            && self.device().is_cpu()
            && x.device().is_cpu()
            && self.dtype().is_float();
        let dtype = self.dtype();
        let x = x.contiguous()?;
        let buffer = match fits {
            true => self.unshared_buffer_mut(),
            false => None,
        };
        let Some(buffer) = buffer else {
            return self.accumulate(&x.channel_moments_backward(g)?);
        };
        match_float_dtype!(dtype, T => {
            let g = acc_vec::<T>(g)?;
            let two = <<T as FloatElement>::Acc as Element>::from_f64(2.0);
            let (sum, square) = (tiled(&g[..c], c), tiled(&g[c..], c));
            let xs = x.as_slice::<T>()?;
            for_each_tile(buffer.as_mut_slice::<T>()?, c, #[inline(always)] |first, tile: &mut [T]| {
                let from = &xs[first..first + tile.len()];
                for ((d, &v), (&gs, &gq)) in tile.iter_mut().zip(from).zip(sum.iter().zip(&square)) {
                    // The term rounded to T first, as the separate tensor was.
                    let term = T::from_acc(gs + two * v.to_acc() * gq);
                    *d = T::from_acc(d.to_acc() + term.to_acc());
                }
            });
        }, dtype => return Err(unsupported(op, dtype)));
        Ok(self)
    }

    /// `x * scale[ch] + shift[ch]` for this `[.., c]` tensor `x` and `scale`, `shift` of
    /// `[c]`.
    pub fn channel_affine(&self, scale: &Tensor, shift: &Tensor) -> Result<Tensor> {
        let op = "channel_affine";
        let (_, c) = self.rows_by_channels(op)?;
        check_per_channel(op, scale, c, self)?;
        check_per_channel(op, shift, c, self)?;
        if !self.device().is_cpu() {
            return self.mul(scale)?.add(shift);
        }
        let x = self.contiguous()?;
        match_float_dtype!(x.dtype(), T => {
            let (a, b) = (tiled(&acc_vec::<T>(scale)?, c), tiled(&acc_vec::<T>(shift)?, c));
            map_tiles::<T>(&x, c, #[inline(always)] |xs, out| {
                for ((o, &v), (&a, &b)) in out.iter_mut().zip(xs).zip(a.iter().zip(&b)) {
                    *o = T::from_acc(v.to_acc() * a + b);
                }
            })
        }, dtype => Err(unsupported(op, dtype)))
    }

    /// The gradients of [`channel_affine`](Tensor::channel_affine)'s inputs from this
    /// output gradient `g` (`[.., c]`), given its input `x` and `scale`: `g * scale[ch]`
    /// (`x`'s), `Σ g x` (`scale`'s, `[c]`) and `Σ g` (`shift`'s, `[c]`), in one pass.
    pub fn channel_affine_backward(&self, x: &Tensor, scale: &Tensor) -> Result<[Tensor; 3]> {
        let op = "channel_affine_backward";
        let (rows, c) = self.rows_by_channels(op)?;
        if x.dims() != self.dims() || x.dtype() != self.dtype() || x.device() != self.device() {
            return Err(TensorError::Invalid {
                op,
                msg: format!(
                    "the input {:?} ({} on {}) must match the gradient's {} on {}",
                    x.dims(),
                    x.dtype(),
                    x.device(),
                    self.dtype(),
                    self.device()
                ),
                shape: *self.shape(),
            });
        }
        check_per_channel(op, scale, c, self)?;
        if !self.device().is_cpu() {
            let axes: Vec<isize> = (0..self.shape().rank() as isize - 1).collect();
            return Ok([
                self.mul(scale)?,
                self.mul(x)?.sum(&axes, false)?,
                self.sum(&axes, false)?,
            ]);
        }
        let (g, x) = (self.contiguous()?, x.contiguous()?);
        match_float_dtype!(g.dtype(), T => {
            let a = tiled(&acc_vec::<T>(scale)?, c);
            let (gs, xs) = (g.as_slice::<T>()?, x.as_slice::<T>()?);
            let mut dx = Buffer::alloc(T::DTYPE, g.elem_count(), g.device())?;
            let outs: Vec<&mut [T]> = dx.as_mut_slice::<T>()?.chunks_mut(rows_per_block(c) * c).collect();
            // One pass: each block writes its rows of `g · scale` and sums `g x` and `g`.
            let sums = block_sums(rows, c, 2, outs, #[inline(always)] |at, out, acc| {
                let (gx, gsum) = acc.split_at_mut(acc.len() / 2);
                let tiles = gs[at.clone()].chunks(a.len()).zip(xs[at].chunks(a.len()));
                for ((g_tile, x_tile), o_tile) in tiles.zip(out.chunks_mut(a.len())) {
                    let outs = o_tile.iter_mut().zip(g_tile).zip(x_tile);
                    for ((((o, &gv), &xv), &a), (s, t)) in outs.zip(&a).zip(gx.iter_mut().zip(gsum.iter_mut())) {
                        *o = T::from_acc(gv.to_acc() * a);
                        let gv = gv.to_f64();
                        *s += gv * xv.to_f64();
                        *t += gv;
                    }
                }
            });
            let dx = Tensor::from_buffer(dx, g.dims())?;
            let device = self.device();
            let dscale = Tensor::from_vec(sums[..c].to_vec(), &[c], device)?;
            let dshift = Tensor::from_vec(sums[c..].to_vec(), &[c], device)?;
            Ok([dx, dscale.to_dtype(T::DTYPE)?, dshift.to_dtype(T::DTYPE)?])
        }, dtype => Err(unsupported(op, dtype)))
    }

    /// `(rows, c)` of a `[.., c]` tensor of rank 1 or more.
    fn rows_by_channels(&self, op: &'static str) -> Result<(usize, usize)> {
        match self.dims().last() {
            Some(&c) if c > 0 => Ok((self.elem_count() / c, c)),
            _ => Err(TensorError::Invalid {
                op,
                msg: "needs a last axis of channels".into(),
                shape: *self.shape(),
            }),
        }
    }
}

/// Whole rows of `c` per block of a per-channel sum.
fn rows_per_block(c: usize) -> usize {
    (BLOCK_ELEMENTS / c).max(1)
}

/// `width * c` sums over `rows` rows taken in blocks of [`rows_per_block`]: `add(at, out,
/// acc)` adds block `at` (its element range, whole rows) into `acc`, `width` running sums
/// of a tile each (zeroed, folded to the channels after the block), with `out`, that
/// block's item of `outs` (one per block: rows of an output it writes on the way). The
/// blocks' partial sums are added in block order, so the bits do not depend on the
/// thread count.
fn block_sums<O: Send>(
    rows: usize,
    c: usize,
    width: usize,
    outs: Vec<O>,
    add: impl Fn(Range<usize>, O, &mut [f64]) + Sync,
) -> Vec<f64> {
    let (per_block, tile) = (rows_per_block(c), tile_len(c));
    let mut partials = vec![0.0f64; outs.len() * width * c];
    let items: Vec<((usize, O), &mut [f64])> = outs
        .into_iter()
        .enumerate()
        .zip(partials.chunks_mut(width * c))
        .collect();
    for_each_split(items, rows * c, &|((b, out), partial)| {
        let at = b * per_block * c..((b + 1) * per_block).min(rows) * c;
        let mut acc = vec![0.0f64; width * tile];
        vectorize(
            #[inline(always)]
            || add(at, out, &mut acc),
        );
        for (p, sums) in partial.chunks_exact_mut(c).zip(acc.chunks_exact(tile)) {
            for row in sums.chunks_exact(c) {
                for (p, &s) in p.iter_mut().zip(row) {
                    *p += s;
                }
            }
        }
    });
    let mut sums = vec![0.0f64; width * c];
    for block in partials.chunks(width * c) {
        for (s, p) in sums.iter_mut().zip(block) {
            *s += p;
        }
    }
    sums
}

/// Calls `f(first, tile)` on `data` cut into tiles of whole rows of `c` (`first`: the
/// tile's first element), on this thread's kernel threads when there is enough to move.
fn for_each_tile<T: Send>(data: &mut [T], c: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    let tile = tile_len(c);
    split_rows(data, c, &|first, rows: &mut [T]| {
        vectorize(
            #[inline(always)]
            || {
                for (i, part) in rows.chunks_mut(tile).enumerate() {
                    f(first * c + i * tile, part);
                }
            },
        )
    });
}

/// A tensor of `x`'s shape whose every tile of whole rows of `c` is `f(x's tile, out
/// tile)`.
fn map_tiles<T: FloatElement>(
    x: &Tensor,
    c: usize,
    f: impl Fn(&[T], &mut [T]) + Sync,
) -> Result<Tensor> {
    let src = x.as_slice::<T>()?;
    let mut out = Buffer::alloc(T::DTYPE, x.elem_count(), x.device())?;
    for_each_tile(
        out.as_mut_slice::<T>()?,
        c,
        #[inline(always)]
        |first, tile: &mut [T]| f(&src[first..first + tile.len()], tile),
    );
    Tensor::from_buffer(out, x.dims())
}

/// A per-channel tensor's values in `T`'s accumulation type.
fn acc_vec<T: FloatElement>(t: &Tensor) -> Result<Vec<T::Acc>> {
    Ok(t.contiguous()?
        .as_slice::<T>()?
        .iter()
        .map(|v| v.to_acc())
        .collect())
}

/// `t` must be `[len]` of `like`'s dtype and device.
fn check_per_channel(op: &'static str, t: &Tensor, len: usize, like: &Tensor) -> Result<()> {
    if t.dims() != [len] || t.dtype() != like.dtype() || t.device() != like.device() {
        return Err(TensorError::Invalid {
            op,
            msg: format!(
                "expected [{len}] of {} on {}, got {:?} of {} on {}",
                like.dtype(),
                like.device(),
                t.dims(),
                t.dtype(),
                t.device()
            ),
            shape: *like.shape(),
        });
    }
    Ok(())
}

fn unsupported(op: &'static str, dtype: DType) -> TensorError {
    TensorError::UnsupportedDType { op, dtype }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::threads::PARALLEL_MIN;
    use crate::{set_num_threads, Device};
    use proptest::prelude::*;

    fn tensor(values: &[f32], dims: &[usize]) -> Tensor {
        Tensor::from_slice(values, dims, Device::Cpu).unwrap()
    }

    fn values(t: &Tensor) -> Vec<f32> {
        t.to_vec::<f32>().unwrap()
    }

    /// The composed reference: the element-wise ops and reductions these kernels fuse.
    fn axes(x: &Tensor) -> Vec<isize> {
        (0..x.shape().rank() as isize - 1).collect()
    }

    fn close(a: &[f32], b: &[f32], tol: f32) -> bool {
        a.len() == b.len()
            && a.iter()
                .zip(b)
                .all(|(x, y)| (x - y).abs() <= tol * (1.0 + x.abs().max(y.abs())))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Each kernel against its composition from the generic ops, on random shapes.
        #[test]
        fn the_fused_kernels_equal_their_composition(
            rows in 1usize..300,
            c in 1usize..9,
            seed in 0u64..1000,
        ) {
            let n = rows * c;
            // At least 2c values: the moments' gradient below takes 2c of them.
            let gen = |salt: u64| -> Vec<f32> {
                (0..n.max(2 * c) as u64)
                    .map(|i| (((i * 2654435761 + seed * 97 + salt) % 2001) as f32 - 1000.0) / 250.0)
                    .collect()
            };
            let x = tensor(&gen(1)[..n], &[rows, c]);
            let g = tensor(&gen(2)[..n], &[rows, c]);
            let a = tensor(&gen(3)[..c], &[c]);
            let b = tensor(&gen(4)[..c], &[c]);
            let ax = axes(&x);

            let moments = x.channel_moments().unwrap();
            let composed = Tensor::concat(
                &[&x.sum(&ax, false).unwrap(), &x.square().unwrap().sum(&ax, false).unwrap()],
                0,
            )
            .unwrap();
            prop_assert!(close(&values(&moments), &values(&composed), 1e-4));

            let g2 = tensor(&gen(5)[..2 * c], &[2 * c]);
            let dx = x.channel_moments_backward(&g2).unwrap();
            let want = x
                .mul(&g2.narrow(0, c, c).unwrap()).unwrap()
                .scale(2.0).unwrap()
                .add(&g2.narrow(0, 0, c).unwrap()).unwrap();
            prop_assert!(close(&values(&dx), &values(&want), 1e-5));

            let y = x.channel_affine(&a, &b).unwrap();
            let want = x.mul(&a).unwrap().add(&b).unwrap();
            prop_assert!(close(&values(&y), &values(&want), 1e-6));

            let [dx, da, db] = g.channel_affine_backward(&x, &a).unwrap();
            prop_assert!(close(&values(&dx), &values(&g.mul(&a).unwrap()), 1e-6));
            let want_da = g.mul(&x).unwrap().sum(&ax, false).unwrap();
            prop_assert!(close(&values(&da), &values(&want_da), 1e-4));
            prop_assert!(close(&values(&db), &values(&g.sum(&ax, false).unwrap()), 1e-4));
        }
    }

    #[test]
    fn moments_of_a_known_tensor_and_of_higher_ranks() {
        // [2, 2, 2]: channel 0 holds 1, 3, 5, 7 and channel 1 holds 2, 4, 6, 8.
        let x = tensor(&[1., 2., 3., 4., 5., 6., 7., 8.], &[2, 2, 2]);
        assert_eq!(values(&x.channel_moments().unwrap()), [16., 20., 84., 120.]);
        let y = x
            .channel_affine(&tensor(&[2., -1.], &[2]), &tensor(&[0.5, 0.], &[2]))
            .unwrap();
        assert_eq!(y.dims(), &[2, 2, 2]);
        assert_eq!(values(&y), [2.5, -2., 6.5, -4., 10.5, -6., 14.5, -8.]);
    }

    #[test]
    fn a_nan_reaches_its_channel_only() {
        let x = tensor(&[f32::NAN, 1., 2., 3.], &[2, 2]);
        let m = values(&x.channel_moments().unwrap());
        assert!(m[0].is_nan() && m[2].is_nan());
        assert_eq!([m[1], m[3]], [4., 10.]);
    }

    #[test]
    fn threads_do_not_change_a_bit() {
        let (rows, c) = (PARALLEL_MIN / 8, 16);
        let v: Vec<f32> = (0..rows * c)
            .map(|i| ((i * 7919) % 1013) as f32 * 0.013 - 6.0)
            .collect();
        let x = tensor(&v, &[rows, c]);
        let g = tensor(&v.iter().rev().copied().collect::<Vec<_>>(), &[rows, c]);
        let a = tensor(&v[..c], &[c]);
        let run = |threads: usize| {
            set_num_threads(threads);
            let [dx, da, db] = g.channel_affine_backward(&x, &a).unwrap();
            let out = [
                x.channel_moments().unwrap(),
                x.channel_affine(&a, &a).unwrap(),
                dx,
                da,
                db,
            ];
            out.map(|t| values(&t).iter().map(|v| v.to_bits()).collect::<Vec<_>>())
        };
        let before = crate::num_threads();
        let one = run(1);
        let two = run(2);
        set_num_threads(before);
        assert_eq!(one, two);
    }

    #[test]
    fn bad_shapes_are_errors_that_name_the_op() {
        let x = tensor(&[1., 2., 3., 4.], &[2, 2]);
        let e = x
            .channel_affine(&tensor(&[1., 2., 3.], &[3]), &tensor(&[0., 0.], &[2]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("channel_affine") && e.contains("[3]"), "{e}");
        let e = x
            .channel_moments_backward(&tensor(&[1., 2.], &[2]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("expected [4]"), "{e}");
        let g = tensor(&[1., 2.], &[1, 2]);
        assert!(g
            .channel_affine_backward(&x, &tensor(&[1., 1.], &[2]))
            .is_err());
        let scalar = Tensor::scalar(1.0f32, Device::Cpu).unwrap();
        assert!(scalar.channel_moments().is_err());
        let ints = Tensor::from_slice(&[1i64, 2], &[1, 2], Device::Cpu).unwrap();
        assert!(ints.channel_moments().is_err());
    }

    /// Adding the moments' gradient in place gives the bits of making it and adding it,
    /// in f32 and bf16, and leaves a shared gradient alone.
    #[test]
    fn moments_gradient_added_in_place_has_the_bits_of_the_sum() {
        let (rows, c) = (300, 5);
        let vals = |seed: usize, n: usize| -> Vec<f32> {
            (0..n)
                .map(|i| ((i * 7919 + seed * 131) % 1000) as f32 / 250.0 - 2.0)
                .collect()
        };
        for dtype in [DType::F32, DType::BF16] {
            let t = |v: Vec<f32>, dims: &[usize]| tensor(&v, dims).to_dtype(dtype).unwrap();
            let x = t(vals(1, rows * c), &[rows, c]);
            let g = t(vals(2, 2 * c), &[2 * c]);
            let prev = t(vals(3, rows * c), &[rows, c]);
            let expected = prev
                .accumulate(&x.channel_moments_backward(&g).unwrap())
                .unwrap()
                .to_dtype(DType::F32)
                .unwrap();
            let prev = t(vals(3, rows * c), &[rows, c]);
            let fused = prev.channel_moments_backward_add(&x, &g).unwrap();
            assert_eq!(
                values(&fused.to_dtype(DType::F32).unwrap()),
                values(&expected),
                "{dtype}"
            );
            // A gradient whose buffer is shared is not written through.
            let shared = t(vals(3, rows * c), &[rows, c]);
            let before = values(&shared.to_dtype(DType::F32).unwrap());
            let sum = shared.clone().channel_moments_backward_add(&x, &g).unwrap();
            assert_eq!(values(&shared.to_dtype(DType::F32).unwrap()), before);
            assert_eq!(
                values(&sum.to_dtype(DType::F32).unwrap()),
                values(&expected)
            );
        }
    }
}
