//! Word-oriented range coder with power-of-two totals.
//!
//! # Invariants (referred to by number elsewhere)
//!
//! The coder works on an interval `[low, low + range)` of an infinitely long binary fraction, of
//! which the words already written are the leading digits (base 2^32).
//!
//! 1. **Normalised range.** Between symbols `2^32 <= range <= 2^64 - 1`. A symbol of
//!    precision `p <= MAX_PRECISION` scales by `r = range >> p >= 2^(32 - p) >= 2^8`, so the new
//!    range `r * freq` is at least 1 and one shift by 32 bits restores invariant 1.
//! 2. **No division when encoding.** Totals are powers of two, so `range / total` is a shift.
//!    The decoder needs one integer division per symbol (`point / r`) to find the slot.
//! 3. **Carries.** `low` is the unwritten tail. When `low + r * cum` overflows 64 bits the carry
//!    belongs to the words already written; it is added to the last word and ripples back
//!    through words equal to `u32::MAX`. It never ripples past the first word, because the
//!    interval always stays inside the one we started with, `[0, 2^64 - 1)`.
//! 4. **Truncation loss.** Slots `[r * 2^p, range)` are never used. Since `range >= 2^32` and
//!    `p <= 24` this wastes less than `2^-8` of the range in the worst case and about `2^-24`
//!    on average, i.e. the coded size stays within a tiny fraction of the ideal.
//! 5. **Termination.** The encoder ends with one word: the top half of the point of the final
//!    interval with the most trailing zero bits (at least 32 exist by invariant 1), written
//!    without its zero low bytes (up to three of them). The decoder reads a short last word as
//!    its high bytes and zero words past the end, so it sees exactly that point. (Format
//!    version 1 wrote the smallest such point's top half, whole; it decodes the same way.)
//! 6. **Robustness.** The decoder uses wrapping arithmetic and never indexes by a value it
//!    decoded without bounds: garbage input decodes to garbage, never to a panic or a hang, and
//!    the chunk checksum (see `format`) reports it.

mod decoder;
mod encoder;

pub use decoder::RangeDecoder;
pub use encoder::RangeEncoder;

/// Largest `precision` a symbol may be coded with (see invariants 1 and 4).
pub const MAX_PRECISION: u32 = 24;

/// Something that takes coded symbols: the real encoder, or a meter of ideal code length.
/// Encoding logic is written once against this trait, so `ideal_bits` measures exactly the
/// model the encoder uses.
pub trait SymbolSink {
    /// Code the symbol occupying `[cum, cum + freq)` of a total of `2^precision`.
    fn put(&mut self, cum: u32, freq: u32, precision: u32);

    /// The sink as a range encoder, when it is one: vector kernels then keep its state in
    /// registers (`RangeEncoder::state`) instead of calling `put`.
    fn as_range_encoder(&mut self) -> Option<&mut RangeEncoder> {
        None
    }

    /// Code `nbits` (<= 32) raw bits uniformly.
    #[inline(always)]
    fn put_bits(&mut self, value: u32, nbits: u32) {
        match nbits {
            0 => {}
            1..=16 => self.put(value, 1, nbits),
            _ => {
                self.put(value >> 16, 1, nbits - 16);
                self.put(value & 0xFFFF, 1, 16);
            }
        }
    }
}

/// Adds up `-log2(freq / 2^precision)` of every symbol: the length the model asks for.
#[derive(Debug, Default, Clone)]
pub struct IdealMeter {
    pub bits: f64,
}

impl SymbolSink for IdealMeter {
    #[inline]
    fn put(&mut self, _cum: u32, freq: u32, precision: u32) {
        self.bits += precision as f64 - (freq as f64).log2();
    }
}

#[cfg(test)]
mod tests;
