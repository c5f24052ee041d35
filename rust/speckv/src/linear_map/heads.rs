//! A map's outputs laid out as a cache layer, a key's rotary position embedding applied on the
//! way: the inverse of `sources`' gather, so the caller does not reorder and rotate them in
//! torch (four tensor operations and a copy per layer, on the restore's serial path).
//!
//! The outputs are `batch x rows` rows of `stride` floats, row `r` being token `r % rows` of
//! batch entry `r / rows`; the layer is the `heads * dim` columns from `col` on, head `h`'s
//! `dim` values side by side. The result is `batch x heads x rows x dim`, row-major.
//!
//! Invariant (R2), what keeps the result the bits of the torch code it replaces
//! (`speckv.predictors.rope.Rope.rope` of the token layout undone): with `h = dim / 2` and
//! `half[c] = -u[c + h]` for `c < h`, `u[c - h]` otherwise,
//!
//! ```text
//! k[c] = u[c] * cos[t, c] + half[c] * sin[t, c]      three correctly rounded f32 operations,
//!                                                     in this order
//! ```
//!
//! (negation is exact; Rust never fuses the multiplies into the addition), and without tables
//! `k[c] = u[c]`.

use super::sources::rotate;
use crate::error::{invalid, Result};

/// Where a layer sits in a map's outputs and how it is laid out (see the module's notes).
#[derive(Debug, Clone, Copy)]
pub struct Heads<'a> {
    /// Floats per row of the outputs, and the layer's first column.
    pub stride: usize,
    pub col: usize,
    /// Batch entries and rows (tokens) an entry.
    pub batch: usize,
    pub rows: usize,
    pub heads: usize,
    pub dim: usize,
    /// The rotation to apply: `cos` and `sin`, `rows x dim`, or None (values).
    pub rope: Option<(&'a [f32], &'a [f32])>,
}

impl Heads<'_> {
    /// Checks outputs `y` against the layout and the tables.
    pub fn check(&self, y: &[f32]) -> Result<()> {
        let width = self.heads.checked_mul(self.dim).filter(|&w| w > 0);
        let fits = width.and_then(|w| self.col.checked_add(w)).is_some_and(|end| end <= self.stride);
        let want = self.batch.checked_mul(self.rows).and_then(|r| r.checked_mul(self.stride));
        if !fits || want != Some(y.len()) {
            return invalid(format!(
                "map heads: {} outputs are not {} x {} rows of {} with {} x {} from column {}",
                y.len(),
                self.batch,
                self.rows,
                self.stride,
                self.heads,
                self.dim,
                self.col
            ));
        }
        if let Some((cos, sin)) = self.rope {
            // `rows * dim` checked: with no batch entries, `rows` is not bounded by `y`
            if !self.dim.is_multiple_of(2)
                || self.rows.checked_mul(self.dim) != Some(cos.len())
                || sin.len() != cos.len()
            {
                return invalid(format!(
                    "map heads: rotary tables of {} and {} values for {} rows x {} (an even dim)",
                    cos.len(),
                    sin.len(),
                    self.rows,
                    self.dim
                ));
            }
        }
        Ok(())
    }

    /// The layer of outputs `y` (checked by `check`) into `out`, `batch x heads x rows x dim`
    /// (at most `y.len()` floats).
    pub fn write(&self, y: &[f32], out: &mut [f32]) {
        let (d, rows) = (self.dim, self.rows);
        for (i, dst) in out.chunks_exact_mut(d).enumerate() {
            // `dst` is token `t` of head `h` of entry `b`
            let (t, h, b) = (i % rows, i / rows % self.heads, i / (rows * self.heads));
            let u = &y[(b * rows + t) * self.stride + self.col + h * d..][..d];
            match self.rope {
                None => dst.copy_from_slice(u),
                Some((cos, sin)) => rotate::<false>(u, &cos[t * d..][..d], &sin[t * d..][..d], dst),
            }
        }
    }

    /// Floats of the layer: `batch x heads x rows x dim`.
    pub fn floats(&self) -> usize {
        self.batch * self.heads * self.rows * self.dim
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_become_heads_and_a_keys_rotation_is_applied() {
        // batch 2, rows 2, outputs of 5 columns: the layer is 1 head x 2 from column 1
        #[rustfmt::skip]
        let y = [
            9.0, 1.0, 2.0, 9.0, 9.0,
            9.0, 3.0, 4.0, 9.0, 9.0,
            9.0, 5.0, 6.0, 9.0, 9.0,
            9.0, 7.0, 8.0, 9.0, 9.0,
        ];
        let (cos, sin) = ([0.5, 0.25, 1.0, 2.0], [0.5, 0.5, 0.0, 1.0]);
        let layer = Heads { stride: 5, col: 1, batch: 2, rows: 2, heads: 1, dim: 2, rope: Some((&cos, &sin)) };
        layer.check(&y).unwrap();
        assert_eq!(layer.floats(), 8);
        let mut out = [0.0f32; 8];
        layer.write(&y, &mut out);
        #[rustfmt::skip]
        let want = [
            1.0 * 0.5 - 2.0 * 0.5, 2.0 * 0.25 + 1.0 * 0.5, 3.0 * 1.0 - 4.0 * 0.0, 4.0 * 2.0 + 3.0 * 1.0,
            5.0 * 0.5 - 6.0 * 0.5, 6.0 * 0.25 + 5.0 * 0.5, 7.0 * 1.0 - 8.0 * 0.0, 8.0 * 2.0 + 7.0 * 1.0,
        ];
        assert_eq!(out, want);
        // two heads of one value each, no rotation: head-major
        let plain = Heads { stride: 5, col: 1, batch: 2, rows: 2, heads: 2, dim: 1, rope: None };
        plain.check(&y).unwrap();
        plain.write(&y, &mut out);
        assert_eq!(out, [1.0, 3.0, 2.0, 4.0, 5.0, 7.0, 6.0, 8.0]);
    }

    #[test]
    fn layouts_that_do_not_fit_are_refused() {
        let y = [0.0f32; 20];
        let ok = Heads { stride: 5, col: 1, batch: 2, rows: 2, heads: 2, dim: 2, rope: None };
        ok.check(&y).unwrap();
        assert!(Heads { col: 2, ..ok }.check(&y).is_err(), "past the row's end");
        assert!(Heads { batch: 3, ..ok }.check(&y).is_err(), "more rows than given");
        assert!(Heads { rows: 1, ..ok }.check(&y).is_err(), "fewer rows than given");
        assert!(Heads { heads: 0, ..ok }.check(&y).is_err());
        assert!(Heads { stride: 0, ..ok }.check(&y).is_err());
        assert!(Heads { rope: Some((&[1.0; 4], &[0.0; 3])), ..ok }.check(&y).is_err());
        let odd = Heads { stride: 3, col: 0, batch: 1, rows: 1, heads: 1, dim: 3, rope: Some((&[1.0; 3], &[0.0; 3])) };
        assert!(odd.check(&[0.0; 3]).is_err(), "an odd dim has no halves to rotate");
        assert!(Heads { col: usize::MAX, ..ok }.check(&y).is_err(), "no overflow");
        assert!(Heads { rows: usize::MAX, ..ok }.check(&y).is_err(), "no overflow");
        let none = Heads { batch: 0, rows: usize::MAX / 2, rope: Some((&[1.0; 4], &[0.0; 4])), ..ok };
        assert!(none.check(&[]).is_err(), "tables checked without overflow where no entry bounds the rows");
        assert_eq!(Heads { rope: None, ..none }.floats(), 0);
    }
}
