//! Decodes one chunk of the fast lane: the chunk parsed and checked, then the AVX-512 or AVX2
//! kernel where it runs, the portable loop elsewhere, the same output (F1-F5).

use crate::error::Result;
use crate::words::Word;

use super::*;

/// A parsed chunk, ready to decode.
pub(crate) struct Chunk<'a> {
    /// Every table's entries, `2^P` each, back to back (F1).
    pub(crate) lut: Vec<u32>,
    /// Offset into `lut` of channel `k`'s table, for `k < K + 16` (channel `k mod K`), so
    /// sixteen consecutive scalars read their offsets with one unaligned load.
    pub(crate) base: Vec<u32>,
    pub(crate) states: [u32; STATES],
    /// The words, two bytes each.
    pub(crate) words: &'a [u8],
}

impl Chunk<'_> {
    pub(crate) fn word(&self, i: usize) -> Option<u32> {
        let b = self.words.get(2 * i..2 * i + 2)?;
        Some(u16::from_le_bytes([b[0], b[1]]) as u32)
    }

    pub(crate) fn n_words(&self) -> usize {
        self.words.len() / 2
    }
}

/// Parses and validates a chunk of `scalars` scalars (F3; the layout in the module doc).
pub(crate) fn parse_chunk(bytes: &[u8], split: Split, period: usize, scalars: usize) -> Result<Chunk<'_>> {
    let mut r = bytes;
    let head = take(&mut r, 2)?;
    let g = head[0] as usize;
    if g == 0 || g > MAX_TABLES || head[1] != 0 {
        return Err(bad(format!("{g} tables (1..={MAX_TABLES}), reserved byte {}", head[1])));
    }
    let mut lut = Vec::with_capacity(g << split.precision);
    for _ in 0..g {
        Table::read(&mut r, split)?.entries(&mut lut);
    }
    let k = channels(period, scalars);
    let ids = take(&mut r, k.div_ceil(2))?;
    let mut base = Vec::with_capacity(k + 16);
    for c in 0..k + 16 {
        let c = c % k;
        let id = (ids[c / 2] >> (4 * (c % 2))) & 0xF;
        if id as usize >= g {
            return Err(bad(format!("channel {c} uses table {id} of {g}")));
        }
        base.push((id as u32) << split.precision);
    }
    if k % 2 == 1 && ids[k / 2] >> 4 != 0 {
        return Err(bad("the unused half of the last id byte is not zero"));
    }
    let mut states = [0u32; STATES];
    for s in states.iter_mut() {
        let b = take(&mut r, 4)?;
        *s = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        if *s < LOW {
            return Err(bad("a coder state below its range"));
        }
    }
    if !r.len().is_multiple_of(2) {
        return Err(bad("the words end in half a word"));
    }
    Ok(Chunk { lut, base, states, words: r })
}

/// Decodes scalars `from..out.len()` of a parsed chunk one at a time (F1, F2), from word
/// `pos`; returns the position after the last word read.
/// `split` is `split_of::<W>()`.
#[inline(always)]
pub(crate) fn decode_from<W: Word>(
    c: &mut Chunk,
    split: Split,
    out: &mut [W],
    from: usize,
    mut pos: usize,
) -> Result<usize> {
    let (r, b) = (split.raw_bits, split.slot_bits());
    let (slot_mask, raw_mask) = ((1u32 << b) - 1, (1u32 << r) - 1);
    let k = c.base.len() - 16;
    let mut channel = from % k;
    for (j, o) in out.iter_mut().enumerate().skip(from) {
        let s = c.states[j % STATES];
        let slot = s & slot_mask;
        let e = c.lut[(c.base[channel] + (slot >> r)) as usize];
        channel += 1;
        if channel == k {
            channel = 0;
        }
        *o = W::from_u32((e >> SYMBOL_SHIFT) << r | (slot & raw_mask));
        let next = ((e & ENTRY_MASK) + 1) * (s >> b) + ((e >> ENTRY_BITS) & ENTRY_MASK);
        // without a branch (the renormalisation is a coin flip a predictor would miss half
        // the time): past the last word it reads 0, and the position past the end fails the
        // call below, whatever was written to `out`
        let need = next < LOW;
        let word = c.word(pos).unwrap_or(0);
        c.states[j % STATES] = if need { next << 16 | word } else { next };
        pos += need as usize;
    }
    if pos > c.n_words() {
        return Err(bad("the words run out before the scalars"));
    }
    Ok(pos)
}

/// Whether the vector kernels run here.
pub(super) fn vector_kernel() -> bool {
    #[cfg(target_arch = "x86_64")]
    return avx512::enabled();
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Which kernel decodes the fast lane here: `"avx512"`, `"avx2"` or `"portable"` (same
/// output; `SPECKV_SIMD=avx2` stops at AVX2, `SPECKV_SIMD=0` forces the portable code).
pub fn kernel() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    if avx512::enabled() {
        return "avx512";
    } else if avx2::enabled() {
        return "avx2";
    }
    "portable"
}

/// Decodes one chunk into `out` (its scalars), checking F4.
pub fn decode_chunk<W: Word>(bytes: &[u8], period: usize, out: &mut [W]) -> Result<()> {
    let split = split_of::<W>()?;
    let mut c = parse_chunk(bytes, split, period, out.len())?;
    let (mut done, mut pos) = (0usize, 0usize);
    #[cfg(target_arch = "x86_64")]
    if avx512::enabled() {
        // SAFETY: `enabled` checked that this processor has AVX-512F.
        (done, pos) = unsafe { avx512::decode(&mut c, split, out) };
    } else if avx2::enabled() {
        // SAFETY: `enabled` checked that this processor has AVX2.
        (done, pos) = unsafe { avx2::decode(&mut c, split, out) };
    }
    let pos = decode_from(&mut c, split, out, done, pos)?;
    if pos != c.n_words() || c.states.iter().any(|&s| s != LOW) {
        return Err(bad("coded data does not end where its scalars do"));
    }
    Ok(())
}
