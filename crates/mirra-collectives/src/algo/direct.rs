//! One-pass all-reduce through shared memory (`direct`), the bandwidth-optimal schedule
//! when every rank can address every other rank's buffer: rank `r` owns chunk `r`; for
//! each slice of it, it combines that slice of every rank's buffer into its own (its own
//! first, then the others in rank order) and writes the result into every other rank's
//! buffer while the slice is still in its cache.
//!
//! Per rank: reads `len` and writes `len` elements in all, the least any all-reduce can
//! move (each input read once, each output written once), against a ring's
//! `(3n - 2)(n - 1)/n` reads for `n` ranks. No progress counters: chunk `r` of every buffer
//! is touched by rank `r` alone during the data phase, so the only synchronisation is the
//! transport's rendezvous before and exit wait after.

use crate::algo::algorithm::Algorithm;
use crate::algo::slicing::{chunk, slice};
use crate::transport::{Ctx, Loc, Stop, MAX_WORLD_SIZE};

/// The `direct` backend.
pub(crate) struct Direct;

impl Algorithm for Direct {
    fn name(&self) -> &'static str {
        "direct"
    }

    fn all_reduce(&self, ctx: &Ctx<'_>) -> Result<(), Stop> {
        let (n, r, len) = (ctx.world(), ctx.rank(), ctx.recv_len());
        if n == 1 {
            return Ok(());
        }
        let mine = chunk(len, n, r);
        let (slices, per) = ctx.slicing(mine.len());
        let mut srcs = [Loc::send(0, 0); MAX_WORLD_SIZE];
        for j in 0..slices {
            ctx.check()?;
            let s = slice(&mine, per, j);
            let mut k = 0;
            for p in (0..n).filter(|&p| p != r) {
                srcs[k] = Loc::send(p, s.start);
                k += 1;
            }
            // SAFETY: chunk `r` of every rank's buffer is read and written by this rank
            // only (each rank works on its own chunk); the destination is this rank's
            // buffer, which is not among the sources (other ranks' buffers).
            unsafe { ctx.reduce(Loc::recv(r, s.start), &srcs[..k], s.len(), true, true) };
            for p in (0..n).filter(|&p| p != r) {
                // SAFETY: as above: this slice of rank `p`'s buffer is touched by this rank
                // alone, and it is a different buffer from the source (ours).
                unsafe { ctx.copy(Loc::recv(p, s.start), Loc::recv(r, s.start), s.len()) };
            }
        }
        Ok(())
    }
}
