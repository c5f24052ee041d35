//! The bins model's decoder sixteen scalars at a time, with AVX-512F (x86-64).
//!
//! A group is sixteen consecutive scalars `j .. j + 16` of the chunk with `j` a multiple of 16,
//! so their states are sixteen consecutive ones (half of version 3's 32, all of version 4's 16:
//! B4). Per group: B1 for every lane (integer vector operations; `mu`'s floor by a per-lane
//! arithmetic shift), one rANS step per lane (two gathers, a multiply, the words of the lanes
//! that renormalise taken with an expand in lane order, as the portable decoder takes them),
//! then B3 backwards: each lane's raw-bit count, their prefix sum for the lanes' bit
//! positions, one gather of the bits. Whatever a vector does not cover falls back to the
//! portable code, which reads the same words and bits in the same order: a group with a
//! non-finite `mu` or a far-out one (B1's left shift) or too few words left is decoded scalar
//! by scalar by the caller; a group with an escape, a bin below `w` (B3's unary depth) or above
//! the format's binade (`t > M`), or too few raw bytes left, finishes its patterns lane by lane
//! after the vector rANS step.

use std::arch::x86_64::*;
use std::sync::OnceLock;

use super::{finish, BinTables, BitReader, Cursor, Layout, Place, BINS_PER_SIGMA_LOG2, CLASS_MAX, DEPTH_MAX};
use super::{CLASS_UNPHASED, ESCAPE, HALF, LOW, PHASES, PHASE_BITS, PRECISION, STATES, SYMBOLS};
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

