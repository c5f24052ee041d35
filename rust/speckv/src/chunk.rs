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
//! independent chains let the processor overlap them (format version 2 writes `LANES` = 4,
//! version 1 wrote 2). The payload is `[lengths of lanes 0..N-2: u32 LE each][lane 0
//! words]...[lane N-1 words]` (the last lane's length is what remains).

use std::sync::Arc;

use crate::coder::{RangeDecoder, SymbolSink};
use crate::error::Error;
use crate::model::grid::ValueGrid;
use crate::model::ladder::{ScaleMap, SigmaTable, CHOICE_SHIFT_POS, CHOICE_TABLE_MASK};
use crate::model::mixture::MixtureCdf;
use crate::model::{ModelParams, RawPatternModel, TableBank};
use crate::words::Word;
use crate::DType;

/// Independent coders per chunk in streams this build writes (format version 2).
pub const LANES: usize = 4;
/// Coders per chunk in format version 1 streams, which this build still reads.
pub const LANES_V1: usize = 2;

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
    /// The name the APIs use: `"exact"` or `"fast"`.
    pub fn name(self) -> &'static str {
        match self {
            ModelKind::Exact => "exact",
            ModelKind::Fast => "fast",
        }
    }

    /// Inverse of `name`.
    pub fn from_name(name: &str) -> Option<ModelKind> {
        match name {
            "exact" => Some(ModelKind::Exact),
            "fast" => Some(ModelKind::Fast),
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
            PredictedModel::Exact { cdf, .. } => cdf.digest(),
            PredictedModel::Fast { bank, .. } => bank.digest(),
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
        let mut escapes = RawPatternModel::new(self.dtype, &self.params);
        match &self.predicted {
            PredictedModel::Exact { cdf, grid, sigmas } => {
                let exact = Exact { cdf, grid, sigmas };
                let full = x.len() / N * N;
                for base in (0..full).step_by(N) {
                    let group = base..base + N;
                    exact.encode_group(
                        lanes,
                        &mut escapes,
                        x[group.clone()].try_into().unwrap(),
                        mu[group.clone()].try_into().unwrap(),
                        codes[group].try_into().unwrap(),
                    );
                }
                for (l, lane) in lanes.iter_mut().enumerate().take(x.len() - full) {
                    let i = full + l;
                    exact.encode_one(lane, &mut escapes, x[i], &exact.setup(mu[i], codes[i]));
                }
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
                for_lanes(x.len(), lanes, &mut escapes, one);
            }
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
        let mut escapes = RawPatternModel::new(self.dtype, &self.params);
        match &self.predicted {
            PredictedModel::Exact { cdf, grid, sigmas } => {
                let exact = Exact { cdf, grid, sigmas };
                let full = out.len() / N * N;
                for base in (0..full).step_by(N) {
                    let group = base..base + N;
                    exact.decode_group(
                        lanes,
                        &mut escapes,
                        (&mut out[group.clone()]).try_into().unwrap(),
                        mu[group.clone()].try_into().unwrap(),
                        codes[group].try_into().unwrap(),
                    );
                }
                for (l, lane) in lanes.iter_mut().enumerate().take(out.len() - full) {
                    let i = full + l;
                    out[i] = exact.decode_one(lane, &mut escapes, &exact.setup(mu[i], codes[i]));
                }
            }
            PredictedModel::Fast { bank, scales, grid } => {
                let precision = self.params.table_precision as u32;
                let one = |dec: &mut RangeDecoder, esc: &mut RawPatternModel, i: usize| match rounded(grid, mu[i]) {
                    Some(m) => {
                        decode_fast(bank, precision, dec, esc, W::from_u32(m), scales.choose_packed(codes[i], m))
                    }
                    None => W::from_u32(esc.decode(dec)),
                };
                for_lanes_dec(out, lanes, &mut escapes, one);
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

/// The exact model's tables, with the per-scalar steps of coding and decoding.
///
/// Scalars are coded in groups of `N` (one per lane) in two stages: first every scalar's
/// window and both `cum` values are computed with no branch that depends on the data, then
/// each lane codes its symbol. The `N` independent computations of a stage sit side by side,
/// so the processor overlaps them instead of waiting on one chain at a time. Escapes (and
/// non-finite predictions) leave the group's fast path in lane order, so the shared escape
/// model sees scalars in the same order on both sides.
struct Exact<'a> {
    cdf: &'a MixtureCdf,
    grid: &'a ValueGrid,
    sigmas: &'a SigmaTable,
}

/// What one scalar's coding needs that does not depend on the coded data.
#[derive(Clone, Copy)]
struct Setup {
    mu: f64,
    sigma: f64,
    inv_sigma: f64,
    window: Window,
    /// `cum`'s leak term at the pattern truncating `mu` (see `Exact::guess`).
    leak: u32,
    /// `G_MAX + n`: where the escape symbol starts.
    escape: u32,
}

impl Exact<'_> {
    /// The window of patterns a prediction can code without escaping: every finite pattern
    /// whose interval meets `[mu - W sigma, mu + W sigma]`, give or take one at each end. An
    /// 8-bit format has so few patterns that leaking one unit to each of them costs nothing
    /// measurable (2^-16 of the mass), so its window is simply every finite pattern.
    #[inline(always)]
    fn window(&self, mu: f64, sigma: f64) -> Window {
        let grid = self.grid;
        if grid.max_ordinal < 256 {
            return Window { lo: grid.min_ordinal, n: (grid.max_ordinal - grid.min_ordinal + 1) as u32 };
        }
        let reach = self.cdf.half_width * sigma;
        let lo = (grid.ordinal_toward_zero(mu - reach) - 1).max(grid.min_ordinal);
        let hi = (grid.ordinal_toward_zero(mu + reach) + 1).min(grid.max_ordinal);
        Window { lo, n: (hi - lo + 1) as u32 }
    }

    /// A non-finite `mu` predicts nothing: `escape` is then 0, so every slot is an escape
    /// (its scalar goes to the raw model with no escape symbol; see `encode_slow`).
    #[inline(always)]
    fn setup(&self, mu: f32, code: i16) -> Setup {
        let (sigma, inv_sigma) = self.sigmas.get(code);
        let mu = mu as f64;
        if !mu.is_finite() {
            return Setup { mu: 0.0, sigma, inv_sigma, window: Window { lo: 0, n: 1 }, leak: 0, escape: 0 };
        }
        let window = self.window(mu, sigma);
        let leak = (self.grid.ordinal_toward_zero(mu) - window.lo).clamp(0, window.n as i64) as u32;
        Setup { mu, sigma, inv_sigma, window, leak, escape: self.cdf.g_max + window.n }
    }

    /// `cum(k)` of the exact model (see `model::mixture`).
    #[inline(always)]
    fn cum(&self, s: &Setup, k: i64) -> u32 {
        self.cdf.eval((self.grid.lower_edge(k) - s.mu) * s.inv_sigma) + (k - s.window.lo) as u32
    }

    #[inline(always)]
    fn in_window(s: &Setup, k: i64) -> bool {
        k >= s.window.lo && k < s.window.lo + s.window.n as i64
    }

    #[inline(always)]
    fn encode_group<W: Word, S: SymbolSink, const N: usize>(
        &self,
        lanes: &mut [S; N],
        escapes: &mut RawPatternModel,
        x: &[W; N],
        mu: &[f32; N],
        codes: &[i16; N],
    ) {
        let scalars: [Setup; N] = std::array::from_fn(|l| self.setup(mu[l], codes[l]));
        // Stage 1: both ends of every scalar's interval (clamped into the window, so an
        // escaping scalar computes harmless values it will not use).
        let k: [i64; N] = std::array::from_fn(|l| x[l].ordinal());
        let kc: [i64; N] = std::array::from_fn(|l| {
            let w = scalars[l].window;
            k[l].clamp(w.lo, w.lo + w.n as i64 - 1)
        });
        let lo: [u32; N] = std::array::from_fn(|l| self.cum(&scalars[l], kc[l]));
        let hi: [u32; N] = std::array::from_fn(|l| self.cum(&scalars[l], kc[l] + 1));
        // Stage 2: code, in lane order.
        for l in 0..N {
            let s = &scalars[l];
            if s.escape != 0 && Self::in_window(s, k[l]) {
                lanes[l].put(lo[l], hi[l] - lo[l], self.cdf.precision);
            } else {
                self.encode_slow(&mut lanes[l], escapes, x[l], s);
            }
        }
    }

    #[inline(always)]
    fn encode_one<W: Word, S: SymbolSink>(&self, sink: &mut S, escapes: &mut RawPatternModel, x: W, s: &Setup) {
        let k = x.ordinal();
        if s.escape != 0 && Self::in_window(s, k) {
            let (lo, hi) = (self.cum(s, k), self.cum(s, k + 1));
            sink.put(lo, hi - lo, self.cdf.precision);
        } else {
            self.encode_slow(sink, escapes, x, s);
        }
    }

    /// A scalar outside its window: the escape symbol, then its raw pattern; with a
    /// non-finite `mu`, the raw pattern alone.
    #[cold]
    #[inline(never)]
    fn encode_slow<W: Word, S: SymbolSink>(&self, sink: &mut S, escapes: &mut RawPatternModel, x: W, s: &Setup) {
        if s.escape != 0 {
            sink.put(s.escape, (1 << self.cdf.precision) - s.escape, self.cdf.precision);
        }
        escapes.encode(sink, x.to_u32());
    }

    /// Where the decoder looks first for slot `q`: `cum(k)` is `G(z_k)` plus the leak
    /// `k - lo`; with the leak of the pattern at `mu` taken off `q`, the inverse of `G` alone
    /// (`MixtureCdf::guess_z`) gives a value, and the pattern whose interval holds it is the
    /// guess (patterns near `mu` differ in leak by a handful of units, far below one pattern's
    /// share of `G` where symbols are likely).
    #[inline(always)]
    fn guess(&self, s: &Setup, q: u32) -> i64 {
        let target = q.saturating_sub(s.leak).min(self.cdf.g_max - 1);
        let w = s.window;
        self.grid.nearest_ordinal(s.mu + self.cdf.guess_z(target) * s.sigma).clamp(w.lo, w.lo + w.n as i64 - 1)
    }

    /// Decodes one scalar per lane with two evaluations of `cum` each in the common case: the
    /// guess, and `cum` at it and the next pattern to confirm it. A miss (a slot within a few
    /// units of a boundary, or the far tails) runs `search`. The result never depends on the
    /// guess: it is the one `k` with `cum(k) <= q < cum(k + 1)`.
    #[inline(always)]
    fn decode_group<W: Word, const N: usize>(
        &self,
        lanes: &mut [RangeDecoder; N],
        escapes: &mut RawPatternModel,
        out: &mut [W; N],
        mu: &[f32; N],
        codes: &[i16; N],
    ) {
        let scalars: [Setup; N] = std::array::from_fn(|l| self.setup(mu[l], codes[l]));
        let precision = self.cdf.precision;
        let q: [u32; N] = std::array::from_fn(|l| lanes[l].peek(precision));
        let k: [i64; N] = std::array::from_fn(|l| self.guess(&scalars[l], q[l]));
        let below: [u32; N] = std::array::from_fn(|l| self.cum(&scalars[l], k[l]));
        let above: [u32; N] = std::array::from_fn(|l| self.cum(&scalars[l], k[l] + 1));
        for l in 0..N {
            // `q < escape` is implied when `q < above` and the scalar has a window (`above`
            // is at most `G_MAX + n` inside it); a non-finite `mu` has `escape` 0.
            if scalars[l].escape != 0 && below[l] <= q[l] && q[l] < above[l] {
                lanes[l].consume(below[l], above[l] - below[l]);
                out[l] = W::from_ordinal(k[l]);
            } else {
                out[l] = W::from_ordinal(self.decode_slow(&mut lanes[l], escapes, &scalars[l], q[l], k[l], below[l]));
            }
        }
    }

    #[inline(always)]
    fn decode_one<W: Word>(&self, dec: &mut RangeDecoder, escapes: &mut RawPatternModel, s: &Setup) -> W {
        let q = dec.peek(self.cdf.precision);
        let k = self.guess(s, q);
        let (below, above) = (self.cum(s, k), self.cum(s, k + 1));
        if s.escape != 0 && below <= q && q < above {
            dec.consume(below, above - below);
            W::from_ordinal(k)
        } else {
            W::from_ordinal(self.decode_slow(dec, escapes, s, q, k, below))
        }
    }

    /// Everything but a confirmed guess: a raw pattern (non-finite `mu`), an escape, or a
    /// search from the missed guess `k` (whose `cum` is `c_k`). Returns the ordinal (for a raw
    /// pattern, the ordinal of that pattern).
    #[cold]
    #[inline(never)]
    fn decode_slow(
        &self,
        dec: &mut RangeDecoder,
        escapes: &mut RawPatternModel,
        s: &Setup,
        q: u32,
        k: i64,
        c_k: u32,
    ) -> i64 {
        let width = self.grid.dtype().bits();
        if s.escape == 0 {
            // Nothing was peeked for this scalar's model: the raw model reads from scratch.
            return crate::dtype::ordinal_of(escapes.decode(dec), width);
        }
        if q >= s.escape {
            dec.consume(s.escape, (1 << self.cdf.precision) - s.escape);
            return crate::dtype::ordinal_of(escapes.decode(dec), width);
        }
        self.search(dec, s, q, k, c_k)
    }

    /// The `k` in the window with `cum(k) <= q < cum(k + 1)`, found by galloping away from the
    /// missed guess `k` to bracket it, then bisecting, remembering `cum` at both ends of the
    /// bracket. `cum(first)` may exceed `q` and `cum(last + 1)` may not, but only in a corrupt
    /// stream; the search then stops at an end (and the chunk's clean-end check reports it).
    fn search(&self, dec: &mut RangeDecoder, s: &Setup, q: u32, k: i64, c_k: u32) -> i64 {
        let cum = |k: i64| self.cum(s, k);
        let (first, last) = (s.window.lo, s.window.lo + s.window.n as i64 - 1);
        let (mut below, mut above);
        let (mut c_below, mut c_above);
        (below, c_below) = (k, c_k);
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
        below
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
