//! Calibration statistics, summed exactly: per channel of a cache, the sum of its values, of
//! its squared residuals against the prediction (bf16 mode) and of its squared residuals in
//! the fp8 mode. The CUDA module computes the same numbers on the GPU
//! (`cuda/speckv_stats.cuh`), so these statistics do not depend on where they were taken.
//!
//! Invariant (S1), what makes the sums bit-identical whatever the order, thread count or device:
//! every term is computed with correctly rounded float64 operations in a fixed order (below),
//! then turned into a fixed-point integer `trunc(term * 2^64)` (toward zero; magnitudes clamped
//! to `2^FIXED_CLAMP_LOG2` units), and terms are added as 192-bit two's complement integers,
//! which associate and commute. One rounding to float64 happens at the end, by the caller
//! (Python: `int / 2**64`, correctly rounded). Non-finite terms add nothing.
//!
//! Terms of a scalar with cache value `t`, prediction `p` (bf16 mode) and `p8` (fp8 mode, in
//! cache units), fp8 scale `s`, and `q` the value of `t` quantised to fp8 (in fp8 units):
//!
//! ```text
//! value      t
//! bf16       (t - p)^2
//! fp8        (q - p8 / s)^2
//! ```

/// Fraction bits of the fixed-point terms.
pub const FIXED_FRACTION_BITS: i32 = 64;
/// Largest magnitude of one term, in units of `2^-64`: `2^160` (values up to `2^96`), so
/// `2^31` terms cannot overflow the 192-bit sum.
pub const FIXED_CLAMP_LOG2: i32 = 160;

/// A 192-bit two's complement integer, least significant limb first.
pub type Fixed = [u64; 3];

/// `trunc(v * 2^64)` as a [`Fixed`] (S1): exact from the bits of `v`; 0 for non-finite `v`.
pub fn fixed(v: f64) -> Fixed {
    let Some((negative, mantissa, shift)) = parts(v) else {
        return [0; 3];
    };
    let mut magnitude: Fixed = [0; 3];
    if shift + 53 > FIXED_CLAMP_LOG2 {
        magnitude[2] = 1u64 << (FIXED_CLAMP_LOG2 - 128);
    } else if shift >= 0 {
        let (limb, within) = ((shift / 64) as usize, (shift % 64) as u32);
        magnitude[limb] = mantissa << within;
        if within > 0 && limb + 1 < 3 {
            magnitude[limb + 1] = mantissa >> (64 - within);
        }
    } else if shift > -64 {
        magnitude[0] = mantissa >> (-shift) as u32;
    }
    if negative {
        negate(&mut magnitude);
    }
    magnitude
}

/// A finite `v` as `(negative, mantissa, shift)` with `|v| * 2^64 = mantissa * 2^shift`
/// (`mantissa < 2^53`); `None` for infinities and NaN.
#[inline(always)]
fn parts(v: f64) -> Option<(bool, u64, i32)> {
    let bits = v.to_bits();
    let biased = ((bits >> 52) & 0x7FF) as i32;
    if biased == 0x7FF {
        return None;
    }
    let mantissa = (bits & ((1u64 << 52) - 1)) | if biased != 0 { 1u64 << 52 } else { 0 };
    // v = mantissa * 2^e, e = max(biased, 1) - 1075; in units of 2^-64: mantissa << (e + 64)
    Some((bits >> 63 == 1, mantissa, biased.max(1) - 1075 + FIXED_FRACTION_BITS))
}

fn negate(x: &mut Fixed) {
    let mut carry = 1u64;
    for limb in x.iter_mut() {
        let (sum, overflow) = (!*limb).overflowing_add(carry);
        *limb = sum;
        carry = overflow as u64;
    }
}

/// `acc += x` (mod 2^192).
pub fn add(acc: &mut Fixed, x: &Fixed) {
    let mut carry = 0u64;
    for (a, &b) in acc.iter_mut().zip(x) {
        let (s1, o1) = a.overflowing_add(b);
        let (s2, o2) = s1.overflowing_add(carry);
        *a = s2;
        carry = (o1 | o2) as u64;
    }
}

/// `fixed(v)` as an `i128` when its magnitude is below `2^SMALL_LOG2` units (the common
/// case: values and squared residuals below `2^36`), else `None`. The same integer: only the
/// width differs, so sums of these are `fixed` sums.
#[inline(always)]
fn small_fixed(v: f64) -> Option<i128> {
    let Some((negative, mantissa, shift)) = parts(v) else {
        return Some(0);
    };
    let magnitude = if shift >= 0 {
        if shift + 53 > SMALL_LOG2 {
            return None;
        }
        (mantissa as i128) << shift
    } else if shift > -64 {
        (mantissa >> -shift) as i128
    } else {
        0
    };
    Some(if negative { -magnitude } else { magnitude })
}

/// Largest magnitude (log2, in units) `small_fixed` takes; `2^(126 - SMALL_LOG2)` of them add
/// up in an `i128` without overflow, so partial sums are flushed that often.
const SMALL_LOG2: i32 = 100;
const SMALL_TERMS: usize = 1 << 25;

fn fixed_of_i128(v: i128) -> Fixed {
    [v as u64, (v >> 64) as u64, (v >> 127) as u64]
}

/// Per-channel sums of one cache tensor `[batch, heads, tokens, dim]` (flat, C order), the
/// channels being `(head, dim)`: of the values, of `(t - p)^2` and of `(q - p8 / s)^2`,
/// `[3][heads * dim]` (see the module's notes).
pub type ChannelSums = [Vec<Fixed>; 3];

