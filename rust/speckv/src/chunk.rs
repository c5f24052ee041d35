//! Coding one chunk: a run of consecutive scalars with its own coders and adaptive state, so
//! chunks are independent of each other (and of the thread that codes them).
//!
//! Predicted mode, 8- and 16-bit formats (the value-space model, `model::mixture`): the
//! pattern of `x` is a symbol of the mixture CDF around the real prediction `mu` (an f32, so a
//! prediction finer than the format's grid keeps its information), integrated over the
//! pattern's rounding interval (`model::grid`). Outside the window, and for NaN/inf, the
//! ESCAPE symbol is followed by the raw pattern (`raw::RawPatternModel`). A non-finite `mu`
//! predicts nothing: its scalar goes to the raw model directly.
//!
//! Predicted mode, float32 (the ordinal model, `model::tables`): the residual in ulps
//! `d = ord(x) - ord(mu)` is a symbol of the table for `s = sigma / ulp(mu)`; for scales above
//! the top table the high part of `d` goes through the table and `shift` low bits uniformly.
//!
//! Predictor-free mode: each scalar's raw pattern with a model chosen by its channel.
//!
//! Lanes: scalars alternate between two range coders writing separate word streams. A
//! decoder's work on one symbol depends on the symbol before it in the same coder; two
//! independent chains let the processor overlap them. The payload is
//! `[lane-0 length: u32 LE][lane-0 words][lane-1 words]`.

use std::sync::Arc;

use crate::coder::{RangeDecoder, SymbolSink};
use crate::error::Error;
use crate::model::grid::ValueGrid;
use crate::model::ladder::{ScaleMap, SigmaTable};
use crate::model::mixture::MixtureCdf;
use crate::model::{ModelParams, RawPatternModel, TableBank};
use crate::prediction::{CHOICE_SHIFT_POS, CHOICE_TABLE_MASK};
use crate::words::Word;
use crate::DType;

/// Independent coders per chunk.
pub const LANES: usize = 2;

/// Which model predicted scalars are coded with; the stream header records it.
///
/// * `Exact` (8/16-bit formats): the mixture integrated over each value's rounding interval
///   around the float32 prediction; within 0.2% of the continuous ideal, whatever the ratio of
///   sigma to the format's spacing. Choose it to store caches: it is the smallest.
/// * `Fast`: residuals counted in ulps of the prediction rounded to the format, coded from
///   81 precomputed tables; several times faster to decode, a few percent larger where sigma
///   spans binades (values near zero, sigma comparable to the value). Choose it when decode
///   speed matters more than the last few percent (e.g. a hot offload path). float32 always
///   uses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ModelKind {
    #[default]
    Exact,
    Fast,
}

