//! Coding one chunk: a run of consecutive scalars with its own coders and adaptive state, so
//! chunks are independent of each other (and of the thread that codes them).
//!
//! Predicted mode, 8- and 16-bit formats (the exact model, `model::mixture`): the
//! pattern of `x` is a symbol of the mixture CDF around the real prediction `mu` (an f32, so a
//! prediction finer than the format's grid keeps its information), integrated over the
//! pattern's rounding interval (`model::grid`). Outside the window, and for NaN/inf, the
//! ESCAPE symbol is followed by the raw pattern (`raw::RawPatternModel`). A non-finite `mu`
//! predicts nothing: its scalar goes to the raw model directly.
//!
//! Predicted mode, float32 and the fast model (`model::tables`): the residual in ulps
//! `d = ord(x) - ord(mu)` is a symbol of the table for `s = sigma / ulp(mu)`; for scales above
//! the top table the high part of `d` goes through the table and `shift` low bits uniformly.
//!
//! Predictor-free mode: each scalar's raw pattern with a model chosen by its channel.
//!
//! Lanes: scalar `i` goes to range coder `i % N`, each writing its own word stream. A
//! decoder's work on one symbol depends on the symbol before it in the same coder; `N`
//! independent chains let the processor overlap them (format version 2 writes `LANES` = 8,
//! version 1 wrote 2). `codec::join_lanes` lays a chunk's lanes out one after another (the
//! byte layout is in `format::header`).

use std::sync::Arc;

use crate::coder::{RangeDecoder, SymbolSink};
use crate::dtype::DType;
use crate::error::Error;
use crate::exact::Exact;
use crate::model::grid::ValueGrid;
use crate::model::ladder::{ScaleMap, SigmaTable, CHOICE_SHIFT_POS, CHOICE_TABLE_MASK};
use crate::model::mixture::MixtureCdf;
use crate::model::{ModelParams, RawPatternModel, TableBank};
use crate::words::Word;

/// Independent coders per chunk in streams this build writes (format version 2).
pub const LANES: usize = 8;
/// Coders per chunk in format version 1 streams, which this build still reads.
pub const LANES_V1: usize = 2;

/// Which model predicted scalars are coded with; the stream header records it.
///
/// * `Exact` (8/16-bit formats): the mixture integrated over each value's rounding interval
///   around the float32 prediction; within 0.2% of the continuous ideal, whatever the ratio of
///   sigma to the format's spacing. Choose it to store caches: it is the smallest.
/// * `Bins` (8/16-bit formats): the same mixture at a quarter to an eighth of sigma's
///   resolution, from static tables with interleaved rANS (`crate::bins`, format version 4;
///   version 3 is still read); decodes several times faster than `Exact` for a few thousandths
///   of a bit per scalar plus ~0.016 bits per scalar of a 24,576-scalar chunk (its rANS states).
///   Choose it where a restore waits on the coder.
/// * `Fast`: residuals counted in ulps of the prediction rounded to the format, coded from
///   81 precomputed tables; a little faster to decode (~1.25x with the exact model's AVX2
///   kernels, ~2x without them), a few percent larger where sigma spans binades (values near
///   zero, sigma comparable to the value). Choose it when decode speed matters more than the
///   last few percent on a processor without AVX2. float32 always uses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ModelKind {
    #[default]
    Exact,
    Fast,
    Bins,
}

impl ModelKind {
    /// The name the APIs use: `"exact"` or `"fast"`.
    pub fn name(self) -> &'static str {
        match self {
            ModelKind::Exact => "exact",
            ModelKind::Fast => "fast",
            ModelKind::Bins => "bins",
        }
    }

    /// Inverse of `name`.
    pub fn from_name(name: &str) -> Option<ModelKind> {
        match name {
            "exact" => Some(ModelKind::Exact),
            "fast" => Some(ModelKind::Fast),
            "bins" => Some(ModelKind::Bins),
            _ => None,
        }
    }

    /// The model `dtype` is actually coded with when `self` is asked for.
    pub fn for_dtype(self, dtype: DType) -> ModelKind {
        if dtype.bits() > 16 {
            ModelKind::Fast
        } else {
            self
        }
    }
}

/// The model a predicted stream is coded with, with its tables.
pub enum PredictedModel {
    Exact {
        cdf: Arc<MixtureCdf>,
        grid: Arc<ValueGrid>,
        sigmas: &'static SigmaTable,
    },
    /// `grid` is there to round the prediction to the format (absent for float32).
    Fast {
        bank: Arc<TableBank>,
        scales: ScaleMap,
        grid: Option<Arc<ValueGrid>>,
    },
    /// Coded chunk by chunk by `crate::bins` (`codec` routes it there), never through the
    /// range coder's lanes.
    Bins {
        tables: Arc<crate::bins::BinTables>,
    },
}

