//! The bins model's encoder sixteen scalars at a time, with AVX-512F (x86-64): the same bytes
//! as the portable code in `encoder.rs`, which covers whatever the vectors do not.
//!
//! `run_groups`: per group of sixteen consecutive scalars, B1 for every lane
//! (`avx512::places`), then B2-B3 in integer vector operations: each lane's bin, its symbol or
//! the escape (one gather for whether the symbol has a frequency), its raw bits and their
//! count. The sixteen steps are stored and the raw bits appended lane by lane, in scalar
//! order. A group with a non-finite or far-out `mu` is the caller's, scalar by scalar.
//!
//! `steps_back`: B4's steps backwards, a group of sixteen consecutive scalars `j .. j + 16`
//! (`j` a multiple of 16) at a time. Their states are sixteen different ones (B4: scalar `j`
//! goes to state `j mod S`, `S` 16 or 32), each its own chain, so stepping the sixteen
//! together gives every state the sequence the scalar loop gives it. The scalar loop pushes a
//! group's words from lane 15 down to lane 0; the vector takes the lanes that renormalise in
//! that order (the lanes reversed, then compressed). The quotient by a frequency is the
//! portable one (`Coding::quotient`, `x * magic >> 48`) in 64-bit lanes.

use std::arch::x86_64::*;

use super::avx512::{places, Places};
use super::tables::{CODING_BYTES, MAGIC_AT, QUOTIENT_SHIFT};
use super::{Encoder, DEPTH_MAX, ESCAPE, HALF, NO_STEP, PRECISION, STATES, SYMBOLS};
use crate::words::Word;

const WIDTH: usize = 16;

