//! The joint model's integer form: the conditional sums of `crate::joint` in exact integer
//! arithmetic, so they run at the integer units' speed (AVX-512 VNNI: 32 multiply-adds an
//! instruction) and in any order.
//!
//! The float form's sums (invariant J1) are float32 with each multiply and add rounded in a
//! fixed order: ~11 multiply-adds a cycle on AVX-512, most of a joint stream's decode. Here each
//! source channel `s` (the `E` outside channels, then the layer's own) has a residual
//! multiplier `scale[s]` (a power of two, about `256 / sigma[s]`), each coded channel `i` a
//! unit `unit[i]` (a power of two) and integer coefficients `A[i, s]` (`build`):
//!
//! ```text
//! q[s, t]  = int16(round_ties_even(clamp(e[s, t] * scale[s], -32767, 32767)))
//! acc[i,t] = sum_s A[i, s] * q[s, t]          (int32, wrapping: exact in any order)
//! mu'[i,t] = mu[i, t] + (offset[i] + float32(acc[i, t]) * unit[i])
//! ```
//!
//! Invariant (J4), what makes encoder and decoder agree on any machine, kernel and thread
//! count: `q` is one correctly rounded float32 multiply, a clamp and a rounding to the
//! nearest integer (ties to even); `A` and `q` lie in `[-32767, 32767]`, so a pair of products
//! (what one VNNI lane adds) fits an int32, and the int32 sums wrap, so every kernel and every
//! order gives the same `acc`; `float32(acc)` rounds to nearest even, then the multiply by
//! `unit[i]` and the two adds are each one rounded float32 operation in the order written.
//! `e` is J1's residual (0 where not finite). A stream coded in this form sets
//! `FLAG_JOINT_INT`; the float form's streams are still read as before.
//!
//! Layout for the kernels: sources come in pairs (VNNI multiplies and adds two int16 a lane),
//! the outside channels padded to an even count `Ep`, then the own channels padded to `Cp`:
//! source `s' < E` is outside channel `s'`, `Ep <= s' < Ep + C` own channel `s' - Ep`, the
//! pad sources are 0 with coefficient 0. The residuals of a layer are held pair-interleaved,
//! `q[(p * T + t) * 2 + h]` for source `2p + h`, and each row of `A` has `Ep + Cp` entries.

use std::sync::OnceLock;

use crate::error::{invalid, Result};

/// The integer form's arrays for a stream's layers (see the module's notes).
#[derive(Debug, Clone, Copy)]
pub struct IntegerJoint<'a> {
    /// `layers x (E + C)`: each source channel's residual multiplier (a power of two).
    pub scale: &'a [f32],
    /// `layers x C x (Ep + Cp)`: the integer coefficients, row `i` nonzero only before own
    /// channel `i`.
    pub coef: &'a [i16],
    /// `layers x C`: each coded channel's unit (a power of two).
    pub unit: &'a [f32],
}

/// The largest magnitude of a quantised residual or coefficient (J4: two products fit an int32).
pub const LIMIT: i32 = 32767;
/// Residual steps per sigma: a residual's rounding moves a channel's mean by at most
/// `|a| * sigma / 512`, against a sigma of its own.
const STEPS_PER_SIGMA: f64 = 256.0;

/// `n` rounded up to even: a side's sources in pairs.
pub fn even(n: usize) -> usize {
    n + (n & 1)
}

/// The floor of `log2(x)` for a positive normal double, read from its exponent bits (exact,
/// where a `log2` call could differ between C libraries).
fn exponent(x: f64) -> i32 {
    ((x.to_bits() >> 52) & 0x7ff) as i32 - 1023
}

/// Two to the power `k` (`k` within float32's normal range).
fn pow2(k: i32) -> f32 {
    f32::from_bits(((k + 127) as u32) << 23)
}

/// The residual multiplier of a source channel whose sigma is `sigma`: the power of two at or
/// below `STEPS_PER_SIGMA / sigma`, 1 where `sigma` is not a positive finite number.
pub fn residual_scale(sigma: f32) -> f32 {
    let x = STEPS_PER_SIGMA / sigma as f64;
    if !(sigma > 0.0 && x.is_finite() && x >= f64::MIN_POSITIVE) {
        return 1.0;
    }
    pow2(exponent(x).clamp(-60, 60))
}

