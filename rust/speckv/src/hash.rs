//! Checksums, fingerprints and digests: XXH3-64, the same on every platform. Used by the
//! container (chunk and header checksums), the prediction fingerprint and the table digests.

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

/// Whether `bytes` still have the checksum `stored`. Fuzz builds (`--cfg fuzzing`, which
/// cargo-fuzz sets; `fuzz/README.md`) accept any, so that the fuzzer reaches the parsers and
/// decoders behind the checksums: anyone can compute XXH3 for a forged stream, so those must
/// refuse bad bytes without the checksums' help.
pub fn matches(bytes: &[u8], stored: u64) -> bool {
    cfg!(fuzzing) || checksum(bytes) == stored
}
