//! Floats become integers once: sigma becomes a *sigma code* `round(8 log2 sigma)`, computed from
//! its bits with integer comparisons only, and a prediction's exponent turns it into a *scale
//! code* `round(8 log2 s)` where `s = sigma / ulp(mu)` is the residual's scale in ulps.

use super::params::{ModelParams, STEPS_PER_OCTAVE};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// `ceil(2^23 (2^((2i+1)/16) - 1))`: an f32 mantissa at or above entry `i` rounds
/// `8 log2(1 + m / 2^23)` up past `i + 1/2`. (Checked against libm in the tests.)
const MANTISSA_THRESHOLDS: [u32; 8] = [371396, 1164244, 2028851, 2971711, 3999908, 5121165, 6343903, 7677310];

/// Sigma codes are clamped here; nothing finer or coarser changes any table choice.
pub const SIGMA_CODE_MIN: i32 = -8 * 127;
pub const SIGMA_CODE_MAX: i32 = 8 * 128;

/// `round(8 log2 sigma)` from the bits of a positive finite f32; subnormals clamp to
/// `SIGMA_CODE_MIN`. Errors name the offending value.
pub fn sigma_code(sigma: f32) -> Result<i16> {
    if !(sigma.is_finite() && sigma > 0.0) {
        return Err(Error::InvalidArgument(format!("sigma must be positive and finite, got {sigma}")));
    }
    let bits = sigma.to_bits();
    let exponent = (bits >> 23) as i32;
    if exponent == 0 {
        return Ok(SIGMA_CODE_MIN as i16);
    }
    let mantissa = bits & 0x7F_FFFF;
    let step = MANTISSA_THRESHOLDS.iter().filter(|&&t| mantissa >= t).count() as i32;
    Ok((STEPS_PER_OCTAVE * (exponent - 127) + step).clamp(SIGMA_CODE_MIN, SIGMA_CODE_MAX) as i16)
}

/// `sigma_code` of a positive *normal* float32 (no zero, subnormal, infinity or NaN), before
/// clamping: the same integer with no branch, so a loop over many vectorises.
#[inline(always)]
pub fn normal_sigma_code(sigma: f32) -> i32 {
    let bits = sigma.to_bits();
    let mantissa = bits & 0x7F_FFFF;
    let step: i32 = MANTISSA_THRESHOLDS.iter().map(|&t| (mantissa >= t) as i32).sum();
    STEPS_PER_OCTAVE * ((bits >> 23) as i32 - 127) + step
}

/// Per-scalar codes of a relative sigma, `sigma_code(sqrt(s^2 + (r mu)^2))` with correctly
/// rounded float32 steps (the same codes on every machine): `mu` is `[.., heads, tokens, dim]`
/// and `s`, `r` are `[heads, dim]`. The loop over a row vectorises (`normal_sigma_code`); a
/// sigma that is not a positive normal float32 takes `sigma_code`'s path (and its error).
pub fn relative_codes(mu: &[f32], s: &[f32], r: &[f32], heads: usize, tokens: usize, dim: usize) -> Result<Vec<i16>> {
    let mut codes = vec![0i16; mu.len()];
    let mut odd = false;
    each_relative_sigma(mu, s, r, heads, tokens, dim, &mut codes, |code, sigma| {
        odd |= !sigma.is_normal();
        *code = normal_sigma_code(sigma).clamp(SIGMA_CODE_MIN, SIGMA_CODE_MAX) as i16;
        Ok(())
    })?;
    if odd {
        // zero, subnormal or not finite somewhere: those scalars as `sigma_code` says
        each_relative_sigma(mu, s, r, heads, tokens, dim, &mut codes, |code, sigma| {
            if !sigma.is_normal() {
                *code = sigma_code(sigma)?;
            }
            Ok(())
        })?;
    }
    Ok(codes)
}

/// `f(code slot, sqrt(s^2 + (r mu)^2))` for every scalar of `mu`, in order.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn each_relative_sigma(
    mu: &[f32],
    s: &[f32],
    r: &[f32],
    heads: usize,
    tokens: usize,
    dim: usize,
    codes: &mut [i16],
    mut f: impl FnMut(&mut i16, f32) -> Result<()>,
) -> Result<()> {
    // one row = one token of one head: its channels line up with s and r's row
    for (row_index, (row, out)) in mu.chunks_exact(dim).zip(codes.chunks_exact_mut(dim)).enumerate() {
        let h = row_index / tokens % heads;
        let (s_row, r_row) = (&s[h * dim..(h + 1) * dim], &r[h * dim..(h + 1) * dim]);
        for (((code, &m), &sc), &rc) in out.iter_mut().zip(row).zip(s_row).zip(r_row) {
            let scaled = rc * m;
            f(code, (sc * sc + scaled * scaled).sqrt())?;
        }
    }
    Ok(())
}

/// `2^(r/8)` for `r = 0..8`, from the pure-Rust libm (identical on every platform).
fn eighth_octave_roots() -> &'static [f64; 8] {
    static ROOTS: std::sync::OnceLock<[f64; 8]> = std::sync::OnceLock::new();
    ROOTS.get_or_init(|| std::array::from_fn(|r| libm::exp2(r as f64 / 8.0)))
}

