//! Codes one chunk of the bins model, run by run (B1-B4; the rANS states run backwards).

use std::sync::Arc;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::words::Word;

use super::*;

/// Codes one chunk, run by run (the joint model hands it a channel at a time).
pub struct Encoder {
    pub(super) layout: Layout,
    pub(super) tables: Arc<BinTables>,
    /// Per scalar so far: `table * SYMBOLS + symbol`, or `NO_STEP`.
    pub(super) steps: Vec<u32>,
    pub(super) bits: BitWriter,
}

impl Encoder {
    pub fn new(dtype: DType, tables: Arc<BinTables>, scalars: usize) -> Result<Encoder> {
        let layout = Layout::of(dtype)
            .ok_or_else(|| Error::InvalidArgument(format!("bins: {} is not an 8- or 16-bit format", dtype.name())))?;
        let bits = BitWriter { acc: 0, n: 0, out: Vec::with_capacity(scalars * 2) };
        Ok(Encoder { layout, tables, steps: Vec::with_capacity(scalars), bits })
    }

    /// The next scalars `x`, against `mu` and their sigma codes.
    pub fn run<W: Word>(&mut self, x: &[W], mu: &[f32], codes: &[i16]) {
        let (l, r) = (self.layout, self.tables.revision);
        for ((&xw, &m), &c) in x.iter().zip(mu).zip(codes) {
            let w = xw.to_u32();
            let Some(p) = place(l, r, m, c) else {
                self.steps.push(NO_STEP);
                self.bits.put(w, l.width);
                continue;
            };
            let (mant, field) = (w & ((1 << l.m) - 1), (w >> l.m) & ((1 << l.e_bits) - 1));
            let found = if l.finite(field, mant) { bin_of(l, w, p.fw) } else { None };
            let row = p.table * SYMBOLS;
            match found {
                Some((b, raw, n))
                    if (0..2 * HALF).contains(&(b - p.base + HALF))
                        && self.tables.entries[row + (b - p.base + HALF) as usize] & 0xFFFF != 0 =>
                {
                    self.steps.push((row + (b - p.base + HALF) as usize) as u32);
                    self.bits.put(raw, n);
                }
                _ => {
                    self.steps.push((row + ESCAPE) as u32);
                    self.bits.put(w, l.width);
                }
            }
        }
    }

    /// The chunk's payload (B4, the layout in the module doc).
    pub fn finish(self) -> Vec<u8> {
        let r = self.tables.revision;
        let mut state = vec![LOW; r.states];
        // `j mod S` as a mask: S is a power of two (`Revision::states`), and a division per
        // scalar was a sixth of this loop
        debug_assert!(r.states.is_power_of_two());
        let lane = r.states - 1;
        let mut words: Vec<u16> = Vec::with_capacity(self.steps.len() + 1);
        for (j, &step) in self.steps.iter().enumerate().rev() {
            if step == NO_STEP {
                continue;
            }
            let code = self.tables.coding[step as usize];
            let s = &mut state[j & lane];
            if *s >= code.limit {
                words.push(*s as u16);
                *s >>= 16;
            }
            let q = code.quotient(*s);
            *s = (q << PRECISION) + (*s - q * code.freq) + code.start;
        }
        let raw = self.bits.finish();
        let mut out = Vec::with_capacity(r.min_chunk_len() + 2 * words.len() + raw.len());
        for s in state {
            out.extend_from_slice(&s.to_le_bytes());
        }
        out.extend_from_slice(&(words.len() as u32).to_le_bytes());
        for w in words.iter().rev() {
            out.extend_from_slice(&w.to_le_bytes());
        }
        out.extend_from_slice(&raw);
        out
    }
}