impl ModelKind {
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
    Value {
        cdf: Arc<MixtureCdf>,
        grid: Arc<ValueGrid>,
        sigmas: &'static SigmaTable,
    },
    /// `grid` is there to round the prediction to the format (absent for float32).
    Ordinal {
        bank: Arc<TableBank>,
        scales: ScaleMap,
        grid: Option<Arc<ValueGrid>>,
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
}

/// A window of patterns `[lo, lo + n)` around a prediction.
#[derive(Clone, Copy)]
struct Window {
    lo: i64,
    n: u32,
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
            ModelKind::Exact => PredictedModel::Value {
                cdf: MixtureCdf::shared(&params),
                grid: ValueGrid::shared(dtype),
                sigmas: SigmaTable::shared(),
            },
            ModelKind::Fast => PredictedModel::Ordinal {
                bank: TableBank::shared(&params),
                scales: ScaleMap::new(dtype, &params),
                grid: (dtype.bits() <= 16).then(|| ValueGrid::shared(dtype)),
            },
        };
        StreamModel {
            dtype,
            params,
            predicted,
            raw_contexts: raw_contexts.max(1),
            context_period: context_period.max(1),
        }
    }

    /// Digest of the tables predicted coding reads (written to and checked against headers).
    pub fn table_digest(&self) -> u64 {
        match &self.predicted {
            PredictedModel::Value { cdf, .. } => cdf.digest(),
            PredictedModel::Ordinal { bank, .. } => bank.digest(),
        }
    }

    /// Codes `x` against predictions `mu` with per-scalar sigma codes. Scalar `i` goes to
    /// lane `i % LANES`.
    pub fn encode_predicted<W: Word, S: SymbolSink>(&self, lanes: &mut [S; LANES], x: &[W], mu: &[f32], codes: &[i16]) {
        let mut escapes = RawPatternModel::new(self.dtype, &self.params);
        let [a, b] = lanes;
        match &self.predicted {
            PredictedModel::Value { cdf, grid, sigmas } => {
                let one = |sink: &mut S, esc: &mut RawPatternModel, i: usize| {
                    encode_value(cdf, grid, sink, esc, x[i], mu[i], sigmas.get(codes[i]))
                };
                for_pairs(x.len(), a, b, &mut escapes, one);
            }
            PredictedModel::Ordinal { bank, scales, grid } => {
                let precision = self.params.table_precision as u32;
                let one = |sink: &mut S, esc: &mut RawPatternModel, i: usize| match rounded(grid, mu[i]) {
                    Some(m) => {
                        let choice = scales.choose_packed(codes[i], m);
                        encode_ordinal(bank, precision, sink, esc, x[i], W::from_u32(m), choice)
                    }
                    None => esc.encode(sink, x[i].to_u32()),
                };
                for_pairs(x.len(), a, b, &mut escapes, one);
            }
        }
    }

    /// Inverse of `encode_predicted`; fills `out` (same length as `mu` and `codes`).
    pub fn decode_predicted<W: Word>(
        &self,
        lanes: &mut [RangeDecoder; LANES],
        out: &mut [W],
        mu: &[f32],
        codes: &[i16],
    ) {
        let mut escapes = RawPatternModel::new(self.dtype, &self.params);
        let [a, b] = lanes;
        match &self.predicted {
            PredictedModel::Value { cdf, grid, sigmas } => {
                let one = |dec: &mut RangeDecoder, esc: &mut RawPatternModel, i: usize| {
                    decode_value(cdf, grid, dec, esc, mu[i], sigmas.get(codes[i]))
                };
                for_pairs_dec(out, a, b, &mut escapes, one);
            }
            PredictedModel::Ordinal { bank, scales, grid } => {
                let precision = self.params.table_precision as u32;
                let one = |dec: &mut RangeDecoder, esc: &mut RawPatternModel, i: usize| match rounded(grid, mu[i]) {
                    Some(m) => {
                        decode_ordinal(bank, precision, dec, esc, W::from_u32(m), scales.choose_packed(codes[i], m))
                    }
                    None => W::from_u32(esc.decode(dec)),
                };
                for_pairs_dec(out, a, b, &mut escapes, one);
            }
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
    pub fn encode_raw<W: Word, S: SymbolSink>(&self, lanes: &mut [S; LANES], x: &[W], start: usize) {
        let mut models = self.raw_models();
        for (i, &xw) in x.iter().enumerate() {
            models[self.context(start + i)].encode(&mut lanes[i % LANES], xw.to_u32());
        }
    }

    pub fn decode_raw<W: Word>(&self, lanes: &mut [RangeDecoder; LANES], out: &mut [W], start: usize) {
        let mut models = self.raw_models();
        for (i, slot) in out.iter_mut().enumerate() {
            *slot = W::from_u32(models[self.context(start + i)].decode(&mut lanes[i % LANES]));
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

/// Runs `one(lane, escapes, i)` for every scalar, alternating lanes, in scalar order.
#[inline(always)]
fn for_pairs<S, F: FnMut(&mut S, &mut RawPatternModel, usize)>(
    n: usize,
    a: &mut S,
    b: &mut S,
    escapes: &mut RawPatternModel,
    mut one: F,
) {
    for i in 0..n / 2 {
        one(a, escapes, 2 * i);
        one(b, escapes, 2 * i + 1);
    }
    if n % 2 == 1 {
        one(a, escapes, n - 1);
    }
}

/// Like `for_pairs` for decoding: `out[i] = one(lane, escapes, i)`.
#[inline(always)]
fn for_pairs_dec<'a, W, F>(
    out: &mut [W],
    a: &mut RangeDecoder<'a>,
    b: &mut RangeDecoder<'a>,
    escapes: &mut RawPatternModel,
    mut one: F,
) where
    F: FnMut(&mut RangeDecoder<'a>, &mut RawPatternModel, usize) -> W,
{
    let n = out.len();
    for i in 0..n / 2 {
        out[2 * i] = one(a, escapes, 2 * i);
        out[2 * i + 1] = one(b, escapes, 2 * i + 1);
    }
    if n % 2 == 1 {
        out[n - 1] = one(a, escapes, n - 1);
    }
}

/// The window of patterns a prediction can code without escaping: every finite pattern whose
/// interval meets `[mu - W sigma, mu + W sigma]`, give or take one at each end. An 8-bit
/// format has so few patterns that leaking one unit to each of them costs nothing measurable
/// (2^-16 of the mass), so its window is simply every finite pattern, found without work.
#[inline(always)]
fn window(cdf: &MixtureCdf, grid: &ValueGrid, mu: f64, sigma: f64) -> Window {
    if grid.max_ordinal < 256 {
        return Window { lo: grid.min_ordinal, n: (grid.max_ordinal - grid.min_ordinal + 1) as u32 };
    }
    let reach = cdf.half_width * sigma;
    let lo = (grid.ordinal_toward_zero(mu - reach) - 1).max(grid.min_ordinal);
    let hi = (grid.ordinal_toward_zero(mu + reach) + 1).min(grid.max_ordinal);
    Window { lo, n: (hi - lo + 1) as u32 }
}

/// `cum(k)` of the value-space model (see `model::mixture`).
#[inline(always)]
fn value_cum(cdf: &MixtureCdf, grid: &ValueGrid, w: Window, mu: f64, inv_sigma: f64, k: i64) -> u32 {
    cdf.eval((grid.lower_edge(k) - mu) * inv_sigma) + (k - w.lo) as u32
}

#[inline(always)]
fn encode_value<W: Word, S: SymbolSink>(
    cdf: &MixtureCdf,
    grid: &ValueGrid,
    sink: &mut S,
    escapes: &mut RawPatternModel,
    x: W,
    mu: f32,
    (sigma, inv_sigma): (f64, f64),
) {
    let mu = mu as f64;
    if !mu.is_finite() {
        escapes.encode(sink, x.to_u32());
        return;
    }
    let w = window(cdf, grid, mu, sigma);
    let k = x.ordinal();
    let escape = cdf.g_max + w.n;
    if k < w.lo || k >= w.lo + w.n as i64 {
        sink.put(escape, (1 << cdf.precision) - escape, cdf.precision);
        escapes.encode(sink, x.to_u32());
    } else {
        let lo = value_cum(cdf, grid, w, mu, inv_sigma, k);
        let hi = value_cum(cdf, grid, w, mu, inv_sigma, k + 1);
        sink.put(lo, hi - lo, cdf.precision);
    }
}

#[inline(always)]
fn decode_value<W: Word>(
    cdf: &MixtureCdf,
    grid: &ValueGrid,
    dec: &mut RangeDecoder,
    escapes: &mut RawPatternModel,
    mu: f32,
    (sigma, inv_sigma): (f64, f64),
) -> W {
    let mu = mu as f64;
    if !mu.is_finite() {
        return W::from_u32(escapes.decode(dec));
    }
    let w = window(cdf, grid, mu, sigma);
    let escape = cdf.g_max + w.n;
    let q = dec.peek(cdf.precision);
    if q >= escape {
        dec.consume(escape, (1 << cdf.precision) - escape);
        return W::from_u32(escapes.decode(dec));
    }
    let cum = |k: i64| value_cum(cdf, grid, w, mu, inv_sigma, k);
    let (first, last) = (w.lo, w.lo + w.n as i64 - 1);
    // Start where the mixture alone puts q (the leak term rarely moves the answer far).
    let k = grid.nearest_ordinal(mu + cdf.guess_z(q.min(cdf.g_max - 1)) * sigma).clamp(first, last);
    // Find the k with cum(k) <= q < cum(k + 1): gallop away from the guess to bracket it,
    // then bisect, remembering cum at both ends of the bracket. cum(first) may exceed q and
    // cum(last + 1) may not, but only in a corrupt stream; the search then stops at an end.
    let (mut below, mut above);
    let (mut c_below, mut c_above);
    (below, c_below) = (k, cum(k));
    if c_below <= q {
        let mut step = 1i64;
        loop {
            above = (below + step).min(last + 1);
            c_above = cum(above);
            if c_above > q || above == last + 1 {
                break;
            }
            (below, c_below) = (above, c_above);
            step *= 2;
        }
    } else {
        let mut step = 1i64;
        (above, c_above) = (below, c_below);
        loop {
            below = (above - step).max(first);
            c_below = cum(below);
            if c_below <= q || below == first {
                break;
            }
            (above, c_above) = (below, c_below);
            step *= 2;
        }
    }
    while above - below > 1 {
        let mid = below + (above - below) / 2;
        let c = cum(mid);
        if c <= q {
            (below, c_below) = (mid, c);
        } else {
            (above, c_above) = (mid, c);
        }
    }
    let c_above = c_above.max(c_below + 1);
    dec.consume(c_below, c_above - c_below);
    W::from_ordinal(below)
}

#[inline(always)]
fn encode_ordinal<W: Word, S: SymbolSink>(
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
fn decode_ordinal<W: Word>(
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
