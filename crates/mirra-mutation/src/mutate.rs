//! The damage done to a file: bytes flipped, the file cut short, garbage or a copy of
//! part of the file appended; and proptest's strategy that draws it, biased towards the
//! headers and trailers where formats keep their sizes and checksums.

use proptest::prelude::*;

/// One change to a file's bytes. Positions are taken modulo the length of the bytes the
/// change applies to, so that a sequence of changes always applies.
#[derive(Clone, Debug)]
pub enum Mutation {
    /// The byte at `at` XOR-ed with `mask` (never 0, so the byte changes).
    Flip {
        /// Where.
        at: usize,
        /// The bits flipped.
        mask: u8,
    },
    /// The bytes cut to their first `len`.
    Truncate {
        /// Bytes kept.
        len: usize,
    },
    /// `garbage` appended.
    Extend {
        /// The bytes appended.
        garbage: Vec<u8>,
    },
    /// `len` bytes from `from` appended again (a second copy of a record or member).
    AppendCopy {
        /// Where the copy starts.
        from: usize,
        /// How many bytes it takes at most.
        len: usize,
    },
}

/// `original` with `mutations` applied in order.
pub fn apply(original: &[u8], mutations: &[Mutation]) -> Vec<u8> {
    let mut bytes = original.to_vec();
    for m in mutations {
        match m {
            Mutation::Flip { at, mask } => {
                if !bytes.is_empty() {
                    let at = at % bytes.len();
                    bytes[at] ^= mask;
                }
            }
            Mutation::Truncate { len } => bytes.truncate(len % (bytes.len() + 1)),
            Mutation::Extend { garbage } => bytes.extend_from_slice(garbage),
            Mutation::AppendCopy { from, len } => {
                if !bytes.is_empty() {
                    let from = from % bytes.len();
                    let end = from + len.min(&(bytes.len() - from));
                    bytes.extend_from_within(from..end);
                }
            }
        }
    }
    bytes
}

/// Positions in a file of `len` bytes: anywhere, half the time; else in the first 64
/// bytes (headers) or the last 16 (trailers).
fn position(len: usize) -> BoxedStrategy<usize> {
    let len = len.max(1);
    prop_oneof![
        2 => 0..len,
        1 => 0..len.min(64),
        1 => len.saturating_sub(16)..len,
    ]
    .boxed()
}

/// One to three [`Mutation`]s of a file of `len` bytes.
pub fn mutations(len: usize) -> impl Strategy<Value = Vec<Mutation>> {
    let one = prop_oneof![
        4 => (position(len), 1..=255u8).prop_map(|(at, mask)| Mutation::Flip { at, mask }),
        2 => position(len).prop_map(|len| Mutation::Truncate { len }),
        1 => proptest::collection::vec(any::<u8>(), 1..64)
            .prop_map(|garbage| Mutation::Extend { garbage }),
        1 => (position(len), 1..4096usize).prop_map(|(from, len)| Mutation::AppendCopy { from, len }),
    ];
    proptest::collection::vec(one, 1..=3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_mutation_changes_the_bytes_as_it_says() {
        let original = [1u8, 2, 3, 4];
        assert_eq!(
            apply(&original, &[Mutation::Flip { at: 5, mask: 0x10 }]),
            [1, 0x12, 3, 4]
        );
        assert_eq!(apply(&original, &[Mutation::Truncate { len: 2 }]), [1, 2]);
        assert_eq!(
            apply(&original, &[Mutation::Extend { garbage: vec![9] }]),
            [1, 2, 3, 4, 9]
        );
        assert_eq!(
            apply(&original, &[Mutation::AppendCopy { from: 2, len: 9 }]),
            [1, 2, 3, 4, 3, 4]
        );
        // In order, each on the result of the last.
        assert_eq!(
            apply(
                &original,
                &[
                    Mutation::Truncate { len: 1 },
                    Mutation::Flip { at: 3, mask: 1 }
                ]
            ),
            [0]
        );
        assert_eq!(
            apply(&[], &[Mutation::Flip { at: 3, mask: 1 }]),
            [] as [u8; 0]
        );
    }

    proptest! {
        #[test]
        fn every_drawn_mutation_changes_the_file(ms in mutations(100)) {
            // A flip never has mask 0, a truncation keeps fewer bytes, an extension adds.
            // The file's bytes are all different (0, 1, ..., 99), so copies of its own
            // bytes appended after a cut cannot restore it: a file cut to `l` bytes holds
            // only values below `l`, and its byte `l` was `l`. (A file of one repeated
            // byte can be restored so: cut to 94, 6 bytes copied back. CI drew that case.)
            // Only a flip undone by another flip, or garbage that happens to be the bytes
            // a cut removed, gives the file back.
            let original: Vec<u8> = (0..100).collect();
            let flips = ms.iter().filter(|m| matches!(m, Mutation::Flip { .. })).count();
            let cut_then_extended = ms
                .iter()
                .skip_while(|m| !matches!(m, Mutation::Truncate { .. }))
                .any(|m| matches!(m, Mutation::Extend { .. }));
            let out = apply(&original, &ms);
            prop_assert!(out != original || flips > 1 || cut_then_extended);
        }
    }
}
