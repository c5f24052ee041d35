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
        let word = self.peek_word();
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
    ///
    /// Whether a word is shifted in depends on the data (about every fifth symbol at six bits
    /// each), so it is done without a branch: the next word is always read, and kept or not by
    /// a select. A mispredicted jump here would throw away the other lanes' work in flight.
    #[inline(always)]
    pub fn consume(&mut self, cum: u32, freq: u32) {
        let point = self.point.wrapping_sub(self.scale * cum as u64);
        let range = self.scale.wrapping_mul(freq as u64).max(1);
        // Shifts and masks rather than `if`, which the compiler would turn back into a jump.
        let refill = (range < MIN_RANGE) as u64;
        let shift = refill as u32 * WORD_BITS;
        let word = self.peek_word() as u64 & 0u64.wrapping_sub(refill);
        self.point = (point << shift) | word;
        self.range = range << shift;
        self.pos = self.pos.saturating_add(4 * refill as usize);
    }

    /// The word at `pos` without advancing: zero past the end (invariant 5); a short last
    /// word (`RangeEncoder::finish`) holds the word's high bytes, its low bytes being zero.
    #[inline(always)]
    fn peek_word(&self) -> u32 {
        match self.input.get(self.pos..self.pos + 4) {
            Some(b) => u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            None => self.short_word(),
        }
    }

    #[cold]
    fn short_word(&self) -> u32 {
        let rest = self.input.get(self.pos..).unwrap_or(&[]);
        let mut word = [0u8; 4];
        word[4 - rest.len().min(3)..].copy_from_slice(&rest[..rest.len().min(3)]);
        u32::from_le_bytes(word)
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

    /// `(point, range, scale, pos)`: the state a vectorised decoder keeps in registers for
    /// a run of symbols (`exact::avx512`), handed back with `set_state`.
    #[inline(always)]
    pub(crate) fn state(&self) -> (u64, u64, u64, u64) {
        (self.point, self.range, self.scale, self.pos as u64)
    }

    #[inline(always)]
    pub(crate) fn set_state(&mut self, point: u64, range: u64, scale: u64, pos: u64) {
        (self.point, self.range, self.scale, self.pos) = (point, range, scale, pos as usize);
    }

    /// The coded bytes this decoder reads.
    pub(crate) fn input(&self) -> &'a [u8] {
        self.input
    }

    /// The word at byte `pos` as `consume` would read it there (short or zero at the end).
    pub(crate) fn word_at(&self, pos: u64) -> u32 {
        RangeDecoder { pos: pos as usize, ..self.clone() }.peek_word()
    }

    /// True when the decoder read exactly the words the encoder wrote: a correct stream is
    /// consumed up to one implicit zero word past its end (invariant 5; a short last word
    /// counts as a whole one), and has no tail.
    pub fn finished_cleanly(&self) -> bool {
        self.pos == self.input.len().div_ceil(4) * 4 + 4
    }
}
