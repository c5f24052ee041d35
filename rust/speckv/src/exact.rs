//! The exact model's per-scalar coding steps (see `model::mixture` for the model): windows,
//! `cum`, the decoder's guess and search, and the group-of-lanes schedule that `chunk` runs.
//! On x86-64 the group steps run eight lanes at once with AVX-512 (`avx512`) or four with AVX2
//! (`avx2`), computing bit for bit what the portable code computes; `SPECKV_SIMD=avx2` stops at
//! AVX2, `SPECKV_SIMD=0` turns both off (`kernels()` says which run).

use crate::coder::{RangeDecoder, SymbolSink};
use crate::model::grid::ValueGrid;
use crate::model::ladder::SigmaTable;
use crate::model::mixture::MixtureCdf;
use crate::model::RawPatternModel;
use crate::words::Word;

pub mod tables;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;

/// Which kernels code the exact model in this process: `"avx512"`, `"avx2"` or `"portable"`
/// (another architecture, no AVX2, or `SPECKV_SIMD=0`; `SPECKV_SIMD=avx2` stops at AVX2). All
/// write and read the same bytes.
pub fn kernels() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        if avx512::enabled() {
            return "avx512";
        }
        if avx2::enabled() {
            return "avx2";
        }
    }
    "portable"
}

/// A window of patterns `[lo, lo + n)` around a prediction.
#[derive(Clone, Copy, Default)]
pub(crate) struct Window {
    lo: i64,
    n: u32,
}

/// The exact model's tables, with the per-scalar steps of coding and decoding.
///
/// Scalars are coded in groups of `N` (one per lane) in two stages: first every scalar's
/// window and both `cum` values are computed with no branch that depends on the data, then
/// each lane codes its symbol. The `N` independent computations of a stage sit side by side,
/// so the processor overlaps them instead of waiting on one chain at a time. Escapes (and
/// non-finite predictions) leave the group's fast path in lane order, so the shared escape
/// model sees scalars in the same order on both sides.
pub(crate) struct Exact<'a> {
    cdf: &'a MixtureCdf,
    grid: &'a ValueGrid,
    sigmas: &'a SigmaTable,
}

/// What one scalar's coding needs that does not depend on the coded data.
#[derive(Clone, Copy, Default)]
pub(crate) struct Setup {
    mu: f64,
    sigma: f64,
    inv_sigma: f64,
    window: Window,
    /// `G_MAX + n`: where the escape symbol starts.
    escape: u32,
}

/// `[body(0), .., body(n - 1)]` with `body` written out in place: the group steps build their
/// per-lane arrays with it (through `std::array::from_fn` or a helper taking a closure, the
/// compiler sometimes leaves a call per array per group, which cost the portable code 15-20%).
macro_rules! each {
    ($n:expr, |$l:ident| $body:expr) => {{
        let mut out = [Default::default(); $n];
        #[allow(clippy::needless_range_loop)]
        for $l in 0..$n {
            out[$l] = $body;
        }
        out
    }};
}

impl<'a> Exact<'a> {
    pub(crate) fn new(cdf: &'a MixtureCdf, grid: &'a ValueGrid, sigmas: &'a SigmaTable) -> Self {
        Exact { cdf, grid, sigmas }
    }

    /// Codes `x` against `mu` and per-scalar sigma codes, scalar `i` on lane `i % N`.
    pub(crate) fn encode<W: Word, S: SymbolSink, const N: usize>(
        &self,
        lanes: &mut [S; N],
        escapes: &mut RawPatternModel,
        x: &[W],
        mu: &[f32],
        codes: &[i16],
    ) {
        let full = x.len() / N * N;
        let mut done = 0;
        #[cfg(target_arch = "x86_64")]
        if let (true, Ok(lanes8)) = (avx512::enabled(), <&mut [S; 8]>::try_from(&mut lanes[..])) {
            // SAFETY: `enabled()` checked that this processor has AVX-512F and AVX2.
            done = unsafe { avx512::encode(self, lanes8, escapes, &x[..full], &mu[..full], &codes[..full]) };
        } else if self.vectorised() {
            let (x, mu, codes) = (&x[..full], &mu[..full], &codes[..full]);
            // SAFETY: `vectorised()` checked that this processor has AVX2; `lanes` has N.
            done = match N {
                4 => unsafe { avx2::encode::<W, S, 1>(self, lanes, escapes, x, mu, codes) },
                8 => unsafe { avx2::encode::<W, S, 2>(self, lanes, escapes, x, mu, codes) },
                _ => 0,
            };
        }
        for base in (done..full).step_by(N) {
            let group = base..base + N;
            self.encode_group(
                lanes,
                escapes,
                x[group.clone()].try_into().unwrap(),
                mu[group.clone()].try_into().unwrap(),
                codes[group].try_into().unwrap(),
            );
        }
        for (l, lane) in lanes.iter_mut().enumerate().take(x.len() - full) {
            let i = full + l;
            self.encode_one(lane, escapes, x[i], &self.setup(mu[i], codes[i]));
        }
    }

