//! The exact model's group steps for all eight lanes in one vector, with AVX-512 (x86-64).
//!
//! The same steps as `avx2` (read its notes: every value that decides a coded interval is
//! computed with the portable code's operations in the same order, so the bytes are the same;
//! only the decoder's guess differs, and every guess is confirmed), eight scalars wide.
//!
//! The decoder also keeps the eight range decoders' state in vectors (`Coders`): measured on
//! a Zen 4, the per-lane scalar coder steps took more time than the vector guess and `cum`
//! together, and doing them as vector operations is what made this kernel faster than AVX2's
//! (widening the guess and `cum` alone gained a few percent). The slot `point / scale` has no
//! vector integer division: `slots` divides in floats and corrects the quotient exactly.

use std::arch::x86_64::*;
use std::sync::OnceLock;

use super::{Exact, Setup, Window};
use crate::coder::{RangeDecoder, SymbolSink};
use crate::model::mixture::{FRACTION_BITS, GUESS_BITS, STEPS_PER_Z};
use crate::model::RawPatternModel;
use crate::words::Word;

/// Lanes one kernel call codes side by side.
pub(crate) const WIDTH: usize = 8;

/// True when this processor has AVX-512F and AVX-512DQ and `SPECKV_SIMD` is neither `0` nor
/// `avx2`.
pub(crate) fn enabled() -> bool {
    static ENABLED: OnceLock<bool> = OnceLock::new();
    *ENABLED.get_or_init(|| {
        let wanted = std::env::var("SPECKV_SIMD").map_or(true, |v| !matches!(v.trim(), "0" | "avx2"));
        wanted
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512dq")
            && is_x86_feature_detected!("avx2")
    })
}

/// The constants of one stream's exact model, broadcast once per call.
struct Consts {
    min_ord: __m512i,
    max_ord: __m512i,
    max_mag: __m512i,
    rebias: __m512i,
    shift_m: __m512i,
    shift_keep: __m512i,
    sub_base: __m512i,
    exp_mask: __m512i,
    frac_mask: __m512i,
    implicit: __m512i,
    one: __m512i,
    zero: __m512i,
    last_edge: __m512i,
    last_pair: __m512i,
    half_width: __m512d,
    steps: __m512d,
    fraction_scale: __m512d,
    last_node: __m512d,
    g_top: __m512i,
    slot_mul: __m512i,
    last_slot: __m512i,
    full_window: bool,
    full_n: __m512i,
    edges: *const f32,
    nodes: *const u32,
    inverse: *const f32,
}

impl Consts {
    #[target_feature(enable = "avx512f,avx512dq,avx2")]
    unsafe fn new(ex: &Exact) -> Consts {
        let (m, bias, max_mag) = ex.grid.layout();
        let edges = ex.grid.edges();
        let nodes = ex.cdf.nodes();
        Consts {
            min_ord: _mm512_set1_epi64(ex.grid.min_ordinal),
            max_ord: _mm512_set1_epi64(ex.grid.max_ordinal),
            max_mag: _mm512_set1_epi64(max_mag as i64),
            rebias: _mm512_set1_epi64(1023 - bias),
            shift_m: _mm512_set1_epi64(m as i64),
            shift_keep: _mm512_set1_epi64(52 - m as i64),
            sub_base: _mm512_set1_epi64(52 - m as i64 + 1),
            exp_mask: _mm512_set1_epi64(0x7FF),
            frac_mask: _mm512_set1_epi64((1i64 << 52) - 1),
            implicit: _mm512_set1_epi64(1i64 << 52),
            one: _mm512_set1_epi64(1),
            zero: _mm512_setzero_si512(),
            last_edge: _mm512_set1_epi64(edges.len() as i64 - 1),
            last_pair: _mm512_set1_epi64(edges.len() as i64 - 2),
            half_width: _mm512_set1_pd(ex.cdf.half_width),
            steps: _mm512_set1_pd(STEPS_PER_Z),
            fraction_scale: _mm512_set1_pd((1u32 << FRACTION_BITS) as f64),
            last_node: _mm512_set1_pd((nodes.len() - 2) as f64),
            g_top: _mm512_set1_epi64(ex.cdf.g_max as i64 - 1),
            slot_mul: _mm512_set1_epi64(ex.cdf.slot_multiplier() as i64),
            last_slot: _mm512_set1_epi64((1i64 << GUESS_BITS) - 1),
            full_window: ex.grid.max_ordinal < 256,
            full_n: _mm512_set1_epi64(ex.grid.max_ordinal - ex.grid.min_ordinal + 1),
            edges: edges.as_ptr(),
            nodes: nodes.as_ptr(),
            inverse: ex.cdf.inverse_z().as_ptr(),
        }
    }
}

