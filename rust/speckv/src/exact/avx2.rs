//! The exact model's group steps for a quad of lanes at once, with AVX2 (x86-64); a chunk's
//! eight lanes are two quads.
//!
//! Every value that decides a coded interval is computed with the operations of the portable
//! code in `exact`, in the same order: IEEE-754 subtract, multiply, add, compare, truncating
//! conversion, and integer arithmetic. Vector and scalar forms of these are the same
//! correctly rounded operations, so a stream written here decodes with the portable code and
//! the other way round (the tests check both ways). Only the decoder's *guess* is computed
//! differently (lower precision), and a guess never decides anything: every decoded symbol is
//! confirmed by `cum`, exactly as in `Exact::decode_group`.
//!
//! Per quad of scalars (one per lane): the setup (window, leak, escape) in vectors; then
//! the four coders' slots; the guesses; `cum` at both ends; and last, lane by lane in order,
//! the coder step (or the portable slow path for escapes, misses and non-finite `mu`).

use std::arch::x86_64::*;
use std::sync::OnceLock;

use super::{Exact, Setup, Window};
use crate::coder::{RangeDecoder, SymbolSink};
use crate::model::mixture::{FRACTION_BITS, GUESS_BITS, STEPS_PER_Z};
use crate::model::RawPatternModel;
use crate::words::Word;

/// True when this processor has AVX2 and `SPECKV_SIMD` is not `0` (checked once). Where
/// `avx512::enabled()` holds too, the AVX-512 kernels run instead.
pub(crate) fn enabled() -> bool {
    static ENABLED: OnceLock<bool> = OnceLock::new();
    *ENABLED.get_or_init(|| {
        std::env::var("SPECKV_SIMD").map_or(true, |v| v.trim() != "0") && is_x86_feature_detected!("avx2")
    })
}

/// The constants of one stream's exact model, broadcast once per call.
struct Consts {
    min_ord: __m256i,
    max_ord: __m256i,
    max_mag: __m256i,
    /// `1023 - exponent bias`: subtracted from an f64 exponent field.
    rebias: __m256i,
    /// `mantissa bits` and `52 - mantissa bits`, as shift counts.
    shift_m: __m128i,
    shift_keep: __m128i,
    /// `52 - mantissa bits + 1`, for targets' subnormals.
    sub_base: __m256i,
    exp_mask: __m256i,
    frac_mask: __m256i,
    implicit: __m256i,
    one: __m256i,
    zero: __m256i,
    last_edge: __m256i,
    /// The last index where an edge pair starts.
    last_pair: __m256i,
    half_width: __m256d,
    steps: __m256d,
    fraction_scale: __m256d,
    last_node: __m256d,
    g_top: __m256i,
    slot_mul: __m256i,
    last_slot: __m256i,
    /// 8-bit formats: every finite pattern is in every window (`Exact::window`).
    full_window: bool,
    full_n: __m256i,
    edges: *const f32,
    nodes: *const i32,
    inverse: *const f32,
}

impl Consts {
    #[target_feature(enable = "avx2")]
    unsafe fn new(ex: &Exact) -> Consts {
        let (m, bias, max_mag) = ex.grid.layout();
        let edges = ex.grid.edges();
        let nodes = ex.cdf.nodes();
        Consts {
            min_ord: _mm256_set1_epi64x(ex.grid.min_ordinal),
            max_ord: _mm256_set1_epi64x(ex.grid.max_ordinal),
            max_mag: _mm256_set1_epi64x(max_mag as i64),
            rebias: _mm256_set1_epi64x(1023 - bias),
            shift_m: _mm_set_epi64x(0, m as i64),
            shift_keep: _mm_set_epi64x(0, 52 - m as i64),
            sub_base: _mm256_set1_epi64x(52 - m as i64 + 1),
            exp_mask: _mm256_set1_epi64x(0x7FF),
            frac_mask: _mm256_set1_epi64x((1i64 << 52) - 1),
            implicit: _mm256_set1_epi64x(1i64 << 52),
            one: _mm256_set1_epi64x(1),
            zero: _mm256_setzero_si256(),
            last_edge: _mm256_set1_epi64x(edges.len() as i64 - 1),
            last_pair: _mm256_set1_epi64x(edges.len() as i64 - 2),
            half_width: _mm256_set1_pd(ex.cdf.half_width),
            steps: _mm256_set1_pd(STEPS_PER_Z),
            fraction_scale: _mm256_set1_pd((1u32 << FRACTION_BITS) as f64),
            last_node: _mm256_set1_pd((nodes.len() - 2) as f64),
            g_top: _mm256_set1_epi64x(ex.cdf.g_max as i64 - 1),
            slot_mul: _mm256_set1_epi64x(ex.cdf.slot_multiplier() as i64),
            last_slot: _mm256_set1_epi64x((1i64 << GUESS_BITS) - 1),
            full_window: ex.grid.max_ordinal < 256,
            full_n: _mm256_set1_epi64x(ex.grid.max_ordinal - ex.grid.min_ordinal + 1),
            edges: edges.as_ptr(),
            nodes: nodes.as_ptr() as *const i32,
            inverse: ex.cdf.inverse_z().as_ptr(),
        }
    }
}

