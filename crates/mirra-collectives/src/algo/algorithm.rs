//! What an algorithm is: its schedules of the collectives, run inside a data phase.

use crate::algo::default_schedules;
use crate::transport::{Ctx, Desc, Stop};

/// One algorithm's schedules. Each runs inside a data phase: every rank has posted its
/// buffers, the metadata agrees across ranks, and no buffer is freed before every rank has
/// left the phase. A schedule returns `Err` only from a wait or an abort check.
pub(crate) trait Algorithm: Sync {
    /// The backend name.
    fn name(&self) -> &'static str;

    /// Whether this rank should post `desc` eagerly (its input copied into the group's
    /// memory: see [`Ctx::is_eager`]), in a group of `world` ranks that posts up to
    /// `eager_bytes` so. Every rank must answer the same for the same collective. A
    /// schedule run eagerly may write no peer's output.
    fn eager(&self, _desc: &Desc, _world: usize, _eager_bytes: usize) -> bool {
        false
    }

    /// In-place all-reduce of every rank's buffer (`recv_len` elements).
    fn all_reduce(&self, ctx: &Ctx<'_>) -> Result<(), Stop>;

    /// Reduce-scatter: send has `world x count`, recv `count` elements.
    fn reduce_scatter(&self, ctx: &Ctx<'_>) -> Result<(), Stop> {
        default_schedules::reduce_scatter(ctx)
    }

    /// All-gather: recv has `world x count`, send `count` elements.
    fn all_gather(&self, ctx: &Ctx<'_>) -> Result<(), Stop> {
        default_schedules::all_gather(ctx)
    }

    /// In-place broadcast from `ctx.root()`.
    fn broadcast(&self, ctx: &Ctx<'_>) -> Result<(), Stop> {
        default_schedules::broadcast(ctx)
    }

    /// In-place reduce to `ctx.root()`.
    fn reduce(&self, ctx: &Ctx<'_>) -> Result<(), Stop> {
        default_schedules::reduce(ctx)
    }
}