/// `ValueGrid::ordinal_toward_zero`, eight at once (see `avx2::ordinal_toward_zero`).
#[inline(always)]
unsafe fn ordinal_toward_zero(c: &Consts, v: __m512d) -> __m512i {
    let bits = _mm512_castpd_si512(v);
    let negative = _mm512_srai_epi64::<63>(bits);
    let e64 = _mm512_and_si512(_mm512_srli_epi64::<52>(bits), c.exp_mask);
    let frac = _mm512_and_si512(bits, c.frac_mask);
    let e = _mm512_sub_epi64(e64, c.rebias);
    let normal = _mm512_or_si512(_mm512_sllv_epi64(e, c.shift_m), _mm512_srlv_epi64(frac, c.shift_keep));
    let normal = _mm512_min_epi64(normal, c.max_mag);
    // A shift of 64 or more (every f64 subnormal and zero, e64 = 0, among them) gives 0.
    let shift = _mm512_sub_epi64(c.sub_base, e);
    let subnormal = _mm512_srlv_epi64(_mm512_or_si512(frac, c.implicit), shift);
    let subnormal = _mm512_mask_blend_epi64(_mm512_cmpeq_epi64_mask(e64, c.zero), subnormal, c.zero);
    let is_normal = _mm512_cmpgt_epi64_mask(e, c.zero);
    let magnitude = _mm512_mask_blend_epi64(is_normal, subnormal, normal);
    // Infinity: the largest magnitude; NaN: 0.
    let special = _mm512_cmpeq_epi64_mask(e64, c.exp_mask);
    let infinite = special & _mm512_cmpeq_epi64_mask(frac, c.zero);
    let magnitude = _mm512_mask_blend_epi64(infinite, magnitude, c.max_mag);
    let magnitude = _mm512_mask_blend_epi64(special & !infinite, magnitude, c.zero);
    _mm512_xor_si512(magnitude, negative)
}

/// Eight setups (`Exact::setup`), all with finite `mu`.
struct Setups {
    mu: __m512d,
    sigma: __m512d,
    inv_sigma: __m512d,
    lo: __m512i,
    n: __m512i,
}

#[inline(always)]
unsafe fn setup(c: &Consts, ex: &Exact, mu: &[f32], codes: &[i16]) -> Setups {
    let g = |l: usize| ex.sigmas.get(codes[l]);
    let s = [g(0), g(1), g(2), g(3), g(4), g(5), g(6), g(7)];
    let sigma = _mm512_setr_pd(s[0].0, s[1].0, s[2].0, s[3].0, s[4].0, s[5].0, s[6].0, s[7].0);
    let inv_sigma = _mm512_setr_pd(s[0].1, s[1].1, s[2].1, s[3].1, s[4].1, s[5].1, s[6].1, s[7].1);
    let mu = _mm512_cvtps_pd(_mm256_loadu_ps(mu.as_ptr()));
    if c.full_window {
        return Setups { mu, sigma, inv_sigma, lo: c.min_ord, n: c.full_n };
    }
    let reach = _mm512_mul_pd(c.half_width, sigma);
    let lo = _mm512_max_epi64(_mm512_sub_epi64(ordinal_toward_zero(c, _mm512_sub_pd(mu, reach)), c.one), c.min_ord);
    let hi = _mm512_min_epi64(_mm512_add_epi64(ordinal_toward_zero(c, _mm512_add_pd(mu, reach)), c.one), c.max_ord);
    let n = _mm512_add_epi64(_mm512_sub_epi64(hi, lo), c.one);
    Setups { mu, sigma, inv_sigma, lo, n }
}