#[inline(always)]
unsafe fn min_i64(a: __m256i, b: __m256i) -> __m256i {
    _mm256_blendv_epi8(a, b, _mm256_cmpgt_epi64(a, b))
}

#[inline(always)]
unsafe fn max_i64(a: __m256i, b: __m256i) -> __m256i {
    _mm256_blendv_epi8(b, a, _mm256_cmpgt_epi64(a, b))
}

/// The low 32 bits of each 64-bit lane, packed into four 32-bit lanes.
#[inline(always)]
unsafe fn pack32(v: __m256i) -> __m128i {
    _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(v, _mm256_setr_epi32(0, 2, 4, 6, 0, 0, 0, 0)))
}

/// `ValueGrid::ordinal_toward_zero`, four at once: the same integer steps on the bits of `v`,
/// with selects where the portable code branches.
#[inline(always)]
unsafe fn ordinal_toward_zero(c: &Consts, v: __m256d) -> __m256i {
    let bits = _mm256_castpd_si256(v);
    let negative = _mm256_cmpgt_epi64(c.zero, bits);
    let e64 = _mm256_and_si256(_mm256_srli_epi64::<52>(bits), c.exp_mask);
    let frac = _mm256_and_si256(bits, c.frac_mask);
    let e = _mm256_sub_epi64(e64, c.rebias);
    // Normal in the target: (e << m | frac >> (52 - m)), at most the largest magnitude.
    let normal = _mm256_or_si256(_mm256_sll_epi64(e, c.shift_m), _mm256_srl_epi64(frac, c.shift_keep));
    let normal = min_i64(normal, c.max_mag);
    // Subnormal in the target: the full significand shifted further right; a shift of 64 or
    // more (which includes every f64 subnormal and zero, e64 = 0) gives 0, as `srlv` does.
    let shift = _mm256_sub_epi64(c.sub_base, e);
    let subnormal = _mm256_srlv_epi64(_mm256_or_si256(frac, c.implicit), shift);
    let subnormal = _mm256_andnot_si256(_mm256_cmpeq_epi64(e64, c.zero), subnormal);
    let is_normal = _mm256_cmpgt_epi64(e, c.zero);
    let magnitude = _mm256_blendv_epi8(subnormal, normal, is_normal);
    // Infinity: the largest magnitude; NaN: 0.
    let special = _mm256_cmpeq_epi64(e64, c.exp_mask);
    let infinite = _mm256_and_si256(special, _mm256_cmpeq_epi64(frac, c.zero));
    let magnitude = _mm256_blendv_epi8(magnitude, c.max_mag, infinite);
    let magnitude = _mm256_andnot_si256(_mm256_andnot_si256(infinite, special), magnitude);
    _mm256_xor_si256(magnitude, negative)
}

/// `ValueGrid::lower_edge` of four ordinals, as f64.
#[inline(always)]
unsafe fn lower_edge(c: &Consts, k: __m256i) -> __m256d {
    let index = min_i64(max_i64(_mm256_sub_epi64(k, c.min_ord), c.zero), c.last_edge);
    _mm256_cvtps_pd(gather_f32(c.edges, pack32(index)))
}

