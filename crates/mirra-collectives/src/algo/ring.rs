//! Ring all-reduce: a reduce-scatter then an all-gather around the ring `r -> r + 1`, over
//! `n` chunks, each step pipelined in slices.
//!
//! Reduce-scatter, step `s = 0..n-1`: rank `r` accumulates chunk `(r - s - 1) mod n` of its
//! left neighbour's buffer into its own, slice by slice, as soon as the neighbour has
//! finished that slice (at step 0 the neighbour's chunk is its untouched input). After
//! `n - 1` steps rank `r` holds the final chunk `(r + 1) mod n`, reduced along the chain
//! `c, c + 1, ..., c - 1` (the last step also divides, for Mean).
//!
//! All-gather, step `s = 0..n-1`: rank `r` copies chunk `(r - s) mod n` from its left
//! neighbour once the neighbour has it final.
//!
//! Each final chunk is computed once, by one rank, and copied to the others, so every
//! rank ends bitwise identical. Per rank: `2(n-1)` steps, each reading `len/n` elements of
//! the neighbour; the reduce steps also read and write `len/n` of its own.
//!
//! Progress (lane 0): unit `step * slices + j + 1` means slices `0..=j` of global step
//! `step` (reduce-scatter steps `0..n-1`, then all-gather steps) are done.

use crate::algo::algorithm::Algorithm;
use crate::algo::slicing::{chunk, slice};
use crate::transport::{Ctx, Loc, Stop};

/// The ring backend.
pub(crate) struct Ring;

impl Algorithm for Ring {
    fn name(&self) -> &'static str {
        "ring"
    }

    fn all_reduce(&self, ctx: &Ctx<'_>) -> Result<(), Stop> {
        let (n, r, len) = (ctx.world(), ctx.rank(), ctx.recv_len());
        if n == 1 {
            return Ok(());
        }
        let left = (r + n - 1) % n;
        let (slices, per) = ctx.slicing(len.div_ceil(n));
        let unit = |step: usize, j: usize| step * slices + j + 1;
        for s in 0..n - 1 {
            let c = chunk(len, n, (r + 2 * n - s - 1) % n);
            let last = s == n - 2;
            for j in 0..slices {
                if s > 0 {
                    ctx.wait(left, 0, unit(s - 1, j))?;
                } else {
                    ctx.check()?;
                }
                let part = slice(&c, per, j);
                // SAFETY: the left neighbour finished writing this slice of chunk c at its
                // step s - 1 (waited for above; at step 0 it is its untouched input) and
                // writes chunk c again only in its all-gather, after the chain reducing c
                // has ended, which needs this step. Our own slice of chunk c is read by
                // the right neighbour only at its step s + 1, after we publish below.
                unsafe {
                    ctx.reduce(
                        Loc::recv(r, part.start),
                        &[Loc::send(left, part.start)],
                        part.len(),
                        true,
                        last,
                    )
                };
                ctx.publish(0, unit(s, j));
            }
        }
        for s in 0..n - 1 {
            let step = n - 1 + s;
            let c = chunk(len, n, (r + n - s) % n);
            for j in 0..slices {
                ctx.wait(left, 0, unit(step - 1, j))?;
                let part = slice(&c, per, j);
                // SAFETY: the left neighbour holds this slice of chunk c final (its step
                // `step - 1`, waited for) and never writes it again. Our copy of chunk c
                // was last read in the reduce-scatter chain of c, which has ended (the
                // final value exists), and is read next by the right neighbour after we
                // publish below.
                unsafe {
                    ctx.copy(
                        Loc::recv(r, part.start),
                        Loc::send(left, part.start),
                        part.len(),
                    )
                };
                ctx.publish(0, unit(step, j));
            }
        }
        Ok(())
    }
}