/// Codes whole groups from the start of `x` while they fit the vector path (module doc);
/// returns the scalars done (a multiple of 16).
///
/// # Safety
/// The processor must have AVX-512F (`avx512::enabled`).
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn run_groups<W: Word>(enc: &mut Encoder, x: &[W], mu: &[f32], codes: &[i16]) -> usize {
    let (l, r) = (enc.layout, enc.tables.revision);
    let set = _mm512_set1_epi32;
    let (zero, one, m, e_bits) = (_mm512_setzero_si512(), set(1), l.m as i32, l.e_bits as i32);
    let entries = enc.tables.entries.as_ptr() as *const i32;
    let n = x.len().min(mu.len()).min(codes.len());
    let mut done = 0;
    while done + WIDTH <= n {
        // SAFETY (loads): `done + 16 <= n`, inside `x`, `mu` and `codes`.
        let bits = _mm512_loadu_si512(mu.as_ptr().add(done) as *const _);
        let code = _mm512_cvtepi16_epi32(_mm256_loadu_si256(codes.as_ptr().add(done) as *const __m256i));
        let Some(Places { base, table, fw }) = places(l, r, bits, code) else {
            break;
        };
        let w = if W::BITS == 16 {
            _mm512_cvtepu16_epi32(_mm256_loadu_si256(x.as_ptr().add(done) as *const __m256i))
        } else {
            _mm512_cvtepu8_epi32(_mm_loadu_si128(x.as_ptr().add(done) as *const __m128i))
        };
        // the pattern's fields
        let mant = _mm512_and_si512(w, set((1 << m) - 1));
        let field = _mm512_and_si512(_mm512_srlv_epi32(w, set(m)), set((1 << e_bits) - 1));
        let negative = _mm512_test_epi32_mask(w, set(1 << (m + e_bits)));
        let mut finite = _mm512_cmple_epi32_mask(field, set(l.field_max as i32));
        if l.e4m3 {
            finite &= !(_mm512_cmpeq_epi32_mask(field, set(15)) & _mm512_cmpeq_epi32_mask(mant, set(7)));
        }
        // B3's zero bin (below `w`'s exponent): the depth in unary and the mantissa bits, or
        // from `DEPTH_MAX` on, that many zeros and the magnitude's bits
        let below = _mm512_cmplt_epi32_mask(field, fw);
        let d = _mm512_sub_epi32(_mm512_sub_epi32(fw, one), field);
        let shallow = _mm512_cmplt_epi32_mask(d, set(DEPTH_MAX as i32));
        let zero_raw = _mm512_mask_mov_epi32(
            _mm512_slli_epi32::<{ DEPTH_MAX }>(_mm512_and_si512(w, set((1 << (m + e_bits)) - 1))),
            shallow,
            _mm512_or_si512(_mm512_sllv_epi32(one, d), _mm512_sllv_epi32(mant, _mm512_add_epi32(d, one))),
        );
        let zero_count =
            _mm512_mask_mov_epi32(set(DEPTH_MAX as i32 + e_bits + m), shallow, _mm512_add_epi32(d, set(1 + m)));
        // bins from 1 up, of binade `t`: `M - t` mantissa bits where `t <= M`, none above
        let t = _mm512_sub_epi32(field, fw);
        let far = _mm512_cmpgt_epi32_mask(t, set(20));
        let inside = _mm512_cmple_epi32_mask(t, set(m));
        let rest = _mm512_sub_epi32(set(m), t);
        let j = _mm512_mask_mov_epi32(
            _mm512_sllv_epi32(_mm512_or_si512(set(1 << m), mant), _mm512_sub_epi32(t, set(m))),
            inside,
            _mm512_or_si512(_mm512_sllv_epi32(one, t), _mm512_srlv_epi32(mant, rest)),
        );
        let j = _mm512_maskz_mov_epi32(!below, j);
        let upper_raw = _mm512_maskz_and_epi32(inside, mant, _mm512_sub_epi32(_mm512_sllv_epi32(one, rest), one));
        let upper_count = _mm512_maskz_mov_epi32(inside, rest);
        // B2: the bin, its symbol, whether the table gives it a frequency
        let b = _mm512_mask_sub_epi32(j, negative, set(-1), j);
        let k = _mm512_add_epi32(_mm512_sub_epi32(b, base), set(HALF as i32));
        let row = _mm512_mullo_epi32(table, set(SYMBOLS as i32));
        let candidate = finite & !(!below & far) & _mm512_cmplt_epu32_mask(k, set(2 * HALF as i32));
        // SAFETY: a candidate's index is a table's row plus a symbol below ESCAPE, inside
        // `entries`; other lanes are not read.
        let entry = _mm512_mask_i32gather_epi32::<4>(zero, candidate, _mm512_add_epi32(row, k), entries);
        let coded = candidate & _mm512_test_epi32_mask(entry, set(0xFFFF));
        let step = _mm512_mask_mov_epi32(_mm512_add_epi32(row, set(ESCAPE as i32)), coded, _mm512_add_epi32(row, k));
        // an escape's raw bits are its pattern
        let raw = _mm512_mask_mov_epi32(w, coded, _mm512_mask_mov_epi32(upper_raw, below, zero_raw));
        let count =
            _mm512_mask_mov_epi32(set(l.width as i32), coded, _mm512_mask_mov_epi32(upper_count, below, zero_count));
        let mut lanes = [[0u32; WIDTH]; 3];
        for (a, v) in lanes.iter_mut().zip([step, raw, count]) {
            _mm512_storeu_si512(a.as_mut_ptr() as *mut _, v);
        }
        let [steps, raws, counts] = lanes;
        enc.steps.extend_from_slice(&steps);
        enc.bits.put_all(&raws, &counts);
        done += WIDTH;
    }
    done
}

