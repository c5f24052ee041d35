//! The value-space model: a fixed-point CDF of the Gaussian mixture on a fine grid of
//! `z = (v - mu) / sigma`, read by linear interpolation in integers.
//!
//! A pattern `k` with interval `[a_k, a_{k+1})` gets, inside the window `[k_lo, k_hi]`,
//!
//! ```text
//! cum(k)  = G(z(a_k)) + (k - k_lo)          freq(k) = cum(k + 1) - cum(k) >= 1
//! ```
//!
//! where `G` rises from 0 to `G_MAX` over `z in [-W, W]`. The `+1` per pattern ("leak") keeps
//! every pattern codable however narrow its interval (near zero a format packs thousands of
//! patterns into a sliver of the real line). Everything else (NaNs, infinities, patterns outside
//! the window) is the ESCAPE symbol, `[G_MAX + n, 2^24)`, at least `weight_escape` of the
//! total since `G_MAX + n <= (1 - w_e) 2^24` for any window of `n <= 2^16` patterns.
//!
//! Determinism: `z` comes from two IEEE-754 operations (`(a - mu) * (1 / sigma)`, f64, no
//! fused multiply-add), then a clamp and a floor: correctly rounded on every platform, so both
//! sides get the same integers. The table itself is built once with a pure-Rust libm and
//! covered by the stream's table digest. No transcendental function runs while coding.

use super::params::{ModelParams, MAX_WINDOW};
use crate::hash::Hasher;

/// Grid steps per unit of z.
pub(crate) const STEPS_PER_Z: f64 = 64.0;
/// Fraction bits of the interpolation.
pub(crate) const FRACTION_BITS: u32 = 16;
/// Bits of the slot index of the inverse table the decoder guesses from.
pub(crate) const GUESS_BITS: u32 = 12;

/// The fixed-point mixture CDF and its coarse inverse.
#[derive(Debug)]
pub struct MixtureCdf {
    /// `G` at `z_i = -W + i / STEPS_PER_Z`, `i = 0..=N`, then one repeat of the last value.
    nodes: Vec<u32>,
    /// `G^-1(j G_MAX / 2^GUESS_BITS)` for `j = 0..=2^GUESS_BITS`: the inverse CDF at evenly
    /// spaced slots, read by linear interpolation. It only chooses where the decoder looks
    /// (`chunk::decode_exact` confirms every guess with `eval`), so it is f32 and outside the
    /// digest.
    inverse_z: Vec<f32>,
    pub g_max: u32,
    pub precision: u32,
    /// Half-width `W` of the window in units of sigma.
    pub half_width: f64,
    /// `floor(2^(32 + GUESS_BITS) / G_MAX)`: `q * this` is the slot of `q` in 32.32 fixed
    /// point, without a division.
    slot_multiplier: u64,
    digest: u64,
}

fn normal_cdf(z: f64) -> f64 {
    0.5 * libm::erfc(-z * std::f64::consts::FRAC_1_SQRT_2)
}

impl MixtureCdf {
    /// The CDF for `params`, built on first use and then shared.
    pub fn shared(params: &ModelParams) -> std::sync::Arc<MixtureCdf> {
        static CACHE: super::ParamsCache<MixtureCdf> = std::sync::OnceLock::new();
        super::shared(&CACHE, params, || MixtureCdf::build(params))
    }

    pub fn build(params: &ModelParams) -> MixtureCdf {
        let precision = params.table_precision as u32;
        let total = 1u64 << precision;
        let escape = (params.weight_escape as u64 * total) >> 16;
        let g_max = (total - escape - MAX_WINDOW as u64) as u32;
        let wide = params.wide_factor as f64;
        let half_width = 8.0 * wide;
        let (wn, ww) = (params.weight_narrow as f64, params.weight_wide as f64);
        let mix = |z: f64| (wn * normal_cdf(z) + ww * normal_cdf(z / wide)) / (wn + ww);
        let n = (2.0 * half_width * STEPS_PER_Z) as usize;
        let (lo, hi) = (mix(-half_width), mix(half_width));
        let mut nodes: Vec<u32> = (0..=n)
            .map(|i| {
                let z = -half_width + i as f64 / STEPS_PER_Z;
                libm::floor((mix(z) - lo) / (hi - lo) * g_max as f64 + 0.5) as u32
            })
            .collect();
        nodes[0] = 0;
        nodes[n] = g_max;
        nodes.push(g_max);
        // The inverse at each slot edge: the node below the target by bisection, then linear
        // interpolation inside that node's step (exactly how `eval` reads the grid).
        let inverse_z = (0..=1u64 << GUESS_BITS)
            .map(|j| {
                let target = (j * g_max as u64) as f64 / (1u64 << GUESS_BITS) as f64;
                let i = nodes[..=n].partition_point(|&v| (v as f64) <= target).saturating_sub(1).min(n - 1);
                let rise = (nodes[i + 1] - nodes[i]) as f64;
                let fraction = if rise > 0.0 { ((target - nodes[i] as f64) / rise).min(1.0) } else { 0.0 };
                ((i as f64 + fraction) / STEPS_PER_Z - half_width) as f32
            })
            .collect();
        let mut h = Hasher::new();
        for v in &nodes {
            h.update(&v.to_le_bytes());
        }
        let slot_multiplier = (1u64 << (32 + GUESS_BITS)) / g_max as u64;
        MixtureCdf { nodes, inverse_z, g_max, precision, half_width, slot_multiplier, digest: h.finish() }
    }