/// The integer form of a float joint model: `coef` (`layers x C x (E + C)`, as
/// `crate::joint::Joint` takes it) and each source channel's sigma (`layers x (E + C)`) into
/// `(scale, A, unit)` (the module's rule). Row `i` takes the coefficients J1 reads (the
/// outside channels', own channels' before `i`; the rest are 0); its unit is the smallest power
/// of two for which its largest `|a / scale|` fits `LIMIT`; `A` is `a / (scale * unit)`
/// rounded to nearest even (exact powers of two in float64: one rounding).
pub fn build(channels: usize, outside: usize, coef: &[f32], sigma: &[f32]) -> Result<(Vec<f32>, Vec<i16>, Vec<f32>)> {
    let width = outside + channels;
    if channels == 0 || !sigma.len().is_multiple_of(width) || coef.len() != sigma.len() / width * channels * width {
        return invalid(format!(
            "joint integer form: {} coefficients and {} sigmas do not hold whole layers of {channels} channels and {outside} outside",
            coef.len(),
            sigma.len()
        ));
    }
    let layers = sigma.len() / width;
    let (ep, cp) = (even(outside), even(channels));
    let scale: Vec<f32> = sigma.iter().map(|&s| residual_scale(s)).collect();
    let mut a = vec![0i16; layers * channels * (ep + cp)];
    let mut unit = vec![1f32; layers * channels];
    for layer in 0..layers {
        let scales = &scale[layer * width..(layer + 1) * width];
        for i in 0..channels {
            // the sources row `i` reads (J1: the outside channels, own channels before `i`)
            let used = outside + i;
            let row = &coef[(layer * channels + i) * width..][..used];
            let ratio = |s: usize| row[s] as f64 / scales[s] as f64;
            let largest = (0..used).map(|s| ratio(s).abs()).filter(|r| r.is_finite()).fold(0f64, f64::max);
            if largest < f64::MIN_POSITIVE {
                continue; // an all-zero row: unit 1, no terms
            }
            // the smallest k with largest / 2^k <= LIMIT
            let mut k = exponent(largest / LIMIT as f64);
            while largest / 2f64.powi(k) > LIMIT as f64 {
                k += 1;
            }
            let k = k.clamp(-126, 127);
            unit[layer * channels + i] = pow2(k);
            let out = &mut a[(layer * channels + i) * (ep + cp)..][..ep + cp];
            for s in 0..used {
                let q = (ratio(s) / 2f64.powi(k)).round_ties_even();
                let q = if q.is_finite() { q.clamp(-(LIMIT as f64), LIMIT as f64) as i16 } else { 0 };
                out[if s < outside { s } else { ep + s - outside }] = q;
            }
        }
    }
    Ok((scale, a, unit))
}

impl IntegerJoint<'_> {
    /// Checks the arrays' lengths against `layers` of `channels` and `outside` channels.
    pub fn check(&self, layers: usize, channels: usize, outside: usize) -> Result<()> {
        let sizes = [
            (self.scale.len(), layers * (outside + channels), "residual scales"),
            (self.coef.len(), layers * channels * (even(outside) + even(channels)), "integer coefficients"),
            (self.unit.len(), layers * channels, "units"),
        ];
        for (got, want, what) in sizes {
            if got != want {
                return invalid(format!("joint integer form: {got} {what} given, {want} expected for {layers} layers"));
            }
        }
        Ok(())
    }
}

/// J4's `q` of one residual.
#[inline(always)]
pub fn quantise(e: f32, scale: f32) -> i16 {
    (e * scale).max(-(LIMIT as f32)).min(LIMIT as f32).round_ties_even() as i16
}

