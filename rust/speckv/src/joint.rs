//! The joint residual model: a layer's scalars coded channel by channel, each channel's
//! prediction corrected by the residuals already coded for the same token.
//!
//! Every head's residual is a projection of the same hidden-state error, so a token's
//! residuals across channels, heads and K/V are strongly correlated; a calibrated linear
//! conditional model (coefficients from the Cholesky factor of their covariance) turns that
//! into a better `mu` and a smaller sigma for every channel after the first.
//!
//! Layout: a stream coded with it (`FLAG_JOINT`) holds whole layers of `C` channels x `T`
//! tokens, channel-major (scalar `c * T + t` of a layer is channel `c` of token `t`), and its
//! chunks hold whole layers. The residual of a scalar is `e = value(x) - mu` in float32 (0 where
//! that is not finite). Channel `i` of token `t` is coded against
//!
//! ```text
//! mu'[i, t] = mu[i, t] + acc,   acc = offset[i] + sum_{j < E} a[i, j] * o[j, t]
//!                                              + sum_{j < i} a[i, E + j] * e[j, t]
//! ```
//!
//! with `o` the `E` residual channels given from outside the stream (e.g. the same tokens' keys
//! when coding values), `a` (`C x (E + C)`, row `i` reads columns `..E + i`) and `offset` the
//! layer's calibrated parameters.
//!
//! Invariant (J1), what makes encoder and decoder agree bit for bit on any machine and thread
//! count: `acc` is built in exactly this order, `acc = acc + (a * o)` with the product and the
//! sum each one correctly rounded float32 operation (Rust never fuses them unless asked with
//! `mul_add`; the loop over tokens vectorises lane-wise without reordering any token's sum),
//! zero coefficients skipped (by both sides alike), then `mu' = mu + acc`.

use std::sync::OnceLock;

use crate::error::{invalid, Result};
use crate::hash::Hasher;
use crate::words::Word;
use crate::DType;

/// A joint residual model for a stream of whole layers (see the module's notes).
#[derive(Debug, Clone, Copy)]
pub struct Joint<'a> {
    /// Channels of a layer (`C`) and tokens (`T`).
    pub channels: usize,
    pub tokens: usize,
    /// Residual channels given from outside the stream per layer (`E`, may be 0), and their
    /// values: `layers x E x T`.
    pub outside_channels: usize,
    pub outside: &'a [f32],
    /// `layers x C x (E + C)` coefficients and `layers x C` offsets.
    pub coef: &'a [f32],
    pub offset: &'a [f32],
}

impl<'a> Joint<'a> {
    pub fn layer_scalars(&self) -> usize {
        self.channels * self.tokens
    }

    fn width(&self) -> usize {
        self.outside_channels + self.channels
    }

    /// Checks the arrays against a stream of `n` scalars in chunks of `chunk` (whole layers).
    pub fn check(&self, n: usize, chunk: usize) -> Result<()> {
        let per_layer = self.layer_scalars();
        if self.channels == 0 || self.tokens == 0 || !n.is_multiple_of(per_layer) || !chunk.is_multiple_of(per_layer) {
            return invalid(format!(
                "joint: {n} scalars in chunks of {chunk} are not whole layers of {} channels x {} tokens",
                self.channels, self.tokens
            ));
        }
        let layers = n / per_layer;
        let sizes = [
            (self.outside.len(), layers * self.outside_channels * self.tokens, "outside residuals"),
            (self.coef.len(), layers * self.channels * self.width(), "coefficients"),
            (self.offset.len(), layers * self.channels, "offsets"),
        ];
        for (got, want, what) in sizes {
            if got != want {
                return invalid(format!("joint: {got} {what} given, {want} expected for {layers} layers"));
            }
        }
        Ok(())
    }

    /// Digest of one layer's parameters (and the layout), mixed into each chunk's prediction
    /// fingerprint: a decoder given other parameters is refused before it decodes. The outside
    /// residuals are not in it: they come from data that is itself checked.
    pub fn digest(&self, layer: usize) -> u64 {
        let mut h = Hasher::new();
        for v in [self.channels, self.tokens, self.outside_channels] {
            h.update(&(v as u64).to_le_bytes());
        }
        let rows = self.channels * self.width();
        for v in &self.coef[layer * rows..(layer + 1) * rows] {
            h.update(&v.to_bits().to_le_bytes());
        }
        for v in &self.offset[layer * self.channels..(layer + 1) * self.channels] {
            h.update(&v.to_bits().to_le_bytes());
        }
        h.finish()
    }