/// Decodes whole groups from the start of `out` while they fit the vector path (module doc);
/// returns the scalars done (a multiple of 16). `cur.j` must be a multiple of 16.
///
/// # Safety
/// The processor must have AVX-512F (`enabled`).
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn groups<W: Word>(
    l: Layout,
    tables: &BinTables,
    words: &[u8],
    raw: &BitReader,
    states: &mut [u32; STATES],
    cur: &mut Cursor,
    out: &mut [W],
    mu: &[f32],
    codes: &[i16],
) -> usize {
    debug_assert!(cur.j.is_multiple_of(WIDTH));
    let n_words = words.len() / 2;
    let m = l.m as i32;
    let set = _mm512_set1_epi32;
    let zero = _mm512_setzero_si512();
    let one = set(1);
    let (lut, entries) = (tables.lut.as_ptr() as *const i32, tables.entries.as_ptr() as *const i32);
    let r = tables.revision;
    // B1's rounding shift, in eighths of a bin, before the shift by `d` (none without it)
    let rounding = set(if r.rounding { 4 } else { 0 });
    let raw_ptr = raw.bytes.as_ptr() as *const i32;
    let mut done = 0;
    while done + WIDTH <= out.len() && cur.pos + WIDTH <= n_words {
        // SAFETY (loads): `done + 16 <= out.len() == mu.len() == codes.len()`.
        let bits = _mm512_loadu_si512(mu.as_ptr().add(done) as *const _);
        let code = _mm512_cvtepi16_epi32(_mm256_loadu_si256(codes.as_ptr().add(done) as *const __m256i));
        // B1
        let f = _mm512_and_si512(_mm512_srli_epi32::<23>(bits), set(0xFF));
        let subnormal = _mm512_cmpeq_epi32_mask(f, zero);
        let e_sigma = _mm512_sub_epi32(_mm512_srai_epi32::<3>(code), set(BINS_PER_SIGMA_LOG2));
        let e_ulp = _mm512_mask_mov_epi32(_mm512_sub_epi32(f, set(127 + m)), subnormal, set(i32::MIN / 2));
        let e = _mm512_min_epi32(
            _mm512_max_epi32(_mm512_max_epi32(e_sigma, e_ulp), set(1 - l.bias)),
            set(l.field_max as i32 - l.bias),
        );
        let fraction = _mm512_and_si512(bits, set(0x7F_FFFF));
        let mant = _mm512_mask_or_epi32(fraction, !subnormal, fraction, set(1 << 23));
        let negative_mu = _mm512_cmplt_epi32_mask(bits, zero);
        let signed = _mm512_mask_sub_epi32(mant, negative_mu, zero, mant);
        let sh = _mm512_sub_epi32(_mm512_add_epi32(_mm512_max_epi32(f, one), set(PHASE_BITS as i32 - 150)), e);
        // the vector path takes the right shifts only (a left shift: a far-out mu, or none)
        if _mm512_cmpeq_epi32_mask(f, set(0xFF)) | _mm512_cmpge_epi32_mask(sh, zero) != 0 {
            break;
        }
        let q = _mm512_srav_epi32(signed, _mm512_min_epi32(_mm512_sub_epi32(zero, sh), set(31)));
        // the rounding shift: 4 >> d for d in 0..=2, else 0 (a count of 3 or more, or a negative
        // one read as unsigned, shifts everything out)
        let d = _mm512_sub_epi32(e, _mm512_max_epi32(e_ulp, set(1 - l.bias - m)));
        let shift = _mm512_srlv_epi32(rounding, d);
        let q = _mm512_mask_sub_epi32(_mm512_add_epi32(q, shift), negative_mu, q, shift);
        let base = _mm512_srai_epi32::<{ PHASE_BITS }>(q);
        let class = _mm512_min_epi32(
            _mm512_max_epi32(_mm512_sub_epi32(code, _mm512_slli_epi32::<3>(e)), set(r.class_min)),
            set(CLASS_MAX),
        );
        let phased = _mm512_add_epi32(
            _mm512_slli_epi32::<{ PHASE_BITS }>(_mm512_sub_epi32(class, set(r.class_min))),
            _mm512_and_si512(q, set(PHASES as i32 - 1)),
        );
        let unphased = _mm512_add_epi32(_mm512_sub_epi32(class, set(CLASS_UNPHASED)), set(r.phased_tables() as i32));
        let table = _mm512_mask_mov_epi32(phased, _mm512_cmpge_epi32_mask(class, set(CLASS_UNPHASED)), unphased);
        let fw = _mm512_add_epi32(e, set(l.bias));
        // B4: one step per lane
        // SAFETY: `r.states` is 16 or 32 and `cur.j` a multiple of 16: the sixteen states from
        // here are inside the array.
        let half = states.as_mut_ptr().add(cur.j & (r.states - 1));
        let s = _mm512_loadu_si512(half as *const _);
        let slot = _mm512_and_si512(s, set((1 << PRECISION) - 1));
        // SAFETY (gathers): a table index is below TABLES and a slot below 2^PRECISION, and
        // `lut` has 4 bytes past its last slot for the 4-byte read; a symbol is below SYMBOLS.
        let idx = _mm512_or_si512(_mm512_slli_epi32::<{ PRECISION }>(table), slot);
        let symbol = _mm512_and_si512(_mm512_i32gather_epi32::<1>(idx, lut), set(0xFF));
        let entry = _mm512_i32gather_epi32::<4>(
            _mm512_add_epi32(_mm512_mullo_epi32(table, set(SYMBOLS as i32)), symbol),
            entries,
        );
        let freq = _mm512_and_si512(entry, set(0xFFFF));
        let next = _mm512_sub_epi32(
            _mm512_add_epi32(_mm512_mullo_epi32(freq, _mm512_srli_epi32::<{ PRECISION }>(s)), slot),
            _mm512_srli_epi32::<16>(entry),
        );
        let need = _mm512_cmplt_epu32_mask(next, set(LOW as i32));
        // SAFETY: `pos + 16 <= n_words`: the 16 words are inside `words`.
        let fresh = _mm512_cvtepu16_epi32(_mm256_loadu_si256(words.as_ptr().add(2 * cur.pos) as *const __m256i));
        let fresh = _mm512_maskz_expand_epi32(need, fresh);
        let s = _mm512_mask_mov_epi32(next, need, _mm512_or_si512(_mm512_slli_epi32::<16>(next), fresh));
        _mm512_storeu_si512(half as *mut _, s);
        cur.pos += need.count_ones() as usize;
        cur.j += WIDTH;
        // B3 backwards
        let b = _mm512_add_epi32(base, _mm512_sub_epi32(symbol, set(HALF as i32)));
        let negative = _mm512_cmplt_epi32_mask(b, zero);
        let j = _mm512_mask_sub_epi32(b, negative, set(-1), b);
        // floor(log2 j) from the float32 exponent (j < 2^24: exact)
        let t = _mm512_sub_epi32(_mm512_srli_epi32::<23>(_mm512_castps_si512(_mm512_cvtepi32_ps(j))), set(127));
        let zero_bin = _mm512_cmpeq_epi32_mask(j, zero);
        let special = _mm512_cmpeq_epi32_mask(symbol, set(ESCAPE as i32)) | _mm512_cmpgt_epi32_mask(t, set(m));
        // raw bits before the mantissa bits (B3): a zero bin's unary depth and its one
        let n = _mm512_mask_mov_epi32(_mm512_sub_epi32(set(m), t), zero_bin, set(m));
        let dst = out.as_mut_ptr().add(done);
        // lane i's bits start at `at` plus the bits of the lanes before it: a prefix sum of
        // the counts, or, where a zero bin's depth is read from the bits themselves, a walk
        let mut start = [0i32; WIDTH];
        let mut depth = [0i32; WIDTH];
        let mut walked = cur.at;
        let mut deep = false;
        let fits =
            cur.at < 1 << 30 && (cur.at + WIDTH * (l.m as usize + 1 + DEPTH_MAX as usize)) / 8 + 4 <= raw.bytes.len();
        if special == 0 && fits && zero_bin != 0 {
            let mut counts = [0i32; WIDTH];
            _mm512_storeu_si512(counts.as_mut_ptr() as *mut _, n);
            for lane in 0..WIDTH {
                if zero_bin >> lane & 1 == 1 {
                    let d = ((raw.peek_at(walked) as u32) | 1 << DEPTH_MAX).trailing_zeros();
                    deep |= d >= DEPTH_MAX;
                    depth[lane] = d as i32;
                    walked += d as usize + 1;
                }
                start[lane] = walked as i32;
                walked += counts[lane] as usize;
            }
        }
        if special != 0 || deep || !fits {
            let mut arrays = [[0i32; WIDTH]; 3];
            for (a, v) in arrays.iter_mut().zip([base, fw, symbol]) {
                _mm512_storeu_si512(a.as_mut_ptr() as *mut _, v);
            }
            let [bases, fws, symbols] = arrays;
            for (lane, ((&base, &fw), &symbol)) in bases.iter().zip(&fws).zip(&symbols).enumerate() {
                let p = Place { fw, base: base as i64, table: 0 };
                *dst.add(lane) = W::from_u32(finish(l, raw, &mut cur.at, &mut cur.broken, p, symbol as usize));
            }
            done += WIDTH;
            continue;
        }
        let (at, depth) = if zero_bin == 0 {
            let mut inclusive = n;
            inclusive = _mm512_add_epi32(inclusive, _mm512_alignr_epi32::<15>(inclusive, zero));
            inclusive = _mm512_add_epi32(inclusive, _mm512_alignr_epi32::<14>(inclusive, zero));
            inclusive = _mm512_add_epi32(inclusive, _mm512_alignr_epi32::<12>(inclusive, zero));
            inclusive = _mm512_add_epi32(inclusive, _mm512_alignr_epi32::<8>(inclusive, zero));
            cur.at += _mm512_reduce_add_epi32(n) as usize;
            (_mm512_add_epi32(set(cur.at as i32 - _mm512_reduce_add_epi32(n)), _mm512_sub_epi32(inclusive, n)), zero)
        } else {
            cur.at = walked;
            (_mm512_loadu_si512(start.as_ptr() as *const _), _mm512_loadu_si512(depth.as_ptr() as *const _))
        };
        // SAFETY: every lane's bits end before `cur.at + 16 (M + 1 + DEPTH_MAX)`, and 4 bytes
        // past its byte fit (`fits`).
        let gathered = _mm512_i32gather_epi32::<1>(_mm512_srli_epi32::<3>(at), raw_ptr);
        let low_bits = _mm512_and_si512(
            _mm512_srlv_epi32(gathered, _mm512_and_si512(at, set(7))),
            _mm512_sub_epi32(_mm512_sllv_epi32(one, n), one),
        );
        // a zero bin's exponent field is `w`'s less one less its depth (below 0: no value)
        let below = _mm512_sub_epi32(_mm512_sub_epi32(fw, one), depth);
        cur.broken |= _mm512_mask_cmplt_epi32_mask(zero_bin, below, zero) != 0;
        let field = _mm512_mask_mov_epi32(_mm512_add_epi32(fw, t), zero_bin, _mm512_max_epi32(below, zero));
        let high = _mm512_maskz_mov_epi32(!zero_bin, _mm512_sub_epi32(_mm512_sllv_epi32(j, n), set(1 << m)));
        let mant = _mm512_or_si512(high, low_bits);
        let mut broken = _mm512_cmpgt_epu32_mask(field, set(l.field_max as i32));
        if l.e4m3 {
            broken |= _mm512_cmpeq_epi32_mask(field, set(15)) & _mm512_cmpeq_epi32_mask(mant, set(7));
        }
        cur.broken |= broken != 0;
        let sign = _mm512_maskz_mov_epi32(negative, set(1 << (l.m + l.e_bits)));
        let pattern = _mm512_or_si512(
            _mm512_or_si512(sign, _mm512_sllv_epi32(_mm512_and_si512(field, set((1 << l.e_bits) - 1)), set(m))),
            mant,
        );
        // SAFETY: `done + 16 <= out.len()`.
        if W::BITS == 16 {
            _mm256_storeu_si256(dst as *mut __m256i, _mm512_cvtepi32_epi16(pattern));
        } else {
            _mm_storeu_si128(dst as *mut __m128i, _mm512_cvtepi32_epi8(pattern));
        }
        done += WIDTH;
    }
    done
}
