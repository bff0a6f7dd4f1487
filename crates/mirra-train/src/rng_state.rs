//! The state of the training's random generator (dropout), which checkpoints save.

use mirra_tensor::init::Rng;
use rand::SeedableRng;

/// Where a ChaCha8 generator stands: seed, stream and word position reconstruct it exactly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RngState {
    /// The 256-bit key.
    pub seed: [u8; 32],
    /// The stream (nonce).
    pub stream: u64,
    /// 32-bit words consumed from the stream.
    pub word_pos: u128,
}

impl RngState {
    /// The state of `rng`.
    pub fn of(rng: &Rng) -> RngState {
        RngState {
            seed: rng.get_seed(),
            stream: rng.get_stream(),
            word_pos: rng.get_word_pos(),
        }
    }

    /// A generator in this state.
    pub fn to_rng(&self) -> Rng {
        let mut rng = Rng::from_seed(self.seed);
        rng.set_stream(self.stream);
        rng.set_word_pos(self.word_pos);
        rng
    }
}