    /// Inverse of `encode`: fills `out` (as long as `mu` and `codes`).
    pub(crate) fn decode<W: Word, const N: usize>(
        &self,
        lanes: &mut [RangeDecoder; N],
        escapes: &mut RawPatternModel,
        out: &mut [W],
        mu: &[f32],
        codes: &[i16],
    ) {
        let full = out.len() / N * N;
        let mut done = 0;
        #[cfg(target_arch = "x86_64")]
        if let (true, Ok(lanes8)) = (avx512::enabled(), <&mut [RangeDecoder; 8]>::try_from(&mut lanes[..])) {
            // SAFETY: `enabled()` checked that this processor has AVX-512F and AVX2.
            done = unsafe { avx512::decode(self, lanes8, escapes, &mut out[..full], &mu[..full], &codes[..full]) };
        } else if self.vectorised() {
            let (out, mu, codes) = (&mut out[..full], &mu[..full], &codes[..full]);
            // SAFETY: `vectorised()` checked that this processor has AVX2; `lanes` has N.
            done = match N {
                4 => unsafe { avx2::decode::<W, 1>(self, lanes, escapes, out, mu, codes) },
                8 => unsafe { avx2::decode::<W, 2>(self, lanes, escapes, out, mu, codes) },
                _ => 0,
            };
        }
        for base in (done..full).step_by(N) {
            let group = base..base + N;
            self.decode_group(
                lanes,
                escapes,
                (&mut out[group.clone()]).try_into().unwrap(),
                mu[group.clone()].try_into().unwrap(),
                codes[group].try_into().unwrap(),
            );
        }
        for (l, lane) in lanes.iter_mut().enumerate().take(out.len() - full) {
            let i = full + l;
            out[i] = self.decode_one(lane, escapes, &self.setup(mu[i], codes[i]));
        }
    }

