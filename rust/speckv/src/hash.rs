//! Checksums, fingerprints and digests: XXH3-64, the same on every platform. Used by the
//! container (chunk and header checksums), the prediction fingerprint and the table digests;
//! and the plain bytes those fingerprints hash (`plain_bytes`).

/// Streaming XXH3-64.
pub struct Hasher(xxhash_rust::xxh3::Xxh3);

impl Default for Hasher {
    fn default() -> Self {
        Self::new()
    }
}

impl Hasher {
    pub fn new() -> Hasher {
        Hasher(xxhash_rust::xxh3::Xxh3::new())
    }

    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    pub fn finish(&self) -> u64 {
        self.0.digest()
    }
}

/// One-shot XXH3-64 of a byte string.
pub fn checksum(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}

/// XXH3-64 of `bytes` seeded with the XXH3-64 of `key`: the checksum of a store entry
/// (`speckv.store`'s entry version 3), which reads wrong under any other key as well as when
/// damaged. About as fast as reading the bytes, so a restore does not pay for it (the BLAKE2b
/// of version 2 cost more than decoding a fast-lane block).
pub fn keyed_checksum(key: &[u8], bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(bytes, checksum(key))
}

/// Whether `bytes` still have the checksum `stored`. Fuzz builds (`--cfg fuzzing`, which
/// cargo-fuzz sets; `fuzz/README.md`) accept any, so that the fuzzer reaches the parsers and
/// decoders behind the checksums: anyone can compute XXH3 for a forged stream, so those must
/// refuse bad bytes without the checksums' help.
pub fn matches(bytes: &[u8], stored: u64) -> bool {
    cfg!(fuzzing) || checksum(bytes) == stored
}

/// Number types whose every byte is initialised and which have no padding.
pub(crate) trait Plain: Copy {}
impl Plain for f32 {}
impl Plain for i16 {}

/// The bytes of a slice of plain numbers in memory order, which is little-endian: the crate
/// refuses to build for big-endian targets (see `lib.rs`), so fingerprints agree across
/// machines.
pub(crate) fn plain_bytes<T: Plain>(values: &[T]) -> &[u8] {
    // SAFETY:
    // - `values` is a valid slice of `T: Plain`: every byte is initialised, with no padding;
    // - `u8` has alignment 1 and the byte length is the slice's own size;
    // - the result borrows `values`, so it cannot outlive it.
    unsafe { std::slice::from_raw_parts(values.as_ptr() as *const u8, std::mem::size_of_val(values)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Golden words: an entry's checksum must never change, or every stored entry reads as
    /// damaged (computed once with the `xxhash` Python package: `xxh3_64(b"payload",
    /// seed=xxh3_64(b"00112233445566778899aabbccddeeff"))`).
    #[test]
    fn keyed_checksum_is_pinned_and_depends_on_the_key() {
        let key = b"00112233445566778899aabbccddeeff";
        const GOLDEN: u64 = 0x9e2b_5ef8_c8e2_a9b2;
        assert_eq!(keyed_checksum(key, b"payload"), GOLDEN);
        assert_ne!(keyed_checksum(b"00112233445566778899aabbccddeefe", b"payload"), GOLDEN);
        assert_ne!(keyed_checksum(key, b"paylobd"), GOLDEN);
        assert_eq!(keyed_checksum(key, b""), xxhash_rust::xxh3::xxh3_64_with_seed(b"", checksum(key)));
    }
}
