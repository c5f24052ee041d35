//! The exact model's group steps for all eight lanes in one vector, with AVX-512 (x86-64).
//!
//! The same steps as `avx2` (read its notes: every value that decides a coded interval is
//! computed with the portable code's operations in the same order, so the bytes are the same;
//! only the decoder's guess differs, and every guess is confirmed), eight scalars wide. The
//! decoder is bound by the latency of one group's chain (slot, guess, `cum`, coder step):
//! eight lanes in one chain decode twice as many symbols per chain as the AVX2 kernel's four,
//! without needing the processor to overlap two chains.

use std::arch::x86_64::*;
use std::sync::OnceLock;

use super::{Exact, Setup, Window};
use crate::coder::{RangeDecoder, SymbolSink};
use crate::model::mixture::{FRACTION_BITS, GUESS_BITS, STEPS_PER_Z};
use crate::model::RawPatternModel;
use crate::words::Word;

/// Lanes one kernel call codes side by side.
pub(crate) const WIDTH: usize = 8;

/// True when this processor has AVX-512F and `SPECKV_SIMD` is neither `0` nor `avx2`.
pub(crate) fn enabled() -> bool {
    static ENABLED: OnceLock<bool> = OnceLock::new();
    *ENABLED.get_or_init(|| {
        let wanted = std::env::var("SPECKV_SIMD").map_or(true, |v| !matches!(v.trim(), "0" | "avx2"));
        wanted && is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx2")
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
    #[target_feature(enable = "avx512f,avx2")]
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
    let leak = (ex.grid.ordinal_toward_zero(mu[l]) - window.lo).clamp(0, window.n as i64) as u32;
    Setup { mu: mu[l], sigma: sigma[l], inv_sigma: inv[l], window, leak, escape: ex.cdf.g_max + window.n }
}

/// `Exact::encode` for eight lanes: every group of `x` (a multiple of 8).
///
/// # Safety
/// The processor must have AVX-512F and AVX2 (`enabled()`).
#[target_feature(enable = "avx512f,avx2")]
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
    for base in (0..x.len()).step_by(WIDTH) {
        let (xs, mus, cs) = (&x[base..base + WIDTH], &mu[base..base + WIDTH], &codes[base..base + WIDTH]);
        if !mus.iter().all(|m| m.is_finite()) {
            ex.encode_group(lanes, escapes, xs.try_into().unwrap(), mus.try_into().unwrap(), cs.try_into().unwrap());
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
        let (mut below, mut above) = ([0u32; WIDTH], [0u32; WIDTH]);
        let (b, a) = cum_pair(&c, &s, kc);
        _mm256_storeu_si256(below.as_mut_ptr() as *mut __m256i, b);
        _mm256_storeu_si256(above.as_mut_ptr() as *mut __m256i, a);
        // In the window when k == kc.
        let inside = _mm512_cmpeq_epi64_mask(k, kc);
        for l in 0..WIDTH {
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

/// `Exact::decode` for eight lanes: every group of `out` (a multiple of 8).
///
/// # Safety
/// The processor must have AVX-512F and AVX2 (`enabled()`).
#[target_feature(enable = "avx512f,avx2")]
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
    let len = out.len();
    let finite = |base: usize| mu[base..base + WIDTH].iter().all(|m| m.is_finite());
    // Software pipelining: the next group's setup (which does not wait on the coders) is
    // computed before this group's coder steps, so it fills the time this group's chain
    // waits on its loads.
    let mut next = (!out.is_empty() && finite(0)).then(|| setup(&c, ex, &mu[..WIDTH], &codes[..WIDTH]));
    for base in (0..out.len()).step_by(WIDTH) {
        let (mus, cs) = (&mu[base..base + WIDTH], &codes[base..base + WIDTH]);
        let group: &mut [W; WIDTH] = (&mut out[base..base + WIDTH]).try_into().unwrap();
        let following = base + WIDTH;
        let Some(s) = next.take() else {
            ex.decode_group(lanes, escapes, group, mus.try_into().unwrap(), cs.try_into().unwrap());
            next = (following < len && finite(following))
                .then(|| setup(&c, ex, &mu[following..following + WIDTH], &codes[following..following + WIDTH]));
            continue;
        };
        let q: [u32; WIDTH] = [
            lanes[0].peek(precision),
            lanes[1].peek(precision),
            lanes[2].peek(precision),
            lanes[3].peek(precision),
            lanes[4].peek(precision),
            lanes[5].peek(precision),
            lanes[6].peek(precision),
            lanes[7].peek(precision),
        ];
        let qv = _mm512_setr_epi64(
            q[0] as i64,
            q[1] as i64,
            q[2] as i64,
            q[3] as i64,
            q[4] as i64,
            q[5] as i64,
            q[6] as i64,
            q[7] as i64,
        );
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
        // Two candidates from `base` (see `avx2::guess`).
        let k0 = ordinal_toward_zero(&c, v);
        let negative = _mm512_srai_epi64::<63>(_mm512_castpd_si512(v));
        let hi = _mm512_sub_epi64(_mm512_add_epi64(s.lo, s.n), c.one);
        let first = _mm512_min_epi64(
            _mm512_max_epi64(_mm512_add_epi64(k0, negative), s.lo),
            _mm512_max_epi64(_mm512_sub_epi64(hi, c.one), s.lo),
        );
        let (c0, c1) = cum_pair(&c, &s, first);
        let c2 = cum(&c, &s, _mm512_add_epi64(first, _mm512_set1_epi64(2)));
        let second = _mm512_cmpgt_epi64_mask(hi, first);
        let (mut cs, mut ks) = ([[0u32; WIDTH]; 3], [0i64; WIDTH]);
        _mm256_storeu_si256(cs[0].as_mut_ptr() as *mut __m256i, c0);
        _mm256_storeu_si256(cs[1].as_mut_ptr() as *mut __m256i, c1);
        _mm256_storeu_si256(cs[2].as_mut_ptr() as *mut __m256i, c2);
        _mm512_storeu_si512(ks.as_mut_ptr() as *mut __m512i, first);
        next = (following < len && finite(following))
            .then(|| setup(&c, ex, &mu[following..following + WIDTH], &codes[following..following + WIDTH]));
        for l in 0..WIDTH {
            let (q, [c0, c1, c2]) = (q[l], [cs[0][l], cs[1][l], cs[2][l]]);
            // As in `avx2::finish`: the candidate chosen by masks, one branch taken nearly
            // always.
            let up = (q >= c1) as u32;
            let mask = 0u32.wrapping_sub(up);
            let (low, high) = ((c0 & !mask) | (c1 & mask), (c1 & !mask) | (c2 & mask));
            let ordinal = if (c0 <= q) & (q < high) & ((up == 0) | (second >> l & 1 == 1)) {
                lanes[l].consume(low, high - low);
                ks[l] + up as i64
            } else {
                let setup = lane_setup(ex, &s, l);
                ex.decode_slow(&mut lanes[l], escapes, &setup, q, ks[l], c0)
            };
            group[l] = W::from_ordinal(ordinal);
        }
    }
    out.len()
}
