//! The collectives, by name: what errors and benchmark tables call them.

use std::fmt;

/// The collectives, as named in errors and benchmark tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Collective {
    /// Every rank ends with the reduction of all ranks' buffers.
    AllReduce,
    /// Rank `r` ends with chunk `r` of the reduction.
    ReduceScatter,
    /// Every rank ends with all ranks' buffers, in rank order.
    AllGather,
    /// Every rank ends with the root's buffer.
    Broadcast,
    /// The root ends with the reduction of all ranks' buffers.
    Reduce,
    /// No rank leaves before every rank has arrived.
    Barrier,
}

impl Collective {
    /// Every collective.
    pub const ALL: [Collective; 6] = [
        Collective::AllReduce,
        Collective::ReduceScatter,
        Collective::AllGather,
        Collective::Broadcast,
        Collective::Reduce,
        Collective::Barrier,
    ];

    /// The snake-case name (`all_reduce`, ...).
    pub const fn as_str(self) -> &'static str {
        match self {
            Collective::AllReduce => "all_reduce",
            Collective::ReduceScatter => "reduce_scatter",
            Collective::AllGather => "all_gather",
            Collective::Broadcast => "broadcast",
            Collective::Reduce => "reduce",
            Collective::Barrier => "barrier",
        }
    }
}

impl fmt::Display for Collective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
