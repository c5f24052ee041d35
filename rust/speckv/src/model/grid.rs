//! The value grid of a storage format: where each bit pattern sits on the real line.
//!
//! A pattern stands for the interval of reals that round to it; its *edges* are the midpoints
//! to its neighbours in ordinal order (`-0` owns `(-tiny/2, 0]`, `+0` owns `[0, tiny/2)`, the
//! largest finite value owns up to half an ulp beyond it). Every edge of an 8- or 16-bit format
//! is exactly an f32, so one f32 per pattern holds them all.

use std::sync::{Arc, Mutex, OnceLock};

use crate::dtype::DType;

/// Edges and ordinal bounds of one 8- or 16-bit format.
#[derive(Debug)]
pub struct ValueGrid {
    dtype: DType,
    /// `lower_edge[k - min_ordinal]` for every finite ordinal `k`, plus the upper edge of the
    /// largest one at the end.
    lower_edge: Vec<f32>,
    /// Smallest and largest ordinal of a finite pattern.
    pub min_ordinal: i64,
    pub max_ordinal: i64,
    /// Magnitude (pattern without sign) of the largest finite value.
    max_magnitude: u32,
    /// `dtype.mantissa_bits()` and `dtype.exponent_bias()`, kept here so that the hot paths
    /// read two fields instead of matching on the dtype.
    mantissa_bits: u32,
    exponent_bias: i64,
}

/// The value of a finite pattern, exactly, as f64.
fn value_of(dtype: DType, bits: u32) -> f64 {
    let m = dtype.mantissa_bits();
    let sign = if bits >> (dtype.bits() - 1) & 1 == 1 { -1.0 } else { 1.0 };
    let exponent = dtype.exponent_field(bits) as i32;
    let mantissa = (bits & ((1 << m) - 1)) as f64;
    let unit = libm::ldexp(1.0, 1 - dtype.exponent_bias() - m as i32);
    let magnitude =
        if exponent == 0 { mantissa * unit } else { (mantissa + (1u64 << m) as f64) * libm::ldexp(unit, exponent - 1) };
    sign * magnitude
}

/// The value of `bits` as float32 (exact: every 8/16-bit value is a float32), `None` where the
/// pattern is not finite.
pub(crate) fn finite_value(dtype: DType, bits: u32) -> Option<f32> {
    let magnitude = bits & !(1 << (dtype.bits() - 1));
    (magnitude <= max_finite_magnitude(dtype)).then(|| value_of(dtype, bits) as f32)
}

/// Largest finite magnitude pattern: just below the all-ones exponent, except for e4m3fn,
/// which uses that exponent for normal numbers and keeps only all-ones for NaN.
fn max_finite_magnitude(dtype: DType) -> u32 {
    match dtype {
        DType::Float8E4M3Fn => 0x7E,
        _ => (((1 << dtype.exponent_bits()) - 1) << dtype.mantissa_bits()) - 1,
    }
}

impl ValueGrid {
    /// The grid of `dtype` (8 or 16 bits), built once and shared.
    pub fn shared(dtype: DType) -> Arc<ValueGrid> {
        static CACHE: OnceLock<Mutex<Vec<Arc<ValueGrid>>>> = OnceLock::new();
        let cache = CACHE.get_or_init(|| Mutex::new(Vec::new()));
        let mut guard = cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(g) = guard.iter().find(|g| g.dtype == dtype) {
            return g.clone();
        }
        let grid = Arc::new(ValueGrid::build(dtype));
        guard.push(grid.clone());
        grid
    }

