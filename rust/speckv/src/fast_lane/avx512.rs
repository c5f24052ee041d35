//! The fast lane's decoder sixteen scalars at a time, with AVX-512F (x86-64).
//!
//! Each step decodes two vectors of sixteen states (scalars `j .. j + 32` of the chunk, F2):
//! one gather of table entries, a multiply, and a renormalisation that reads the words of the
//! lanes that need one with an expand (lane order, so the words are taken in scalar order as
//! the portable decoder takes them, F2). The caller finishes what is left with the portable
//! code, which checks every read; this kernel stops while a step's worst case (one word per
//! state) still fits the words.

use std::arch::x86_64::*;
use std::sync::OnceLock;

use super::{Chunk, Split, ENTRY_BITS, ENTRY_MASK, LOW, STATES, SYMBOL_SHIFT};
use crate::words::Word;

const WIDTH: usize = 16;

/// True when this processor has AVX-512F and `SPECKV_SIMD` is neither `0` nor `avx2`.
pub(crate) fn enabled() -> bool {
    static ENABLED: OnceLock<bool> = OnceLock::new();
    *ENABLED.get_or_init(|| {
        let wanted = std::env::var("SPECKV_SIMD").map_or(true, |v| !matches!(v.trim(), "0" | "avx2"));
        wanted && is_x86_feature_detected!("avx512f")
    })
}

/// Decodes whole steps of `STATES` scalars into `out` from the start of the chunk; returns the
/// scalars done and the words read.
///
/// # Safety
/// The processor must have AVX-512F (`enabled`).
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn decode<W: Word>(c: &mut Chunk, split: Split, out: &mut [W]) -> (usize, usize) {
    let k = c.base.len() - WIDTH;
    let n_words = c.n_words();
    let advance = STATES % k;
    let raw = _mm512_set1_epi32(split.raw_bits as i32);
    let slot = _mm512_set1_epi32(split.slot_bits() as i32);
    let index_mask = _mm512_set1_epi32(((1u32 << split.precision) - 1) as i32);
    let raw_mask = _mm512_set1_epi32(((1u32 << split.raw_bits) - 1) as i32);
    let entry_mask = _mm512_set1_epi32(ENTRY_MASK as i32);
    let one = _mm512_set1_epi32(1);
    let low = _mm512_set1_epi32(LOW as i32);
    let lut = c.lut.as_ptr() as *const i32;
    let base = c.base.as_ptr();
    let words = c.words.as_ptr();
    // SAFETY (all loads and stores below): `states` has STATES = 2 * WIDTH entries; `base`
    // has K + WIDTH entries and `off < K`; every gathered index is a table's offset (below
    // `lut.len()` minus 2^P, checked by `parse_chunk`) plus a slot below 2^P; the word load
    // reads 16 words at `pos`, and a step starts only while `pos + STATES <= n_words`; the
    // stores write 16 scalars at `j + WIDTH * g < steps * STATES <= out.len()`.
    let mut x = [
        _mm512_loadu_si512(c.states.as_ptr() as *const _),
        _mm512_loadu_si512(c.states.as_ptr().add(WIDTH) as *const _),
    ];
    let mut off = [0usize, WIDTH % k];
    let (mut pos, mut j) = (0usize, 0usize);
    while j + STATES <= out.len() && pos + STATES <= n_words {
        for g in 0..2 {
            let s = x[g];
            let tb = _mm512_loadu_si512(base.add(off[g]) as *const _);
            let idx = _mm512_add_epi32(_mm512_and_si512(_mm512_srlv_epi32(s, raw), index_mask), tb);
            let e = _mm512_i32gather_epi32::<4>(idx, lut);
            let f = _mm512_add_epi32(_mm512_and_si512(e, entry_mask), one);
            let rank = _mm512_and_si512(_mm512_srli_epi32::<ENTRY_BITS>(e), entry_mask);
            let value = _mm512_or_si512(
                _mm512_sllv_epi32(_mm512_srli_epi32::<SYMBOL_SHIFT>(e), raw),
                _mm512_and_si512(s, raw_mask),
            );
            let dst = out.as_mut_ptr().add(j + WIDTH * g);
            if W::BITS == 16 {
                _mm256_storeu_si256(dst as *mut __m256i, _mm512_cvtepi32_epi16(value));
            } else {
                _mm_storeu_si128(dst as *mut __m128i, _mm512_cvtepi32_epi8(value));
            }
            let next = _mm512_add_epi32(_mm512_mullo_epi32(f, _mm512_srlv_epi32(s, slot)), rank);
            let need = _mm512_cmplt_epu32_mask(next, low);
            let fresh = _mm512_cvtepu16_epi32(_mm256_loadu_si256(words.add(2 * pos) as *const __m256i));
            let fresh = _mm512_maskz_expand_epi32(need, fresh);
            x[g] = _mm512_mask_mov_epi32(next, need, _mm512_or_si512(_mm512_slli_epi32::<16>(next), fresh));
            pos += need.count_ones() as usize;
            off[g] += advance;
            if off[g] >= k {
                off[g] -= k;
            }
        }
        j += STATES;
    }
    _mm512_storeu_si512(c.states.as_mut_ptr() as *mut _, x[0]);
    _mm512_storeu_si512(c.states.as_mut_ptr().add(WIDTH) as *mut _, x[1]);
    (j, pos)
}
