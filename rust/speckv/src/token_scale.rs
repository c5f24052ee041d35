//! The adaptive token scale: inside a jointly coded layer, each token's sigma follows how large
//! that token's residuals have been in the channels already coded.
//!
//! Why: a token's residuals in every channel are projections of one hidden-state error, so
//! their *size* varies from token to token together (a scale mixture: the joint model's
//! conditional residuals have a kurtosis of ~4.4 where a Gaussian has 3). The joint model
//! (`crate::joint`) codes a layer channel-major, so when channel `i` of token `t` is coded the
//! decoder already has channels `0..i` of that token: their standardised residuals say how
//! large this token's errors are. On SmolLM2-135M with the fp8 predictor this takes 0.08-0.10
//! bits off every bf16 scalar and 0.04-0.05 off every fp8 one, on held-out text of either
//! bundled genre (kurtosis back to ~3.35).
//!
//! The model, per layer and token `t`, before channel `i` (`prior` and `clamp` from the
//! stream header):
//!
//! ```text
//! z[j, t]   = (value(x[j, t]) - mu'[j, t]) * (1 / sigma[j])     mu' the joint model's mean,
//!                                                                sigma the channel's own
//! energy[t] = sum_{j < i} min(z[j, t]^2, clamp)                 in order j = 0, 1, ...
//! ratio     = (prior + energy[t]) * (1 / (prior + i))
//! code'     = clamp_to_ladder(code[i, t] + sigma_code(sqrt(ratio)))
//! ```
//!
//! so the first channel is coded with its calibrated sigma and later ones with
//! `sigma * sqrt(ratio)`: the running mean of the token's squared standardised residuals,
//! with `prior` pseudo-channels of exactly the calibrated size. `clamp` keeps one outlier
//! (a far value, an escape) from inflating the rest of its token.
//!
//! Invariant (J3), what keeps both sides in step bit for bit: every step above is one
//! correctly rounded float32 operation taken in the order written (`1 / sigma` is the ladder's
//! exact `f64` reciprocal rounded once to f32, `sqrt` is IEEE's, `min` is exact), the
//! residual is `crate::joint::residuals`' (0 where not finite), and `sigma_code` reads only
//! bits. The state starts from zero at every layer, so a chunk of whole layers codes alone.

use crate::error::{invalid, Result};
use crate::model::ladder::{normal_sigma_code, SigmaTable, SIGMA_CODE_MAX, SIGMA_CODE_MIN};

/// The token scale's two knobs, as the stream header stores them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TokenScale {
    /// Pseudo-channels of calibrated size the running mean starts from (1..=255): small
    /// trusts a token's first channels sooner.
    pub prior: u8,
    /// Largest squared standardised residual one channel adds (1..=255).
    pub clamp: u8,
}

impl Default for TokenScale {
    /// Chosen by measurement (SmolLM2-135M, fp8 predictor, both bundled genres, ideal code
    /// lengths): priors 2-8 are within 0.001 b/scalar of each other, 4 is best on the
    /// average; the clamp changes nothing measurable on real caches at 25, and bounds what a
    /// single far outlier can do to its token.
    fn default() -> Self {
        TokenScale { prior: 4, clamp: 25 }
    }
}

impl TokenScale {
    pub fn validate(&self) -> std::result::Result<(), String> {
        if self.prior == 0 || self.clamp == 0 {
            return Err(format!("token scale: prior {} and clamp {} must be at least 1", self.prior, self.clamp));
        }
        Ok(())
    }

    pub(crate) fn check(&self) -> Result<()> {
        self.validate().map_or_else(invalid, Ok)
    }
}

/// One chunk's running state: the energy of every token of the layer being coded.
pub(crate) struct TokenEnergy {
    scale: TokenScale,
    energy: Vec<f32>,
    residual: Vec<f32>,
}

impl TokenEnergy {
    pub(crate) fn new(scale: TokenScale, tokens: usize) -> TokenEnergy {
        TokenEnergy { scale, energy: vec![0.0; tokens], residual: vec![0.0; tokens] }
    }

    /// A new layer starts from nothing coded.
    pub(crate) fn reset(&mut self) {
        self.energy.fill(0.0);
    }

    /// Channel `i`'s sigma codes per token (J3): `codes` the calibrated ones, `out` the
    /// scaled ones.
    #[inline(always)]
    pub(crate) fn codes(&self, i: usize, codes: &[i16], out: &mut [i16]) {
        let prior = self.scale.prior as f32;
        let inverse = 1.0f32 / (prior + i as f32);
        for ((slot, &code), &e) in out.iter_mut().zip(codes).zip(&self.energy) {
            // ratio >= prior / (prior + i) > 2^-126 and <= 256: a normal float, and so is its
            // root, whose code `normal_sigma_code` reads without a branch
            let ratio = (prior + e) * inverse;
            let shift = normal_sigma_code(ratio.sqrt()).clamp(SIGMA_CODE_MIN, SIGMA_CODE_MAX);
            *slot = (code as i32 + shift).clamp(SIGMA_CODE_MIN, SIGMA_CODE_MAX) as i16;
        }
    }

    /// Adds channel `i`'s coded values to the energy (J3): `values` are theirs
    /// (`joint::values_into`), `corrected` the mean they were coded against, `codes` their
    /// calibrated sigma codes.
    #[inline(always)]
    pub(crate) fn add(&mut self, values: &[f32], corrected: &[f32], codes: &[i16]) {
        crate::joint::residuals_of(values, corrected, &mut self.residual);
        let (table, clamp) = (SigmaTable::shared(), self.scale.clamp as f32);
        let step = |e: &mut f32, u: f32, inverse: f32| {
            let z = u * inverse;
            *e += (z * z).min(clamp);
        };
        match codes.first() {
            // a channel's calibrated sigma is one code for all its tokens: one lookup
            Some(&first) if codes.iter().all(|&c| c == first) => {
                let inverse = table.get(first).1 as f32;
                for (e, &u) in self.energy.iter_mut().zip(&self.residual) {
                    step(e, u, inverse);
                }
            }
            _ => {
                for ((e, &u), &code) in self.energy.iter_mut().zip(&self.residual).zip(codes) {
                    step(e, u, table.get(code).1 as f32);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bf16_values(x: &[u16]) -> Vec<f32> {
        let mut out = vec![0.0; x.len()];
        crate::joint::values_into(crate::dtype::DType::BFloat16, x, &mut out);
        out
    }

    #[test]
    fn a_token_with_large_residuals_gets_a_larger_sigma() {
        let mut s = TokenEnergy::new(TokenScale::default(), 3);
        let codes = [0i16; 3];
        let mut out = [0i16; 3];
        s.codes(0, &codes, &mut out);
        assert_eq!(out, [0, 0, 0], "the first channel keeps its calibrated sigma");
        // residuals of 0, 1 and 4 sigmas (sigma code 0 = 1.0) in channel 0
        let x: [u16; 3] = [0x0000, 0x3F80, 0x4080]; // 0, 1, 4 in bfloat16
        s.add(&bf16_values(&x), &[0.0; 3], &codes);
        s.codes(1, &codes, &mut out);
        // ratios 4/5, 5/5, 20/5: 8 log2 sqrt = -0.64, 0, 8
        assert_eq!(out, [-1, 0, 8]);
        // the clamp: a residual of 100 sigmas adds 25, not 10^4
        s.reset();
        s.add(&bf16_values(&[0x42C8, 0, 0]), &[0.0; 3], &codes); // 100
        s.codes(1, &codes, &mut out);
        assert_eq!(out[0], 10, "ratio 29/5: round(4 log2 5.8) = 10");
    }
}