/// Everything fixed for a whole stream that coding a chunk needs.
pub struct StreamModel {
    pub dtype: DType,
    pub params: ModelParams,
    pub predicted: PredictedModel,
    /// Predictor-free contexts: scalar `i` uses model `(i % context_period) % raw_contexts`.
    pub raw_contexts: usize,
    pub context_period: usize,
    /// The adaptive token scale of jointly coded layers (`crate::token_scale`); `None` for
    /// streams without the joint model and ones coded without it.
    pub token_scale: Option<crate::token_scale::TokenScale>,
}

impl StreamModel {
    pub fn new(
        dtype: DType,
        params: ModelParams,
        kind: ModelKind,
        raw_contexts: usize,
        context_period: usize,
    ) -> StreamModel {
        let predicted = match kind.for_dtype(dtype) {
            ModelKind::Exact => PredictedModel::Exact {
                cdf: MixtureCdf::shared(&params),
                grid: ValueGrid::shared(dtype),
                sigmas: SigmaTable::shared(),
            },
            ModelKind::Fast => PredictedModel::Fast {
                bank: TableBank::shared(&params),
                scales: ScaleMap::new(dtype, &params),
                grid: (dtype.bits() <= 16).then(|| ValueGrid::shared(dtype)),
            },
            ModelKind::Bins => {
                PredictedModel::Bins { tables: crate::bins::BinTables::shared(&params, crate::bins::CURRENT) }
            }
        };
        StreamModel {
            dtype,
            params,
            predicted,
            raw_contexts: raw_contexts.max(1),
            context_period: context_period.max(1),
            token_scale: None,
        }
    }

    /// Digest of the tables predicted coding reads (written to and checked against headers).
    pub fn table_digest(&self) -> u64 {
        match &self.predicted {
            PredictedModel::Exact { cdf, .. } => cdf.digest(),
            PredictedModel::Fast { bank, .. } => bank.digest(),
            PredictedModel::Bins { tables } => tables.digest(),
        }
    }

    /// Codes `x` against predictions `mu` with per-scalar sigma codes. Scalar `i` goes to
    /// lane `i % N`.
    pub fn encode_predicted<W: Word, S: SymbolSink, const N: usize>(
        &self,
        lanes: &mut [S; N],
        x: &[W],
        mu: &[f32],
        codes: &[i16],
    ) {
        self.encode_predicted_with(lanes, &mut self.escapes(), x, mu, codes)
    }

    /// A fresh escape model (the adaptive model of escaped scalars' raw patterns).
    pub fn escapes(&self) -> RawPatternModel {
        RawPatternModel::new(self.dtype, &self.params)
    }

    /// `encode_predicted` with the caller's escape model, which carries its statistics from
    /// run to run (the joint model codes a chunk as many runs).
    pub fn encode_predicted_with<W: Word, S: SymbolSink, const N: usize>(
        &self,
        lanes: &mut [S; N],
        escapes: &mut RawPatternModel,
        x: &[W],
        mu: &[f32],
        codes: &[i16],
    ) {
        match &self.predicted {
            PredictedModel::Exact { cdf, grid, sigmas } => {
                Exact::new(cdf, grid, sigmas).encode(lanes, escapes, x, mu, codes)
            }
            PredictedModel::Fast { bank, scales, grid } => {
                let precision = self.params.table_precision as u32;
                let one = |sink: &mut S, esc: &mut RawPatternModel, i: usize| match rounded(grid, mu[i]) {
                    Some(m) => {
                        let choice = scales.choose_packed(codes[i], m);
                        encode_fast(bank, precision, sink, esc, x[i], W::from_u32(m), choice)
                    }
                    None => esc.encode(sink, x[i].to_u32()),
                };
                for_lanes(x.len(), lanes, escapes, one);
            }
            PredictedModel::Bins { .. } => unreachable!("codec codes bins streams with bins::Encoder"),
        }
    }

    /// Inverse of `encode_predicted`; fills `out` (same length as `mu` and `codes`).
    pub fn decode_predicted<W: Word, const N: usize>(
        &self,
        lanes: &mut [RangeDecoder; N],
        out: &mut [W],
        mu: &[f32],
        codes: &[i16],
    ) {
        self.decode_predicted_with(lanes, &mut self.escapes(), out, mu, codes)
    }

    /// Inverse of `encode_predicted_with`.
    pub fn decode_predicted_with<W: Word, const N: usize>(
        &self,
        lanes: &mut [RangeDecoder; N],
        escapes: &mut RawPatternModel,
        out: &mut [W],
        mu: &[f32],
        codes: &[i16],
    ) {
        match &self.predicted {
            PredictedModel::Exact { cdf, grid, sigmas } => {
                Exact::new(cdf, grid, sigmas).decode(lanes, escapes, out, mu, codes)
            }
            PredictedModel::Fast { bank, scales, grid } => {
                let precision = self.params.table_precision as u32;
                let one = |dec: &mut RangeDecoder, esc: &mut RawPatternModel, i: usize| match rounded(grid, mu[i]) {
                    Some(m) => {
                        decode_fast(bank, precision, dec, esc, W::from_u32(m), scales.choose_packed(codes[i], m))
                    }
                    None => W::from_u32(esc.decode(dec)),
                };
                for_lanes_dec(out, lanes, escapes, one);
            }
            PredictedModel::Bins { .. } => unreachable!("codec decodes bins streams with bins::Decoder"),
        }
    }