/// The terms of one scalar (S1's fixed order of float64 operations).
#[inline(always)]
pub fn terms(t: f32, p: f32, p8: f32, q: f32, scale: f64) -> [f64; 3] {
    let value = t as f64;
    let e = value - p as f64;
    let e8 = q as f64 - p8 as f64 / scale;
    [value, e * e, e8 * e8]
}

/// `ChannelSums` of `t` (the cache), `p` and `p8` (the predictions for the bf16 and fp8
/// modes), `q` (`t` quantised to fp8, in fp8 units) and the fp8 scale, all of one shape with
/// `heads`, `tokens` and `dim` its last three dimensions.
#[allow(clippy::too_many_arguments)]
pub fn channel_sums(
    t: &[f32],
    p: &[f32],
    p8: &[f32],
    q: &[f32],
    scale: f64,
    heads: usize,
    tokens: usize,
    dim: usize,
) -> ChannelSums {
    let channels = heads * dim;
    let mut out: ChannelSums = std::array::from_fn(|_| vec![[0u64; 3]; channels]);
    if channels == 0 || tokens == 0 {
        return out;
    }
    // partial sums of the small terms per statistic and channel, added to `out` every
    // SMALL_TERMS rows (and at the end); larger terms go to `out` directly
    let mut small = vec![[0i128; 3]; channels];
    let flush = |small: &mut Vec<[i128; 3]>, out: &mut ChannelSums| {
        for (c, partial) in small.iter_mut().enumerate() {
            for (k, v) in partial.iter_mut().enumerate() {
                add(&mut out[k][c], &fixed_of_i128(*v));
                *v = 0;
            }
        }
    };
    // rows of `dim` scalars: one token of one head, its channels `h * dim ..`
    let rows = t.chunks_exact(dim).zip(p.chunks_exact(dim)).zip(p8.chunks_exact(dim)).zip(q.chunks_exact(dim));
    for (row, (((t, p), p8), q)) in rows.enumerate() {
        if row > 0 && row % SMALL_TERMS == 0 {
            flush(&mut small, &mut out);
        }
        let first = (row / tokens) % heads * dim;
        for d in 0..dim {
            for (k, term) in terms(t[d], p[d], p8[d], q[d], scale).into_iter().enumerate() {
                match small_fixed(term) {
                    Some(v) => small[first + d][k] += v,
                    None => add(&mut out[k][first + d], &fixed(term)),
                }
            }
        }
    }
    flush(&mut small, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(x: &Fixed) -> i128 {
        // the low 128 bits as a signed integer (enough for the values below)
        (x[0] as u128 | (x[1] as u128) << 64) as i128
    }

    #[test]
    fn fixed_is_exact_and_truncates_toward_zero() {
        assert_eq!(value(&fixed(1.0)), 1i128 << 64);
        assert_eq!(value(&fixed(-1.5)), -(3i128 << 63));
        assert_eq!(value(&fixed(2f64.powi(-64))), 1);
        assert_eq!(value(&fixed(2f64.powi(-65))), 0);
        assert_eq!(value(&fixed(-3.0 * 2f64.powi(-65))), -1, "toward zero");
        assert_eq!(value(&fixed(f64::MIN_POSITIVE)), 0);
        assert_eq!(fixed(f64::NAN), [0; 3]);
        assert_eq!(fixed(f64::INFINITY), [0; 3]);
        assert_eq!(fixed(1e300), [0, 0, 1 << 32], "clamped to 2^160");
        let mut neg = fixed(-1e300);
        add(&mut neg, &fixed(1e300));
        assert_eq!(neg, [0; 3]);
        let big = fixed(3.0 * 2f64.powi(70));
        assert_eq!(big, [0, 0, 3 << 6], "3 * 2^134 units");
    }

    #[test]
    fn small_fixed_is_fixed_where_it_applies() {
        for v in [0.0, -0.0, 1.0, -1.5, 3e-20, -7e-21, 2f64.powi(35), -(2f64.powi(36) - 1.0), 1e-300, f64::NAN] {
            assert_eq!(fixed_of_i128(small_fixed(v).unwrap()), fixed(v), "{v}");
        }
        assert_eq!(small_fixed(2f64.powi(36)), None);
        assert_eq!(small_fixed(-1e30), None);
    }

    #[test]
    fn sums_do_not_depend_on_the_order() {
        let mut state = 7u64;
        let values: Vec<f64> = (0..10_000)
            .map(|_| {
                state = crate::test_env::lcg_step(state);
                let m = (state >> 11) as f64 / (1u64 << 53) as f64 - 0.5;
                m * 2f64.powi((state % 80) as i32 - 40)
            })
            .collect();
        let mut forward = [0u64; 3];
        let mut backward = [0u64; 3];
        for v in &values {
            add(&mut forward, &fixed(*v));
        }
        for v in values.iter().rev() {
            add(&mut backward, &fixed(*v));
        }
        assert_eq!(forward, backward);
    }

    #[test]
    fn channel_sums_group_by_head_and_dim() {
        // [batch 1, heads 2, tokens 3, dim 2]: channel (h, d) holds 3 tokens
        let t: Vec<f32> = (0..12).map(|i| i as f32).collect();
        let zeros = vec![0f32; 12];
        let s = channel_sums(&t, &zeros, &zeros, &t, 2.0, 2, 3, 2);
        let units = |x: f64| (x * 2f64.powi(64)) as i128;
        // channel (0, 0): tokens 0, 2, 4; (1, 1): 7, 9, 11
        assert_eq!(value(&s[0][0]), units(6.0));
        assert_eq!(value(&s[1][0]), units(20.0));
        assert_eq!(value(&s[0][3]), units(27.0));
        assert_eq!(value(&s[2][3]), units(49.0 + 81.0 + 121.0));
    }
}
