//! Reduce-to-one (TensorFlow's `ReductionToOneDevice`), the baseline: rank 0 reduces all
//! ranks' buffers into its own in one pass per slice (its own first, then ranks `1..n` in
//! order), then every other rank copies rank 0's result, slice by slice as rank 0
//! publishes it.
//!
//! Rank 0 reads `n x len` and writes `len` elements; every other rank reads and writes
//! `len`. Two synchronisation levels, but all reduction work on one rank.
//!
//! Progress (lane 0 of rank 0): unit `j + 1` means slices `0..=j` are final.

use crate::algo::algorithm::Algorithm;
use crate::algo::slicing::slice;
use crate::transport::{Ctx, Loc, Stop, MAX_WORLD_SIZE};

/// The reduce-to-one backend.
pub(crate) struct ReduceToOne;

impl Algorithm for ReduceToOne {
    fn name(&self) -> &'static str {
        "reduce-to-one"
    }

    fn all_reduce(&self, ctx: &Ctx<'_>) -> Result<(), Stop> {
        let (n, r, len) = (ctx.world(), ctx.rank(), ctx.recv_len());
        if n == 1 {
            return Ok(());
        }
        let (slices, per) = ctx.slicing(len);
        let all = 0..len;
        if r == 0 {
            let mut srcs = [Loc::send(0, 0); MAX_WORLD_SIZE];
            for j in 0..slices {
                ctx.check()?;
                let part = slice(&all, per, j);
                for (p, loc) in srcs.iter_mut().enumerate().take(n).skip(1) {
                    *loc = Loc::send(p, part.start);
                }
                // SAFETY: every other rank leaves this slice of its buffer untouched until
                // we publish it below (it waits for that before copying into it); our own
                // buffer is read by others only after the publish.
                unsafe {
                    ctx.reduce(
                        Loc::recv(0, part.start),
                        &srcs[1..n],
                        part.len(),
                        true,
                        true,
                    )
                };
                ctx.publish(0, j + 1);
            }
        } else {
            for j in 0..slices {
                ctx.wait(0, 0, j + 1)?;
                let part = slice(&all, per, j);
                // SAFETY: rank 0 published this slice final and never writes it again; our
                // own slice was read by rank 0 before that publish, and no one else reads it.
                unsafe {
                    ctx.copy(
                        Loc::recv(r, part.start),
                        Loc::send(0, part.start),
                        part.len(),
                    )
                };
            }
        }
        Ok(())
    }
}