    fn raw_models(&self) -> Vec<RawPatternModel> {
        vec![RawPatternModel::new(self.dtype, &self.params); self.raw_contexts]
    }

    #[inline(always)]
    fn context(&self, index: usize) -> usize {
        (index % self.context_period) % self.raw_contexts
    }

    /// Predictor-free coding of scalars `start..`; scalar `start + i` goes to lane `i % N`.
    pub fn encode_raw<W: Word, S: SymbolSink, const N: usize>(&self, lanes: &mut [S; N], x: &[W], start: usize) {
        let mut models = self.raw_models();
        for (i, &xw) in x.iter().enumerate() {
            models[self.context(start + i)].encode(&mut lanes[i % N], xw.to_u32());
        }
    }

    pub fn decode_raw<W: Word, const N: usize>(&self, lanes: &mut [RangeDecoder; N], out: &mut [W], start: usize) {
        let mut models = self.raw_models();
        for (i, slot) in out.iter_mut().enumerate() {
            *slot = W::from_u32(models[self.context(start + i)].decode(&mut lanes[i % N]));
        }
    }
}

/// The fast model's prediction: `mu` rounded to the format's pattern (float32: its own bits;
/// bfloat16: round-half-even on the bits, the common case made cheap; others: the grid's
/// nearest pattern). A non-finite `mu` predicts nothing.
#[inline(always)]
fn rounded(grid: &Option<Arc<ValueGrid>>, mu: f32) -> Option<u32> {
    if !mu.is_finite() {
        return None;
    }
    let bits = mu.to_bits();
    Some(match grid {
        Some(g) if g.dtype() == DType::BFloat16 => (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16,
        Some(g) => g.nearest_pattern(mu as f64),
        None => bits,
    })
}

/// Runs `one(lane, escapes, i)` for every scalar in scalar order, scalar `i` on lane `i % N`.
/// The inner loop over lanes is unrolled (N is a constant), so the N independent coders'
/// dependency chains sit side by side in the instruction stream and overlap.
#[inline(always)]
fn for_lanes<S, F: FnMut(&mut S, &mut RawPatternModel, usize), const N: usize>(
    n: usize,
    lanes: &mut [S; N],
    escapes: &mut RawPatternModel,
    mut one: F,
) {
    let full = n / N;
    for i in 0..full {
        for (l, lane) in lanes.iter_mut().enumerate() {
            one(lane, escapes, i * N + l);
        }
    }
    for (l, lane) in lanes.iter_mut().enumerate().take(n - full * N) {
        one(lane, escapes, full * N + l);
    }
}

/// Like `for_lanes` for decoding: `out[i] = one(lane, escapes, i)`.
#[inline(always)]
fn for_lanes_dec<'a, W, F, const N: usize>(
    out: &mut [W],
    lanes: &mut [RangeDecoder<'a>; N],
    escapes: &mut RawPatternModel,
    mut one: F,
) where
    F: FnMut(&mut RangeDecoder<'a>, &mut RawPatternModel, usize) -> W,
{
    let n = out.len();
    let full = n / N;
    for (i, group) in out.chunks_exact_mut(N).enumerate() {
        for ((l, lane), slot) in lanes.iter_mut().enumerate().zip(group.iter_mut()) {
            *slot = one(lane, escapes, i * N + l);
        }
    }
    for (l, lane) in lanes.iter_mut().enumerate().take(n - full * N) {
        out[full * N + l] = one(lane, escapes, full * N + l);
    }
}

#[inline(always)]
fn encode_fast<W: Word, S: SymbolSink>(
    bank: &TableBank,
    precision: u32,
    sink: &mut S,
    escapes: &mut RawPatternModel,
    x: W,
    mu: W,
    choice: u16,
) {
    let shift = (choice >> CHOICE_SHIFT_POS) as u32;
    let half = (1i64 << shift) >> 1;
    let biased = x.ordinal() - mu.ordinal() + half;
    let (cum, freq, escaped) = bank.encode_interval((choice & CHOICE_TABLE_MASK) as usize, biased >> shift);
    sink.put(cum, freq, precision);
    if escaped {
        escapes.encode(sink, x.to_u32());
    } else {
        sink.put_bits((biased & ((1i64 << shift) - 1)) as u32, shift);
    }
}

#[inline(always)]
fn decode_fast<W: Word>(
    bank: &TableBank,
    precision: u32,
    dec: &mut RangeDecoder,
    escapes: &mut RawPatternModel,
    mu: W,
    choice: u16,
) -> W {
    let q = dec.peek(precision);
    let (high, cum, freq, escaped) = bank.decode_interval((choice & CHOICE_TABLE_MASK) as usize, q);
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

/// The error for a chunk whose coded words do not end where the encoder ended them.
pub(crate) fn unclean_end(chunk: usize) -> Error {
    Error::Corrupt(format!("chunk {chunk}: coded data does not end where its scalars do"))
}