    /// Whether the AVX2 kernels run: on x86-64 with AVX2, unless `SPECKV_SIMD=0`.
    #[cfg(target_arch = "x86_64")]
    fn vectorised(&self) -> bool {
        avx2::enabled()
    }

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
            return Setup { mu: 0.0, sigma, inv_sigma, window: Window { lo: 0, n: 1 }, escape: 0 };
        }
        let window = self.window(mu, sigma);
        Setup { mu, sigma, inv_sigma, window, escape: self.cdf.g_max + window.n }
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
        let scalars: [Setup; N] = each!(N, |l| self.setup(mu[l], codes[l]));
        // Stage 1: both ends of every scalar's interval (clamped into the window, so an
        // escaping scalar computes harmless values it will not use).
        let k: [i64; N] = each!(N, |l| x[l].ordinal());
        let kc: [i64; N] = each!(N, |l| {
            let w = scalars[l].window;
            k[l].clamp(w.lo, w.lo + w.n as i64 - 1)
        });
        let lo: [u32; N] = each!(N, |l| self.cum(&scalars[l], kc[l]));
        let hi: [u32; N] = each!(N, |l| self.cum(&scalars[l], kc[l] + 1));
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

    /// `cum`'s leak term `k - lo` at the pattern truncating `mu`: what `guess` takes off the
    /// slot first (patterns near `mu` differ in leak by a handful of units, far below one
    /// pattern's share of `G` where symbols are likely). Only decoders need it.
    #[inline(always)]
    fn leak_at_mu(&self, s: &Setup) -> u32 {
        (self.grid.ordinal_toward_zero(s.mu) - s.window.lo).clamp(0, s.window.n as i64) as u32
    }

    /// Where the decoder looks first for slot `q`: `cum(k)` is `G(z_k)` plus the leak
    /// `k - lo`; with an estimate `leak` of it taken off `q`, the inverse of `G` alone
    /// (`MixtureCdf::guess_z`) gives a value, and the pattern whose interval holds it is the
    /// guess.
    #[inline(always)]
    fn guess(&self, s: &Setup, leak: u32, q: u32) -> i64 {
        let target = q.saturating_sub(leak).min(self.cdf.g_max - 1);
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
        let scalars: [Setup; N] = each!(N, |l| self.setup(mu[l], codes[l]));
        // Before the slots: nothing here waits on the coders.
        let leaks: [u32; N] = each!(N, |l| self.leak_at_mu(&scalars[l]));
        let precision = self.cdf.precision;
        let q: [u32; N] = each!(N, |l| lanes[l].peek(precision));
        let k: [i64; N] = each!(N, |l| self.guess(&scalars[l], leaks[l], q[l]));
        let below: [u32; N] = each!(N, |l| self.cum(&scalars[l], k[l]));
        let above: [u32; N] = each!(N, |l| self.cum(&scalars[l], k[l] + 1));
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
        let k = self.guess(s, self.leak_at_mu(s), q);
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
        // Most misses are far off in windows where the leak term dominates (near zero, where
        // thousands of patterns share little mass): guess again with the leak at the missed
        // guess instead of at `mu`, which usually lands on the symbol or next to it.
        let (mut k, mut c_k) = (k, c_k);
        for _ in 0..2 {
            let again = self.guess(s, (k - s.window.lo) as u32, q);
            if again == k {
                break;
            }
            let (c, next) = (cum(again), cum(again + 1));
            if c <= q && q < next {
                dec.consume(c, next - c);
                return again;
            }
            (k, c_k) = (again, c);
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coder::RangeEncoder;
    use crate::dtype::DType;
    use crate::model::ModelParams;

    /// Records every coded interval: two implementations that record the same sequence code
    /// the same bytes.
    #[derive(Default, Debug, PartialEq)]
    struct Recorder(Vec<(u32, u32, u32)>);

    impl SymbolSink for Recorder {
        fn put(&mut self, cum: u32, freq: u32, precision: u32) {
            self.0.push((cum, freq, precision));
        }
    }

    struct Case<W = u16> {
        x: Vec<W>,
        mu: Vec<f32>,
        codes: Vec<i16>,
    }

    /// Predictions and values that exercise every branch of the window and the guess: binade
    /// edges, zero and the subnormals, huge values and sigmas, NaN and infinite `mu`, values
    /// near `mu` and arbitrary patterns.
    fn case(dtype: DType, n: usize, seed: u64) -> Case {
        let mut state = seed;
        let mut next = move || {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        let grid = ValueGrid::shared(dtype);
        let (mut x, mut mu, mut codes) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..n {
            let r = next();
            // The format's smallest normal binade, where its subnormals begin.
            let min_normal = 1 - dtype.exponent_bias();
            let mut code_near = None;
            let m: f32 = match r % 11 {
                10 => {
                    let e = min_normal + (r >> 8) as i32 % 6 - 3;
                    code_near = Some((8 * (e - 1 - (r >> 16) as i32 % 10)) as i16);
                    let frac = 1.0 + (next() % 1024) as f32 / 1024.0;
                    frac * 2f32.powi(e) * if r >> 40 & 1 == 1 { -1.0 } else { 1.0 }
                }
                0 => f32::from_bits(next() as u32),
                1 => [0.0, -0.0, 1.0, -1.0, 2.0, 0.5, 65504.0, 1e-40, -1e-45, 3.0e38][(r >> 8) as usize % 10],
                2 => [f32::NAN, f32::INFINITY, f32::NEG_INFINITY][(r >> 8) as usize % 3],
                3 => (1u32 << ((r >> 8) % 30)) as f32 * if r >> 40 & 1 == 1 { -1.0 } else { 1.0 },
                _ => ((next() >> 11) as f64 / (1u64 << 53) as f64 * 4.0 - 2.0) as f32,
            };
            let code = match (code_near, r >> 20 & 3) {
                (Some(code), _) => code,
                (None, 0) => (next() % 2041) as i16 - 1016,
                (None, _) => (next() % 80) as i16 - 70,
            };
            let (sigma, _) = crate::model::ladder::sigma_and_inverse(code);
            let v = match r >> 24 & 7 {
                0 => dtype.from_ordinal((next() % 65536) as i64 - 32768),
                _ => {
                    let noise = ((next() >> 11) as f64 / (1u64 << 53) as f64 - 0.5) * 6.0 * sigma;
                    let target = m as f64 + noise;
                    if target.is_finite() {
                        grid.nearest_pattern(target)
                    } else {
                        0x7FC0
                    }
                }
            };
            x.push(v as u16);
            mu.push(m);
            codes.push(code);
        }
        Case { x, mu, codes }
    }

    fn exact(dtype: DType) -> (std::sync::Arc<MixtureCdf>, std::sync::Arc<ValueGrid>) {
        (MixtureCdf::shared(&ModelParams::default()), ValueGrid::shared(dtype))
    }

    #[test]
    fn portable_group_and_single_steps_code_the_same_intervals() {
        let (cdf, grid) = exact(DType::BFloat16);
        let ex = Exact::new(&cdf, &grid, SigmaTable::shared());
        let c = case(DType::BFloat16, 4000, 1);
        let params = ModelParams::default();
        let (mut grouped, mut single): ([Recorder; 4], [Recorder; 4]) = Default::default();
        let (mut e1, mut e2) =
            (RawPatternModel::new(DType::BFloat16, &params), RawPatternModel::new(DType::BFloat16, &params));
        for base in (0..c.x.len()).step_by(4) {
            let g = base..base + 4;
            ex.encode_group(
                &mut grouped,
                &mut e1,
                c.x[g.clone()].try_into().unwrap(),
                c.mu[g.clone()].try_into().unwrap(),
                c.codes[g].try_into().unwrap(),
            );
            for (l, sink) in single.iter_mut().enumerate() {
                let i = base + l;
                ex.encode_one(sink, &mut e2, c.x[i], &ex.setup(c.mu[i], c.codes[i]));
            }
        }
        assert_eq!(grouped, single);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_kernels_agree_with_the_portable_code_bit_for_bit() {
        if !crate::test_env::have("avx2", is_x86_feature_detected!("avx2"), "no AVX2 on this processor") {
            return;
        }
        for seed in 0..6 {
            for dtype in [DType::BFloat16, DType::Float16] {
                kernels_agree::<u16, 4, 1>(dtype, seed);
                kernels_agree::<u16, 8, 2>(dtype, seed);
            }
            for dtype in [DType::Float8E4M3Fn, DType::Float8E5M2] {
                kernels_agree::<u8, 4, 1>(dtype, seed);
                kernels_agree::<u8, 8, 2>(dtype, seed);
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx512_kernels_agree_with_the_portable_code_bit_for_bit() {
        let present = is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512dq")
            && is_x86_feature_detected!("avx2");
        if !crate::test_env::have("avx512", present, "no AVX-512 on this processor") {
            return;
        }
        for seed in 0..6 {
            for dtype in [DType::BFloat16, DType::Float16] {
                kernels_agree::<u16, 8, 0>(dtype, seed);
            }
            for dtype in [DType::Float8E4M3Fn, DType::Float8E5M2] {
                kernels_agree::<u8, 8, 0>(dtype, seed);
            }
        }
    }

    /// The kernel under test: AVX2 with `H` quads (`N = 4 H` lanes), or AVX-512 (`H = 0`, eight
    /// lanes).
    ///
    /// # Safety
    /// The processor must have the kernel's instruction sets.
    #[cfg(target_arch = "x86_64")]
    unsafe fn vector_encode<W: Word, S: SymbolSink, const N: usize, const H: usize>(
        ex: &Exact,
        lanes: &mut [S; N],
        escapes: &mut RawPatternModel,
        c: &Case<W>,
    ) {
        match H {
            0 => avx512::encode(ex, (&mut lanes[..]).try_into().unwrap(), escapes, &c.x, &c.mu, &c.codes),
            _ => avx2::encode::<_, _, H>(ex, lanes, escapes, &c.x, &c.mu, &c.codes),
        };
    }

    /// The AVX2 kernels with `H` quads (`N = 4 H` lanes; `H = 0`: the AVX-512 kernels, eight
    /// lanes) against the portable group steps:
    /// the same intervals in the same order per lane when encoding, and each side decodes
    /// what the other encodes.
    #[cfg(target_arch = "x86_64")]
    fn kernels_agree<W: Word + std::fmt::Debug + PartialEq, const N: usize, const H: usize>(dtype: DType, seed: u64) {
        let params = ModelParams::default();
        let (cdf, grid) = exact(dtype);
        let ex = Exact::new(&cdf, &grid, SigmaTable::shared());
        let c = case(dtype, 4096, seed);
        let c = Case { x: c.x.iter().map(|&v| W::from_u32(v as u32)).collect::<Vec<W>>(), mu: c.mu, codes: c.codes };
        let portable_encode = |sinks: &mut [Recorder; N]| {
            let mut esc = RawPatternModel::new(dtype, &params);
            for base in (0..c.x.len()).step_by(N) {
                let g = base..base + N;
                ex.encode_group(
                    sinks,
                    &mut esc,
                    c.x[g.clone()].try_into().unwrap(),
                    c.mu[g.clone()].try_into().unwrap(),
                    c.codes[g].try_into().unwrap(),
                );
            }
        };
        let mut portable: [Recorder; N] = std::array::from_fn(|_| Recorder::default());
        portable_encode(&mut portable);
        let mut vector: [Recorder; N] = std::array::from_fn(|_| Recorder::default());
        // SAFETY (here and below): the caller checked for the kernels' instruction sets.
        unsafe { vector_encode::<_, _, N, H>(&ex, &mut vector, &mut RawPatternModel::new(dtype, &params), &c) };
        assert_eq!(portable, vector, "{dtype:?} seed {seed} lanes {N}");
        let mut lanes: [RangeEncoder; N] = std::array::from_fn(|_| RangeEncoder::new());
        unsafe { vector_encode::<_, _, N, H>(&ex, &mut lanes, &mut RawPatternModel::new(dtype, &params), &c) };
        let words = lanes.map(RangeEncoder::finish);
        // The same bytes as the portable steps write (the AVX-512 kernel keeps real encoders'
        // state in vectors, a different path from the one the recorders above took).
        let mut portable_lanes: [RangeEncoder; N] = std::array::from_fn(|_| RangeEncoder::new());
        let mut esc = RawPatternModel::new(dtype, &params);
        for base in (0..c.x.len()).step_by(N) {
            let g = base..base + N;
            ex.encode_group(
                &mut portable_lanes,
                &mut esc,
                c.x[g.clone()].try_into().unwrap(),
                c.mu[g.clone()].try_into().unwrap(),
                c.codes[g].try_into().unwrap(),
            );
        }
        assert!(portable_lanes.map(RangeEncoder::finish) == words, "{dtype:?} seed {seed} lanes {N}: bytes");
        let decoders = || -> [RangeDecoder; N] { std::array::from_fn(|l| RangeDecoder::new(&words[l])) };
        let mut dec = decoders();
        let mut esc = RawPatternModel::new(dtype, &params);
        let mut out = vec![W::default(); c.x.len()];
        unsafe {
            match H {
                0 => avx512::decode(&ex, (&mut dec[..]).try_into().unwrap(), &mut esc, &mut out, &c.mu, &c.codes),
                _ => avx2::decode::<_, H>(&ex, &mut dec, &mut esc, &mut out, &c.mu, &c.codes),
            }
        };
        assert_eq!(out, c.x, "{dtype:?} seed {seed} lanes {N}: vector decode");
        assert!(dec.iter().all(|d| d.finished_cleanly()));
        let mut dec = decoders();
        let mut esc = RawPatternModel::new(dtype, &params);
        let mut out = vec![W::default(); c.x.len()];
        for base in (0..c.x.len()).step_by(N) {
            let g = base..base + N;
            ex.decode_group(
                &mut dec,
                &mut esc,
                (&mut out[g.clone()]).try_into().unwrap(),
                c.mu[g.clone()].try_into().unwrap(),
                c.codes[g].try_into().unwrap(),
            );
        }
        assert_eq!(out, c.x, "{dtype:?} seed {seed} lanes {N}: portable decode");
    }
}