    /// `mu'` of channel `i` of `layer` (invariant J1): `mu` is the channel's run of `T`
    /// predictions, `own` the residuals of channels `..i` of the layer (channel-major).
    pub fn conditional(&self, layer: usize, i: usize, mu: &[f32], own: &[f32], out: &mut [f32]) {
        let (t, e) = (self.tokens, self.outside_channels);
        let row = &self.coef[(layer * self.channels + i) * self.width()..][..e + i];
        out.fill(self.offset[layer * self.channels + i]);
        let outside = &self.outside[layer * e * t..(layer + 1) * e * t];
        let sources = outside.chunks_exact(t).chain(own[..i * t].chunks_exact(t));
        for (&a, source) in row.iter().zip(sources) {
            if a == 0.0 {
                continue;
            }
            for (acc, &r) in out.iter_mut().zip(source) {
                *acc += a * r;
            }
        }
        for (acc, &m) in out.iter_mut().zip(mu) {
            *acc += m; // float addition commutes exactly: mu + acc
        }
    }
}

/// `out[k] = value(x[k]) - mu[k]` in float32, 0 where that is not finite (invariant J1's `e`).
pub fn residuals<W: Word>(dtype: DType, x: &[W], mu: &[f32], out: &mut [f32]) {
    let table = values(dtype);
    for ((slot, &w), &m) in out.iter_mut().zip(x).zip(mu) {
        let v = match table {
            Some(t) => t[w.to_u32() as usize],
            None => f32::from_bits(w.to_u32()),
        };
        let r = v - m;
        *slot = if r.is_finite() { r } else { 0.0 };
    }
}

/// Each pattern's value as float32 (exact for 8/16-bit formats; NaN for non-finite ones),
/// built once per format; `None` for float32 itself.
fn values(dtype: DType) -> Option<&'static [f32]> {
    static TABLES: [OnceLock<Vec<f32>>; 4] = [OnceLock::new(), OnceLock::new(), OnceLock::new(), OnceLock::new()];
    let slot = match dtype {
        DType::BFloat16 => 0,
        DType::Float16 => 1,
        DType::Float8E4M3Fn => 2,
        DType::Float8E5M2 => 3,
        DType::Float32 => return None,
    };
    Some(TABLES[slot].get_or_init(|| {
        (0..1u32 << dtype.bits())
            .map(|bits| crate::model::grid::finite_value(dtype, bits).unwrap_or(f32::NAN))
            .collect()
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn residuals_are_exact_and_zero_where_not_finite() {
        let x: [u16; 4] = [0x3F80, 0xBFC0, 0x7F80, 0x7FC1]; // 1, -1.5, inf, NaN in bfloat16
        let mut out = [9.0; 4];
        residuals(DType::BFloat16, &x, &[0.25, 0.5, 0.0, 1.0], &mut out);
        assert_eq!(out, [0.75, -2.0, 0.0, 0.0]);
        let fp8: [u8; 3] = [0x38, 0x7F, 0xFE]; // 1.0, NaN, -448 in e4m3fn
        let mut out = [9.0; 3];
        residuals(DType::Float8E4M3Fn, &fp8, &[0.0, 0.0, -400.0], &mut out);
        assert_eq!(out, [1.0, 0.0, -48.0]);
    }

    #[test]
    fn conditional_means_follow_the_stated_order() {
        // 2 channels x 3 tokens, one outside channel
        let joint = Joint {
            channels: 2,
            tokens: 3,
            outside_channels: 1,
            outside: &[1.0, 2.0, 3.0],
            coef: &[0.5, 9.0, 9.0, 0.25, -1.0, 9.0],
            offset: &[0.125, 0.0],
        };
        joint.check(6, 6).unwrap();
        let mut out = [0.0; 3];
        joint.conditional(0, 0, &[10.0, 20.0, 30.0], &[], &mut out);
        assert_eq!(out, [10.0 + 0.125 + 0.5, 20.0 + 0.125 + 1.0, 30.0 + 0.125 + 1.5]);
        joint.conditional(0, 1, &[0.0; 3], &[1.0, -1.0, 4.0], &mut out);
        assert_eq!(out, [0.25 - 1.0, 0.5 + 1.0, 0.75 - 4.0]);
        assert!(joint.check(6, 4).is_err());
        assert!(Joint { coef: &[0.0; 5], ..joint }.check(6, 6).is_err());
        assert_ne!(joint.digest(0), Joint { offset: &[0.125, -0.0], ..joint }.digest(0));
    }
}