/// `out[t] = quantise(e[t], scale)`: one source's residuals, one row.
pub fn quantise_row(e: &[f32], scale: f32, out: &mut [i16]) {
    #[cfg(target_arch = "x86_64")]
    match kernel() {
        "portable" => {}
        "avx2" => {
            // SAFETY: `kernel()` checked at run time that this CPU has AVX2.
            unsafe { quantise_avx2(e, scale, out) };
            return;
        }
        _ => {
            // SAFETY: `kernel()` checked at run time that this CPU has AVX-512F (and BW).
            unsafe { quantise_wide(e, scale, out) };
            return;
        }
    }
    for (slot, &r) in out.iter_mut().zip(e) {
        *slot = quantise(r, scale);
    }
}

/// `quantise_row` sixteen at a time: the same multiply and clamp, then the conversion with
/// its rounding named (to nearest, ties to even) and the narrowing of values already in
/// range; the tail as the portable code. The compiler's own loop converted scalar by scalar
/// (Rust's saturating float-to-int casts), ~15% of a joint stream's decode.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn quantise_wide(e: &[f32], scale: f32, out: &mut [i16]) {
    use std::arch::x86_64::*;
    let n = e.len().min(out.len());
    let (s, lo, hi) = (_mm512_set1_ps(scale), _mm512_set1_ps(-(LIMIT as f32)), _mm512_set1_ps(LIMIT as f32));
    let mut k = 0;
    while k + 16 <= n {
        // SAFETY: sixteen floats of `e` and sixteen int16 of `out` from `k` (`k + 16 <= n`).
        unsafe {
            let v = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(_mm512_loadu_ps(e.as_ptr().add(k)), s), lo), hi);
            let q = _mm512_cvt_roundps_epi32::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v);
            _mm256_storeu_si256(out.as_mut_ptr().add(k).cast(), _mm512_cvtepi32_epi16(q));
        }
        k += 16;
    }
    for (slot, &r) in out[k..n].iter_mut().zip(&e[k..n]) {
        *slot = quantise(r, scale);
    }
}

/// `quantise_row` eight at a time with AVX2: the same multiply and clamp (`max` before `min`,
/// so a NaN becomes `-LIMIT` as `f32::max` makes it), the rounding to nearest, ties to even,
/// written out (`vroundps`, then an exact conversion of an integral value), and the narrowing
/// of values already in range; the tail as the portable code.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn quantise_avx2(e: &[f32], scale: f32, out: &mut [i16]) {
    use std::arch::x86_64::*;
    let n = e.len().min(out.len());
    let (s, lo, hi) = (_mm256_set1_ps(scale), _mm256_set1_ps(-(LIMIT as f32)), _mm256_set1_ps(LIMIT as f32));
    let mut k = 0;
    while k + 8 <= n {
        // SAFETY: eight floats of `e` and eight int16 of `out` from `k` (`k + 8 <= n`).
        unsafe {
            let v = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(_mm256_loadu_ps(e.as_ptr().add(k)), s), lo), hi);
            let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v);
            let q = _mm256_cvttps_epi32(r);
            let narrow = _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256::<1>(q));
            _mm_storeu_si128(out.as_mut_ptr().add(k).cast(), narrow);
        }
        k += 8;
    }
    for (slot, &r) in out[k..n].iter_mut().zip(&e[k..n]) {
        *slot = quantise(r, scale);
    }
}

/// Interleaves two sources' rows (`first`, `second`: sources `2p`, `2p + 1`) into pair `p`
/// of the buffer `q` of `tokens` tokens, the kernels' layout.
#[inline(always)]
pub fn interleave(first: &[i16], second: &[i16], p: usize, tokens: usize, q: &mut [i16]) {
    let pairs = &mut q[p * tokens * 2..(p + 1) * tokens * 2];
    for ((slot, &a), &b) in pairs.chunks_exact_mut(2).zip(first).zip(second) {
        slot[0] = a;
        slot[1] = b;
    }
}

/// Channels whose sums `block` accumulates together (each pair of sources loaded once for all).
pub const BLOCK: usize = 4;

/// A coefficient pair (sources `2p`, `2p + 1`) as one int32, the low half first (VNNI's order).
#[inline(always)]
fn pair(row: &[i16], p: usize) -> i32 {
    (row[2 * p] as u16 as u32 | (row[2 * p + 1] as u16 as u32) << 16) as i32
}