/// The ladder value `2^(code/8)` of a sigma code, and its reciprocal, exactly as both coder
/// sides compute them (an exact power of two times a fixed root).
#[inline]
pub fn sigma_and_inverse(code: i16) -> (f64, f64) {
    let roots = eighth_octave_roots();
    let (octave, step) = ((code as i32).div_euclid(8), (code as i32).rem_euclid(8) as usize);
    let pow2 = |e: i32| f64::from_bits(((e + 1023) as u64) << 52);
    (roots[step] * pow2(octave), pow2(-octave) / roots[step])
}

/// `sigma_and_inverse` of every sigma code, looked up instead of recomputed per scalar.
#[derive(Debug)]
pub struct SigmaTable {
    entries: Vec<(f64, f64)>,
}

impl SigmaTable {
    pub fn shared() -> &'static SigmaTable {
        static TABLE: std::sync::OnceLock<SigmaTable> = std::sync::OnceLock::new();
        TABLE.get_or_init(|| SigmaTable {
            entries: (SIGMA_CODE_MIN..=SIGMA_CODE_MAX).map(|c| sigma_and_inverse(c as i16)).collect(),
        })
    }

    /// `(sigma, 1 / sigma)` of a code; codes outside the ladder clamp to its ends.
    #[inline(always)]
    pub fn get(&self, code: i16) -> (f64, f64) {
        self.entries[((code as i32).clamp(SIGMA_CODE_MIN, SIGMA_CODE_MAX) - SIGMA_CODE_MIN) as usize]
    }
}

/// Where a scale code sends a residual: table `table`, after dropping `shift` low bits that
/// are coded uniformly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableChoice {
    pub table: u16,
    pub shift: u8,
}

/// Packs a table choice into one integer: what the coder needs per scalar, and what the
/// fingerprint hashes.
#[inline(always)]
pub(crate) fn choice_word(c: TableChoice) -> u16 {
    c.table | (c.shift as u16) << CHOICE_SHIFT_POS
}

pub(crate) const CHOICE_SHIFT_POS: u32 = 10;
pub(crate) const CHOICE_TABLE_MASK: u16 = (1 << CHOICE_SHIFT_POS) - 1;

/// Per-dtype lookups turning `(sigma code, exponent field of mu)` into a [`TableChoice`] with
/// two array reads and a clamp.
#[derive(Debug, Clone)]
pub struct ScaleMap {
    /// `-8 * log2 ulp(mu)` per exponent field.
    exponent_offset: Vec<i32>,
    min_code: i32,
    max_code: i32,
    /// Table choice per clamped scale code, packed by `choice_word`.
    packed: Vec<u16>,
    mantissa_bits: u32,
    exponent_mask: u32,
}

impl ScaleMap {
    pub fn new(dtype: DType, params: &ModelParams) -> ScaleMap {
        let exponent_offset =
            (0..1u32 << dtype.exponent_bits()).map(|e| -STEPS_PER_OCTAVE * dtype.ulp_log2(e)).collect();
        let min_code = params.min_scale_code();
        let top = params.max_scale_code();
        // A residual is at most 2^bits ulps away, so no shift beyond the width is ever useful.
        let max_code = top + STEPS_PER_OCTAVE * dtype.bits() as i32;
        let choices: Vec<TableChoice> = (min_code..=max_code)
            .map(|code| {
                let shift = if code > top { (code - top + STEPS_PER_OCTAVE - 1) / STEPS_PER_OCTAVE } else { 0 };
                let table = code - STEPS_PER_OCTAVE * shift - min_code;
                TableChoice { table: table as u16, shift: shift as u8 }
            })
            .collect();
        let packed = choices.into_iter().map(choice_word).collect();
        ScaleMap {
            exponent_offset,
            min_code,
            max_code,
            packed,
            mantissa_bits: dtype.mantissa_bits(),
            exponent_mask: (1 << dtype.exponent_bits()) - 1,
        }
    }

    /// The packed choice for a scalar predicted by the pattern `mu_bits`.
    #[inline(always)]
    pub fn choose_packed(&self, sigma_code: i16, mu_bits: u32) -> u16 {
        let exponent = (mu_bits >> self.mantissa_bits) & self.exponent_mask;
        let code = (sigma_code as i32 + self.exponent_offset[exponent as usize]).clamp(self.min_code, self.max_code);
        self.packed[(code - self.min_code) as usize]
    }

