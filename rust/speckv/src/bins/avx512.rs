//! The bins model's decoder sixteen scalars at a time, with AVX-512F (x86-64).
//!
//! A group is sixteen consecutive scalars `j .. j + 16` of the chunk with `j` a multiple of 16,
//! so their states are sixteen consecutive ones (half of version 3's 32, all of version 4's 16:
//! B4). Per group: B1 for every lane (integer vector operations; `mu`'s floor by a per-lane
//! arithmetic shift), one rANS step per lane (two gathers, a multiply, the words of the lanes
//! that renormalise taken with an expand in lane order, as the portable decoder takes them;
//! past the chunk's last word, zeros, as `super::step` reads them), then B3 backwards: each
//! lane's raw-bit count, their prefix sum for the lanes' bit positions (the zero bins' unary
//! depths read first, in lane order, from the bits), then the bits: with AVX-512 VBMI one
//! byte permutation of the 64 bytes from the group's first bit (a group's bits span at most
//! 16 x (M + 1 + DEPTH_MAX) = 416 bits), else one gather.
//!
//! Whatever a vector does not cover falls back to the portable code, which reads the same
//! words and bits in the same order: a group with a non-finite `mu` or a far-out one (B1's
//! left shift) is decoded scalar by scalar by the caller; a group with an escape, a bin above
//! the format's binade (`t > M`), a depth of `DEPTH_MAX` or more, or a position past the
//! chunk's end finishes its patterns lane by lane after the vector rANS step (near the end, the
//! bits come from the reader's copy of the last bytes, zeros after: `BitReader::window`).
//!
//! Where the time goes (AMD Zen 4, the demo model's `map` caches, `examples/decode_replay.rs`):
//! the loop is bound by each group's latency, its B3 waiting for its gathers, not by the
//! states' chain (32 states, two independent chains, measured no faster) nor by the gathers'
//! count (one packed gather instead of two, measured no faster). What paid: no branch on
//! whether a group has zero bins (a third of the groups, at random: each misprediction threw
//! away the next group's gathers under way), the raw bits by byte permutation, the chunk's
//! last words without leaving the vector path, the raw bits read in place: 208 -> 263 Msym/s
//! per core.
//!
//! On an Intel Xeon (AMX, `decode_replay` on the same kind of caches) the loop is bound by the
//! raw bits' position: the zero bins' depths read from the bits move it, a chain from group to
//! group (cut, as a measurement only, the loop ran at 467 Msym/s instead of 230). What paid:
//! the next group's rANS steps issued before this group's patterns (in program order after
//! them, its gathers waited for room in the reorder window), the chunk's last bytes read from
//! the reader's padded copy instead of lane by lane (one group in 25 took that path: chunks
//! of a few thousand scalars), the second depth read from `s1` without waiting for the first,
//! the cursor kept in registers, and POPCNT/BMI enabled for the scalar operations beside the
//! vectors: 202-210 -> 236-261 Msym/s. Tried and not kept: the depths' loads addressed from
//! the position before the previous group's depths (a load off the chain; 257 against 268),
//! every group of a batch stepped before any pattern (202), 32 states (two chains; no gain).

use std::arch::x86_64::*;
use std::sync::OnceLock;

use super::{finish, BinTables, BitReader, Cursor, Layout, Place, Revision, BINS_PER_SIGMA_LOG2, CLASS_MAX, DEPTH_MAX};
use super::{CLASS_UNPHASED, ESCAPE, HALF, LOW, PHASES, PHASE_BITS, PRECISION, STATES, SYMBOLS};
use crate::words::Word;

const WIDTH: usize = 16;