/// `acc[c * T + t] = sum over sources < 2 * pairs of rows[c][s] * q[s, t]` for `BLOCK` rows
/// (J4's sums; int32, wrapping).
pub fn block(rows: [&[i16]; BLOCK], q: &[i16], tokens: usize, pairs: usize, acc: &mut [i32]) {
    #[cfg(target_arch = "x86_64")]
    match kernel() {
        "avx512-vnni" => {
            // SAFETY: `kernel()` checked at run time that this CPU has AVX-512F/BW and VNNI.
            unsafe { block_vnni(rows, q, tokens, pairs, acc) };
            return;
        }
        "avx512" => {
            // SAFETY: `kernel()` checked at run time that this CPU has AVX-512F and BW.
            unsafe { block_bw(rows, q, tokens, pairs, acc) };
            return;
        }
        "avx2" => {
            // SAFETY: `kernel()` checked at run time that this CPU has AVX2.
            unsafe { block_avx2(rows, q, tokens, pairs, acc) };
            return;
        }
        _ => {}
    }
    block_portable(rows, q, tokens, pairs, acc, 0);
}

/// `block` for tokens `t0..`, in plain Rust.
fn block_portable(rows: [&[i16]; BLOCK], q: &[i16], tokens: usize, pairs: usize, acc: &mut [i32], t0: usize) {
    for (c, row) in rows.iter().enumerate() {
        let out = &mut acc[c * tokens + t0..(c + 1) * tokens];
        out.fill(0);
        for p in 0..pairs {
            let (a0, a1) = (row[2 * p] as i32, row[2 * p + 1] as i32);
            if a0 == 0 && a1 == 0 {
                continue;
            }
            let src = &q[(p * tokens + t0) * 2..(p + 1) * tokens * 2];
            for (slot, x) in out.iter_mut().zip(src.chunks_exact(2)) {
                // |a| and |q| <= LIMIT: the pair's sum fits an int32 (J4)
                *slot = slot.wrapping_add(a0 * x[0] as i32 + a1 * x[1] as i32);
            }
        }
    }
}

/// Tokens per tile of the vector kernels: `BLOCK` x 4 vectors of sixteen int32 sums in registers.
const TILE: usize = 64;

macro_rules! block_kernel {
    ($name:ident, $features:literal, |$s:ident, $a:ident, $x:ident| $madd:expr) => {
        /// `block` with AVX-512 (`$features`): a tile's `BLOCK x 64` sums in sixteen
        /// registers, each pair of sources loaded once for the block; the partial tile in
        /// plain Rust (the same integers).
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $features)]
        unsafe fn $name(rows: [&[i16]; BLOCK], q: &[i16], tokens: usize, pairs: usize, acc: &mut [i32]) {
            use std::arch::x86_64::*;
            const V: usize = 16;
            let mut t0 = 0;
            while t0 + TILE <= tokens {
                let mut sum: [[__m512i; 4]; BLOCK] = [[_mm512_setzero_si512(); 4]; BLOCK];
                for p in 0..pairs {
                    let src = q[(p * tokens + t0) * 2..][..TILE * 2].as_ptr();
                    // SAFETY: `src` points at TILE pairs of int16 (sliced above).
                    let x: [__m512i; 4] =
                        std::array::from_fn(|v| unsafe { _mm512_loadu_si512(src.add(v * 2 * V).cast()) });
                    for (c, row) in sum.iter_mut().enumerate() {
                        let a = _mm512_set1_epi32(pair(rows[c], p));
                        for v in 0..4 {
                            let ($s, $a, $x) = (row[v], a, x[v]);
                            row[v] = $madd;
                        }
                    }
                }
                for (c, row) in sum.iter().enumerate() {
                    for (v, &r) in row.iter().enumerate() {
                        let out = acc[c * tokens + t0 + v * V..][..V].as_mut_ptr();
                        // SAFETY: `out` points at sixteen int32 of `acc` (sliced above).
                        unsafe { _mm512_storeu_si512(out.cast(), r) };
                    }
                }
                t0 += TILE;
            }
            if t0 < tokens {
                block_portable(rows, q, tokens, pairs, acc, t0);
            }
        }
    };
}

