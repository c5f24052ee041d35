//! Coding one chunk: a run of consecutive scalars with its own coder and adaptive state, so
//! chunks are independent of each other (and of the thread that codes them).
//!
//! Predicted mode, per scalar (DESIGN §3):
//! 1. `d = ord(x) - ord(mu)`, the residual in ulps of the prediction;
//! 2. `(table, shift)` from the sigma code and mu's exponent (`ladder::ScaleMap`);
//! 3. with `h = 2^(shift-1)` (0 when `shift = 0`): the table codes `(d + h) >> shift` when it
//!    lies in the window, then the `shift` low bits of `d + h` go uniformly; otherwise the
//!    table's ESCAPE symbol is coded, then the raw pattern of `x` (`raw::RawPatternModel`).
//!
//! Predictor-free mode: each scalar's raw pattern with a model chosen by its channel.
//!
//! Lanes: scalars alternate between two range coders writing separate word streams. A
//! decoder's work on one symbol (a division, table reads) depends on the symbol before it in
//! the same coder; two independent chains let the processor overlap them. The payload is
//! `[lane-0 length: u32 LE][lane-0 words][lane-1 words]`.

/// Independent coders per chunk.
pub const LANES: usize = 2;

use std::sync::Arc;

use crate::coder::{RangeDecoder, SymbolSink};
use crate::error::Error;
use crate::model::ladder::ScaleMap;
use crate::model::{ModelParams, RawPatternModel, TableBank};
use crate::prediction::{CHOICE_SHIFT_POS, CHOICE_TABLE_MASK};
use crate::words::Word;
use crate::DType;

/// Everything fixed for a whole stream that coding a chunk needs.
pub struct StreamModel {
    pub dtype: DType,
    pub params: ModelParams,
    pub bank: Arc<TableBank>,
    pub scales: ScaleMap,
    /// Predictor-free contexts: scalar `i` uses model `(i % context_period) % raw_contexts`.
    pub raw_contexts: usize,
    pub context_period: usize,
}

impl StreamModel {
    pub fn new(
        dtype: DType,
        params: ModelParams,
        raw_contexts: usize,
        context_period: usize,
    ) -> StreamModel {
        StreamModel {
            dtype,
            params,
            bank: TableBank::shared(&params),
            scales: ScaleMap::new(dtype, &params),
            raw_contexts: raw_contexts.max(1),
            context_period: context_period.max(1),
        }
    }

    #[inline(always)]
    fn encode_one<W: Word, S: SymbolSink>(
        &self,
        sink: &mut S,
        escapes: &mut RawPatternModel,
        x: W,
        mu: W,
        choice: u16,
    ) {
        let shift = (choice >> CHOICE_SHIFT_POS) as u32;
        let half = (1i64 << shift) >> 1;
        let biased = x.ordinal() - mu.ordinal() + half;
        let (cum, freq, escaped) = self
            .bank
            .encode_interval((choice & CHOICE_TABLE_MASK) as usize, biased >> shift);
        sink.put(cum, freq, self.params.table_precision as u32);
        if escaped {
            escapes.encode(sink, x.to_u32());
        } else {
            sink.put_bits((biased & ((1i64 << shift) - 1)) as u32, shift);
        }
    }

    #[inline(always)]
    fn decode_one<W: Word>(
        &self,
        dec: &mut RangeDecoder,
        escapes: &mut RawPatternModel,
        mu: W,
        choice: u16,
    ) -> W {
        let q = dec.peek(self.params.table_precision as u32);
        let (high, cum, freq, escaped) = self
            .bank
            .decode_interval((choice & CHOICE_TABLE_MASK) as usize, q);
        dec.consume(cum, freq);
        if escaped {
            W::from_u32(escapes.decode(dec))
        } else {
            let shift = (choice >> CHOICE_SHIFT_POS) as u32;
            let half = (1i64 << shift) >> 1;
            let low = dec.get_bits(shift) as i64;
            W::from_ordinal(mu.ordinal().wrapping_add((high << shift) + low - half))
        }
    }

    /// Codes `x` against predictions `mu`, with the packed table choices of
    /// `prediction::choices_and_fingerprint`. Scalar `i` goes to lane `i % LANES`.
    pub fn encode_predicted<W: Word, S: SymbolSink>(
        &self,
        lanes: &mut [S; LANES],
        x: &[W],
        mu: &[W],
        choices: &[u16],
    ) {
        let mut escapes = RawPatternModel::new(self.dtype, &self.params);
        let [a, b] = lanes;
        let pairs = x.len() / 2;
        for i in 0..pairs {
            let (j, k) = (2 * i, 2 * i + 1);
            self.encode_one(a, &mut escapes, x[j], mu[j], choices[j]);
            self.encode_one(b, &mut escapes, x[k], mu[k], choices[k]);
        }
        if x.len() % 2 == 1 {
            let j = x.len() - 1;
            self.encode_one(a, &mut escapes, x[j], mu[j], choices[j]);
        }
    }

    /// Inverse of `encode_predicted`; fills `out` (same length as `mu` and `choices`).
    pub fn decode_predicted<W: Word>(
        &self,
        lanes: &mut [RangeDecoder; LANES],
        out: &mut [W],
        mu: &[W],
        choices: &[u16],
    ) {
        let mut escapes = RawPatternModel::new(self.dtype, &self.params);
        let [a, b] = lanes;
        let pairs = out.len() / 2;
        for i in 0..pairs {
            let (j, k) = (2 * i, 2 * i + 1);
            out[j] = self.decode_one(a, &mut escapes, mu[j], choices[j]);
            out[k] = self.decode_one(b, &mut escapes, mu[k], choices[k]);
        }
        if out.len() % 2 == 1 {
            let j = out.len() - 1;
            out[j] = self.decode_one(a, &mut escapes, mu[j], choices[j]);
        }
    }

    fn raw_models(&self) -> Vec<RawPatternModel> {
        vec![RawPatternModel::new(self.dtype, &self.params); self.raw_contexts]
    }

    #[inline(always)]
    fn context(&self, index: usize) -> usize {
        (index % self.context_period) % self.raw_contexts
    }

    /// Predictor-free coding of scalars `start..`; scalar `start + i` goes to lane `i % LANES`.
    pub fn encode_raw<W: Word, S: SymbolSink>(
        &self,
        lanes: &mut [S; LANES],
        x: &[W],
        start: usize,
    ) {
        let mut models = self.raw_models();
        for (i, &xw) in x.iter().enumerate() {
            models[self.context(start + i)].encode(&mut lanes[i % LANES], xw.to_u32());
        }
    }

    pub fn decode_raw<W: Word>(
        &self,
        lanes: &mut [RangeDecoder; LANES],
        out: &mut [W],
        start: usize,
    ) {
        let mut models = self.raw_models();
        for (i, slot) in out.iter_mut().enumerate() {
            *slot = W::from_u32(models[self.context(start + i)].decode(&mut lanes[i % LANES]));
        }
    }
}

/// The error for a chunk whose coded words do not end where the encoder ended them.
pub(crate) fn unclean_end(chunk: usize) -> Error {
    Error::Corrupt(format!(
        "chunk {chunk}: coded data does not end where its scalars do"
    ))
}
