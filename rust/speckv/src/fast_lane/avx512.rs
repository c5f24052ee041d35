//! The fast lane's decoder and encoder sixteen scalars at a time, with AVX-512F (x86-64).
//!
//! Each step decodes two vectors of sixteen states (scalars `j .. j + 32` of the chunk, F2):
//! one gather of table entries, a multiply, and a renormalisation that reads the words of the
//! lanes that need one with an expand (lane order, so the words are taken in scalar order as
//! the portable decoder takes them, F2). The caller finishes what is left with the portable
//! code, which checks every read; this kernel stops while a step's worst case (one word per
//! state) still fits the words.
//!
//! The encoder runs the steps backwards as the portable encoder does: per vector, the lanes
//! that must renormalise write their low words in decreasing lane order (a compress of the
//! lane-reversed states), then every lane takes its step; the quotient `x / f` is a float64
//! division, exact here (`x < 2^32` and `f < 2^11`, so `x / f` is never within 2^-43 of the
//! next integer above it unless it is one, and float64 rounds to 2^-52 relative).

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

/// Encodes `x` (whole steps of `STATES` scalars) backwards into `states`, appending words at
/// `n_words`; returns the new word count. `packed[t * 2^S + h]` is `f | c << 16` for symbol
/// `h` of table `t`, `base[k]` the offset of channel `k mod K`'s table (`K + 16` entries).
///
/// # Safety
/// The processor must have AVX-512F (`enabled`); `x.len()` is a multiple of `STATES`; `words`
/// has room for `x.len() + 16` words after `n_words` (at most one per scalar is written, and
/// each store writes sixteen).
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn encode<W: Word>(
    x: &[W],
    split: Split,
    packed: &[u32],
    base: &[u32],
    states: &mut [u32; STATES],
    words: &mut [u16],
    mut n_words: usize,
) -> usize {
    let k = base.len() - WIDTH;
    let steps = x.len() / STATES;
    debug_assert!(words.len() >= n_words + x.len() + WIDTH);
    let raw = _mm512_set1_epi32(split.raw_bits as i32);
    let raw_mask = _mm512_set1_epi32(((1u32 << split.raw_bits) - 1) as i32);
    let limit_shift = _mm512_set1_epi32((32 - split.slot_bits()) as i32);
    let top = _mm512_set1_epi32(1 << split.precision);
    let low16 = _mm512_set1_epi32(0xFFFF);
    let reverse = _mm512_set_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    let mut x_state =
        [_mm512_loadu_si512(states.as_ptr() as *const _), _mm512_loadu_si512(states.as_ptr().add(WIDTH) as *const _)];
    let back = WIDTH % k;
    // channel offset of the last vector's first scalar
    let mut off = (x.len() - WIDTH) % k;
    // SAFETY (all loads and stores below): scalar loads read 16 scalars at `j < x.len() - 15`;
    // `base` loads read 16 entries at `off < K`; gathered indices are a table's offset plus a
    // symbol below 2^S, within `packed`; word stores write 16 words at `n_words`, which stays
    // below `words.len() - 16` (one word per scalar at most).
    for step in (0..steps).rev() {
        for g in (0..2).rev() {
            let j = step * STATES + g * WIDTH;
            let v = if W::BITS == 16 {
                _mm512_cvtepu16_epi32(_mm256_loadu_si256(x.as_ptr().add(j) as *const __m256i))
            } else {
                _mm512_cvtepu8_epi32(_mm_loadu_si128(x.as_ptr().add(j) as *const __m128i))
            };
            let h = _mm512_srlv_epi32(v, raw);
            let tb = _mm512_loadu_si512(base.as_ptr().add(off) as *const _);
            let e = _mm512_i32gather_epi32::<4>(_mm512_add_epi32(tb, h), packed.as_ptr() as *const i32);
            let f = _mm512_and_si512(e, low16);
            let c = _mm512_srli_epi32::<16>(e);
            let s = x_state[g];
            let emit = _mm512_cmpge_epu32_mask(s, _mm512_sllv_epi32(f, limit_shift));
            let out = _mm512_maskz_compress_epi32(emit.reverse_bits(), _mm512_permutexvar_epi32(reverse, s));
            _mm256_storeu_si256(words.as_mut_ptr().add(n_words) as *mut __m256i, _mm512_cvtepi32_epi16(out));
            n_words += emit.count_ones() as usize;
            let s = _mm512_mask_srli_epi32(s, emit, s, 16);
            // x / f in float64, eight lanes at a time
            let quotient = |lo: __m256i, flo: __m256i| {
                _mm512_cvttpd_epu32(_mm512_div_pd(_mm512_cvtepu32_pd(lo), _mm512_cvtepu32_pd(flo)))
            };
            let q_lo = quotient(_mm512_castsi512_si256(s), _mm512_castsi512_si256(f));
            let q_hi = quotient(_mm512_extracti64x4_epi64::<1>(s), _mm512_extracti64x4_epi64::<1>(f));
            let q = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(q_lo), q_hi);
            let cmpl = _mm512_sllv_epi32(_mm512_sub_epi32(top, f), raw);
            let shifted =
                _mm512_or_si512(_mm512_sllv_epi32(_mm512_add_epi32(s, c), raw), _mm512_and_si512(v, raw_mask));
            x_state[g] = _mm512_add_epi32(shifted, _mm512_mullo_epi32(q, cmpl));
            off = if off >= back { off - back } else { off + k - back };
        }
    }
    _mm512_storeu_si512(states.as_mut_ptr() as *mut _, x_state[0]);
    _mm512_storeu_si512(states.as_mut_ptr().add(WIDTH) as *mut _, x_state[1]);
    n_words
}