#[cfg(target_arch = "x86_64")]
block_kernel!(block_vnni, "avx512f,avx512bw,avx512vnni", |s, a, x| _mm512_dpwssd_epi32(s, a, x));
#[cfg(target_arch = "x86_64")]
block_kernel!(block_bw, "avx512f,avx512bw", |s, a, x| _mm512_add_epi32(s, _mm512_madd_epi16(a, x)));

/// Tokens per tile of the AVX2 kernel: `BLOCK` x 2 vectors of eight int32 sums in registers
/// (sixteen 256-bit registers in all, the sources and the coefficient among them).
const TILE_AVX2: usize = 16;

/// `block` with AVX2 (`vpmaddwd`, then add): a tile's `BLOCK x 16` sums in eight registers,
/// each pair of sources loaded once for the block; the partial tile in plain Rust (the same
/// integers).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn block_avx2(rows: [&[i16]; BLOCK], q: &[i16], tokens: usize, pairs: usize, acc: &mut [i32]) {
    use std::arch::x86_64::*;
    const V: usize = 8;
    let mut t0 = 0;
    while t0 + TILE_AVX2 <= tokens {
        let mut sum: [[__m256i; 2]; BLOCK] = [[_mm256_setzero_si256(); 2]; BLOCK];
        for p in 0..pairs {
            let src = q[(p * tokens + t0) * 2..][..TILE_AVX2 * 2].as_ptr();
            // SAFETY: `src` points at TILE_AVX2 pairs of int16 (sliced above).
            let x: [__m256i; 2] = std::array::from_fn(|v| unsafe { _mm256_loadu_si256(src.add(v * 2 * V).cast()) });
            for (c, row) in sum.iter_mut().enumerate() {
                let a = _mm256_set1_epi32(pair(rows[c], p));
                for v in 0..2 {
                    row[v] = _mm256_add_epi32(row[v], _mm256_madd_epi16(a, x[v]));
                }
            }
        }
        for (c, row) in sum.iter().enumerate() {
            for (v, &r) in row.iter().enumerate() {
                let out = acc[c * tokens + t0 + v * V..][..V].as_mut_ptr();
                // SAFETY: `out` points at eight int32 of `acc` (sliced above).
                unsafe { _mm256_storeu_si256(out.cast(), r) };
            }
        }
        t0 += TILE_AVX2;
    }
    if t0 < tokens {
        block_portable(rows, q, tokens, pairs, acc, t0);
    }
}

/// Which kernel computes the integer sums here: `"avx512-vnni"`, `"avx512"` (multiply-add
/// pairs, then add), `"avx2"` (the same, eight lanes; also under `SPECKV_SIMD=avx2`) or
/// `"portable"` (another architecture, no AVX2, or `SPECKV_SIMD=0`): the same integers (J4).
pub fn kernel() -> &'static str {
    static KERNEL: OnceLock<&'static str> = OnceLock::new();
    KERNEL.get_or_init(|| {
        let simd = std::env::var("SPECKV_SIMD").unwrap_or_default();
        let (any, wide) = (simd.trim() != "0", !matches!(simd.trim(), "0" | "avx2"));
        #[cfg(target_arch = "x86_64")]
        {
            if wide && is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw") {
                return if is_x86_feature_detected!("avx512vnni") { "avx512-vnni" } else { "avx512" };
            }
            if any && is_x86_feature_detected!("avx2") {
                return "avx2";
            }
        }
        let _ = (any, wide); // (no vector kernel off x86-64)
        "portable"
    })
}