/// `MixtureCdf::eval` of eight `z`, each node pair read with one 64-bit gather.
#[inline(always)]
unsafe fn eval(c: &Consts, z: __m512d) -> __m256i {
    let t = _mm512_mul_pd(_mm512_add_pd(z, c.half_width), c.steps);
    let t = _mm512_min_pd(_mm512_max_pd(t, _mm512_setzero_pd()), c.last_node);
    let fixed = _mm512_cvttpd_epi32(_mm512_mul_pd(t, c.fraction_scale));
    let i = _mm256_srli_epi32::<{ FRACTION_BITS as i32 }>(fixed);
    let fraction = _mm256_and_si256(fixed, _mm256_set1_epi32((1 << FRACTION_BITS) - 1));
    let pairs = _mm512_i32gather_epi64::<4>(i, c.nodes as *const i64);
    let a = _mm512_and_si512(pairs, _mm512_set1_epi64(0xFFFF_FFFF));
    let b = _mm512_srli_epi64::<32>(pairs);
    let rise = _mm512_mul_epu32(_mm512_sub_epi64(b, a), _mm512_cvtepu32_epi64(fraction));
    _mm512_cvtepi64_epi32(_mm512_add_epi64(a, _mm512_srli_epi64::<{ FRACTION_BITS }>(rise)))
}

/// `(cum(k), cum(k + 1))` of eight ordinals, the two edges read with one 64-bit gather.
#[inline(always)]
unsafe fn cum_pair(c: &Consts, s: &Setups, k: __m512i) -> (__m256i, __m256i) {
    let index = _mm512_min_epi64(_mm512_max_epi64(_mm512_sub_epi64(k, c.min_ord), c.zero), c.last_pair);
    let pairs = _mm512_i32gather_epi64::<4>(_mm512_cvtepi64_epi32(index), c.edges as *const i64);
    let lower = _mm512_cvtepi64_epi32(pairs);
    let upper = _mm512_cvtepi64_epi32(_mm512_srli_epi64::<32>(pairs));
    let z0 = _mm512_mul_pd(_mm512_sub_pd(_mm512_cvtps_pd(_mm256_castsi256_ps(lower)), s.mu), s.inv_sigma);
    let z1 = _mm512_mul_pd(_mm512_sub_pd(_mm512_cvtps_pd(_mm256_castsi256_ps(upper)), s.mu), s.inv_sigma);
    let leak = _mm512_cvtepi64_epi32(_mm512_sub_epi64(k, s.lo));
    let below = _mm256_add_epi32(eval(c, z0), leak);
    let above = _mm256_add_epi32(eval(c, z1), _mm256_add_epi32(leak, _mm256_set1_epi32(1)));
    (below, above)
}

/// `Exact::cum` of eight ordinals.
#[inline(always)]
unsafe fn cum(c: &Consts, s: &Setups, k: __m512i) -> __m256i {
    let index = _mm512_min_epi64(_mm512_max_epi64(_mm512_sub_epi64(k, c.min_ord), c.zero), c.last_edge);
    let edge = _mm512_cvtps_pd(_mm256_i32gather_ps::<4>(c.edges, _mm512_cvtepi64_epi32(index)));
    let z = _mm512_mul_pd(_mm512_sub_pd(edge, s.mu), s.inv_sigma);
    _mm256_add_epi32(eval(c, z), _mm512_cvtepi64_epi32(_mm512_sub_epi64(k, s.lo)))
}

/// The portable setup of lane `l`, for the slow paths.
#[inline(always)]
unsafe fn lane_setup(ex: &Exact, s: &Setups, l: usize) -> Setup {
    let (mut mu, mut sigma, mut inv, mut lo, mut n) = ([0f64; 8], [0f64; 8], [0f64; 8], [0i64; 8], [0i64; 8]);
    _mm512_storeu_pd(mu.as_mut_ptr(), s.mu);
    _mm512_storeu_pd(sigma.as_mut_ptr(), s.sigma);
    _mm512_storeu_pd(inv.as_mut_ptr(), s.inv_sigma);
    _mm512_storeu_si512(lo.as_mut_ptr() as *mut __m512i, s.lo);
    _mm512_storeu_si512(n.as_mut_ptr() as *mut __m512i, s.n);
    let window = Window { lo: lo[l], n: n[l] as u32 };
    Setup { mu: mu[l], sigma: sigma[l], inv_sigma: inv[l], window, escape: ex.cdf.g_max + window.n }
}