/// Four f32 loads at `base[idx[l]]`. Separate loads, not `vgatherdps`: on the processors at
/// hand a gather's latency is several times that of four loads, and the decoder's steps wait
/// on these reads one after another.
#[inline(always)]
unsafe fn gather_f32(base: *const f32, idx: __m128i) -> __m128 {
    let mut i = [0i32; 4];
    _mm_storeu_si128(i.as_mut_ptr() as *mut __m128i, idx);
    _mm_setr_ps(
        *base.offset(i[0] as isize),
        *base.offset(i[1] as isize),
        *base.offset(i[2] as isize),
        *base.offset(i[3] as isize),
    )
}

/// Four unaligned 64-bit loads at byte offset `4 * idx[l]` of `base` (a pair of 32-bit
/// entries each); see `gather_f32`.
#[inline(always)]
unsafe fn gather_pairs(base: *const u32, idx: __m128i) -> __m256i {
    let mut i = [0i32; 4];
    _mm_storeu_si128(i.as_mut_ptr() as *mut __m128i, idx);
    let at = |l: usize| (base.offset(i[l] as isize) as *const i64).read_unaligned();
    _mm256_setr_epi64x(at(0), at(1), at(2), at(3))
}

/// Four scalars' setup (`Exact::setup`), all with finite `mu`.
struct Setups {
    mu: __m256d,
    sigma: __m256d,
    inv_sigma: __m256d,
    lo: __m256i,
    n: __m256i,
}

#[inline(always)]
unsafe fn setup(c: &Consts, ex: &Exact, mu: &[f32], codes: &[i16]) -> Setups {
    let s: [(f64, f64); 4] =
        [ex.sigmas.get(codes[0]), ex.sigmas.get(codes[1]), ex.sigmas.get(codes[2]), ex.sigmas.get(codes[3])];
    let sigma = _mm256_setr_pd(s[0].0, s[1].0, s[2].0, s[3].0);
    let inv_sigma = _mm256_setr_pd(s[0].1, s[1].1, s[2].1, s[3].1);
    let mu = _mm256_cvtps_pd(_mm_loadu_ps(mu.as_ptr()));
    if c.full_window {
        return Setups { mu, sigma, inv_sigma, lo: c.min_ord, n: c.full_n };
    }
    let reach = _mm256_mul_pd(c.half_width, sigma);
    let lo = max_i64(_mm256_sub_epi64(ordinal_toward_zero(c, _mm256_sub_pd(mu, reach)), c.one), c.min_ord);
    let hi = min_i64(_mm256_add_epi64(ordinal_toward_zero(c, _mm256_add_pd(mu, reach)), c.one), c.max_ord);
    let n = _mm256_add_epi64(_mm256_sub_epi64(hi, lo), c.one);
    Setups { mu, sigma, inv_sigma, lo, n }
}

/// `Exact::cum` of four ordinals.
#[inline(always)]
unsafe fn cum(c: &Consts, s: &Setups, k: __m256i) -> __m128i {
    let z = _mm256_mul_pd(_mm256_sub_pd(lower_edge(c, k), s.mu), s.inv_sigma);
    _mm_add_epi32(eval(c, z), pack32(_mm256_sub_epi64(k, s.lo)))
}

/// `MixtureCdf::eval` of four `z`, reading each node pair with one 64-bit gather.
#[inline(always)]
unsafe fn eval(c: &Consts, z: __m256d) -> __m128i {
    // t = ((z + W) * STEPS).clamp(0, last); fixed = trunc(t * 2^16), as the portable code.
    let t = _mm256_mul_pd(_mm256_add_pd(z, c.half_width), c.steps);
    let t = _mm256_min_pd(_mm256_max_pd(t, _mm256_setzero_pd()), c.last_node);
    let fixed = _mm256_cvttpd_epi32(_mm256_mul_pd(t, c.fraction_scale));
    let i = _mm_srli_epi32::<{ FRACTION_BITS as i32 }>(fixed);
    let fraction = _mm_and_si128(fixed, _mm_set1_epi32((1 << FRACTION_BITS) - 1));
    // nodes[i] in the low half of each 64-bit lane, nodes[i + 1] in the high half (i <= last,
    // so both are inside the table).
    let pairs = gather_pairs(c.nodes as *const u32, i);
    let a = _mm256_and_si256(pairs, _mm256_set1_epi64x(0xFFFF_FFFF));
    let b = _mm256_srli_epi64::<32>(pairs);
    let rise = _mm256_mul_epu32(_mm256_sub_epi64(b, a), _mm256_cvtepu32_epi64(fraction));
    pack32(_mm256_add_epi64(a, _mm256_srli_epi64::<{ FRACTION_BITS as i32 }>(rise)))
}

