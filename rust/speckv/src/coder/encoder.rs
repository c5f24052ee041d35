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

    /// Invariant 3: ripple a carry into the words already written.
    #[cold]
    fn propagate_carry(&mut self) {
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

    /// Terminates the stream (invariant 5) and returns its bytes, little-endian words.
    pub fn finish(mut self) -> Vec<u8> {
        let round_up = (1u64 << WORD_BITS) - 1;
        self.add_to_low(round_up);
        self.words.push((self.low >> WORD_BITS) as u32);
        let mut bytes = Vec::with_capacity(self.words.len() * 4);
        for w in &self.words {
            bytes.extend_from_slice(&w.to_le_bytes());
        }
        bytes
    }
}

impl SymbolSink for RangeEncoder {
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
