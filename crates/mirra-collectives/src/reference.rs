//! Naive sequential references of the collectives, for the conformance tests (test builds
//! only): floats are combined in f64, in rank order, and rounded once to
//! the element type; integers wrap in their own type (Mean: truncating division of the
//! wrapped sum), exactly as the backends define them.
//!
//! A backend's float results may differ from these by rounding (it combines in another
//! order or rounds partial results); integer results and results of inputs whose
//! reductions are exact in any order must match bitwise.

use mirra_device::{Buffer, DType};

use crate::collective::Collective;
use crate::error::{CollectiveError, Result};
use crate::reduce::ReduceOp;
use crate::reduce::{with_dtype, Reducible};

fn check(op: Collective, inputs: &[&Buffer]) -> Result<(DType, usize)> {
    let first = inputs.first().ok_or(CollectiveError::InvalidWorldSize {
        world_size: 0,
        max: crate::transport::MAX_WORLD_SIZE,
    })?;
    for (rank, b) in inputs.iter().enumerate() {
        if b.dtype() != first.dtype() {
            return Err(CollectiveError::DTypeMismatch {
                op,
                rank,
                dtype: b.dtype(),
                ref_rank: 0,
                ref_dtype: first.dtype(),
            });
        }
        if b.len() != first.len() {
            return Err(CollectiveError::LengthMismatch {
                op,
                rank,
                len: b.len(),
                ref_rank: 0,
                ref_len: first.len(),
            });
        }
    }
    Ok((first.dtype(), first.len()))
}

fn fold<T: Reducible>(xs: &[&[T]], op: ReduceOp, out: &mut [T]) {
    let n = xs.len();
    for (i, o) in out.iter_mut().enumerate() {
        *o = if T::IS_FLOAT {
            let mut acc = xs[0][i].to_f64();
            for x in &xs[1..] {
                let v = x[i].to_f64();
                acc = match op {
                    ReduceOp::Sum | ReduceOp::Mean => acc + v,
                    ReduceOp::Product => acc * v,
                    ReduceOp::Max => acc.max(v),
                    ReduceOp::Min => acc.min(v),
                };
            }
            if op == ReduceOp::Mean {
                acc /= n as f64;
            }
            <T as mirra_device::Element>::from_f64(acc)
        } else {
            let mut acc = xs[0][i].widen();
            for x in &xs[1..] {
                let v = x[i].widen();
                acc = match op {
                    ReduceOp::Sum | ReduceOp::Mean => T::add(acc, v),
                    ReduceOp::Product => T::mul(acc, v),
                    ReduceOp::Max => T::max(acc, v),
                    ReduceOp::Min => T::min(acc, v),
                };
            }
            if op == ReduceOp::Mean {
                acc = T::div_n(acc, n);
            }
            T::narrow(acc)
        };
    }
}

/// The reduction of all ranks' buffers (what every rank holds after an all-reduce, and
/// the root after a reduce).
pub fn all_reduce(inputs: &[&Buffer], op: ReduceOp) -> Result<Buffer> {
    let (dtype, len) = check(Collective::AllReduce, inputs)?;
    let mut out = inputs[0].clone();
    with_dtype!(dtype, T => {
        let mut xs: Vec<&[T]> = Vec::with_capacity(inputs.len());
        for b in inputs {
            xs.push(b.as_slice::<T>().unwrap_or(&[]));
        }
        if let Ok(o) = out.as_mut_slice::<T>() {
            fold::<T>(&xs, op, &mut o[..len]);
        }
    });
    Ok(out)
}

/// What each rank receives from a reduce-scatter of `inputs` (`world x count` elements
/// each): rank `r` gets elements `[r * count, (r + 1) * count)` of the reduction.
pub fn reduce_scatter(inputs: &[&Buffer], op: ReduceOp) -> Result<Vec<Buffer>> {
    let (dtype, len) = check(Collective::ReduceScatter, inputs)?;
    let n = inputs.len();
    if len % n != 0 {
        return Err(CollectiveError::BufferSizes {
            op: Collective::ReduceScatter,
            rank: 0,
            send_len: len,
            recv_len: len / n,
            world_size: n,
        });
    }
    let full = all_reduce(inputs, op)?;
    let count = len / n;
    let bytes = count * dtype.size_in_bytes();
    (0..n)
        .map(|r| {
            let mut b = Buffer::zeros(dtype, count, full.device()).map_err(|_| {
                CollectiveError::UnsupportedDevice {
                    op: Collective::ReduceScatter,
                    rank: r,
                    device: full.device().to_string(),
                    backend: "reference",
                    accepts: "host buffers only".into(),
                }
            })?;
            b.as_bytes_mut().expect("a host buffer").copy_from_slice(
                &full.as_bytes().expect("checked on the host")[r * bytes..(r + 1) * bytes],
            );
            Ok(b)
        })
        .collect()
}

/// What every rank receives from an all-gather: all inputs, concatenated in rank order.
pub fn all_gather(inputs: &[&Buffer]) -> Result<Buffer> {
    let (dtype, len) = check(Collective::AllGather, inputs)?;
    let device = inputs[0].device();
    let mut out = Buffer::zeros(dtype, len * inputs.len(), device).map_err(|_| {
        CollectiveError::UnsupportedDevice {
            op: Collective::AllGather,
            rank: 0,
            device: device.to_string(),
            backend: "reference",
            accepts: "host buffers only".into(),
        }
    })?;
    let bytes = len * dtype.size_in_bytes();
    for (r, b) in inputs.iter().enumerate() {
        out.as_bytes_mut().expect("a host buffer")[r * bytes..(r + 1) * bytes]
            .copy_from_slice(b.as_bytes().expect("checked on the host"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mirra_device::Device;

    #[test]
    fn reference_folds_in_f64_and_rounds_once() {
        let a = Buffer::from_slice(&[1.0f32, 2.0], Device::Cpu).unwrap();
        let b = Buffer::from_slice(&[3.0f32, -2.0], Device::Cpu).unwrap();
        let out = all_reduce(&[&a, &b], ReduceOp::Mean).unwrap();
        assert_eq!(out.as_slice::<f32>().unwrap(), &[2.0, 0.0]);
        let parts = reduce_scatter(&[&a, &b], ReduceOp::Max).unwrap();
        assert_eq!(parts[0].as_slice::<f32>().unwrap(), &[3.0]);
        assert_eq!(parts[1].as_slice::<f32>().unwrap(), &[2.0]);
        let g = all_gather(&[&a, &b]).unwrap();
        assert_eq!(g.as_slice::<f32>().unwrap(), &[1.0, 2.0, 3.0, -2.0]);
        let i = Buffer::from_slice(&[i64::MAX], Device::Cpu).unwrap();
        let s = all_reduce(&[&i, &i], ReduceOp::Sum).unwrap();
        assert_eq!(s.as_slice::<i64>().unwrap(), &[-2]);
    }

    #[test]
    fn mismatched_inputs_are_errors() {
        let a = Buffer::from_slice(&[1.0f32, 2.0], Device::Cpu).unwrap();
        let b = Buffer::from_slice(&[3.0f32], Device::Cpu).unwrap();
        assert!(matches!(
            all_reduce(&[&a, &b], ReduceOp::Sum),
            Err(CollectiveError::LengthMismatch { rank: 1, .. })
        ));
    }
}
