const WORD_BITS: u32 = 32;
const MIN_RANGE: u64 = 1 << WORD_BITS;

/// Range decoder over little-endian 32-bit words; see the invariants in [`crate::coder`].
#[derive(Debug, Clone)]
pub struct RangeDecoder<'a> {
    /// Offset of the coded point from the bottom of the current interval.
    point: u64,
    range: u64,
    /// `range >> precision` of the symbol being decoded, kept from `peek` for `consume`.
    scale: u64,
    input: &'a [u8],
    /// Next byte to read; may run past `input.len()` (reads there give zero words).
    pos: usize,
}

impl<'a> RangeDecoder<'a> {
    pub fn new(input: &'a [u8]) -> Self {
        let mut dec = RangeDecoder { point: 0, range: u64::MAX, scale: 1, input, pos: 0 };
        let hi = dec.next_word() as u64;
        let lo = dec.next_word() as u64;
        dec.point = (hi << WORD_BITS) | lo;
        dec
    }

    #[inline(always)]
    fn next_word(&mut self) -> u32 {
        let word = match self.input.get(self.pos..self.pos + 4) {
            Some(b) => u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            None => 0,
        };
        self.pos = self.pos.saturating_add(4);
        word
    }

    /// The slot `q` in `[0, 2^precision)` that the next symbol covers.
    #[inline(always)]
    pub fn peek(&mut self, precision: u32) -> u32 {
        let scale = self.range >> precision;
        self.scale = scale;
        // One integer division per symbol (invariant 2); clamped so that a corrupt point
        // cannot select a slot beyond the table.
        (self.point / scale).min((1u64 << precision) - 1) as u32
    }

    /// Removes the symbol `[cum, cum + freq)` found from the last `peek`.
    #[inline(always)]
    pub fn consume(&mut self, cum: u32, freq: u32) {
        self.point = self.point.wrapping_sub(self.scale * cum as u64);
        self.range = self.scale.wrapping_mul(freq as u64).max(1);
        if self.range < MIN_RANGE {
            self.point = (self.point << WORD_BITS) | self.next_word() as u64;
            self.range <<= WORD_BITS;
        }
    }

    /// Decodes `nbits` (<= 32) uniform raw bits, the inverse of `SymbolSink::put_bits`.
    #[inline(always)]
    pub fn get_bits(&mut self, nbits: u32) -> u32 {
        match nbits {
            0 => 0,
            1..=16 => self.get_bits_16(nbits),
            _ => {
                let hi = self.get_bits_16(nbits - 16);
                (hi << 16) | self.get_bits_16(16)
            }
        }
    }

    #[inline(always)]
    fn get_bits_16(&mut self, nbits: u32) -> u32 {
        let v = self.peek(nbits);
        self.consume(v, 1);
        v
    }

    /// True when the decoder read exactly the words the encoder wrote: a correct stream is
    /// consumed up to one implicit zero word past its end (invariant 5), and has no tail.
    pub fn finished_cleanly(&self) -> bool {
        self.input.len() % 4 == 0 && self.pos == self.input.len() + 4
    }
}
