//! The verdict on one collective: every rank's posted arguments checked against each
//! other, in the same order by every rank (or by the one that checks for all), so that
//! all ranks reach the same verdict. A mismatch is an error on every rank, found before
//! any buffer is touched.

use crate::collective::Collective;
use crate::error::{CollectiveError, Result};
use crate::reduce::SUPPORTED_DTYPES;
use crate::transport::{Desc, Place};

/// Where a rank's buffers must live for a backend: host memory for the CPU backends, the
/// rank's own device for the device backends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Accepts(pub Place);

impl std::fmt::Display for Accepts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Place::Cpu => f.write_str("host buffers only"),
            device => write!(f, "buffers on the rank's device ({device}) only"),
        }
    }
}

/// The first rank whose `get` differs from rank 0's, with the rank it is compared with:
/// `(offender, reference)`. When rank 0 alone differs from all others (n >= 3), rank 0 is
/// the offender.
pub(crate) fn odd_one<V: PartialEq>(n: usize, get: impl Fn(usize) -> V) -> Option<(usize, usize)> {
    let first = get(0);
    let p = (1..n).find(|&p| get(p) != first)?;
    if n >= 3 && p == 1 && (2..n).all(|q| get(q) == get(1)) {
        Some((0, 1))
    } else {
        Some((p, 0))
    }
}

/// Check every rank's posted metadata for collective `seq`. Every rank runs the same
/// checks on the same data in the same order, so all ranks reach the same verdict (only
/// `op`, the caller's own collective, can differ between their errors).
pub(crate) fn verdict(
    n: usize,
    d: &dyn Fn(usize) -> Desc,
    op: Collective,
    backend: &'static str,
    place: &dyn Fn(usize) -> Accepts,
) -> Result<()> {
    if let Some((rank, ref_rank)) = odd_one(n, |p| d(p).kind) {
        return Err(CollectiveError::CollectiveMismatch {
            op,
            rank,
            started: d(rank).kind,
            ref_rank,
            ref_started: d(ref_rank).kind,
        });
    }
    let kind = d(0).kind;
    if kind == Collective::Barrier {
        return Ok(());
    }
    for rank in 0..n {
        let x = d(rank);
        let accepts = place(rank);
        for dev in [x.dev_in, x.dev_out] {
            if dev != accepts.0 {
                return Err(CollectiveError::UnsupportedDevice {
                    op,
                    rank,
                    device: dev.to_string(),
                    backend,
                    accepts: accepts.to_string(),
                });
            }
        }
        for dtype in [x.dtype_in, x.dtype_out] {
            if !SUPPORTED_DTYPES.contains(&dtype) {
                return Err(CollectiveError::UnsupportedDType { op, rank, dtype });
            }
        }
        if x.dtype_in != x.dtype_out {
            return Err(CollectiveError::SendRecvDType {
                op,
                rank,
                send: x.dtype_in,
                recv: x.dtype_out,
            });
        }
        let sizes_ok = match kind {
            Collective::ReduceScatter => Some(x.len_in) == x.len_out.checked_mul(n),
            Collective::AllGather => Some(x.len_out) == x.len_in.checked_mul(n),
            _ => true,
        };
        if !sizes_ok {
            return Err(CollectiveError::BufferSizes {
                op,
                rank,
                send_len: x.len_in,
                recv_len: x.len_out,
                world_size: n,
            });
        }
        if matches!(kind, Collective::Broadcast | Collective::Reduce) && x.root >= n {
            return Err(CollectiveError::RootOutOfRange {
                op,
                rank,
                root: x.root,
                world_size: n,
            });
        }
    }
    if let Some((rank, ref_rank)) = odd_one(n, |p| d(p).dtype_in) {
        return Err(CollectiveError::DTypeMismatch {
            op,
            rank,
            dtype: d(rank).dtype_in,
            ref_rank,
            ref_dtype: d(ref_rank).dtype_in,
        });
    }
    // The per-rank count: recv for reduce-scatter, send otherwise.
    let count = |p: usize| {
        let x = d(p);
        if kind == Collective::ReduceScatter {
            x.len_out
        } else {
            x.len_in
        }
    };
    if let Some((rank, ref_rank)) = odd_one(n, count) {
        return Err(CollectiveError::LengthMismatch {
            op,
            rank,
            len: count(rank),
            ref_rank,
            ref_len: count(ref_rank),
        });
    }
    if matches!(
        kind,
        Collective::AllReduce | Collective::ReduceScatter | Collective::Reduce
    ) {
        if let Some((rank, ref_rank)) = odd_one(n, |p| d(p).op) {
            return Err(CollectiveError::ReduceOpMismatch {
                op,
                rank,
                reduce_op: d(rank).op,
                ref_rank,
                ref_reduce_op: d(ref_rank).op,
            });
        }
    }
    if matches!(kind, Collective::Broadcast | Collective::Reduce) {
        if let Some((rank, ref_rank)) = odd_one(n, |p| d(p).root) {
            return Err(CollectiveError::RootMismatch {
                op,
                rank,
                root: d(rank).root,
                ref_rank,
                ref_root: d(ref_rank).root,
            });
        }
    }
    Ok(())
}