/// The eight range encoders' `(low, range)` in vectors (see `RangeEncoder::state`).
struct Encoders {
    low: __m512i,
    range: __m512i,
}

impl Encoders {
    /// `Some` when every lane is a range encoder.
    #[inline(always)]
    unsafe fn new<S: SymbolSink>(lanes: &mut [S; WIDTH]) -> Option<Encoders> {
        if lanes.iter_mut().all(|l| l.as_range_encoder().is_some()) {
            Some(Encoders::load(lanes))
        } else {
            None
        }
    }

    #[inline(always)]
    unsafe fn load<S: SymbolSink>(lanes: &mut [S; WIDTH]) -> Encoders {
        let mut st = [(0u64, 0u64); WIDTH];
        for (s, lane) in st.iter_mut().zip(lanes.iter_mut()) {
            *s = lane.as_range_encoder().map_or((0, 0), |e| e.state());
        }
        Encoders { low: per_lane(|l| st[l].0), range: per_lane(|l| st[l].1) }
    }

    #[inline(always)]
    unsafe fn store<S: SymbolSink>(&self, lanes: &mut [S; WIDTH]) {
        let (mut low, mut range) = ([0u64; WIDTH], [0u64; WIDTH]);
        _mm512_storeu_si512(low.as_mut_ptr() as *mut __m512i, self.low);
        _mm512_storeu_si512(range.as_mut_ptr() as *mut __m512i, self.range);
        for (l, lane) in lanes.iter_mut().enumerate() {
            if let Some(e) = lane.as_range_encoder() {
                e.set_state(low[l], range[l]);
            }
        }
    }
}

/// `RangeEncoder::put` of the lanes in `take`: `[cum, cum + freq)` of `2^precision`. A carry
/// out of `low` (rare) ripples into that lane's written words, then lanes whose range fell
/// below 2^32 write their top word, in the same order as the scalar `put`.
#[inline(always)]
unsafe fn put<S: SymbolSink>(
    k: &mut Encoders,
    lanes: &mut [S; WIDTH],
    take: __mmask8,
    shift: __m512i,
    cum: __m512i,
    freq: __m512i,
) {
    let r = _mm512_srlv_epi64(k.range, shift);
    let low = _mm512_add_epi64(k.low, _mm512_mullo_epi64(r, cum));
    let carry = take & _mm512_cmplt_epu64_mask(low, k.low);
    let range = _mm512_mullo_epi64(r, freq);
    let flush = take & _mm512_cmplt_epu64_mask(range, _mm512_set1_epi64(1 << 32));
    if (carry | flush) != 0 {
        let mut words = [0u64; WIDTH];
        _mm512_storeu_si512(words.as_mut_ptr() as *mut __m512i, _mm512_srli_epi64::<32>(low));
        let mut each = carry | flush;
        while each != 0 {
            let l = each.trailing_zeros() as usize;
            each &= each - 1;
            if let Some(e) = lanes[l].as_range_encoder() {
                if carry >> l & 1 == 1 {
                    e.propagate_carry();
                }
                if flush >> l & 1 == 1 {
                    e.push_word(words[l] as u32);
                }
            }
        }
    }
    let low_after = _mm512_mask_slli_epi64(low, flush, low, 32);
    let range_after = _mm512_mask_slli_epi64(range, flush, range, 32);
    k.low = _mm512_mask_blend_epi64(take, k.low, low_after);
    k.range = _mm512_mask_blend_epi64(take, k.range, range_after);
}