#[cfg(test)]
thread_local! {
    /// Tests set this to run the gather kernel where VBMI is there too.
    pub(super) static NO_VBMI: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether `groups` takes the raw bits with VBMI (tests can turn it off per thread).
fn use_vbmi() -> bool {
    #[cfg(test)]
    if NO_VBMI.with(|v| v.get()) {
        return false;
    }
    vbmi()
}

/// True when the raw bits can be taken with a byte permutation (AVX-512 VBMI and BW).
fn vbmi() -> bool {
    static VBMI: OnceLock<bool> = OnceLock::new();
    *VBMI.get_or_init(|| is_x86_feature_detected!("avx512vbmi") && is_x86_feature_detected!("avx512bw"))
}

/// The inclusive prefix sum of sixteen lanes.
#[inline(always)]
unsafe fn inclusive(v: __m512i) -> __m512i {
    let zero = _mm512_setzero_si512();
    let v = _mm512_add_epi32(v, _mm512_alignr_epi32::<15>(v, zero));
    let v = _mm512_add_epi32(v, _mm512_alignr_epi32::<14>(v, zero));
    let v = _mm512_add_epi32(v, _mm512_alignr_epi32::<12>(v, zero));
    _mm512_add_epi32(v, _mm512_alignr_epi32::<8>(v, zero))
}

/// Lane i: the 4 bytes from byte `offset[i]` of the 64 at `window` (each offset at most 60),
/// one byte permutation instead of a gather (on AMD Zen 4 a 16-lane gather costs ~25 cycles).
///
/// # Safety
/// AVX-512 VBMI and BW (inlined into a function compiled with them); 64 bytes readable at
/// `window`.
#[inline(always)]
unsafe fn window_bytes(window: *const u8, offset: __m512i) -> __m512i {
    let bytes = _mm512_loadu_si512(window as *const _);
    let idx =
        _mm512_add_epi32(_mm512_mullo_epi32(offset, _mm512_set1_epi32(0x0101_0101)), _mm512_set1_epi32(0x0302_0100));
    _mm512_permutexvar_epi8(idx, bytes)
}

/// B1 for sixteen lanes (`super::place`'s arithmetic in vectors).
#[derive(Clone, Copy)]
pub(super) struct Places {
    pub(super) base: __m512i,
    pub(super) table: __m512i,
    pub(super) fw: __m512i,
}

/// B1 for the sixteen lanes of `bits` (`mu`'s float32 patterns) and their sigma codes, as
/// `super::place` computes it; `None` where a lane's `mu` is not finite or needs B1's left
/// shift (a far-out `mu`): such a group goes the portable way.
///
/// # Safety
/// AVX-512F (inlined into a function compiled with it).
#[inline(always)]
pub(super) unsafe fn places(l: Layout, r: Revision, bits: __m512i, code: __m512i) -> Option<Places> {
    let set = _mm512_set1_epi32;
    let (zero, one, m) = (_mm512_setzero_si512(), set(1), l.m as i32);
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
    if _mm512_cmpeq_epi32_mask(f, set(0xFF)) | _mm512_cmpge_epi32_mask(sh, zero) != 0 {
        return None;
    }
    let q = _mm512_srav_epi32(signed, _mm512_min_epi32(_mm512_sub_epi32(zero, sh), set(31)));
    // the rounding shift, in eighths of a bin: 4 >> d for d in 0..=2, else 0 (a count of 3 or
    // more, or a negative one read as unsigned, shifts everything out; none without it)
    let d = _mm512_sub_epi32(e, _mm512_max_epi32(e_ulp, set(1 - l.bias - m)));
    let shift = _mm512_srlv_epi32(set(if r.rounding { 4 } else { 0 }), d);
    let q = _mm512_mask_sub_epi32(_mm512_add_epi32(q, shift), negative_mu, q, shift);
    let class = _mm512_min_epi32(
        _mm512_max_epi32(_mm512_sub_epi32(code, _mm512_slli_epi32::<3>(e)), set(r.class_min)),
        set(CLASS_MAX),
    );
    let phased = _mm512_add_epi32(
        _mm512_slli_epi32::<{ PHASE_BITS }>(_mm512_sub_epi32(class, set(r.class_min))),
        _mm512_and_si512(q, set(PHASES as i32 - 1)),
    );
    let unphased = _mm512_add_epi32(_mm512_sub_epi32(class, set(CLASS_UNPHASED)), set(r.phased_tables() as i32));
    Some(Places {
        base: _mm512_srai_epi32::<{ PHASE_BITS }>(q),
        table: _mm512_mask_mov_epi32(phased, _mm512_cmpge_epi32_mask(class, set(CLASS_UNPHASED)), unphased),
        fw: _mm512_add_epi32(e, set(l.bias)),
    })
}

/// True when this processor has AVX-512F (with POPCNT, BMI1 and BMI2) and `SPECKV_SIMD` is
/// neither `0` nor `avx2`.
pub(crate) fn enabled() -> bool {
    static ENABLED: OnceLock<bool> = OnceLock::new();
    *ENABLED.get_or_init(|| {
        let wanted = std::env::var("SPECKV_SIMD").map_or(true, |v| !matches!(v.trim(), "0" | "avx2"));
        // the scalar bit operations beside the vectors (`popcnt`, `tzcnt`, `shrx`): every
        // AVX-512 processor has them, but the baseline build emulates a population count in
        // fifteen instructions and shifts by `cl` in three micro-operations
        wanted
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("popcnt")
            && is_x86_feature_detected!("bmi1")
            && is_x86_feature_detected!("bmi2")
    })
}

/// Decodes whole groups from the start of `out` while they fit the vector path (module doc);
/// returns the scalars done (a multiple of 16). `cur.j` must be a multiple of 16.
///
/// # Safety
/// The processor must have AVX-512F (`enabled`).
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn groups<W: Word>(
    l: Layout,
    tables: &BinTables,
    words: &[u8],
    raw: &BitReader<'_>,
    states: &mut [u32; STATES],
    cur: &mut Cursor,
    out: &mut [W],
    mu: &[f32],
    codes: &[i16],
) -> usize {
    if use_vbmi() {
        // SAFETY: `vbmi()` checked AVX-512 VBMI and BW, the caller AVX-512F.
        groups_vbmi(l, tables, words, raw, states, cur, out, mu, codes)
    } else {
        groups_gather(l, tables, words, raw, states, cur, out, mu, codes)
    }
}

#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,popcnt,bmi1,bmi2")]
unsafe fn groups_vbmi<W: Word>(
    l: Layout,
    tables: &BinTables,
    words: &[u8],
    raw: &BitReader<'_>,
    states: &mut [u32; STATES],
    cur: &mut Cursor,
    out: &mut [W],
    mu: &[f32],
    codes: &[i16],
) -> usize {
    groups_with::<W, true>(l, tables, words, raw, states, cur, out, mu, codes)
}

#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,popcnt,bmi1,bmi2")]
unsafe fn groups_gather<W: Word>(
    l: Layout,
    tables: &BinTables,
    words: &[u8],
    raw: &BitReader<'_>,
    states: &mut [u32; STATES],
    cur: &mut Cursor,
    out: &mut [W],
    mu: &[f32],
    codes: &[i16],
) -> usize {
    groups_with::<W, false>(l, tables, words, raw, states, cur, out, mu, codes)
}

/// A group after B1 and its rANS steps (B4), before its patterns (B3).
struct Stepped {
    base: __m512i,
    fw: __m512i,
    symbol: __m512i,
}

/// B1 and B4 for the sixteen scalars at the start of `mu` and `codes`; `None` (nothing
/// stepped) where B1 leaves the group to the portable code.
///
/// # Safety
/// AVX-512F (inlined into a function compiled with it); 16 scalars in `mu` and `codes`;
/// `cur.j` a multiple of 16.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn step_group(
    l: Layout,
    tables: &BinTables,
    words: &[u8],
    states: &mut [u32; STATES],
    cur: &mut Cursor,
    mu: &[f32],
    codes: &[i16],
) -> Option<Stepped> {
    let n_words = words.len() / 2;
    let set = _mm512_set1_epi32;
    let (lut, entries) = (tables.lut.as_ptr() as *const i32, tables.entries.as_ptr() as *const i32);
    let r = tables.revision;
    // SAFETY (loads): the caller's 16 scalars of `mu` and `codes`.
    let bits = _mm512_loadu_si512(mu.as_ptr() as *const _);
    let code = _mm512_cvtepi16_epi32(_mm256_loadu_si256(codes.as_ptr() as *const __m256i));
    // B1 (the vector path takes the right shifts only: a left shift is a far-out mu)
    let Places { base, table, fw } = places(l, r, bits, code)?;
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
    let entry =
        _mm512_i32gather_epi32::<4>(_mm512_add_epi32(_mm512_mullo_epi32(table, set(SYMBOLS as i32)), symbol), entries);
    let freq = _mm512_and_si512(entry, set(0xFFFF));
    let next = _mm512_sub_epi32(
        _mm512_add_epi32(_mm512_mullo_epi32(freq, _mm512_srli_epi32::<{ PRECISION }>(s)), slot),
        _mm512_srli_epi32::<16>(entry),
    );
    let need = _mm512_cmplt_epu32_mask(next, set(LOW as i32));
    let fresh = if cur.pos + WIDTH <= n_words {
        // SAFETY: `pos + 16 <= n_words`: the 16 words are inside `words`.
        _mm256_loadu_si256(words.as_ptr().add(2 * cur.pos) as *const __m256i)
    } else {
        // the chunk's last words, zeros past them (as `super::step` reads them)
        let mut last = [0u8; 2 * WIDTH];
        let have = &words[(2 * cur.pos).min(2 * n_words)..2 * n_words];
        last[..have.len()].copy_from_slice(have);
        _mm256_loadu_si256(last.as_ptr() as *const __m256i)
    };
    let fresh = _mm512_cvtepu16_epi32(fresh);
    let fresh = _mm512_maskz_expand_epi32(need, fresh);
    let s = _mm512_mask_mov_epi32(next, need, _mm512_or_si512(_mm512_slli_epi32::<16>(next), fresh));
    _mm512_storeu_si512(half as *mut _, s);
    cur.pos += need.count_ones() as usize;
    cur.j += WIDTH;
    Some(Stepped { base, fw, symbol })
}