/// `(cum(k), cum(k + 1))` of four ordinals, the two edges read with one 64-bit gather. The
/// index is kept inside the table; a `k` outside the window gives values nobody uses.
#[inline(always)]
unsafe fn cum_pair(c: &Consts, s: &Setups, k: __m256i) -> (__m128i, __m128i) {
    let index = min_i64(max_i64(_mm256_sub_epi64(k, c.min_ord), c.zero), c.last_pair);
    let pairs = gather_pairs(c.edges as *const u32, pack32(index));
    let lower = _mm256_castsi256_ps(_mm256_permutevar8x32_epi32(pairs, _mm256_setr_epi32(0, 2, 4, 6, 0, 0, 0, 0)));
    let upper = _mm256_castsi256_ps(_mm256_permutevar8x32_epi32(pairs, _mm256_setr_epi32(1, 3, 5, 7, 0, 0, 0, 0)));
    let z0 = _mm256_mul_pd(_mm256_sub_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(lower)), s.mu), s.inv_sigma);
    let z1 = _mm256_mul_pd(_mm256_sub_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(upper)), s.mu), s.inv_sigma);
    let leak = pack32(_mm256_sub_epi64(k, s.lo));
    let below = _mm_add_epi32(eval(c, z0), leak);
    let above = _mm_add_epi32(eval(c, z1), _mm_add_epi32(leak, _mm_set1_epi32(1)));
    (below, above)
}

/// The portable setup of lane `l`, for the slow paths.
#[inline(always)]
unsafe fn lane_setup(ex: &Exact, s: &Setups, l: usize) -> Setup {
    let (mut mu, mut sigma, mut inv, mut lo, mut n) = ([0f64; 4], [0f64; 4], [0f64; 4], [0i64; 4], [0i64; 4]);
    _mm256_storeu_pd(mu.as_mut_ptr(), s.mu);
    _mm256_storeu_pd(sigma.as_mut_ptr(), s.sigma);
    _mm256_storeu_pd(inv.as_mut_ptr(), s.inv_sigma);
    _mm256_storeu_si256(lo.as_mut_ptr() as *mut __m256i, s.lo);
    _mm256_storeu_si256(n.as_mut_ptr() as *mut __m256i, s.n);
    let window = Window { lo: lo[l], n: n[l] as u32 };
    Setup { mu: mu[l], sigma: sigma[l], inv_sigma: inv[l], window, escape: ex.cdf.g_max + window.n }
}

fn all_finite(mu: &[f32]) -> bool {
    mu.iter().all(|m| m.is_finite())
}

/// `Exact::encode` for 8- and 16-bit formats and `4 * H` lanes: every group of `x` (a multiple of
/// `4 * H`), one quad of lanes after the other.
///
/// # Safety
/// The processor must have AVX2 (`enabled()`); `lanes` holds `4 * H` coders.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn encode<W: Word, S: SymbolSink, const H: usize>(
    ex: &Exact,
    lanes: &mut [S],
    escapes: &mut RawPatternModel,
    x: &[W],
    mu: &[f32],
    codes: &[i16],
) -> usize {
    assert_eq!(lanes.len(), 4 * H);
    let c = Consts::new(ex);
    let precision = ex.cdf.precision;
    for base in (0..x.len()).step_by(4) {
        let lanes: &mut [S; 4] = (&mut lanes[base % (4 * H)..base % (4 * H) + 4]).try_into().unwrap();
        let (xs, mus, cs) = (&x[base..base + 4], &mu[base..base + 4], &codes[base..base + 4]);
        if !all_finite(mus) {
            ex.encode_group(lanes, escapes, xs.try_into().unwrap(), mus.try_into().unwrap(), cs.try_into().unwrap());
            continue;
        }
        let s = setup(&c, ex, mus, cs);
        let k = _mm256_setr_epi64x(xs[0].ordinal(), xs[1].ordinal(), xs[2].ordinal(), xs[3].ordinal());
        let hi = _mm256_sub_epi64(_mm256_add_epi64(s.lo, s.n), c.one);
        let kc = min_i64(max_i64(k, s.lo), hi);
        let (mut below, mut above) = ([0u32; 4], [0u32; 4]);
        let (b, a) = cum_pair(&c, &s, kc);
        _mm_storeu_si128(below.as_mut_ptr() as *mut __m128i, b);
        _mm_storeu_si128(above.as_mut_ptr() as *mut __m128i, a);
        // In the window when k == kc.
        let inside = _mm256_movemask_pd(_mm256_castsi256_pd(_mm256_cmpeq_epi64(k, kc)));
        for l in 0..4 {
            if inside >> l & 1 == 1 {
                lanes[l].put(below[l], above[l] - below[l], precision);
            } else {
                let setup = lane_setup(ex, &s, l);
                ex.encode_slow(&mut lanes[l], escapes, xs[l], &setup);
            }
        }
    }
    x.len()
}

