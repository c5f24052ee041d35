//! The per-element coding parameters a predictor supplies: `mu` (as bit patterns of the target
//! dtype) and sigma (as sigma codes, broadcast over the tensor by strides, so a per-channel
//! sigma costs one small array however large the tensor).
//!
//! Parameters are produced element by element in coding order, so a model that computes them
//! just before each symbol (DESIGN §7) slots in here.

use crate::error::{invalid, Result};
use crate::hash::{plain_bytes, Hasher};

/// Most dimensions a tensor may have.
pub const MAX_NDIM: usize = 8;

/// Sigma codes (see `model::ladder::sigma_code`) broadcast to the tensor's shape.
#[derive(Debug, Clone)]
pub struct SigmaCodes<'a> {
    codes: &'a [i16],
    shape: Vec<usize>,
    strides: Vec<usize>,
}

impl<'a> SigmaCodes<'a> {
    /// `strides[k]` is the step in `codes` along dimension `k` of `shape` (0 where sigma is
    /// broadcast). Every element's offset is checked to fall inside `codes`.
    pub fn new(codes: &'a [i16], shape: &[usize], strides: &[usize]) -> Result<Self> {
        if shape.len() != strides.len() {
            return invalid("sigma: one stride per dimension is required");
        }
        if shape.len() > MAX_NDIM {
            return invalid(format!("sigma: more than {MAX_NDIM} dimensions"));
        }
        let n: usize = shape.iter().product();
        if n > 0 {
            let mut last = 0usize;
            for (&d, &s) in shape.iter().zip(strides) {
                last = (d - 1)
                    .checked_mul(s)
                    .and_then(|v| v.checked_add(last))
                    .ok_or_else(|| crate::error::Error::InvalidArgument("sigma: strides overflow".into()))?;
            }
            if last >= codes.len() {
                return invalid(format!("sigma: strides reach element {last} of {}", codes.len()));
            }
        }
        Ok(SigmaCodes { codes, shape: shape.to_vec(), strides: strides.to_vec() })
    }

    /// Codes of an array of shape `code_shape` (C order) broadcast to `shape` with numpy's
    /// rules: shapes are aligned at the right, and a dimension of the codes is either equal to
    /// the tensor's or 1 (missing leading dimensions count as 1).
    pub fn broadcast(codes: &'a [i16], code_shape: &[usize], shape: &[usize]) -> Result<Self> {
        let refuse = || invalid(format!("sigma: shape {code_shape:?} does not broadcast to x's shape {shape:?}"));
        if code_shape.len() > shape.len() {
            return refuse();
        }
        let count = code_shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        if count != Some(codes.len()) {
            return invalid(format!("sigma: {} values given for shape {code_shape:?}", codes.len()));
        }
        let offset = shape.len() - code_shape.len();
        let mut strides = vec![0usize; shape.len()];
        let mut step = 1usize;
        for j in (0..code_shape.len()).rev() {
            let (have, want) = (code_shape[j], shape[offset + j]);
            if have == want && have != 1 {
                strides[offset + j] = step;
            } else if have != 1 {
                return refuse();
            }
            step *= have;
        }
        Self::new(codes, shape, &strides)
    }

    /// The same sigma for every element.
    pub fn scalar(codes: &'a [i16], shape: &[usize]) -> Result<Self> {
        if codes.len() != 1 {
            return invalid("sigma: a scalar sigma is one code");
        }
        Self::new(codes, shape, &vec![0; shape.len()])
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// A cursor yielding the codes of elements `start..` in C order.
    pub fn cursor(&self, start: usize) -> SigmaCursor<'_> {
        let ndim = self.shape.len();
        let mut coords = vec![0usize; ndim];
        let mut rest = start;
        let mut offset = 0usize;
        for k in (0..ndim).rev() {
            if self.shape[k] > 0 {
                coords[k] = rest % self.shape[k];
                rest /= self.shape[k];
            }
            offset += coords[k] * self.strides[k];
        }
        let (last_len, last_stride) = match ndim {
            0 => (usize::MAX, 0),
            _ => (self.shape[ndim - 1], self.strides[ndim - 1]),
        };
        let left_in_row = last_len.saturating_sub(coords.last().copied().unwrap_or(0));
        SigmaCursor { sigma: self, coords, offset, last_stride, left_in_row }
    }
}

/// Walks the broadcast sigma codes element by element: a step along the last dimension is
/// one add; the odometer over the other dimensions runs once per row.
pub struct SigmaCursor<'a> {
    sigma: &'a SigmaCodes<'a>,
    coords: Vec<usize>,
    offset: usize,
    last_stride: usize,
    /// Elements of the current row not yet returned, including the current one.
    left_in_row: usize,
}

