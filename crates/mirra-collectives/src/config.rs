//! A group's settings ([`Config`]) and the `MIRRA_*` variables they come from.

use std::time::Duration;

/// Default deadline of one collective (`MIRRA_COLLECTIVE_TIMEOUT_MS`).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// Default pipelining unit of every schedule (`MIRRA_SLICE_BYTES`).
pub const DEFAULT_SLICE_BYTES: usize = 256 << 10;
/// Default spin before a waiting rank starts yielding its core (`MIRRA_SPIN_US`): none
/// beyond the first batch of 8 `spin_loop` hints (a fraction of a microsecond), which
/// catches a peer that is running on another core.
///
/// Measured on the 2-core development machine (`docs/COLLECTIVES.md`): with as many ranks
/// as cores, any spin from 0 to 100 us gives the same 4 KiB all-reduce time (under 1 us at
/// 2 ranks); with more ranks than cores, every microsecond of spin is a microsecond the
/// peer we wait for cannot run, and the 4 KiB all-reduce at 4 ranks goes from about 20 us
/// (no spin) to 35 us (2 us), 95 us (10 us) and 160 us (20 us).
pub const DEFAULT_SPIN: Duration = Duration::ZERO;
/// Default time a waiting rank yields before it parks (`MIRRA_PARK_US`).
///
/// Waking a parked thread from the other core costs 0.1-0.8 ms on this machine kind
/// (`shared/design/MEASURED.md`), so parking pays only for waits longer than that; yielding
/// until then keeps the wake-up cost off short waits while other runnable threads (other
/// ranks, compute) still get the core. The small-message times above do not change between
/// 200 us and 5 ms.
pub const DEFAULT_PARK_AFTER: Duration = Duration::from_micros(500);
/// Default size up to which an all-reduce of `direct` is posted eagerly and run in one
/// shot (`MIRRA_EAGER_BYTES`: see [`Config::eager_bytes`]) when every rank can have a core.
///
/// Measured on the 2-core development machine (`docs/COLLECTIVES.md`): with a core per
/// rank a synchronisation is one cache-line transfer, and the one-shot schedule's extra
/// reads cost more than the two it saves from 1 KiB up (at 2 ranks, 4 KiB: 1.32 us one
/// shot, 0.77 us two); at 256 bytes one shot is 12% faster.
pub const DEFAULT_EAGER_BYTES: usize = 512;
/// Default eager size when the group has more ranks than the process has cores: then a
/// waiting rank yields its core, every synchronisation costs context switches, and one
/// shot wins up to a few KiB (4 ranks on 2 cores: 8.1 against 9.9 us at 4 KiB, 16.6
/// against 12.2 us at 16 KiB).
pub const DEFAULT_EAGER_BYTES_OVERSUBSCRIBED: usize = 8 << 10;
/// Largest accepted eager size: every rank keeps two copies of it.
pub const MAX_EAGER_BYTES: usize = 1 << 20;
/// Smallest accepted slice: smaller slices only add synchronisation.
pub const MIN_SLICE_BYTES: usize = 512;

/// Settings of a communicator group.
///
/// `Config::default()` reads the `MIRRA_*` environment variables listed on each field and
/// falls back to the documented defaults; the `with_*` methods override one field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Deadline of every collective, from its start (`MIRRA_COLLECTIVE_TIMEOUT_MS`, default
    /// 60 s). A rank that waits longer fails with
    /// [`CollectiveError::Timeout`](crate::CollectiveError::Timeout) and aborts the group.
    pub timeout: Duration,
    /// Pipelining unit in bytes (`MIRRA_SLICE_BYTES`, default 256 KiB; the variable and
    /// [`with_slice_bytes`](Config::with_slice_bytes) keep it at least 512): every schedule
    /// hands data on in slices of this size (at least one element each) so that large
    /// buffers stream through the ranks, and every rank checks for an abort between slices.
    /// Set directly, the field takes any size; the conformance tests cut small buffers
    /// into many slices that way.
    pub slice_bytes: usize,
    /// How long a waiting rank spins before it yields its core (`MIRRA_SPIN_US`).
    pub spin: Duration,
    /// Largest message that `direct` all-reduces in one shot (`MIRRA_EAGER_BYTES`, at most
    /// [`MAX_EAGER_BYTES`]; 0 turns it off): each rank posts a copy of its input into
    /// memory of the group, then reduces every rank's copy into its own buffer. One
    /// synchronisation instead of three (no one touches another rank's buffer, so no rank
    /// waits for the others to finish), for `n` times the reads. `None` (the default):
    /// [`DEFAULT_EAGER_BYTES`], or [`DEFAULT_EAGER_BYTES_OVERSUBSCRIBED`] for a group with
    /// more ranks than the process has cores.
    pub eager_bytes: Option<usize>,
    /// How long a waiting rank yields before it parks (`MIRRA_PARK_US`), counted from the
    /// start of the wait.
    pub park_after: Duration,
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok()?.trim().parse().ok()
}

