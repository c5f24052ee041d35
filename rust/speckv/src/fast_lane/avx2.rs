//! The fast lane's decoder eight scalars at a time, with AVX2 (x86-64), for processors
//! without AVX-512.
//!
//! The same step as `avx512` (F1, F2): per vector of eight states one gather of table
//! entries and a multiply; AVX2 has no expand, so the renormalisation places the words with a
//! permutation chosen by the mask of the lanes that need one (`PLACES`: lane `i` takes the
//! word whose index is the number of needing lanes below it), which keeps them in lane order.
//! Four vectors make one step of `STATES` scalars; the caller finishes with the portable code.

use std::arch::x86_64::*;
use std::sync::OnceLock;

use super::{Chunk, Split, ENTRY_BITS, ENTRY_MASK, STATES, SYMBOL_SHIFT};
use crate::words::Word;

const WIDTH: usize = 8;

/// True when this processor has AVX2 and `SPECKV_SIMD` is not `0`.
pub(crate) fn enabled() -> bool {
    static ENABLED: OnceLock<bool> = OnceLock::new();
    *ENABLED.get_or_init(|| {
        std::env::var("SPECKV_SIMD").map_or(true, |v| v.trim() != "0") && is_x86_feature_detected!("avx2")
    })
}

/// For each mask of needing lanes, the word index each lane takes (lanes that need none take
/// some index; their word is masked off).
static PLACES: [[u32; WIDTH]; 256] = {
    let mut t = [[0u32; WIDTH]; 256];
    let mut mask = 0;
    while mask < 256 {
        let mut lane = 0;
        let mut rank = 0;
        while lane < WIDTH {
            t[mask][lane] = rank;
            if mask >> lane & 1 == 1 {
                rank += 1;
            }
            lane += 1;
        }
        mask += 1;
    }
    t
};

/// Decodes whole steps of `STATES` scalars into `out` from the start of the chunk; returns the
/// scalars done and the words read.
///
/// # Safety
/// The processor must have AVX2 (`enabled`).
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn decode<W: Word>(c: &mut Chunk, split: Split, out: &mut [W]) -> (usize, usize) {
    let k = c.base.len() - 16;
    let n_words = c.n_words();
    let advance = STATES % k;
    let raw = _mm256_set1_epi32(split.raw_bits as i32);
    let slot = _mm256_set1_epi32(split.slot_bits() as i32);
    let index_mask = _mm256_set1_epi32(((1u32 << split.precision) - 1) as i32);
    let raw_mask = _mm256_set1_epi32(((1u32 << split.raw_bits) - 1) as i32);
    let entry_mask = _mm256_set1_epi32(ENTRY_MASK as i32);
    let one = _mm256_set1_epi32(1);
    let zero = _mm256_setzero_si256();
    let lut = c.lut.as_ptr() as *const i32;
    let base = c.base.as_ptr();
    let words = c.words.as_ptr();
    // SAFETY (all loads and stores below): `states` has STATES = 4 * WIDTH entries; `base`
    // has K + 16 entries and `off < K`; every gathered index is a table's offset plus a slot
    // below 2^P (`parse_chunk`); the word load reads 8 words at `pos`, and a step starts only
    // while `pos + STATES <= n_words`; the stores write 8 scalars at `j + WIDTH * g <
    // steps * STATES <= out.len()`.
    let mut x = [zero; 4];
    for (g, v) in x.iter_mut().enumerate() {
        *v = _mm256_loadu_si256(c.states.as_ptr().add(WIDTH * g) as *const __m256i);
    }
    let mut off = [0usize, WIDTH % k, (2 * WIDTH) % k, (3 * WIDTH) % k];
    let (mut pos, mut j) = (0usize, 0usize);
    while j + STATES <= out.len() && pos + STATES <= n_words {
        for g in 0..4 {
            let s = x[g];
            let tb = _mm256_loadu_si256(base.add(off[g]) as *const __m256i);
            let idx = _mm256_add_epi32(_mm256_and_si256(_mm256_srlv_epi32(s, raw), index_mask), tb);
            let e = _mm256_i32gather_epi32::<4>(lut, idx);
            let f = _mm256_add_epi32(_mm256_and_si256(e, entry_mask), one);
            let rank = _mm256_and_si256(_mm256_srli_epi32::<{ ENTRY_BITS as i32 }>(e), entry_mask);
            let value = _mm256_or_si256(
                _mm256_sllv_epi32(_mm256_srli_epi32::<{ SYMBOL_SHIFT as i32 }>(e), raw),
                _mm256_and_si256(s, raw_mask),
            );
            // eight u32 values (below 2^16) to eight u16 (or u8) in order
            let packed = _mm256_permute4x64_epi64::<0b1000>(_mm256_packus_epi32(value, zero));
            let dst = out.as_mut_ptr().add(j + WIDTH * g);
            if W::BITS == 16 {
                _mm_storeu_si128(dst as *mut __m128i, _mm256_castsi256_si128(packed));
            } else {
                let bytes = _mm_packus_epi16(_mm256_castsi256_si128(packed), _mm_setzero_si128());
                _mm_storel_epi64(dst as *mut __m128i, bytes);
            }
            let next = _mm256_add_epi32(_mm256_mullo_epi32(f, _mm256_srlv_epi32(s, slot)), rank);
            let need_v = _mm256_cmpeq_epi32(_mm256_srli_epi32::<16>(next), zero);
            let need = _mm256_movemask_ps(_mm256_castsi256_ps(need_v)) as usize;
            let fresh = _mm256_cvtepu16_epi32(_mm_loadu_si128(words.add(2 * pos) as *const __m128i));
            let places = _mm256_loadu_si256(PLACES[need].as_ptr() as *const __m256i);
            let fresh = _mm256_permutevar8x32_epi32(fresh, places);
            let renormalised = _mm256_or_si256(_mm256_slli_epi32::<16>(next), fresh);
            x[g] = _mm256_blendv_epi8(next, renormalised, need_v);
            pos += need.count_ones() as usize;
            off[g] += advance;
            if off[g] >= k {
                off[g] -= k;
            }
        }
        j += STATES;
    }
    for (g, v) in x.iter().enumerate() {
        _mm256_storeu_si256(c.states.as_mut_ptr().add(WIDTH * g) as *mut __m256i, *v);
    }
    (j, pos)
}
