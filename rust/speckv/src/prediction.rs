//! The per-element coding parameters a predictor supplies: `mu` (as bit patterns of the target
//! dtype) and sigma (as sigma codes, broadcast over the tensor by strides, so a per-channel
//! sigma costs one small array however large the tensor).
//!
//! Parameters are produced element by element in coding order, so a model that computes them
//! just before each symbol (DESIGN §7) slots in here.

use crate::error::{invalid, Result};
use crate::format::checksum::Hasher;
use crate::model::ladder::{ScaleMap, TableChoice};
use crate::words::{Bits, Word};
use crate::DType;

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
                last = (d - 1).checked_mul(s).and_then(|v| v.checked_add(last)).ok_or_else(|| {
                    crate::Error::InvalidArgument("sigma: strides overflow".into())
                })?;
            }
            if last >= codes.len() {
                return invalid(format!("sigma: strides reach element {last} of {}", codes.len()));
            }
        }
        Ok(SigmaCodes { codes, shape: shape.to_vec(), strides: strides.to_vec() })
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
        SigmaCursor { sigma: self, coords, offset }
    }
}

/// Walks the broadcast sigma codes element by element (an odometer over the shape).
pub struct SigmaCursor<'a> {
    sigma: &'a SigmaCodes<'a>,
    coords: Vec<usize>,
    offset: usize,
}

impl SigmaCursor<'_> {
    #[inline(always)]
    pub fn next_code(&mut self) -> i16 {
        let code = self.sigma.codes[self.offset];
        self.advance();
        code
    }

    #[inline(always)]
    fn advance(&mut self) {
        let mut k = self.coords.len();
        while k > 0 {
            k -= 1;
            self.coords[k] += 1;
            self.offset += self.sigma.strides[k];
            if self.coords[k] < self.sigma.shape[k] {
                return;
            }
            self.offset -= self.coords[k] * self.sigma.strides[k];
            self.coords[k] = 0;
        }
    }
}

/// A prediction for a whole tensor.
#[derive(Debug, Clone)]
pub struct Prediction<'a> {
    /// Predicted bit patterns in the target dtype.
    pub mu: Bits<'a>,
    pub sigma: SigmaCodes<'a>,
}

/// Packs a table choice into the integer that the fingerprint hashes.
#[inline(always)]
pub(crate) fn choice_word(c: TableChoice) -> u16 {
    c.table | (c.shift as u16) << 10
}

/// Fingerprint of the integer coding parameters of elements `start..start + mu.len()`: the
/// predicted bit patterns and the table each element is coded with. Two predictions with the
/// same fingerprint code identically, so a decoder checks this before decoding anything.
pub(crate) fn chunk_fingerprint<W: Word>(
    dtype: DType,
    map: &ScaleMap,
    mu: &[W],
    sigma: &SigmaCodes,
    start: usize,
) -> u64 {
    const BLOCK: usize = 2048;
    let mut hasher = Hasher::new();
    hasher.update(W::as_bytes(mu));
    let mut cursor = sigma.cursor(start);
    let mut buffer = [0u16; BLOCK];
    for block in mu.chunks(BLOCK) {
        for (slot, &m) in buffer.iter_mut().zip(block) {
            let bits = m.to_u32();
            *slot = choice_word(map.choose(cursor.next_code(), dtype.exponent_field(bits)));
        }
        hasher.update(u16::as_bytes(&buffer[..block.len()]));
    }
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

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
