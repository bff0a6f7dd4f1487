//! Wrong models on purpose. An [`Ablation`] removes or distorts one part of the model, so
//! that the checks can show which of them each one would catch: a check suite that a model
//! without communication passes checks nothing (`docs/SCALING.md`, "Ablations").
//!
//! Schedules ([`crate::schedule::Schedule::ablated`]), the overlap simulation and the host
//! model each apply the ablations that concern them and ignore the others.

use crate::{Result, ScalingError};

/// A variant of the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Ablation {
    /// The model as it is.
    None,
    /// Communication costs nothing: every all-reduce takes zero time.
    NoComm,
    /// Every link, and this host's copy rates, twice as fast.
    DoubleBandwidth,
    /// No per-call and no per-step latency: all-reduces cost their bytes only.
    NoLatency,
    /// No overlap: every bucket is reduced after backward has finished.
    NoOverlap,
    /// The host model counts one copy per byte a rank sends (what it counted before it
    /// modelled the ring's memory traffic: reads `3(n-1)/n`, writes `2(n-1)/n`).
    SingleCopy,
    /// The host model lets every rank run on a core of its own, however many ranks there
    /// are (no time-slicing of more ranks than cores).
    NoCoreSharing,
}

impl Ablation {
    /// Every variant, the model itself first.
    pub const ALL: [Ablation; 7] = [
        Ablation::None,
        Ablation::NoComm,
        Ablation::DoubleBandwidth,
        Ablation::NoLatency,
        Ablation::NoOverlap,
        Ablation::SingleCopy,
        Ablation::NoCoreSharing,
    ];

    /// Every real ablation (all but [`Ablation::None`]).
    pub fn ablations() -> impl Iterator<Item = Ablation> {
        Ablation::ALL.into_iter().skip(1)
    }

    /// The name on the command line (`--ablate no-comm`).
    pub const fn name(self) -> &'static str {
        match self {
            Ablation::None => "none",
            Ablation::NoComm => "no-comm",
            Ablation::DoubleBandwidth => "double-bandwidth",
            Ablation::NoLatency => "no-latency",
            Ablation::NoOverlap => "no-overlap",
            Ablation::SingleCopy => "single-copy",
            Ablation::NoCoreSharing => "no-core-sharing",
        }
    }

    /// What the variant changes, in words.
    pub const fn description(self) -> &'static str {
        match self {
            Ablation::None => "the model as it is",
            Ablation::NoComm => "communication costs zero",
            Ablation::DoubleBandwidth => "every link and copy rate twice as fast",
            Ablation::NoLatency => "no per-call or per-step latency",
            Ablation::NoOverlap => "buckets reduced only after backward ends",
            Ablation::SingleCopy => "host: one copy per byte sent, not the ring's traffic",
            Ablation::NoCoreSharing => "host: every rank has a core of its own",
        }
    }

    /// The variant named `name`.
    pub fn parse(name: &str) -> Result<Ablation> {
        Ablation::ALL
            .into_iter()
            .find(|a| a.name() == name)
            .ok_or_else(|| ScalingError::UnknownAblation {
                name: name.to_string(),
                known: Ablation::ALL.map(Ablation::name).join(", "),
            })
    }

    /// The factor every bandwidth is multiplied by.
    pub fn bandwidth_factor(self) -> f64 {
        if self == Ablation::DoubleBandwidth {
            2.0
        } else {
            1.0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_ones_list_the_known() {
        for a in Ablation::ALL {
            assert_eq!(Ablation::parse(a.name()).unwrap(), a);
        }
        assert_eq!(Ablation::ablations().count(), Ablation::ALL.len() - 1);
        assert!(Ablation::ablations().all(|a| a != Ablation::None));
        let e = Ablation::parse("half-bandwidth").unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown ablation `half-bandwidth`; known: none, no-comm, double-bandwidth, \
             no-latency, no-overlap, single-copy, no-core-sharing"
        );
        assert_eq!(Ablation::DoubleBandwidth.bandwidth_factor(), 2.0);
        assert_eq!(Ablation::NoComm.bandwidth_factor(), 1.0);
    }
}