/// `Exact::encode` for eight lanes: every group of `x` (a multiple of 8).
///
/// # Safety
/// The processor must have AVX-512F, AVX-512DQ and AVX2 (`enabled()`).
#[target_feature(enable = "avx512f,avx512dq,avx2")]
pub(crate) unsafe fn encode<W: Word, S: SymbolSink>(
    ex: &Exact,
    lanes: &mut [S; WIDTH],
    escapes: &mut RawPatternModel,
    x: &[W],
    mu: &[f32],
    codes: &[i16],
) -> usize {
    let c = Consts::new(ex);
    let precision = ex.cdf.precision;
    let shift = _mm512_set1_epi64(precision as i64);
    // Real range encoders keep their state in vectors (`Encoders`); other sinks (the ideal
    // meter) take `put` calls.
    let mut coders = Encoders::new(lanes);
    for base in (0..x.len()).step_by(WIDTH) {
        let (xs, mus, cs) = (&x[base..base + WIDTH], &mu[base..base + WIDTH], &codes[base..base + WIDTH]);
        if !mus.iter().all(|m| m.is_finite()) {
            if let Some(coders) = coders.as_ref() {
                coders.store(lanes);
            }
            ex.encode_group(lanes, escapes, xs.try_into().unwrap(), mus.try_into().unwrap(), cs.try_into().unwrap());
            if let Some(coders) = coders.as_mut() {
                *coders = Encoders::load(lanes);
            }
            continue;
        }
        let s = setup(&c, ex, mus, cs);
        let k = _mm512_setr_epi64(
            xs[0].ordinal(),
            xs[1].ordinal(),
            xs[2].ordinal(),
            xs[3].ordinal(),
            xs[4].ordinal(),
            xs[5].ordinal(),
            xs[6].ordinal(),
            xs[7].ordinal(),
        );
        let hi = _mm512_sub_epi64(_mm512_add_epi64(s.lo, s.n), c.one);
        let kc = _mm512_min_epi64(_mm512_max_epi64(k, s.lo), hi);
        let (b, a) = cum_pair(&c, &s, kc);
        // In the window when k == kc.
        let inside = _mm512_cmpeq_epi64_mask(k, kc);
        if let Some(coders) = coders.as_mut() {
            let (b, a) = (_mm512_cvtepu32_epi64(b), _mm512_cvtepu32_epi64(a));
            put(coders, lanes, inside, shift, b, _mm512_sub_epi64(a, b));
            if inside != 0xFF {
                // Escapes, in lane order, by the scalar encoders.
                coders.store(lanes);
                for l in 0..WIDTH {
                    if inside >> l & 1 == 0 {
                        let setup = lane_setup(ex, &s, l);
                        ex.encode_slow(&mut lanes[l], escapes, xs[l], &setup);
                    }
                }
                *coders = Encoders::load(lanes);
            }
            continue;
        }
        let (mut below, mut above) = ([0u32; WIDTH], [0u32; WIDTH]);
        _mm256_storeu_si256(below.as_mut_ptr() as *mut __m256i, b);
        _mm256_storeu_si256(above.as_mut_ptr() as *mut __m256i, a);
        for l in 0..WIDTH {
            if inside >> l & 1 == 1 {
                lanes[l].put(below[l], above[l] - below[l], precision);
            } else {
                let setup = lane_setup(ex, &s, l);
                ex.encode_slow(&mut lanes[l], escapes, xs[l], &setup);
            }
        }
    }
    if let Some(coders) = coders {
        coders.store(lanes);
    }
    x.len()
}

/// `[f(0), .., f(7)]` as one vector of 64-bit lanes.
#[inline(always)]
unsafe fn per_lane(f: impl Fn(usize) -> u64) -> __m512i {
    let v = |l: usize| f(l) as i64;
    _mm512_setr_epi64(v(0), v(1), v(2), v(3), v(4), v(5), v(6), v(7))
}

/// The eight decoders' state in vectors (see `RangeDecoder::state`), with where each lane's
/// bytes are.
struct Coders {
    point: __m512i,
    range: __m512i,
    pos: __m512i,
    /// Address of each lane's first byte, and its length.
    base: __m512i,
    len: __m512i,
}

impl Coders {
    #[inline(always)]
    unsafe fn load(lanes: &[RangeDecoder; WIDTH]) -> Coders {
        let st: [(u64, u64, u64, u64); WIDTH] = [
            lanes[0].state(),
            lanes[1].state(),
            lanes[2].state(),
            lanes[3].state(),
            lanes[4].state(),
            lanes[5].state(),
            lanes[6].state(),
            lanes[7].state(),
        ];
        Coders {
            point: per_lane(|l| st[l].0),
            range: per_lane(|l| st[l].1),
            pos: per_lane(|l| st[l].3),
            base: per_lane(|l| lanes[l].input().as_ptr() as u64),
            len: per_lane(|l| lanes[l].input().len() as u64),
        }
    }