impl Config {
    /// The defaults, with every `MIRRA_*` variable that is set and parses taking precedence.
    pub fn from_env() -> Config {
        Config {
            timeout: env_u64("MIRRA_COLLECTIVE_TIMEOUT_MS")
                .map(Duration::from_millis)
                .unwrap_or(DEFAULT_TIMEOUT),
            slice_bytes: env_u64("MIRRA_SLICE_BYTES")
                .and_then(|b| usize::try_from(b).ok())
                .unwrap_or(DEFAULT_SLICE_BYTES)
                .max(MIN_SLICE_BYTES),
            spin: env_u64("MIRRA_SPIN_US")
                .map(Duration::from_micros)
                .unwrap_or(DEFAULT_SPIN),
            eager_bytes: env_u64("MIRRA_EAGER_BYTES")
                .and_then(|b| usize::try_from(b).ok())
                .map(|b| b.min(MAX_EAGER_BYTES)),
            park_after: env_u64("MIRRA_PARK_US")
                .map(Duration::from_micros)
                .unwrap_or(DEFAULT_PARK_AFTER),
        }
    }

    /// This config with another deadline.
    pub fn with_timeout(mut self, timeout: Duration) -> Config {
        self.timeout = timeout;
        self
    }

    /// This config with another slice size (at least [`MIN_SLICE_BYTES`]).
    pub fn with_slice_bytes(mut self, slice_bytes: usize) -> Config {
        self.slice_bytes = slice_bytes.max(MIN_SLICE_BYTES);
        self
    }

    /// This config with another spin before yielding.
    pub fn with_spin(mut self, spin: Duration) -> Config {
        self.spin = spin;
        self
    }

    /// This config with another eager size (at most [`MAX_EAGER_BYTES`]; 0: never eager).
    pub fn with_eager_bytes(mut self, eager_bytes: usize) -> Config {
        self.eager_bytes = Some(eager_bytes.min(MAX_EAGER_BYTES));
        self
    }

    /// The eager size of a group of `world` ranks (see [`Config::eager_bytes`]).
    pub fn eager_bytes_for(&self, world: usize) -> usize {
        self.eager_bytes.unwrap_or_else(|| {
            let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
            if world > cores {
                DEFAULT_EAGER_BYTES_OVERSUBSCRIBED
            } else {
                DEFAULT_EAGER_BYTES
            }
        })
    }

    /// This config with another time before parking.
    pub fn with_park_after(mut self, park_after: Duration) -> Config {
        self.park_after = park_after;
        self
    }
}

impl Default for Config {
    fn default() -> Config {
        Config::from_env()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eager_size_follows_oversubscription_unless_set() {
        let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
        let auto = Config {
            eager_bytes: None,
            ..Config::default()
        };
        assert_eq!(auto.eager_bytes_for(1), DEFAULT_EAGER_BYTES);
        assert_eq!(auto.eager_bytes_for(cores), DEFAULT_EAGER_BYTES);
        assert_eq!(
            auto.eager_bytes_for(cores + 1),
            DEFAULT_EAGER_BYTES_OVERSUBSCRIBED
        );
        let set = auto.clone().with_eager_bytes(100);
        assert_eq!(set.eager_bytes_for(cores + 1), 100);
        let capped = auto.with_eager_bytes(usize::MAX);
        assert_eq!(capped.eager_bytes_for(2), MAX_EAGER_BYTES);
    }
}
