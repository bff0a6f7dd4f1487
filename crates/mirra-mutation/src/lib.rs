//! Test support for file readers under mutation (a dev-dependency, never a library
//! dependency): real files flipped, truncated and extended at random by proptest, and
//! each damaged file read on its own thread, which must give one error line naming the
//! file or exactly the contents the file holds, within a time bound (no hang), without a
//! panic, and allocating at most the size the file declares (capped by what its format
//! can hold) plus 1 MiB.
//!
//! - [`CountingAlloc`] counts the bytes each thread holds; a test binary installs it as
//!   its global allocator, and [`peak_during`] measures a closure's peak.
//! - [`Mutation`] and [`mutations`]: the damage, and proptest's strategy for it.
//! - [`check_reader`] runs the cases against a reader and an oracle (an [`Expectation`]
//!   per damaged file); [`cases_from_env`] reads `MIRRA_MUTATION_CASES`.
//!
//! - [`fixtures`]: files as their formats' writers lay them out (`.npy`).
//!
//! The layers: `alloc` and `mutate` know nothing of each other; `check` uses both;
//! `fixtures` stands alone.

mod alloc;
mod check;
pub mod fixtures;
mod mutate;

pub use alloc::{peak_during, CountingAlloc};
pub use check::{cases_from_env, check_reader, Config, Expectation, Stats, CASES_VAR};
pub use mutate::{apply, mutations, Mutation};