impl SigmaCursor<'_> {
    #[inline(always)]
    pub fn next_code(&mut self) -> i16 {
        let code = self.sigma.codes[self.offset];
        if self.left_in_row > 1 {
            self.left_in_row -= 1;
            self.offset += self.last_stride;
        } else {
            self.next_row();
        }
        code
    }

    /// Fills `out` with the codes of the next `out.len()` elements: whole rows at a time (a
    /// copy when sigma varies along the last dimension, a fill when it is broadcast there).
    pub fn fill(&mut self, out: &mut [i16]) {
        let mut done = 0;
        while done < out.len() {
            let run = self.left_in_row.min(out.len() - done);
            let dst = &mut out[done..done + run];
            match self.last_stride {
                0 => dst.fill(self.sigma.codes[self.offset]),
                1 => dst.copy_from_slice(&self.sigma.codes[self.offset..self.offset + run]),
                stride => {
                    for (k, d) in dst.iter_mut().enumerate() {
                        *d = self.sigma.codes[self.offset + k * stride];
                    }
                }
            }
            done += run;
            if run < self.left_in_row {
                self.left_in_row -= run;
                self.offset += run * self.last_stride;
            } else {
                self.offset += (run - 1) * self.last_stride;
                self.next_row();
            }
        }
    }

    #[cold]
    fn next_row(&mut self) {
        let ndim = self.coords.len();
        if ndim == 0 {
            return;
        }
        // The fast path leaves `coords[last]` stale; the cursor now sits on the row's last
        // element. Rewind the last dimension, then carry into the ones before it.
        let row_len = self.sigma.shape[ndim - 1];
        self.offset -= (row_len - 1) * self.last_stride;
        self.coords[ndim - 1] = 0;
        let mut k = ndim - 1;
        while k > 0 {
            k -= 1;
            self.coords[k] += 1;
            self.offset += self.sigma.strides[k];
            if self.coords[k] < self.sigma.shape[k] {
                break;
            }
            self.offset -= self.coords[k] * self.sigma.strides[k];
            self.coords[k] = 0;
        }
        self.left_in_row = self.sigma.shape[ndim - 1];
    }
}

/// A prediction for a whole tensor.
#[derive(Debug, Clone)]
pub struct Prediction<'a> {
    /// Predicted values, as float32 whatever the target format: a prediction finer than the
    /// format's grid is worth keeping (see `chunk`).
    pub mu: &'a [f32],
    pub sigma: SigmaCodes<'a>,
    /// Channels coded jointly, each against a mu corrected by the residuals before it
    /// (`crate::joint`); `None`: every scalar against its own `mu`.
    pub joint: Option<crate::joint::Joint<'a>>,
}

/// Fills `codes` with the sigma code of each scalar `start..start + mu.len()` and returns the
/// fingerprint of the integer coding parameters: the bits of `mu` and every scalar's sigma
/// code. Equal fingerprints code identically (however sigma was laid out), so the decoder
/// compares it with the encoder's before decoding a chunk.
pub(crate) fn codes_and_fingerprint(mu: &[f32], sigma: &SigmaCodes, start: usize, codes: &mut Vec<i16>) -> u64 {
    codes.clear();
    codes.resize(mu.len(), 0);
    sigma.cursor(start).fill(codes);
    let mut hasher = Hasher::new();
    hasher.update(plain_bytes(mu));
    hasher.update(plain_bytes(codes));
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_matches_next_code() {
        let codes: Vec<i16> = (0..60).collect();
        for (shape, strides) in [
            (vec![3usize, 4, 5], vec![20usize, 5, 1]),
            (vec![3, 4, 5], vec![0, 5, 0]),
            (vec![3, 4, 5], vec![1, 0, 3]),
            (vec![7], vec![2]),
        ] {
            let s = SigmaCodes::new(&codes, &shape, &strides).unwrap();
            let total: usize = shape.iter().product();
            for start in [0usize, 3, 5] {
                let mut a = s.cursor(start);
                let expected: Vec<i16> = (start..total).map(|_| a.next_code()).collect();
                let mut got = vec![0i16; expected.len()];
                let mut b = s.cursor(start);
                let (first, rest) = got.split_at_mut(expected.len() / 3);
                b.fill(first);
                b.fill(rest);
                assert_eq!(got, expected, "{shape:?} {strides:?} from {start}");
            }
        }
    }

    #[test]
    fn cursor_walks_broadcast_codes_in_c_order() {
        // sigma of shape [1, 3] broadcast to [2, 3], and one of shape [2, 1]
        let codes = [10i16, 11, 12];
        let s = SigmaCodes::new(&codes, &[2, 3], &[0, 1]).unwrap();
        let mut c = s.cursor(0);
        let got: Vec<i16> = (0..6).map(|_| c.next_code()).collect();
        assert_eq!(got, [10, 11, 12, 10, 11, 12]);
        let mut c = s.cursor(4);
        assert_eq!(c.next_code(), 11);
        let s3 = SigmaCodes::new(&codes, &[2, 2, 3], &[0, 0, 1]).unwrap();
        let mut c = s3.cursor(1);
        let got: Vec<i16> = (0..11).map(|_| c.next_code()).collect();
        assert_eq!(got, [11, 12, 10, 11, 12, 10, 11, 12, 10, 11, 12]);
        let one = [7i16];
        let s0 = SigmaCodes::scalar(&one, &[]).unwrap();
        let mut c = s0.cursor(0);
        assert_eq!((c.next_code(), c.next_code()), (7, 7));
        let rows = [1i16, 2];
        let s = SigmaCodes::new(&rows, &[2, 3], &[1, 0]).unwrap();
        let mut c = s.cursor(0);
        let got: Vec<i16> = (0..6).map(|_| c.next_code()).collect();
        assert_eq!(got, [1, 1, 1, 2, 2, 2]);
    }

    #[test]
    fn strides_reaching_outside_are_refused() {
        let codes = [1i16, 2];
        assert!(SigmaCodes::new(&codes, &[2, 3], &[0, 1]).is_err());
        assert!(SigmaCodes::new(&codes, &[3], &[usize::MAX]).is_err());
        assert!(SigmaCodes::new(&codes, &[0, 5], &[9, 9]).is_ok(), "empty tensors touch nothing");
    }
}