    /// Hands the state back to the scalar decoders (`scale` is what `consume` would use).
    #[inline(always)]
    unsafe fn store(&self, lanes: &mut [RangeDecoder; WIDTH], scale: __m512i) {
        let (mut p, mut r, mut s, mut q) = ([0u64; WIDTH], [0u64; WIDTH], [0u64; WIDTH], [0u64; WIDTH]);
        _mm512_storeu_si512(p.as_mut_ptr() as *mut __m512i, self.point);
        _mm512_storeu_si512(r.as_mut_ptr() as *mut __m512i, self.range);
        _mm512_storeu_si512(s.as_mut_ptr() as *mut __m512i, scale);
        _mm512_storeu_si512(q.as_mut_ptr() as *mut __m512i, self.pos);
        for (l, lane) in lanes.iter_mut().enumerate() {
            lane.set_state(p[l], r[l], s[l], q[l]);
        }
    }
}

/// `RangeDecoder::peek` of eight decoders: `min(point / scale, 2^precision - 1)`, exactly.
/// There is no integer division in vectors; a float quotient is off by at most one where it
/// matters (the point converts with a relative error of 2^-53 and the quotient is clamped to
/// 2^precision first), and one multiply and compare each way corrects it.
#[inline(always)]
unsafe fn slots(point: __m512i, scale: __m512i, top: __m512i) -> __m512i {
    let estimate = _mm512_cvttpd_epu64(_mm512_div_pd(_mm512_cvtepu64_pd(point), _mm512_cvtepu64_pd(scale)));
    let q = _mm512_min_epu64(estimate, top);
    // q <= 2^precision keeps q * scale <= range: no overflow.
    let product = _mm512_mullo_epi64(q, scale);
    let over = _mm512_cmpgt_epu64_mask(product, point);
    let q = _mm512_mask_sub_epi64(q, over, q, _mm512_set1_epi64(1));
    let product = _mm512_mask_sub_epi64(product, over, product, scale);
    let under = !over & _mm512_cmpge_epu64_mask(_mm512_sub_epi64(point, product), scale);
    let q = _mm512_mask_add_epi64(q, under, q, _mm512_set1_epi64(1));
    _mm512_min_epu64(q, _mm512_sub_epi64(top, _mm512_set1_epi64(1)))
}

/// `RangeDecoder::consume` of the lanes in `take`: remove `[low, high)`, shift in a word where
/// the range fell below 2^32.
#[inline(always)]
unsafe fn consume(
    k: &mut Coders,
    lanes: &[RangeDecoder; WIDTH],
    take: __mmask8,
    scale: __m512i,
    low: __m512i,
    high: __m512i,
) {
    let point = _mm512_sub_epi64(k.point, _mm512_mullo_epi64(scale, low));
    let range = _mm512_max_epu64(_mm512_mullo_epi64(scale, _mm512_sub_epi64(high, low)), _mm512_set1_epi64(1));
    let refill = take & _mm512_cmplt_epu64_mask(range, _mm512_set1_epi64(1 << 32));
    let whole = _mm512_cmple_epu64_mask(_mm512_add_epi64(k.pos, _mm512_set1_epi64(4)), k.len);
    let addresses = _mm512_add_epi64(k.base, k.pos);
    // SAFETY: only lanes whose next four bytes lie inside their input are read.
    let mut words = _mm512_cvtepu32_epi64(_mm512_mask_i64gather_epi32::<1>(
        _mm256_setzero_si256(),
        refill & whole,
        addresses,
        std::ptr::null::<i32>(),
    ));
    if refill & !whole != 0 {
        words = short_words(k, lanes, refill & !whole, words);
    }
    let shifted = _mm512_or_si512(_mm512_slli_epi64::<32>(point), words);
    k.point = _mm512_mask_blend_epi64(take, k.point, _mm512_mask_blend_epi64(refill, point, shifted));
    k.range =
        _mm512_mask_blend_epi64(take, k.range, _mm512_mask_blend_epi64(refill, range, _mm512_slli_epi64::<32>(range)));
    k.pos = _mm512_mask_add_epi64(k.pos, refill, k.pos, _mm512_set1_epi64(4));
}