/// B4 backwards over the whole groups of `steps` (its length a multiple of 16), from the last
/// group to the first (module doc): `state` is the revision's states after the steps above
/// them, `words` the renormalisation words so far in the order the scalar loop pushes them.
///
/// # Safety
/// The processor must have AVX-512F (`avx512::enabled`); `words` must have room for
/// `steps.len() + 16` words beyond its length.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn steps_back(enc: &Encoder, steps: &[u32], state: &mut [u32; STATES], words: &mut Vec<u16>) {
    debug_assert!(steps.len().is_multiple_of(WIDTH) && words.capacity() >= words.len() + steps.len() + WIDTH);
    let set = _mm512_set1_epi32;
    let zero = _mm512_setzero_si512();
    let tables = &enc.tables;
    let entries = tables.entries.as_ptr() as *const i32;
    // each step's `Coding::magic`, read in place: 8-byte units from the first one's
    const STRIDE: i32 = (CODING_BYTES / 8) as i32;
    let magic = (tables.coding.as_ptr() as *const u8).add(MAGIC_AT) as *const i64;
    let lanes_down = _mm512_set_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    let states = tables.revision.states;
    let mut j = steps.len();
    while j >= WIDTH {
        j -= WIDTH;
        // SAFETY: `states` is 16 or 32 and `j` a multiple of 16: sixteen states from here are
        // inside the array; `j + 16 <= steps.len()`.
        let at = state.as_mut_ptr().add(j & (states - 1));
        let s = _mm512_loadu_si512(at as *const _);
        let step = _mm512_loadu_si512(steps.as_ptr().add(j) as *const _);
        let placed = _mm512_cmpneq_epi32_mask(step, set(NO_STEP as i32));
        // SAFETY: a placed step is a (table, symbol) index with a frequency, inside `entries`
        // and `coding` (below 2^16 entries: `step * 3` fits an i32); other lanes are not read.
        let entry = _mm512_mask_i32gather_epi32::<4>(zero, placed, step, entries);
        let units = _mm512_mullo_epi32(step, _mm512_set1_epi32(STRIDE));
        let magic_low = _mm512_mask_i32gather_epi64::<8>(zero, placed as u8, _mm512_castsi512_si256(units), magic);
        let magic_high =
            _mm512_mask_i32gather_epi64::<8>(zero, (placed >> 8) as u8, _mm512_extracti64x4_epi64::<1>(units), magic);
        let freq = _mm512_and_si512(entry, set(0xFFFF));
        let need = placed & _mm512_cmpge_epu32_mask(s, _mm512_slli_epi32::<{ 32 - PRECISION }>(freq));
        // the words, lane 15 first; at most sixteen, inside the room the caller left
        let down = _mm512_maskz_compress_epi32(need.reverse_bits(), _mm512_permutexvar_epi32(lanes_down, s));
        let len = words.len();
        _mm256_storeu_si256(words.as_mut_ptr().add(len) as *mut __m256i, _mm512_cvtepi32_epi16(down));
        words.set_len(len + need.count_ones() as usize);
        let s = _mm512_mask_srli_epi32(s, need, s, 16);
        let q = _mm512_inserti64x4::<1>(
            _mm512_castsi256_si512(quotient(_mm512_castsi512_si256(s), magic_low)),
            quotient(_mm512_extracti64x4_epi64::<1>(s), magic_high),
        );
        let next = _mm512_add_epi32(
            _mm512_add_epi32(_mm512_slli_epi32::<{ PRECISION }>(q), _mm512_sub_epi32(s, _mm512_mullo_epi32(q, freq))),
            _mm512_srli_epi32::<16>(entry),
        );
        _mm512_storeu_si512(at as *mut _, _mm512_mask_mov_epi32(s, placed, next));
    }
}

/// `x / f` for eight lanes as `Coding::quotient` computes it: `x * magic >> 48`, the product
/// split at the magic's 32nd bit (`x < 2^32`, `magic <= 2^48`: every sum fits 64 bits).
#[inline(always)]
unsafe fn quotient(x: __m256i, magic: __m512i) -> __m256i {
    let x = _mm512_cvtepu32_epi64(x);
    let low = _mm512_mul_epu32(x, magic);
    let high = _mm512_mul_epu32(x, _mm512_srli_epi64::<32>(magic));
    _mm512_cvtepi64_epi32(_mm512_srli_epi64::<{ QUOTIENT_SHIFT - 32 }>(_mm512_add_epi64(
        high,
        _mm512_srli_epi64::<32>(low),
    )))
}
