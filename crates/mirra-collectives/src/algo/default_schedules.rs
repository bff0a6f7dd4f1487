//! The schedules of reduce-scatter, all-gather, broadcast and reduce that every algorithm
//! uses unless it overrides them (the [`Algorithm`](crate::algo::Algorithm) trait's
//! default methods): each rank reads its peers' posted buffers directly, without
//! intermediate hops. They need no progress counters, because what they read is
//! an input no one writes during the collective, and what a rank writes is read by no one
//! else. Work is done in slices so that an abort is noticed promptly.

use crate::algo::slicing::{chunk, slice};
use crate::transport::{Ctx, Loc, Stop, MAX_WORLD_SIZE};

/// Rank `r` receives `⊕_p send_p[r*count..(r+1)*count]`, combined in rank order in one
/// pass. Reads `world x count`, writes `count` elements per rank.
pub(crate) fn reduce_scatter(ctx: &Ctx<'_>) -> Result<(), Stop> {
    let (n, r, count) = (ctx.world(), ctx.rank(), ctx.recv_len());
    let (slices, per) = ctx.slicing(count);
    let all = 0..count;
    for j in 0..slices {
        ctx.check()?;
        let s = slice(&all, per, j);
        let mut srcs = [Loc::send(0, 0); MAX_WORLD_SIZE];
        for (p, loc) in srcs.iter_mut().enumerate().take(n) {
            *loc = Loc::send(p, r * count + s.start);
        }
        // SAFETY: send buffers are inputs no rank writes; this rank's recv buffer is
        // written by this rank only and read by no one; send and recv are distinct
        // buffers (a `&Buffer` and a `&mut Buffer` of the caller).
        unsafe { ctx.reduce(Loc::recv(r, s.start), &srcs[..n], s.len(), false, true) };
    }
    Ok(())
}

/// Rank `r` copies every rank's send buffer into its recv buffer, starting with its own
/// and going round the ring so that ranks spread their reads over different peers.
pub(crate) fn all_gather(ctx: &Ctx<'_>) -> Result<(), Stop> {
    let (n, r, count) = (ctx.world(), ctx.rank(), ctx.send_len());
    let (slices, per) = ctx.slicing(count);
    let all = 0..count;
    for k in 0..n {
        let p = (r + k) % n;
        for j in 0..slices {
            ctx.check()?;
            let s = slice(&all, per, j);
            // SAFETY: as in reduce_scatter: inputs are never written, this rank's recv
            // buffer is touched by this rank only.
            unsafe {
                ctx.copy(
                    Loc::recv(r, p * count + s.start),
                    Loc::send(p, s.start),
                    s.len(),
                )
            };
        }
    }
    Ok(())
}

/// Every rank but the root copies the root's buffer. The root's buffer is only read.
pub(crate) fn broadcast(ctx: &Ctx<'_>) -> Result<(), Stop> {
    let (r, root, len) = (ctx.rank(), ctx.root(), ctx.recv_len());
    if r == root {
        return Ok(());
    }
    let (slices, per) = ctx.slicing(len);
    let all = 0..len;
    for j in 0..slices {
        ctx.check()?;
        let s = slice(&all, per, j);
        // SAFETY: the root never writes its buffer in a broadcast; this rank's buffer is
        // touched by this rank only; they are different ranks' buffers.
        unsafe { ctx.copy(Loc::recv(r, s.start), Loc::send(root, s.start), s.len()) };
    }
    Ok(())
}

/// The buffer is cut into `world` chunks; rank `p` reduces chunk `p` of every rank's buffer
/// (the root's first, then the others in rank order) straight into the root's buffer, so
/// the work is spread over all ranks. Non-root buffers are only read.
pub(crate) fn reduce(ctx: &Ctx<'_>) -> Result<(), Stop> {
    let (n, r, root, len) = (ctx.world(), ctx.rank(), ctx.root(), ctx.recv_len());
    let mine = chunk(len, n, r);
    let (slices, per) = ctx.slicing(mine.len());
    let mut srcs = [Loc::send(0, 0); MAX_WORLD_SIZE];
    for j in 0..slices {
        ctx.check()?;
        let s = slice(&mine, per, j);
        let mut k = 0;
        for p in (0..n).filter(|&p| p != root) {
            srcs[k] = Loc::send(p, s.start);
            k += 1;
        }
        // SAFETY: chunk `r` of the root's buffer is read and written by this rank only
        // (every rank works on its own chunk); the other ranks' buffers are only read in a
        // reduce; the destination (the root's buffer) is not among the sources.
        unsafe { ctx.reduce(Loc::recv(root, s.start), &srcs[..k], s.len(), true, true) };
    }
    Ok(())
}