/// The last, short (or absent) words of the lanes in `which` (`RangeDecoder::word_at`).
#[cold]
#[inline(never)]
#[target_feature(enable = "avx512f,avx512dq,avx2")]
unsafe fn short_words(k: &Coders, lanes: &[RangeDecoder; WIDTH], which: __mmask8, words: __m512i) -> __m512i {
    let (mut pos, mut w) = ([0u64; WIDTH], [0u64; WIDTH]);
    _mm512_storeu_si512(pos.as_mut_ptr() as *mut __m512i, k.pos);
    _mm512_storeu_si512(w.as_mut_ptr() as *mut __m512i, words);
    for l in 0..WIDTH {
        if which >> l & 1 == 1 {
            w[l] = lanes[l].word_at(pos[l]) as u64;
        }
    }
    _mm512_loadu_si512(w.as_ptr() as *const __m512i)
}

/// `Exact::decode` for eight lanes: every group of `out` (a multiple of 8). The decoders'
/// state stays in vectors for the whole run: slots, guesses, `cum` and the coder steps of all
/// eight lanes are vector operations, and only misses, escapes and non-finite predictions
/// hand a lane to the scalar code.
///
/// # Safety
/// The processor must have AVX-512F, AVX-512DQ and AVX2 (`enabled()`).
#[target_feature(enable = "avx512f,avx512dq,avx2")]
pub(crate) unsafe fn decode<W: Word>(
    ex: &Exact,
    lanes: &mut [RangeDecoder; WIDTH],
    escapes: &mut RawPatternModel,
    out: &mut [W],
    mu: &[f32],
    codes: &[i16],
) -> usize {
    let c = Consts::new(ex);
    let precision = ex.cdf.precision;
    let top = _mm512_set1_epi64(1i64 << precision);
    let shift = _mm512_set1_epi64(precision as i64);
    let len = out.len();
    let finite = |base: usize| mu[base..base + WIDTH].iter().all(|m| m.is_finite());
    let mut k = Coders::load(lanes);
    // Software pipelining: the next group's setup (which does not wait on the coders) is
    // computed before this group's coder steps.
    let mut next = (len > 0 && finite(0)).then(|| setup(&c, ex, &mu[..WIDTH], &codes[..WIDTH]));
    for base in (0..len).step_by(WIDTH) {
        let (mus, cs) = (&mu[base..base + WIDTH], &codes[base..base + WIDTH]);
        let group: &mut [W; WIDTH] = (&mut out[base..base + WIDTH]).try_into().unwrap();
        let following = base + WIDTH;
        let Some(s) = next.take() else {
            k.store(lanes, _mm512_srlv_epi64(k.range, shift));
            ex.decode_group(lanes, escapes, group, mus.try_into().unwrap(), cs.try_into().unwrap());
            k = Coders::load(lanes);
            next = (following < len && finite(following))
                .then(|| setup(&c, ex, &mu[following..following + WIDTH], &codes[following..following + WIDTH]));
            continue;
        };
        let scale = _mm512_srlv_epi64(k.range, shift);
        let qv = slots(k.point, scale, top);
        // The guess (`Exact::guess`, in lower precision): leak off q, inverse CDF, value.
        let leak =
            _mm512_min_epi64(_mm512_max_epi64(_mm512_sub_epi64(ordinal_toward_zero(&c, s.mu), s.lo), c.zero), s.n);
        let target = _mm512_min_epi64(_mm512_max_epi64(_mm512_sub_epi64(qv, leak), c.zero), c.g_top);
        let fixed = _mm512_mul_epu32(target, c.slot_mul);
        let slot = _mm512_cvtepi64_epi32(_mm512_min_epi64(_mm512_srli_epi64::<32>(fixed), c.last_slot));
        let fraction = _mm512_mul_pd(
            _mm512_cvtepi32_pd(_mm512_cvtepi64_epi32(_mm512_srli_epi64::<8>(_mm512_and_si512(
                fixed,
                _mm512_set1_epi64(0xFFFF_FFFF),
            )))),
            _mm512_set1_pd(1.0 / (1u64 << 24) as f64),
        );
        let za = _mm512_cvtps_pd(_mm256_i32gather_ps::<4>(c.inverse, slot));
        let zb = _mm512_cvtps_pd(_mm256_i32gather_ps::<4>(c.inverse, _mm256_add_epi32(slot, _mm256_set1_epi32(1))));
        let z = _mm512_add_pd(za, _mm512_mul_pd(_mm512_sub_pd(zb, za), fraction));
        let v = _mm512_add_pd(s.mu, _mm512_mul_pd(z, s.sigma));
        // Two candidates from `first` (see `avx2::guess`).
        let k0 = ordinal_toward_zero(&c, v);
        let negative = _mm512_srai_epi64::<63>(_mm512_castpd_si512(v));
        let hi = _mm512_sub_epi64(_mm512_add_epi64(s.lo, s.n), c.one);
        let first = _mm512_min_epi64(
            _mm512_max_epi64(_mm512_add_epi64(k0, negative), s.lo),
            _mm512_max_epi64(_mm512_sub_epi64(hi, c.one), s.lo),
        );
        let (c0, c1) = cum_pair(&c, &s, first);
        let c2 = cum(&c, &s, _mm512_add_epi64(first, _mm512_set1_epi64(2)));
        let (c0, c1, c2) = (_mm512_cvtepu32_epi64(c0), _mm512_cvtepu32_epi64(c1), _mm512_cvtepu32_epi64(c2));
        next = (following < len && finite(following))
            .then(|| setup(&c, ex, &mu[following..following + WIDTH], &codes[following..following + WIDTH]));
        // Which candidate q points at, and whether it is confirmed (as in `avx2::finish`;
        // inside the window, q below the candidate's upper end is below the escape).
        let up = _mm512_cmpge_epu64_mask(qv, c1);
        let low = _mm512_mask_blend_epi64(up, c0, c1);
        let high = _mm512_mask_blend_epi64(up, c1, c2);
        let second = _mm512_cmpgt_epi64_mask(hi, first);
        let hit = _mm512_cmple_epu64_mask(c0, qv) & _mm512_cmplt_epu64_mask(qv, high) & (!up | second);
        let ordinal = _mm512_mask_add_epi64(first, up, first, c.one);
        let missed = !hit;
        if missed != 0 {
            // The scalar slow path sees the lanes' state before this group's symbols.
            k.store(lanes, scale);
        }
        consume(&mut k, lanes, hit, scale, low, high);
        let mut ords = [0i64; WIDTH];
        _mm512_storeu_si512(ords.as_mut_ptr() as *mut __m512i, ordinal);
        if missed != 0 {
            let (mut q, mut firsts, mut c0s) = ([0u64; WIDTH], [0i64; WIDTH], [0u64; WIDTH]);
            _mm512_storeu_si512(q.as_mut_ptr() as *mut __m512i, qv);
            _mm512_storeu_si512(firsts.as_mut_ptr() as *mut __m512i, first);
            _mm512_storeu_si512(c0s.as_mut_ptr() as *mut __m512i, c0);
            for l in 0..WIDTH {
                if missed >> l & 1 == 1 {
                    let setup = lane_setup(ex, &s, l);
                    ords[l] = ex.decode_slow(&mut lanes[l], escapes, &setup, q[l] as u32, firsts[l], c0s[l] as u32);
                }
            }
            // Take back the missed lanes' state; the others' is in `k` already.
            let back = Coders::load(lanes);
            k.point = _mm512_mask_blend_epi64(missed, k.point, back.point);
            k.range = _mm512_mask_blend_epi64(missed, k.range, back.range);
            k.pos = _mm512_mask_blend_epi64(missed, k.pos, back.pos);
        }
        for (slot, &o) in group.iter_mut().zip(&ords) {
            *slot = W::from_ordinal(o);
        }
    }
    k.store(lanes, _mm512_srlv_epi64(k.range, shift));
    len
}