    pub fn digest(&self) -> u64 {
        self.digest
    }

    /// The grid nodes `G(z_i)` (with the repeated last one) and the inverse table, for
    /// kernels that read them directly (`exact::avx2`).
    pub(crate) fn nodes(&self) -> &[u32] {
        &self.nodes
    }

    pub(crate) fn inverse_z(&self) -> &[f32] {
        &self.inverse_z
    }

    pub(crate) fn slot_multiplier(&self) -> u64 {
        self.slot_multiplier
    }

    /// `G(z)`: 0 below `-W`, `G_MAX` above `W`, interpolated between grid nodes.
    #[inline(always)]
    pub fn eval(&self, z: f64) -> u32 {
        let last = (self.nodes.len() - 2) as f64;
        // Position on the grid in fixed point (node index . 16 fraction bits); t >= 0, so the
        // conversion is a floor, and t <= N < 2^12 keeps it far inside i64.
        let t = ((z + self.half_width) * STEPS_PER_Z).clamp(0.0, last);
        // SAFETY (to_int_unchecked): `t * 2^16` is finite and in [0, 2^28]: `t` was clamped to
        // [0, last] with `last < 2^12` (a NaN `z` cannot occur: `z` is a product of finite
        // values, and `clamp` would return NaN only for a NaN input).
        let fixed = unsafe { (t * (1u32 << FRACTION_BITS) as f64).to_int_unchecked::<i64>() };
        let i = (fixed >> FRACTION_BITS) as usize;
        let fraction = (fixed & ((1 << FRACTION_BITS) - 1)) as u64;
        // SAFETY (get_unchecked): `i <= last = nodes.len() - 2`, so `i + 1 < nodes.len()`.
        let (a, b) = unsafe { (*self.nodes.get_unchecked(i), *self.nodes.get_unchecked(i + 1)) };
        a + (((b - a) as u64 * fraction) >> FRACTION_BITS) as u32
    }

    /// A `z` where `G(z)` is close to `q` (`q < G_MAX`): where the decoder looks first. One
    /// multiply, two loads and an interpolation; no search.
    #[inline(always)]
    pub fn guess_z(&self, q: u32) -> f64 {
        let fixed = q as u64 * self.slot_multiplier;
        // `q < G_MAX` keeps the slot below `2^GUESS_BITS`; the `min` only makes that visible
        // to the compiler, so the two reads need no bounds checks.
        let slot = ((fixed >> 32) as usize).min((1 << GUESS_BITS) - 1);
        let fraction = (fixed as u32) as f32 * (1.0 / 4_294_967_296.0);
        let (a, b) = (self.inverse_z[slot], self.inverse_z[slot + 1]);
        (a + (b - a) * fraction) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn g_rises_from_zero_to_g_max_and_matches_the_mixture() {
        let params = ModelParams::default();
        let g = MixtureCdf::build(&params);
        assert_eq!(g.eval(-1e9), 0);
        assert_eq!(g.eval(-g.half_width), 0);
        assert_eq!(g.eval(g.half_width), g.g_max);
        assert_eq!(g.eval(1e300), g.g_max);
        let mut last = 0;
        let mut z = -25.0;
        while z < 25.0 {
            let v = g.eval(z);
            assert!(v >= last);
            last = v;
            z += 0.001;
        }
        let half = g.eval(0.0) as f64 / g.g_max as f64;
        assert!((half - 0.5).abs() < 1e-6);
        let one_sigma = g.eval(1.0) as f64 / g.g_max as f64;
        let (wn, ww) = (params.weight_narrow as f64, params.weight_wide as f64);
        let expected = (wn * normal_cdf(1.0) + ww * normal_cdf(1.0 / 3.0)) / (wn + ww);
        assert!((one_sigma - expected).abs() < 1e-5, "{one_sigma} {expected}");
        let total = 1u64 << 24;
        assert!(g.g_max as u64 + MAX_WINDOW as u64 <= total - ((params.weight_escape as u64 * total) >> 16));
    }

    /// The digest covers every node of the table both sides code with; it is written to each
    /// stream and checked before decoding. A change here changes coded bytes: it needs a
    /// format version (and the old tables kept for old streams).
    #[test]
    fn table_construction_is_pinned() {
        let g = MixtureCdf::build(&ModelParams::default());
        assert_eq!(format!("{:016x}", g.digest()), "ea7de0b00c548348");
        assert_eq!((g.nodes.len(), g.g_max), (3074, 16_707_584));
    }

    #[test]
    fn guess_inverts_eval() {
        // Linear interpolation between slot edges is close where G is steep (the centre, where
        // nearly every symbol is decoded) and coarser in the flat tails, where a slot spans
        // many nodes; a miss there only costs the decoder a search, never a wrong value.
        let g = MixtureCdf::build(&ModelParams::default());
        for q in (0..g.g_max).step_by(997) {
            let z = g.guess_z(q);
            let back = g.eval(z) as i64;
            let centre = z.abs() < 3.0;
            let tolerance = if centre { 2 + (g.g_max as i64 >> 16) } else { g.g_max as i64 >> 12 };
            assert!((back - q as i64).abs() <= tolerance, "q {q} z {z} back {back}");
        }
    }
}