/// `groups`, the raw bits taken with a byte permutation where `VBMI`, else with a gather;
/// inlined into each of the two, compiled with their features.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn groups_with<W: Word, const VBMI: bool>(
    l: Layout,
    tables: &BinTables,
    words: &[u8],
    raw: &BitReader<'_>,
    states: &mut [u32; STATES],
    cursor: &mut Cursor,
    out: &mut [W],
    mu: &[f32],
    codes: &[i16],
) -> usize {
    debug_assert!(cursor.j.is_multiple_of(WIDTH));
    // the cursor as a local: through the reference, each group's positions went to memory
    // and back (written back at the end)
    let mut local = *cursor;
    let cur = &mut local;
    let m = l.m as i32;
    let set = _mm512_set1_epi32;
    let zero = _mm512_setzero_si512();
    let one = set(1);
    let mut done = 0;
    // a group's rANS steps are issued before the patterns of the group before it: those wait
    // on the raw bits' position, a chain from group to group through the zero bins' depths,
    // and the steps issued first keep the next group's gathers under way meanwhile (in program
    // order after them, they waited for room in the reorder window; +8% here, module doc). A
    // stepped group always gets its patterns below: the loop ends only where the next group
    // was not stepped
    let mut pending = if WIDTH <= out.len() {
        step_group(l, tables, words, states, cur, &mu[..WIDTH], &codes[..WIDTH])
    } else {
        None
    };
    while let Some(Stepped { base, fw, symbol }) = pending {
        pending = if done + 2 * WIDTH <= out.len() {
            let next = done + WIDTH..done + 2 * WIDTH;
            step_group(l, tables, words, states, cur, &mu[next.clone()], &codes[next])
        } else {
            None
        };
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
        // every lane's bits end before `at + 16 (M + 1 + DEPTH_MAX)` (at most 416 bits): they
        // are read from the 64 bytes from `at`'s byte (`BitReader::window`: near the chunk's
        // end, a copy with zeros after; in place, it was one group in 25 here, lane by lane)
        let fits = cur.at < 1 << 30 && cur.at >> 3 <= raw.bytes.len();
        let byte0 = cur.at >> 3;
        let src = if fits { raw.window(byte0) } else { raw.bytes.as_ptr() };
        // lane i's bits start at `at` plus the bits of the lanes before it (their mantissa bits
        // and, for zero bins, unary depths) and its own unary depth. The zero bins' depths are
        // read in lane order (each moves the next), from the bits themselves. 3% of scalars are
        // zero bins (map, demo model): a group has none, one or two 98% of the time, which
        // straight-line code covers without a branch on them; a branch taken by a third of the
        // groups at random (whether there is one) cost more than the rest of B3, since a
        // misprediction throws away the next group's gathers already under way. (An escape or
        // a bin above the binade, `special`, has no count: its group is finished lane by lane
        // below, its starts never read.)
        let through = inclusive(n);
        let before = _mm512_sub_epi32(through, n);
        let z = zero_bin.count_ones();
        let mut moved = 0usize;
        let mut deep = false;
        // the zero bins' depths packed into the low lanes, in lane order
        let depths = if special == 0 && fits && z <= 2 {
            let packed = _mm512_castsi512_si128(_mm512_maskz_compress_epi32(zero_bin, before));
            let (s0, s1) = (_mm_cvtsi128_si32(packed) as usize, _mm_extract_epi32::<1>(packed) as usize);
            // SAFETY: with no special lane every count is in 0..=M, so a start is before
            // `cur.at + 416` bits (an unused one is 0): the 8 bytes from its byte are inside
            // the window's 64 from `byte0` (`fits`).
            // the 57 bits (or more) from bit `at` on
            let bits_at = |at: usize| (src.add((at >> 3) - byte0) as *const u64).read_unaligned() >> (at & 7);
            // in masks, not conditions: a branch on whether a group has a second zero bin
            // (random, data) mispredicted often, and that cost as much as the rest of B3
            let (first, second) = (((z >= 1) as usize).wrapping_neg(), ((z >= 2) as usize).wrapping_neg());
            let d0 = (bits_at(cur.at + s0) as u32 | 1 << DEPTH_MAX).trailing_zeros();
            // the second zero bin's bits start `d0 + 1` after `s1` (at most 17 into the 57 read
            // from there, not waiting for `d0`): one load on the position's chain, not two
            let d1 = ((bits_at(cur.at + s1) >> ((d0 + 1) & first as u32)) as u32 | 1 << DEPTH_MAX).trailing_zeros();
            moved += (d0 as usize + 1) & first;
            moved += (d1 as usize + 1) & second;
            deep = ((d0 >= DEPTH_MAX) as usize & first | (d1 >= DEPTH_MAX) as usize & second) != 0;
            _mm512_castsi128_si512(_mm_set_epi32(0, 0, d1 as i32, d0 as i32))
        } else if special == 0 && fits {
            let mut starts = [0i32; WIDTH];
            _mm512_storeu_si512(starts.as_mut_ptr() as *mut _, _mm512_maskz_compress_epi32(zero_bin, before));
            let mut all = [0i32; WIDTH];
            for k in 0..z as usize {
                let dk = ((raw.peek_at(cur.at + moved + starts[k] as usize) as u32) | 1 << DEPTH_MAX).trailing_zeros();
                deep |= dk >= DEPTH_MAX;
                all[k] = dk as i32;
                moved += dk as usize + 1;
            }
            _mm512_loadu_si512(all.as_ptr() as *const _)
        } else {
            zero
        };
        let depth = _mm512_maskz_expand_epi32(zero_bin, depths);
        let unary = _mm512_maskz_expand_epi32(zero_bin, _mm512_add_epi32(depths, one));
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
        let first = cur.at;
        let at = _mm512_add_epi32(set(first as i32), _mm512_add_epi32(before, inclusive(unary)));
        // the group's mantissa bits: the last lane of their prefix sum
        cur.at += _mm_extract_epi32::<3>(_mm512_extracti32x4_epi32::<3>(through)) as usize + moved;
        // each lane's byte, from the window's first (`byte0`, `first`'s)
        let offset = _mm512_sub_epi32(_mm512_srli_epi32::<3>(at), set(byte0 as i32));
        let gathered = if VBMI {
            // SAFETY: the window has 64 bytes from `src` (`fits`); AVX-512 VBMI and BW checked
            // (`vbmi`). Each lane's 4 bytes from its byte, out of the window's 64.
            window_bytes(src, offset)
        } else {
            // SAFETY: every lane's bits end before `first + 416`: 4 bytes from its byte are
            // inside the window's 64 (`fits`).
            _mm512_i32gather_epi32::<1>(offset, src as *const i32)
        };
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
    *cursor = local;
    done
}
