//! A map's features gathered from the tensors they come from: each source's heads side by
//! side per token, a key's rotary position embedding undone on the way, so the caller does not
//! build (and the map does not read) a float copy of the features first.
//!
//! A source is one layer's K or V (or any `batch x heads x tokens x dim` float32 tensor,
//! row-major). Row `r` of a map over `rows` positions is token `t = r % rows` of batch entry
//! `r / rows`; a source of `n` tokens holds the last `n` positions, so it gives token
//! `t - (rows - n)` where that is in range (the last `rows` of its tokens where `n > rows`)
//! and zeros before it (a sliding-window layer's missing tokens). Its features there are its
//! heads' `dim` values in order, `heads * dim` in all; sources follow one another.
//!
//! Invariant (R1), what keeps these features the bits of the torch code they replace
//! (`speckv.predictors.rope.Rope.unrope` then the token layout): with `h = dim / 2` and
//! `half[c] = -x[c + h]` for `c < h`, `x[c - h]` otherwise,
//!
//! ```text
//! feature[c] = x[c] * cos[t, c] - half[c] * sin[t, c]      three correctly rounded f32
//!                                                           operations, in this order
//! ```
//!
//! (negation is exact; Rust never fuses the multiplies into the subtraction), and a source
//! without tables gives `x[c]` itself.

use crate::error::{invalid, Result};

/// One tensor the features come from (see the module's notes).
#[derive(Debug, Clone, Copy)]
pub struct Source<'a> {
    /// `batch x heads x tokens x dim` float32, row-major.
    pub data: &'a [f32],
    pub heads: usize,
    pub tokens: usize,
    pub dim: usize,
    /// The rotation to undo: `cos` and `sin`, `tokens x dim` (this source's own positions),
    /// or None for values and other sources without one.
    pub rope: Option<(&'a [f32], &'a [f32])>,
}

impl Source<'_> {
    fn width(&self) -> usize {
        self.heads * self.dim
    }

    /// Checks the source's arrays against `batch` entries.
    fn check(&self, batch: usize) -> Result<()> {
        let want = batch
            .checked_mul(self.heads)
            .and_then(|v| v.checked_mul(self.tokens))
            .and_then(|v| v.checked_mul(self.dim));
        if want != Some(self.data.len()) || self.heads == 0 || self.dim == 0 {
            return invalid(format!(
                "linear map: a source of {} values is not {batch} x {} heads x {} tokens x {}",
                self.data.len(),
                self.heads,
                self.tokens,
                self.dim
            ));
        }
        if let Some((cos, sin)) = self.rope {
            if !self.dim.is_multiple_of(2) || cos.len() != self.tokens * self.dim || sin.len() != cos.len() {
                return invalid(format!(
                    "linear map: rotary tables of {} and {} values for {} tokens x {} (an even dim)",
                    cos.len(),
                    sin.len(),
                    self.tokens,
                    self.dim
                ));
            }
        }
        Ok(())
    }
}

/// Checks `sources` for a map of `features` inputs over `batch x rows` rows.
pub(super) fn check(sources: &[Source], batch: usize, features: usize) -> Result<()> {
    for s in sources {
        s.check(batch)?;
    }
    let width: usize = sources.iter().map(Source::width).sum();
    if width != features {
        return invalid(format!("linear map: sources of {width} features for a map of {features}"));
    }
    Ok(())
}

/// Rows `first..first + n` of the features (`n x features`, row-major) into `out`.
pub(super) fn gather(sources: &[Source], rows: usize, first: usize, n: usize, out: &mut [f32]) {
    let features: usize = sources.iter().map(Source::width).sum();
    for (k, row) in out[..n * features].chunks_exact_mut(features).enumerate() {
        let (b, t) = ((first + k) / rows, (first + k) % rows);
        let mut at = 0;
        for s in sources {
            let cols = &mut row[at..at + s.width()];
            at += s.width();
            // the source's token at position `t` of the map's rows, if it holds it
            let Some(token) = (t + s.tokens).checked_sub(rows).filter(|&i| i < s.tokens) else {
                cols.fill(0.0);
                continue;
            };
            for (head, dst) in cols.chunks_exact_mut(s.dim).enumerate() {
                let x = &s.data[((b * s.heads + head) * s.tokens + token) * s.dim..][..s.dim];
                match s.rope {
                    None => dst.copy_from_slice(x),
                    Some((cos, sin)) => {
                        rotate::<true>(x, &cos[token * s.dim..][..s.dim], &sin[token * s.dim..][..s.dim], dst)
                    }
                }
            }
        }
    }
}

/// Invariant R1 for one head's `dim` values (`UNDO`), or R2 (`heads`), which applies the
/// rotation with the same operations but an addition: `x * cos -/+ half * sin`.
#[inline]
pub(super) fn rotate<const UNDO: bool>(x: &[f32], cos: &[f32], sin: &[f32], out: &mut [f32]) {
    let h = x.len() / 2;
    let (lo, hi) = x.split_at(h);
    let (out_lo, out_hi) = out.split_at_mut(h);
    let ((cos_lo, cos_hi), (sin_lo, sin_hi)) = (cos.split_at(h), sin.split_at(h));
    let turn = |a: f32, b: f32| if UNDO { a - b } else { a + b };
    for ((((o, &l), &r), &c), &s) in out_lo.iter_mut().zip(lo).zip(hi).zip(cos_lo).zip(sin_lo) {
        *o = turn(l * c, (-r) * s);
    }
    for ((((o, &l), &r), &c), &s) in out_hi.iter_mut().zip(lo).zip(hi).zip(cos_hi).zip(sin_hi) {
        *o = turn(r * c, l * s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_take_each_sources_last_tokens_and_undo_its_rotation() {
        // batch 1, rows 3; a K of 1 head x 3 tokens x 2 with a rotation, a V of 2 heads x 2
        // tokens x 1 (the last two positions)
        let k = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let cos = [0.5, 0.25, 1.0, 1.0, 0.0, 2.0];
        let sin = [0.5, 0.5, 0.0, 0.0, 1.0, 1.0];
        let v = [7.0, 8.0, 9.0, 10.0];
        let sources = [
            Source { data: &k, heads: 1, tokens: 3, dim: 2, rope: Some((&cos, &sin)) },
            Source { data: &v, heads: 2, tokens: 2, dim: 1, rope: None },
        ];
        check(&sources, 1, 4).unwrap();
        let mut out = [9.0f32; 12];
        gather(&sources, 3, 0, 3, &mut out);
        #[rustfmt::skip]
        let want = [
            1.0 * 0.5 + 2.0 * 0.5, 2.0 * 0.25 - 1.0 * 0.5, 0.0, 0.0,
            3.0, 4.0, 7.0, 9.0,
            5.0 * 0.0 + 6.0 * 1.0, 6.0 * 2.0 - 5.0 * 1.0, 8.0, 10.0,
        ];
        assert_eq!(out, want);
        // a source of more tokens than rows gives its last ones
        let mut tail = [0.0f32; 4];
        gather(&sources[1..], 1, 0, 1, &mut tail[..2]);
        assert_eq!(&tail[..2], &[8.0, 10.0]);
        assert!(check(&sources, 1, 5).is_err());
        assert!(check(&sources, 2, 4).is_err());
        let odd = Source { data: &[1.0; 3], heads: 1, tokens: 1, dim: 3, rope: Some((&[1.0; 3], &[0.0; 3])) };
        assert!(check(&[odd], 1, 3).is_err());
    }
}
