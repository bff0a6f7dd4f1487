//! Per-channel moments and affine maps of channels-last tensors `[.., c]`: what batch
//! normalization is made of. Forward it reads its input twice (the moments, then the
//! affine map) and backward twice (the affine map's gradients, then the moments'), where
//! the same layer composed of element-wise ops and reductions makes some fourteen passes
//! and as many full-size temporaries.
//!
//! Sums over the rows (every axis but the last) are taken in blocks of a fixed number of
//! rows and the blocks' partial sums added in block order, so the result has the same
//! bits on any number of threads.

use mirra_device::{vectorize, Buffer, Element, FloatElement};

use crate::threads::{for_each_split, split_rows};
use crate::{match_float_dtype, DType, Result, Tensor, TensorError};

/// Elements per block of a per-channel sum (whole rows; at least one row).
const BLOCK_ELEMENTS: usize = 1 << 14;

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
            row_sums(rows, c, 2, #[inline(always)] |row, acc| {
                for (ch, &v) in xs[row * c..(row + 1) * c].iter().enumerate() {
                    let v = v.to_f64();
                    acc[ch] += v;
                    acc[c + ch] += v * v;
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
            map_rows::<T>(&x, c, #[inline(always)] |xs, out| {
                for (ch, (o, &v)) in out.iter_mut().zip(xs).enumerate() {
                    *o = T::from_acc(g[ch] + two * v.to_acc() * g[c + ch]);
                }
            })
        }, dtype => Err(unsupported(op, dtype)))
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
            let (a, b) = (acc_vec::<T>(scale)?, acc_vec::<T>(shift)?);
            map_rows::<T>(&x, c, #[inline(always)] |xs, out| {
                for (ch, (o, &v)) in out.iter_mut().zip(xs).enumerate() {
                    *o = T::from_acc(v.to_acc() * a[ch] + b[ch]);
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
            let a = acc_vec::<T>(scale)?;
            let dx = map_rows::<T>(&g, c, #[inline(always)] |gs, out| {
                for (ch, (o, &v)) in out.iter_mut().zip(gs).enumerate() {
                    *o = T::from_acc(v.to_acc() * a[ch]);
                }
            })?;
            let (gs, xs) = (g.as_slice::<T>()?, x.as_slice::<T>()?);
            let sums = row_sums(rows, c, 2, #[inline(always)] |row, acc| {
                let at = row * c..(row + 1) * c;
                for (ch, (&gv, &xv)) in gs[at.clone()].iter().zip(&xs[at]).enumerate() {
                    let gv = gv.to_f64();
                    acc[ch] += gv * xv.to_f64();
                    acc[c + ch] += gv;
                }
            });
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

/// `width * c` sums over `rows` rows: `add(row, acc)` adds one row into a block's `acc`
/// (zeroed per block), and the blocks' partial sums are added in block order.
fn row_sums(
    rows: usize,
    c: usize,
    width: usize,
    add: impl Fn(usize, &mut [f64]) + Sync,
) -> Vec<f64> {
    let per_block = (BLOCK_ELEMENTS / c).max(1);
    let blocks = rows.div_ceil(per_block);
    let mut partials = vec![0.0f64; blocks * width * c];
    let items: Vec<(usize, &mut [f64])> = partials.chunks_mut(width * c).enumerate().collect();
    for_each_split(items, rows * c, &|(b, acc)| {
        vectorize(
            #[inline(always)]
            || {
                for row in b * per_block..((b + 1) * per_block).min(rows) {
                    add(row, acc);
                }
            },
        )
    });
    let mut sums = vec![0.0f64; width * c];
    for block in partials.chunks(width * c) {
        for (s, p) in sums.iter_mut().zip(block) {
            *s += p;
        }
    }
    sums
}

/// A tensor of `x`'s shape whose every row of `c` is `f(x's row, out row)`.
fn map_rows<T: FloatElement>(
    x: &Tensor,
    c: usize,
    f: impl Fn(&[T], &mut [T]) + Sync,
) -> Result<Tensor> {
    let src = x.as_slice::<T>()?;
    let mut out = Buffer::alloc(T::DTYPE, x.elem_count(), x.device())?;
    split_rows(out.as_mut_slice::<T>()?, c, &|first, rows: &mut [T]| {
        vectorize(
            #[inline(always)]
            || {
                let from = &src[first * c..first * c + rows.len()];
                for (xs, o) in from.chunks_exact(c).zip(rows.chunks_exact_mut(c)) {
                    f(xs, o);
                }
            },
        )
    });
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
}
