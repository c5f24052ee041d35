use super::{SymbolSink, MAX_PRECISION};

const WORD_BITS: u32 = 32;
const MIN_RANGE: u64 = 1 << WORD_BITS;

/// Range encoder; see the invariants in [`crate::coder`].
#[derive(Debug, Clone)]
pub struct RangeEncoder {
    low: u64,
    range: u64,
    words: Vec<u32>,
}

impl Default for RangeEncoder {
    fn default() -> Self {
        Self::new()
    }
}

impl RangeEncoder {
    pub fn new() -> Self {
        RangeEncoder { low: 0, range: u64::MAX, words: Vec::new() }
    }

    pub fn with_capacity_words(words: usize) -> Self {
        RangeEncoder { low: 0, range: u64::MAX, words: Vec::with_capacity(words) }
    }

    /// `(low, range)`: the state a vectorised encoder (`exact::avx512`) keeps in registers
    /// for a run of symbols, handed back with `set_state`.
    #[inline(always)]
    pub(crate) fn state(&self) -> (u64, u64) {
        (self.low, self.range)
    }

    #[inline(always)]
    pub(crate) fn set_state(&mut self, low: u64, range: u64) {
        (self.low, self.range) = (low, range);
    }

    /// Appends a word the vectorised `put` flushed.
    #[inline(always)]
    pub(crate) fn push_word(&mut self, word: u32) {
        self.words.push(word);
    }

    /// Invariant 3: ripple a carry into the words already written.
    #[cold]
    pub(crate) fn propagate_carry(&mut self) {
        for word in self.words.iter_mut().rev() {
            let (sum, overflow) = word.overflowing_add(1);
            *word = sum;
            if !overflow {
                return;
            }
        }
        debug_assert!(false, "carry past the first word contradicts invariant 3");
    }

    #[inline(always)]
    fn add_to_low(&mut self, amount: u64) {
        let (low, carry) = self.low.overflowing_add(amount);
        self.low = low;
        if carry {
            self.propagate_carry();
        }
    }

    /// Terminates the stream (invariant 5) and returns its bytes, little-endian words, the
    /// last one possibly short.
    ///
    /// The final point is the one in the final interval with the most trailing zero bits, and
    /// as many of its final word's low bytes as are zero (up to three) are left out: the
    /// decoder reads a short last word as its high bytes (`RangeDecoder`). The interval spans
    /// at least 2^32 (invariant 1), so the low word is zero anyway, and typically a byte or
    /// two of the final word is too. (Version 1 wrote the smallest point whose low 32 bits are
    /// zero, its final word whole; decoders read both.)
    pub fn finish(mut self) -> Vec<u8> {
        let (low, end) = (self.low as u128, self.low as u128 + self.range as u128);
        let mut zeros = WORD_BITS;
        while zeros < 63 && ((low + (1u128 << (zeros + 1)) - 1) & !((1u128 << (zeros + 1)) - 1)) < end {
            zeros += 1;
        }
        let round_up = (1u64 << zeros) - 1;
        self.add_to_low(round_up);
        self.low &= !round_up;
        self.words.push((self.low >> WORD_BITS) as u32);
        let mut bytes = Vec::with_capacity(self.words.len() * 4);
        for w in &self.words {
            bytes.extend_from_slice(&w.to_le_bytes());
        }
        let skip = ((zeros - WORD_BITS) / 8).min(3) as usize;
        // The final word's low bytes come first in little-endian order: drop them from its
        // place, keeping its high bytes at the end of the stream.
        let last = bytes.len() - 4;
        bytes.drain(last..last + skip);
        bytes
    }
}

impl SymbolSink for RangeEncoder {
    fn as_range_encoder(&mut self) -> Option<&mut RangeEncoder> {
        Some(self)
    }

    #[inline(always)]
    fn put(&mut self, cum: u32, freq: u32, precision: u32) {
        debug_assert!(precision <= MAX_PRECISION);
        debug_assert!(freq > 0 && cum as u64 + freq as u64 <= 1u64 << precision);
        let r = self.range >> precision;
        self.add_to_low(r * cum as u64);
        self.range = r * freq as u64;
        if self.range < MIN_RANGE {
            self.words.push((self.low >> WORD_BITS) as u32);
            self.low <<= WORD_BITS;
            self.range <<= WORD_BITS;
        }
    }
}
