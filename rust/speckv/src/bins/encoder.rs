//! Codes one chunk of the bins model, run by run (B1-B4; the rANS states run backwards): the
//! AVX-512 groups where they run (`avx512_encoder`), one scalar at a time elsewhere, the same
//! bytes.

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

    /// The next scalars `x`, against `mu` and their sigma codes: sixteen at a time with
    /// AVX-512 where it runs (`avx512_encoder`), else one at a time; the same bytes.
    pub fn run<W: Word>(&mut self, x: &[W], mu: &[f32], codes: &[i16]) {
        #[cfg(target_arch = "x86_64")]
        if !vector() && super::decoder::avx2_enabled() {
            // SAFETY: `avx2_enabled()` checked at run time that this CPU has AVX2, BMI1, BMI2,
            // LZCNT and POPCNT.
            unsafe { self.run_avx2(x, mu, codes) };
            return;
        }
        self.run_with(x, mu, codes, vector())
    }

    /// `run` without AVX-512, compiled with AVX2 and the scalar bit instructions available to
    /// the compiler (as `Decoder::run_avx2`): the same code, so the same bytes.
    ///
    /// # Safety
    /// The CPU must have AVX2, BMI1, BMI2, LZCNT and POPCNT (`decoder::avx2_present`).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt")]
    pub(super) unsafe fn run_avx2<W: Word>(&mut self, x: &[W], mu: &[f32], codes: &[i16]) {
        self.run_portable(x, mu, codes)
    }

    /// `run`, with the vector groups where `vector` (the processor has AVX-512F).
    pub(super) fn run_with<W: Word>(&mut self, x: &[W], mu: &[f32], codes: &[i16], vector: bool) {
        let n = x.len().min(mu.len()).min(codes.len());
        let mut i = 0;
        #[cfg(not(target_arch = "x86_64"))]
        let _ = vector;
        #[cfg(target_arch = "x86_64")]
        while vector && n - i >= GROUP {
            // SAFETY: `vector` is only true where `avx512::enabled()` found AVX-512F.
            i += unsafe { avx512_encoder::run_groups(self, &x[i..n], &mu[i..n], &codes[i..n]) };
            // a group the vectors left (a non-finite or far-out mu), scalar by scalar
            let end = (i + GROUP).min(n);
            self.run_portable(&x[i..end], &mu[i..end], &codes[i..end]);
            i = end;
        }
        self.run_portable(&x[i..n], &mu[i..n], &codes[i..n]);
    }

    #[inline(always)]
    fn run_portable<W: Word>(&mut self, x: &[W], mu: &[f32], codes: &[i16]) {
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
        #[cfg(target_arch = "x86_64")]
        if !vector() && super::decoder::avx2_enabled() {
            // SAFETY: as in `run`.
            return unsafe { self.finish_avx2() };
        }
        self.finish_with(vector())
    }

    /// `finish` without AVX-512, compiled as `run_avx2` is: the same bytes.
    ///
    /// # Safety
    /// As `run_avx2`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt")]
    pub(super) unsafe fn finish_avx2(self) -> Vec<u8> {
        self.finish_with(false)
    }

    /// `finish`, B4's steps sixteen states at a time where `vector` (the processor has
    /// AVX-512F); the same bytes.
    #[inline(always)]
    pub(super) fn finish_with(self, vector: bool) -> Vec<u8> {
        let r = self.tables.revision;
        let mut state = [LOW; STATES];
        // the vector steps store sixteen words past the end before they count them
        let mut words: Vec<u16> = Vec::with_capacity(self.steps.len() + GROUP);
        let whole = if vector { self.steps.len() / GROUP * GROUP } else { 0 };
        // backwards: the scalars after the last whole group first
        self.steps_back(whole, &mut state, &mut words);
        #[cfg(target_arch = "x86_64")]
        if whole > 0 {
            // SAFETY: `vector` is only true where `avx512::enabled()` found AVX-512F; `whole`
            // is a multiple of 16 and `words` has room for every step's word and 16 more.
            unsafe { avx512_encoder::steps_back(&self, &self.steps[..whole], &mut state, &mut words) };
        }
        let raw = self.bits.finish();
        let mut out = Vec::with_capacity(r.min_chunk_len() + 2 * words.len() + raw.len());
        for s in &state[..r.states] {
            out.extend_from_slice(&s.to_le_bytes());
        }
        out.extend_from_slice(&(words.len() as u32).to_le_bytes());
        for w in words.iter().rev() {
            out.extend_from_slice(&w.to_le_bytes());
        }
        out.extend_from_slice(&raw);
        out
    }

    /// B4 for the steps from `from` on, last first (the scalar loop).
    #[inline(always)]
    fn steps_back(&self, from: usize, state: &mut [u32; STATES], words: &mut Vec<u16>) {
        // `j mod S` as a mask: S is a power of two (`Revision::states`), and a division per
        // scalar was a sixth of this loop
        let lane = self.tables.revision.states - 1;
        for (j, &step) in self.steps.iter().enumerate().skip(from).rev() {
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
    }
}

/// Scalars a vector group codes (`avx512_encoder`).
const GROUP: usize = 16;

/// Whether this processor runs the vector encoder (AVX-512F; `SPECKV_SIMD` as for the decoder).
fn vector() -> bool {
    #[cfg(target_arch = "x86_64")]
    return super::avx512::enabled();
    #[cfg(not(target_arch = "x86_64"))]
    false
}