/// What the decoder of one quad of lanes has computed before its coders step: for each lane
/// the slot `q`, the first of two candidate patterns, and `cum` at it and the next two.
struct Candidates {
    q: [u32; 4],
    base: [i64; 4],
    cums: [[u32; 4]; 3],
    /// Whether the second candidate is inside the window (all ones) or not (0).
    second: [i64; 4],
}

/// The guess (`Exact::guess`, in lower precision) for one quad: the first of its two
/// candidate patterns.
#[inline(always)]
unsafe fn guess(c: &Consts, s: &Setups, q: [u32; 4]) -> __m256i {
    // From registers, not memory: four scalar stores read back as one vector would stall on
    // store forwarding, on the decoder's critical path.
    let qv = _mm256_setr_epi64x(q[0] as i64, q[1] as i64, q[2] as i64, q[3] as i64);
    // Leak off q, then the inverse CDF by interpolation between slot edges.
    let leak = min_i64(max_i64(_mm256_sub_epi64(ordinal_toward_zero(c, s.mu), s.lo), c.zero), s.n);
    let target = min_i64(max_i64(_mm256_sub_epi64(qv, leak), c.zero), c.g_top);
    let fixed = _mm256_mul_epu32(target, c.slot_mul);
    let slot = pack32(min_i64(_mm256_srli_epi64::<32>(fixed), c.last_slot));
    // 24 of the 32 fraction bits are plenty for a guess, and fit a signed conversion.
    let fraction = _mm256_mul_pd(
        _mm256_cvtepi32_pd(pack32(_mm256_srli_epi64::<8>(_mm256_and_si256(fixed, _mm256_set1_epi64x(0xFFFF_FFFF))))),
        _mm256_set1_pd(1.0 / (1u64 << 24) as f64),
    );
    let za = _mm256_cvtps_pd(gather_f32(c.inverse, slot));
    let zb = _mm256_cvtps_pd(gather_f32(c.inverse, _mm_add_epi32(slot, _mm_set1_epi32(1))));
    let z = _mm256_add_pd(za, _mm256_mul_pd(_mm256_sub_pd(zb, za), fraction));
    let v = _mm256_add_pd(s.mu, _mm256_mul_pd(z, s.sigma));
    // The pattern holding v is the truncated ordinal k0 or its neighbour away from zero: two
    // candidates from `base`, whose `cum` values (`candidates`) are read side by side instead
    // of one after another (as `nearest_ordinal` would).
    let k0 = ordinal_toward_zero(c, v);
    let negative = _mm256_castpd_si256(_mm256_cmp_pd::<_CMP_LT_OQ>(v, _mm256_setzero_pd()));
    let hi = _mm256_sub_epi64(_mm256_add_epi64(s.lo, s.n), c.one);
    min_i64(max_i64(_mm256_add_epi64(k0, negative), s.lo), max_i64(_mm256_sub_epi64(hi, c.one), s.lo))
}

/// `cum` at `base`, `base + 1` and `base + 2` of one quad.
#[inline(always)]
unsafe fn candidates(c: &Consts, s: &Setups, q: [u32; 4], base: __m256i) -> Candidates {
    let hi = _mm256_sub_epi64(_mm256_add_epi64(s.lo, s.n), c.one);
    let (c0, c1) = cum_pair(c, s, base);
    let c2 = cum(c, s, _mm256_add_epi64(base, _mm256_set1_epi64x(2)));
    let mut out = Candidates { q, base: [0; 4], cums: [[0; 4]; 3], second: [0; 4] };
    _mm_storeu_si128(out.cums[0].as_mut_ptr() as *mut __m128i, c0);
    _mm_storeu_si128(out.cums[1].as_mut_ptr() as *mut __m128i, c1);
    _mm_storeu_si128(out.cums[2].as_mut_ptr() as *mut __m128i, c2);
    _mm256_storeu_si256(out.base.as_mut_ptr() as *mut __m256i, base);
    _mm256_storeu_si256(out.second.as_mut_ptr() as *mut __m256i, _mm256_cmpgt_epi64(hi, base));
    out
}