    fn build(dtype: DType) -> ValueGrid {
        assert!(dtype.bits() <= 16, "value grids are for 8- and 16-bit formats");
        let max_magnitude = max_finite_magnitude(dtype);
        let (min_ordinal, max_ordinal) = (-(max_magnitude as i64) - 1, max_magnitude as i64);
        let value = |k: i64| value_of(dtype, dtype.from_ordinal(k));
        let mut lower_edge = Vec::with_capacity((max_ordinal - min_ordinal + 2) as usize);
        for k in min_ordinal..=max_ordinal {
            let below = if k == min_ordinal { value(k) - (value(k + 1) - value(k)) } else { value(k - 1) };
            lower_edge.push(((below + value(k)) / 2.0) as f32);
        }
        let top = value(max_ordinal);
        lower_edge.push((top + (top - value(max_ordinal - 1)) / 2.0) as f32);
        ValueGrid {
            dtype,
            lower_edge,
            min_ordinal,
            max_ordinal,
            max_magnitude,
            mantissa_bits: dtype.mantissa_bits(),
            exponent_bias: dtype.exponent_bias() as i64,
        }
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Every lower edge (see `lower_edge`), for kernels that read them directly.
    pub(crate) fn edges(&self) -> &[f32] {
        &self.lower_edge
    }

    /// `(mantissa bits, exponent bias, largest finite magnitude)`: what `ordinal_toward_zero`
    /// needs of the format.
    pub(crate) fn layout(&self) -> (u32, i64, u32) {
        (self.mantissa_bits, self.exponent_bias, self.max_magnitude)
    }

    /// Lower edge of the interval of finite ordinal `k`; `k = max_ordinal + 1` gives the upper
    /// edge of the largest value. Out-of-range `k` is clamped.
    #[inline(always)]
    pub fn lower_edge(&self, k: i64) -> f64 {
        let i = (k - self.min_ordinal).clamp(0, self.lower_edge.len() as i64 - 1) as usize;
        self.lower_edge[i] as f64
    }

    /// The pattern whose rounding interval holds finite `v` (saturating at the largest
    /// finite values; ties go up). Deterministic integer and comparison work only.
    #[inline(always)]
    pub fn nearest_pattern(&self, v: f64) -> u32 {
        self.dtype.from_ordinal(self.nearest_ordinal(v))
    }

    /// Ordinal of `nearest_pattern`. `ordinal_toward_zero` truncates `|v|`, so the nearest
    /// pattern is that one or its neighbour away from zero; one comparison with that
    /// neighbour's edge decides, without a branch on the sign (which the decoder could not
    /// predict).
    #[inline(always)]
    pub fn nearest_ordinal(&self, v: f64) -> i64 {
        let k = self.ordinal_toward_zero(v);
        let negative = v.is_sign_negative();
        // Away from zero: k + 1 above zero, k - 1 below; the edge between them is the lower
        // edge of the larger ordinal.
        let away = if negative { k - 1 } else { k + 1 };
        let edge = self.lower_edge(if negative { k } else { k + 1 });
        let beyond = if negative { v < edge } else { v >= edge };
        let inside = away >= self.min_ordinal && away <= self.max_ordinal;
        // A mask rather than `if`: the compiler keeps it free of branches (`beyond` is a coin
        // toss for the decoder's guesses).
        let take = -((beyond & inside) as i64);
        k ^ ((k ^ away) & take)
    }

    /// An ordinal near `v`: the pattern whose magnitude is `|v|` truncated to the format (toward
    /// zero), clamped to the finite range. Monotone in `v`, deterministic, integer work on the
    /// bits of `v` only.
    #[inline(always)]
    pub fn ordinal_toward_zero(&self, v: f64) -> i64 {
        let bits = v.to_bits();
        let negative = bits >> 63 == 1;
        let m = self.mantissa_bits;
        let e64 = ((bits >> 52) & 0x7FF) as i64;
        let frac = bits & ((1u64 << 52) - 1);
        let magnitude = if e64 == 0x7FF {
            if frac != 0 {
                0 // NaN: anywhere deterministic will do
            } else {
                self.max_magnitude as u64
            }
        } else {
            // Biased exponent in the target format.
            let e = e64 - 1023 + self.exponent_bias;
            if e >= 1 {
                ((e as u64) << m | frac >> (52 - m)).min(self.max_magnitude as u64)
            } else {
                // Subnormal in the target: shift the full significand further right.
                let shift = (52 - m as i64) + (1 - e);
                if shift >= 64 || e64 == 0 {
                    0
                } else {
                    (frac | 1u64 << 52) >> shift
                }
            }
        };
        // -m - 1 == !m: flip every bit for negative values, without a branch.
        (magnitude as i64) ^ -(negative as i64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edges_bracket_every_value_and_increase() {
        for dtype in [DType::BFloat16, DType::Float16, DType::Float8E4M3Fn, DType::Float8E5M2] {
            let g = ValueGrid::build(dtype);
            for k in g.min_ordinal..=g.max_ordinal {
                let v = value_of(dtype, dtype.from_ordinal(k));
                assert!(g.lower_edge(k) <= v && v <= g.lower_edge(k + 1), "{dtype:?} {k}");
                assert!(g.lower_edge(k) < g.lower_edge(k + 1), "{dtype:?} {k}");
                if v != 0.0 {
                    assert_eq!(g.ordinal_toward_zero(v), k, "{dtype:?} value {v}");
                }
            }
            assert_eq!(g.lower_edge(0), 0.0);
        }
        let g = ValueGrid::build(DType::BFloat16);
        assert_eq!(g.max_ordinal, 0x7F7F);
        assert_eq!(ValueGrid::build(DType::Float8E4M3Fn).max_ordinal, 0x7E);
        assert_eq!(ValueGrid::build(DType::Float8E5M2).max_ordinal, 0x7B);
        assert_eq!(ValueGrid::build(DType::Float16).max_ordinal, 0x7BFF);
    }

    #[test]
    fn nearest_pattern_matches_round_to_nearest() {
        let g = ValueGrid::build(DType::BFloat16);
        let mut v = 1e-38f32;
        while v < 1e38 {
            for x in [v, -v, v * 1.003, -v * 0.997] {
                let bits = x.to_bits();
                let rne = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16;
                let got = g.nearest_pattern(x as f64);
                // ties may differ from round-half-even; nothing else may
                assert!(got == rne || (got as i64 - rne as i64).abs() == 1 && bits & 0xFFFF == 0x8000, "{x}");
            }
            v *= 1.37;
        }
        assert_eq!(g.nearest_pattern(0.0), 0);
        assert_eq!(g.nearest_pattern(-0.0), 0x8000);
    }

    #[test]
    fn ordinal_toward_zero_is_monotone_and_truncates() {
        let g = ValueGrid::build(DType::BFloat16);
        let mut last = i64::MIN;
        let mut v = -1e39f64;
        while v < 1e39 {
            let k = g.ordinal_toward_zero(v);
            assert!(k >= last);
            let kv = value_of(DType::BFloat16, DType::BFloat16.from_ordinal(k));
            assert!(kv.abs() <= v.abs() || k == g.max_ordinal || k == g.min_ordinal);
            last = k;
            v = if v.abs() < 1e-42 {
                -v + 1e-43
            } else if v < 0.0 {
                v * 0.93
            } else {
                v * 1.07
            };
        }
    }
}
