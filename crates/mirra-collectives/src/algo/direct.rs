//! All-reduce through shared memory (`direct`), for ranks that can address each other's
//! buffers, in one of two schedules.
//!
//! **Two-shot** (the bandwidth-optimal schedule): rank `r` owns chunk `r`; for each slice
//! of it, it combines that slice of every rank's buffer into its own (its own first, then
//! the others in rank order) and writes the result into every other rank's buffer while
//! the slice is still in its cache. Per rank: reads `len` and writes `len` elements in
//! all, the least any all-reduce can move (each input read once, each output written
//! once), against a ring's `(3n - 2)(n - 1)/n` reads for `n` ranks. No progress counters:
//! chunk `r` of every buffer is touched by rank `r` alone during the data phase, so the
//! only synchronisation is the transport's rendezvous before and exit wait after.
//!
//! **One-shot**, for messages up to the group's eager size (`Config::eager_bytes`), the
//! latency-optimal schedule: every rank posts a copy of its input eagerly, and combines
//! every rank's copy, in rank order, into its own buffer. Each rank reads `n x len`
//! elements, but writes only its own buffer, so the rendezvous is the only
//! synchronisation: no exit wait, no data-phase handshake. Every rank combines the same
//! operands in the same order, so all results are bitwise equal.

use crate::algo::algorithm::Algorithm;
use crate::algo::slicing::{chunk, slice};
use crate::collective::Collective;
use crate::transport::{Ctx, Desc, Loc, Stop, MAX_WORLD_SIZE};

/// The `direct` backend.
pub(crate) struct Direct;

impl Algorithm for Direct {
    fn name(&self) -> &'static str {
        "direct"
    }

    fn eager(&self, desc: &Desc, world: usize, eager_bytes: usize) -> bool {
        let bytes = desc.len_out.saturating_mul(desc.dtype_out.size_in_bytes());
        desc.kind == Collective::AllReduce && world > 1 && bytes <= eager_bytes
    }

    fn all_reduce(&self, ctx: &Ctx<'_>) -> Result<(), Stop> {
        let (n, r, len) = (ctx.world(), ctx.rank(), ctx.recv_len());
        if n == 1 {
            return Ok(());
        }
        if ctx.is_eager() {
            let srcs: [Loc; MAX_WORLD_SIZE] = std::array::from_fn(|p| Loc::send(p, 0));
            // SAFETY: the sources are every rank's eager copy, written before the
            // rendezvous and not again before every rank has posted the next collective
            // (after this data phase); the destination is this rank's own output, which no
            // other rank touches in an eager collective, and is none of the copies.
            unsafe { ctx.reduce(Loc::recv(r, 0), &srcs[..n], len, false, true) };
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
