//! The algorithms: each one a schedule over the shared transport
//! ([`Ctx`](crate::transport::Ctx)), NCCL style: topology arithmetic (neighbours, parents,
//! children, chunk boundaries) and the order of waits, reductions and copies, with no
//! knowledge of how ranks find each other, wait or fail. A new algorithm is one new module
//! implementing [`Algorithm`] and one line in [`by_name`].
//!
//! The modules stand in layers: [`slicing`] (chunk and slice boundaries) at the bottom,
//! then [`default_schedules`] (reduce-scatter, all-gather, broadcast and reduce, which every
//! backend uses unless it overrides them), then the [`Algorithm`] trait, then one module per
//! backend (`ring`, `tree`, `reduce_to_one`, `direct`), and this registry on top. Only
//! all-reduce differs between backends today.

pub(crate) mod algorithm;
pub(crate) mod default_schedules;
pub(crate) mod direct;
pub(crate) mod reduce_to_one;
pub(crate) mod ring;
pub(crate) mod slicing;
pub(crate) mod tree;

pub(crate) use algorithm::Algorithm;

/// The names [`cpu_group`](crate::cpu_group) accepts, in the order benchmarks list them.
pub const BACKENDS: &[&str] = &["ring", "tree", "reduce-to-one", "direct"];

/// The algorithm of a backend name.
pub(crate) fn by_name(name: &str) -> Option<&'static dyn Algorithm> {
    match name {
        "ring" => Some(&ring::Ring),
        "tree" => Some(&tree::DoubleBinaryTree),
        "reduce-to-one" => Some(&reduce_to_one::ReduceToOne),
        "direct" => Some(&direct::Direct),
        _ => None,
    }
}