/// J4's `mu'` of one coded channel from `acc` (its sum over the sources before its block,
/// `block`) and the terms of own channels `from..` before it: `row[ep + j]` times own channel
/// `j`'s residuals (`own`: the layer's quantised residuals, channel by channel);
/// `out[t] = mu[t] + (offset + float32(sum[t]) * unit)`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub fn finish(
    row: &[i16],
    ep: usize,
    from: usize,
    own: &[i16],
    acc: &[i32],
    offset: f32,
    unit: f32,
    mu: &[f32],
    out: &mut [f32],
) {
    let tokens = mu.len();
    let to = from + own.len() / tokens.max(1);
    let mut sum = [0i32; TILE];
    for t0 in (0..tokens).step_by(TILE) {
        let n = TILE.min(tokens - t0);
        let sum = &mut sum[..n];
        sum.copy_from_slice(&acc[t0..t0 + n]);
        for j in from..to {
            let a = row[ep + j] as i32;
            let src = &own[(j - from) * tokens + t0..][..n];
            for (slot, &x) in sum.iter_mut().zip(src) {
                *slot = slot.wrapping_add(a * x as i32);
            }
        }
        for ((o, &m), &s) in out[t0..t0 + n].iter_mut().zip(&mu[t0..t0 + n]).zip(sum.iter()) {
            *o = m + (offset + s as f32 * unit);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scales_and_units_are_powers_of_two_and_coefficients_fit() {
        assert_eq!(residual_scale(1.0), 256.0);
        assert_eq!(residual_scale(3.0), 64.0); // 85.3 -> 64
        assert_eq!(residual_scale(0.0), 1.0);
        assert_eq!(residual_scale(f32::NAN), 1.0);
        assert_eq!(residual_scale(-1.0), 1.0);
        // 2 channels, 1 outside, one layer: rows [a(outside), a(own 0), a(own 1)]
        // (the 7s and 9s: coefficients J1 never reads, on a channel's own or later channels)
        let coef = [0.5f32, 7.0, 9.0, -0.25, 1.5, 9.0];
        let sigma = [1.0f32, 2.0, 4.0];
        let (scale, a, unit) = build(2, 1, &coef, &sigma).unwrap();
        assert_eq!(scale, [256.0, 128.0, 64.0]);
        // Ep = 2, Cp = 2: row layout [outside 0, pad, own 0, own 1]
        assert_eq!(a.len(), 2 * 4);
        for i in 0..2 {
            let row = &a[i * 4..(i + 1) * 4];
            assert!(row.iter().any(|&v| v.unsigned_abs() > LIMIT as u16 / 2), "{row:?}");
            assert_eq!(row[1], 0);
            assert_eq!(row[3], 0);
        }
        // row 0 reads no own channel
        assert_eq!(a[2], 0);
        // what the integers stand for, within one unit each
        let back = |i: usize, s: usize, col: usize| a[i * 4 + col] as f64 * unit[i] as f64 * scale[s] as f64;
        assert!((back(0, 0, 0) - 0.5).abs() <= unit[0] as f64 * 256.0);
        assert!((back(1, 0, 0) + 0.25).abs() <= unit[1] as f64 * 256.0);
        assert!((back(1, 1, 2) - 1.5).abs() <= unit[1] as f64 * 128.0);
        assert!(build(2, 1, &coef[..5], &sigma).is_err());
        assert!(IntegerJoint { scale: &scale, coef: &a, unit: &unit }.check(1, 2, 1).is_ok());
        assert!(IntegerJoint { scale: &scale, coef: &a[1..], unit: &unit }.check(1, 2, 1).is_err());
    }

    #[test]
    fn a_row_quantises_as_each_residual_does() {
        let mut seed = 5u64;
        let mut next = move || {
            seed = crate::test_env::lcg_step(seed);
            (seed >> 33) as u32
        };
        // ties at every half, extremes, subnormals, infinities, and random values
        let mut e: Vec<f32> = (-80..80).map(|k| k as f32 * 0.5).collect();
        e.extend([f32::INFINITY, f32::NEG_INFINITY, f32::MAX, -f32::MAX, 1e-40, -1e-40, 0.0, -0.0, f32::NAN]);
        e.extend((0..300).map(|_| f32::from_bits(next() % 0x7f80_0000) * if next() % 2 == 0 { 1.0 } else { -1.0 }));
        for scale in [1.0f32, 256.0, 0.5, 2f32.powi(-40), 2f32.powi(40)] {
            for len in [e.len(), 17, 16, 3] {
                let mut row = vec![7i16; len];
                quantise_row(&e[..len], scale, &mut row);
                let want: Vec<i16> = e[..len].iter().map(|&r| quantise(r, scale)).collect();
                assert_eq!(row, want, "scale {scale} len {len} kernel {}", kernel());
                #[cfg(target_arch = "x86_64")]
                if crate::test_env::have("avx2", is_x86_feature_detected!("avx2"), "no AVX2 on this processor") {
                    let mut narrow = vec![9i16; len];
                    // SAFETY: AVX2 checked just above.
                    unsafe { quantise_avx2(&e[..len], scale, &mut narrow) };
                    assert_eq!(narrow, want, "avx2: scale {scale} len {len}");
                }
            }
        }
    }

    #[test]
    fn quantised_residuals_round_to_even_and_clamp() {
        assert_eq!(quantise(0.5, 1.0), 0);
        assert_eq!(quantise(1.5, 1.0), 2);
        assert_eq!(quantise(-2.5, 1.0), -2);
        assert_eq!(quantise(1e30, 1e10), LIMIT as i16);
        assert_eq!(quantise(f32::NEG_INFINITY, 1.0), -LIMIT as i16);
    }

    #[test]
    fn every_kernel_sums_the_same_integers() {
        let mut seed = 3u64;
        let mut next = move || {
            seed = crate::test_env::lcg_step(seed);
            (seed >> 33) as u32
        };
        for &(tokens, pairs) in &[(64usize, 5usize), (200, 9), (7, 3), (129, 1), (128, 0)] {
            // extremes included: the sums wrap
            let q: Vec<i16> = (0..pairs * tokens * 2)
                .map(|k| if k % 7 == 0 { LIMIT as i16 } else { ((next() % 65535) as i32 - LIMIT) as i16 })
                .collect();
            let rows: Vec<Vec<i16>> = (0..BLOCK)
                .map(|c| {
                    (0..pairs * 2)
                        .map(|k| if (k + c) % 5 == 0 { -LIMIT as i16 } else { (next() % 2001) as i16 - 1000 })
                        .collect()
                })
                .collect();
            let rows: [&[i16]; BLOCK] = std::array::from_fn(|c| rows[c].as_slice());
            let mut fast = vec![1i32; BLOCK * tokens];
            block(rows, &q, tokens, pairs, &mut fast);
            let mut portable = vec![2i32; BLOCK * tokens];
            block_portable(rows, &q, tokens, pairs, &mut portable, 0);
            // the definition, written out
            for c in 0..BLOCK {
                for t in 0..tokens {
                    let want = (0..2 * pairs).fold(0i32, |s, k| {
                        s.wrapping_add(rows[c][k] as i32 * q[((k / 2) * tokens + t) * 2 + k % 2] as i32)
                    });
                    assert_eq!(portable[c * tokens + t], want, "tokens {tokens} pairs {pairs}");
                }
            }
            assert_eq!(fast, portable, "kernel {} tokens {tokens} pairs {pairs}", kernel());
            #[cfg(target_arch = "x86_64")]
            if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw") {
                // the kernel without VNNI, where this CPU has VNNI too
                let mut bw = vec![3i32; BLOCK * tokens];
                // SAFETY: AVX-512F and BW checked just above.
                unsafe { block_bw(rows, &q, tokens, pairs, &mut bw) };
                assert_eq!(bw, portable, "tokens {tokens} pairs {pairs}");
            }
            #[cfg(target_arch = "x86_64")]
            if crate::test_env::have("avx2", is_x86_feature_detected!("avx2"), "no AVX2 on this processor") {
                // the AVX2 kernel, whichever this process picked
                let mut narrow = vec![4i32; BLOCK * tokens];
                // SAFETY: AVX2 checked just above.
                unsafe { block_avx2(rows, &q, tokens, pairs, &mut narrow) };
                assert_eq!(narrow, portable, "avx2: tokens {tokens} pairs {pairs}");
            }
        }
    }
}