    /// The same choice, unpacked, for a prediction with this exponent field.
    pub fn choose(&self, sigma_code: i16, exponent_field: u32) -> TableChoice {
        let word = self.choose_packed(sigma_code, exponent_field << self.mantissa_bits);
        TableChoice { table: word & CHOICE_TABLE_MASK, shift: (word >> CHOICE_SHIFT_POS) as u8 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_codes_are_sigma_code_of_each_scalar() {
        let (heads, tokens, dim) = (3usize, 5usize, 4usize);
        let mut seed = 3u64;
        let mut next = move || {
            seed = crate::test_env::lcg_step(seed);
            let unit = (seed >> 40) as f32 / (1u64 << 24) as f32; // [0, 1)
            (unit * 20.0 - 10.0) * 0.01f32.powi((seed & 3) as i32)
        };
        let s: Vec<f32> = (0..heads * dim).map(|_| next().abs() + 1e-3).collect();
        let r: Vec<f32> = (0..heads * dim).map(|_| next().abs()).collect();
        let mut mu: Vec<f32> = (0..2 * heads * tokens * dim).map(|_| next()).collect();
        let reference = |mu: &[f32]| -> Result<Vec<i16>> {
            mu.iter()
                .enumerate()
                .map(|(k, &m)| {
                    let h = k / dim / tokens % heads;
                    let (sc, rc) = (s[h * dim + k % dim], r[h * dim + k % dim]);
                    sigma_code((sc * sc + (rc * m) * (rc * m)).sqrt())
                })
                .collect()
        };
        assert_eq!(relative_codes(&mu, &s, &r, heads, tokens, dim).unwrap(), reference(&mu).unwrap());
        // a sigma that underflows to zero or overflows is an error, as in sigma_code
        let (tiny, zero) = (vec![1e-30f32; heads * dim], vec![0f32; heads * dim]);
        assert!(relative_codes(&mu, &tiny, &zero, heads, tokens, dim).is_err());
        mu[7] = f32::INFINITY;
        assert!(relative_codes(&mu, &s, &r, heads, tokens, dim).is_err());
    }

    #[test]
    fn thresholds_match_libm() {
        for (i, &t) in MANTISSA_THRESHOLDS.iter().enumerate() {
            let exact = libm::exp2((2 * i + 1) as f64 / 16.0) - 1.0;
            assert_eq!(t, libm::ceil(exact * (1u64 << 23) as f64) as u32);
        }
    }

    #[test]
    fn sigma_code_is_rounded_eighth_octaves() {
        let mut x = 1e-30f32;
        while x < 1e30 {
            let expected = libm::round(8.0 * libm::log2(x as f64)) as i32;
            assert_eq!(sigma_code(x).unwrap() as i32, expected, "sigma {x}");
            x *= 1.0137;
        }
        assert_eq!(sigma_code(1.0).unwrap(), 0);
        assert_eq!(sigma_code(2.0).unwrap(), 8);
        assert_eq!(sigma_code(f32::from_bits(1)).unwrap() as i32, SIGMA_CODE_MIN);
        for bad in [0.0, -1.0, f32::NAN, f32::INFINITY] {
            assert!(sigma_code(bad).is_err());
        }
    }

    #[test]
    fn the_branch_free_code_of_normal_floats_is_sigma_code() {
        // every mantissa threshold's neighbours in a few binades, then a sweep
        let mut values = vec![f32::MIN_POSITIVE, 1.0, 255.9, 3.4e38];
        for e in [-126i32, -20, -1, 0, 1, 7, 127] {
            for &t in &MANTISSA_THRESHOLDS {
                for m in [t - 1, t, t + 1] {
                    values.push(f32::from_bits((((e + 127) as u32) << 23) | m));
                }
            }
        }
        let mut x = 1.0e-37f32;
        while x < 1e37 {
            values.push(x);
            x *= 1.013;
        }
        for v in values {
            let clamped = normal_sigma_code(v).clamp(SIGMA_CODE_MIN, SIGMA_CODE_MAX) as i16;
            assert_eq!(clamped, sigma_code(v).unwrap(), "{v:e}");
        }
    }

    #[test]
    fn ladder_values_are_powers_of_the_eighth_root_of_two() {
        for code in [SIGMA_CODE_MIN as i16, -9, -8, -1, 0, 1, 7, 8, 100, SIGMA_CODE_MAX as i16] {
            let (s, inv) = sigma_and_inverse(code);
            let exact = 2f64.powf(code as f64 / 8.0);
            assert!((s / exact - 1.0).abs() < 1e-15, "{code}");
            assert!((s * inv - 1.0).abs() < 1e-15, "{code}");
        }
        assert_eq!(sigma_and_inverse(8).0, 2.0);
    }

    #[test]
    fn scale_choice_tracks_sigma_over_ulp() {
        let params = ModelParams::default();
        let map = ScaleMap::new(DType::BFloat16, &params);
        let e_one = DType::BFloat16.exponent_field(0x3F80); // ulp 2^-7
                                                            // sigma = 2^-7 -> s = 1 ulp -> code 0 -> table 32 (min code -32), no shift
        let c = map.choose(sigma_code(2f32.powi(-7)).unwrap(), e_one);
        assert_eq!(c, TableChoice { table: 32, shift: 0 });
        // sigma = 2^3 -> s = 2^10 ulp -> 4 octaves above the top table
        let c = map.choose(sigma_code(8.0).unwrap(), e_one);
        assert_eq!(c.shift, 4);
        assert_eq!(c.table as usize, params.n_tables() - 1);
        // tiny sigma clamps to the first table
        assert_eq!(map.choose(sigma_code(1e-30).unwrap(), e_one), TableChoice { table: 0, shift: 0 });
    }
}