/// The coder steps of one quad, lane by lane in scalar order.
#[inline(always)]
unsafe fn finish<W: Word>(
    ex: &Exact,
    lanes: &mut [RangeDecoder],
    escapes: &mut RawPatternModel,
    out: &mut [W],
    s: &Setups,
    k: &Candidates,
) {
    for l in 0..4 {
        let (q, [c0, c1, c2]) = (k.q[l], [k.cums[0][l], k.cums[1][l], k.cums[2][l]]);
        // Which candidate `q` points at: a coin toss, so chosen with masks (an `if` here
        // compiles to a jump that mispredicts half the time).
        let up = (q >= c1) as u32;
        let mask = 0u32.wrapping_sub(up);
        let (low, high) = ((c0 & !mask) | (c1 & mask), (c1 & !mask) | (c2 & mask));
        // One branch, taken nearly always: `&` rather than `&&`, so that `up` decides no jump.
        // As in `Exact::decode_group`, `q < high` inside the window implies that `q` is below
        // the escape.
        let ordinal = if (c0 <= q) & (q < high) & ((up == 0) | (k.second[l] != 0)) {
            lanes[l].consume(low, high - low);
            k.base[l] + up as i64
        } else {
            let setup = lane_setup(ex, s, l);
            ex.decode_slow(&mut lanes[l], escapes, &setup, q, k.base[l], c0)
        };
        out[l] = W::from_ordinal(ordinal);
    }
}

/// `Exact::decode` for 8- and 16-bit formats and `4 * H` lanes: every group of `out` (a multiple of
/// `4 * H`).
///
/// Decoding is bound by latency: each lane's slot waits for its previous symbol, and the
/// guess, the candidates' `cum` and the coder step wait on the slot. With `H = 2` the two
/// quads' chains are independent, and their stages are interleaved in the instruction
/// stream (slots A, B; guesses A, B; `cum` A, B; steps A, B) so the processor works on both
/// at once.
///
/// # Safety
/// The processor must have AVX2 (`enabled()`); `lanes` holds `4 * H` decoders.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn decode<W: Word, const H: usize>(
    ex: &Exact,
    lanes: &mut [RangeDecoder],
    escapes: &mut RawPatternModel,
    out: &mut [W],
    mu: &[f32],
    codes: &[i16],
) -> usize {
    let width = 4 * H;
    assert_eq!(lanes.len(), width);
    let c = Consts::new(ex);
    let precision = ex.cdf.precision;
    for at in (0..out.len()).step_by(width) {
        let (mus, cs) = (&mu[at..at + width], &codes[at..at + width]);
        if !all_finite(mus) {
            for h in 0..H {
                let quad = 4 * h..4 * h + 4;
                let lanes: &mut [RangeDecoder; 4] = (&mut lanes[quad.clone()]).try_into().unwrap();
                let group = (&mut out[at + quad.start..at + quad.end]).try_into().unwrap();
                ex.decode_group(
                    lanes,
                    escapes,
                    group,
                    mus[quad.clone()].try_into().unwrap(),
                    cs[quad].try_into().unwrap(),
                );
            }
            continue;
        }
        let s: [Setups; H] = std::array::from_fn(|h| setup(&c, ex, &mus[4 * h..], &cs[4 * h..]));
        let mut q = [[0u32; 4]; H];
        for h in 0..H {
            for l in 0..4 {
                q[h][l] = lanes[4 * h + l].peek(precision);
            }
        }
        let mut base = [_mm256_setzero_si256(); H];
        for h in 0..H {
            base[h] = guess(&c, &s[h], q[h]);
        }
        let k: [Candidates; H] = std::array::from_fn(|h| candidates(&c, &s[h], q[h], base[h]));
        for h in 0..H {
            let quad = at + 4 * h..at + 4 * h + 4;
            finish(ex, &mut lanes[4 * h..4 * h + 4], escapes, &mut out[quad], &s[h], &k[h]);
        }
    }
    out.len()
}
