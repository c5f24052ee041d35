//! The joint residual model: a layer's scalars coded channel by channel, each channel's
//! prediction corrected by the residuals already coded for the same token.
//!
//! Every head's residual is a projection of the same hidden-state error, so a token's
//! residuals across channels, heads and K/V are strongly correlated; a calibrated linear
//! conditional model (coefficients from the Cholesky factor of their covariance) turns that
//! into a better `mu` and a smaller sigma for every channel after the first.
//!
//! Layout: a stream coded with it (`FLAG_JOINT`) holds whole layers of `C` channels x `T`
//! tokens, channel-major (scalar `c * T + t` of a layer is channel `c` of token `t`), and its
//! chunks hold whole layers. The residual of a scalar is `e = value(x) - mu` in float32 (0 where
//! that is not finite). Channel `i` of token `t` is coded against
//!
//! ```text
//! mu'[i, t] = mu[i, t] + acc,   acc = offset[i] + sum_{j < E} a[i, j] * o[j, t]
//!                                              + sum_{j < i} a[i, E + j] * e[j, t]
//! ```
//!
//! with `o` the `E` residual channels given from outside the stream (e.g. the same tokens' keys
//! when coding values), `a` (`C x (E + C)`, row `i` reads columns `..E + i`) and `offset` the
//! layer's calibrated parameters.
//!
//! Invariant (J1), what makes encoder and decoder agree bit for bit on any machine and thread
//! count: `acc` is built in exactly this order, `acc = acc + (a * o)` with the product and the
//! sum each one correctly rounded float32 operation (Rust never fuses them unless asked with
//! `mul_add`; the loop over tokens vectorises lane-wise without reordering any token's sum),
//! zero coefficients skipped (by both sides alike), then `mu' = mu + acc`.
//!
//! Invariant (J2): a layer whose coefficients and offsets are all zero is coded against `mu`
//! itself (not `mu + 0.0`, which would turn -0.0 into +0.0), its scalars in one run.
//!
//! A stream may also scale each token's sigmas by its residuals so far (`crate::token_scale`,
//! invariant J3); J2 layers are coded with their sigmas as given. A stream with
//! `FLAG_JOINT_INT` computes `acc` in the integer form instead (`crate::joint_integer`,
//! invariant J4: `Joint::integer`); J2 and J3 hold there alike.

use std::sync::OnceLock;

use crate::dtype::DType;
use crate::error::{invalid, Result};
use crate::hash::{plain_bytes, Hasher};
use crate::joint_integer::IntegerJoint;
use crate::words::Word;

/// A joint residual model for a stream of whole layers (see the module's notes).
#[derive(Debug, Clone, Copy)]
pub struct Joint<'a> {
    /// Channels of a layer (`C`) and tokens (`T`).
    pub channels: usize,
    pub tokens: usize,
    /// Residual channels given from outside the stream per layer (`E`, may be 0), and their
    /// values: `layers x E x T`.
    pub outside_channels: usize,
    pub outside: &'a [f32],
    /// `layers x C x (E + C)` coefficients and `layers x C` offsets.
    pub coef: &'a [f32],
    pub offset: &'a [f32],
    /// The integer form of the same model (`crate::joint_integer`, invariant J4), where the
    /// stream is coded in it (`FLAG_JOINT_INT`); its offsets are `offset`.
    pub integer: Option<IntegerJoint<'a>>,
}

impl<'a> Joint<'a> {
    pub fn layer_scalars(&self) -> usize {
        self.channels * self.tokens
    }

    fn width(&self) -> usize {
        self.outside_channels + self.channels
    }

    /// Checks the arrays against a stream of `n` scalars in chunks of `chunk` (whole layers).
    pub fn check(&self, n: usize, chunk: usize) -> Result<()> {
        let layers = self.check_parameters(n, chunk)?;
        let want = layers * self.outside_channels * self.tokens;
        if self.outside.len() != want {
            return invalid(format!(
                "joint: {} outside residuals given, {want} expected for {layers} layers",
                self.outside.len()
            ));
        }
        Ok(())
    }

    /// `check` without the outside residuals (what a stream's header and fingerprints need,
    /// for chunks coded elsewhere: `codec::assemble_predicted`); returns the layers.
    pub fn check_parameters(&self, n: usize, chunk: usize) -> Result<usize> {
        let per_layer = self.layer_scalars();
        if self.channels == 0 || self.tokens == 0 || !n.is_multiple_of(per_layer) || !chunk.is_multiple_of(per_layer) {
            return invalid(format!(
                "joint: {n} scalars in chunks of {chunk} are not whole layers of {} channels x {} tokens",
                self.channels, self.tokens
            ));
        }
        let layers = n / per_layer;
        let sizes = [
            (self.coef.len(), layers * self.channels * self.width(), "coefficients"),
            (self.offset.len(), layers * self.channels, "offsets"),
        ];
        for (got, want, what) in sizes {
            if got != want {
                return invalid(format!("joint: {got} {what} given, {want} expected for {layers} layers"));
            }
        }
        if let Some(integer) = &self.integer {
            integer.check(layers, self.channels, self.outside_channels)?;
        }
        Ok(layers)
    }

    /// Whether `layer`'s coefficients and offsets are all zero: such a layer is coded against
    /// `mu` as it is, in one run (invariant J2; no conditional sums, no residuals), which is
    /// what a calibration without a joint model for that layer asks for.
    pub fn is_plain(&self, layer: usize) -> bool {
        let rows = self.channels * self.width();
        let coef = &self.coef[layer * rows..(layer + 1) * rows];
        let offset = &self.offset[layer * self.channels..(layer + 1) * self.channels];
        coef.iter().chain(offset).all(|&v| v == 0.0)
    }

    /// Digest of one layer's parameters (and the layout), mixed into each chunk's prediction
    /// fingerprint: a decoder given other parameters is refused before it decodes. The outside
    /// residuals are not in it: they come from data that is itself checked.
    pub fn digest(&self, layer: usize) -> u64 {
        let mut h = Hasher::new();
        for v in [self.channels, self.tokens, self.outside_channels] {
            h.update(&(v as u64).to_le_bytes());
        }
        let (w, c) = (self.width(), self.channels);
        match &self.integer {
            // what the integer form computes with (J4), not the float coefficients (whose
            // zeros it shares: `is_plain`)
            Some(integer) => {
                let row = crate::joint_integer::even(self.outside_channels) + crate::joint_integer::even(c);
                h.update(b"J4");
                h.update(&[self.is_plain(layer) as u8]);
                h.update(plain_bytes(&integer.scale[layer * w..(layer + 1) * w]));
                h.update(plain_bytes(&integer.coef[layer * c * row..(layer + 1) * c * row]));
                h.update(plain_bytes(&integer.unit[layer * c..(layer + 1) * c]));
            }
            None => h.update(plain_bytes(&self.coef[layer * c * w..(layer + 1) * c * w])),
        }
        h.update(plain_bytes(&self.offset[layer * c..(layer + 1) * c]));
        h.finish()
    }

    /// `mu'` of channel `i` of `layer` (invariant J1): `mu` is the channel's run of `T`
    /// predictions, `own` the residuals of channels `..i` of the layer (channel-major).
    pub fn conditional(&self, layer: usize, i: usize, mu: &[f32], own: &[f32], out: &mut [f32]) {
        let (t, e) = (self.tokens, self.outside_channels);
        let row = &self.coef[(layer * self.channels + i) * self.width()..][..e + i];
        let offset = self.offset[layer * self.channels + i];
        let outside = &self.outside[layer * e * t..(layer + 1) * e * t];
        let args = Sum { row, offset, outside, own: &own[..i * t], tokens: t };
        #[cfg(target_arch = "x86_64")]
        {
            if wide_kernels() {
                // SAFETY: `wide_kernels()` checked at run time that this CPU has AVX2 and
                // AVX-512F, the features `sum_wide` is compiled for.
                unsafe { sum_wide(&args, mu, out) };
                return;
            }
        }
        sum_tiles::<TILE>(&args, mu, out);
    }
}

/// Channels whose sums `Joint::block` accumulates together: each source row is loaded once
/// for all of them instead of once per channel (the sums are bound by those loads).
pub const BLOCK: usize = 4;

impl Joint<'_> {
    /// The first terms of J1's sums of channels `i0 .. i0 + BLOCK` of `layer`: the offset,
    /// every outside channel's term and the terms of own channels `..i0`, in J1's order and
    /// skipping zero coefficients as `conditional` does, into `acc` (`BLOCK x T`, channel by
    /// channel). `finish` adds the rest: what `conditional` computes, bit for bit, since
    /// every token's sum is the same sequence of operations.
    pub fn block(&self, layer: usize, i0: usize, own: &[f32], acc: &mut [f32]) {
        let (t, e) = (self.tokens, self.outside_channels);
        let w = self.width();
        let rows: [&[f32]; BLOCK] =
            std::array::from_fn(|c| &self.coef[(layer * self.channels + i0 + c) * w..][..e + i0]);
        let offsets: [f32; BLOCK] = std::array::from_fn(|c| self.offset[layer * self.channels + i0 + c]);
        let outside = &self.outside[layer * e * t..(layer + 1) * e * t];
        let args = BlockSum { rows, offsets, outside, own: &own[..i0 * t], tokens: t };
        #[cfg(target_arch = "x86_64")]
        {
            if wide_kernels() {
                // SAFETY: `wide_kernels()` checked at run time that this CPU has AVX2 and
                // AVX-512F, the features `block_wide` is compiled for.
                unsafe { block_wide(&args, acc) };
                return;
            }
        }
        block_tiles::<BLOCK_TILE>(&args, acc);
    }

    /// J1's `mu'` of channel `i` of `layer` from `acc`, its sum over the terms before own
    /// channel `i0` (`block`): the terms of own channels `i0..i`, then `mu + acc`.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub fn finish(&self, layer: usize, i: usize, i0: usize, mu: &[f32], own: &[f32], acc: &[f32], out: &mut [f32]) {
        let (t, e) = (self.tokens, self.outside_channels);
        let row = &self.coef[(layer * self.channels + i) * self.width()..][e + i0..e + i];
        let out = &mut out[..t];
        out.copy_from_slice(&acc[..t]);
        for (j, &a) in row.iter().enumerate() {
            if a != 0.0 {
                for (slot, &r) in out.iter_mut().zip(&own[(i0 + j) * t..(i0 + j + 1) * t]) {
                    *slot += a * r;
                }
            }
        }
        for (o, &m) in out.iter_mut().zip(mu) {
            *o += m; // float addition commutes exactly: mu + acc
        }
    }
}

/// `BLOCK` channels' first terms (`Joint::block`) and what they read.
#[derive(Clone, Copy)]
struct BlockSum<'s> {
    rows: [&'s [f32]; BLOCK],
    offsets: [f32; BLOCK],
    outside: &'s [f32],
    own: &'s [f32],
    tokens: usize,
}

/// Tokens per tile of `block_tiles`: `BLOCK` channels' accumulators of a tile stay in
/// registers (4 x 64 float32 = sixteen AVX-512 registers).
const BLOCK_TILE: usize = 64;

#[inline(always)]
fn block_tiles<const T: usize>(s: &BlockSum, acc: &mut [f32]) {
    let t = s.tokens;
    let sources = || s.outside.chunks_exact(t).chain(s.own.chunks_exact(t));
    let mut t0 = 0;
    while t0 + T <= t {
        let mut tile = [[0f32; T]; BLOCK];
        for (c, row) in tile.iter_mut().enumerate() {
            *row = [s.offsets[c]; T];
        }
        for (j, source) in sources().enumerate() {
            let src: &[f32; T] = source[t0..t0 + T].try_into().unwrap();
            for (c, row) in tile.iter_mut().enumerate() {
                let a = s.rows[c][j];
                if a != 0.0 {
                    for k in 0..T {
                        row[k] += a * src[k];
                    }
                }
            }
        }
        for (c, row) in tile.iter().enumerate() {
            acc[c * t + t0..c * t + t0 + T].copy_from_slice(row);
        }
        t0 += T;
    }
    if t0 < t {
        block_tail(s, acc, t0);
    }
}

/// `block_tiles` for tokens `t0..`, one channel at a time.
fn block_tail(s: &BlockSum, acc: &mut [f32], t0: usize) {
    let t = s.tokens;
    let sources = || s.outside.chunks_exact(t).chain(s.own.chunks_exact(t));
    for c in 0..BLOCK {
        let tail = &mut acc[c * t + t0..(c + 1) * t];
        tail.fill(s.offsets[c]);
        for (source, &a) in sources().zip(s.rows[c]) {
            if a != 0.0 {
                for (slot, &r) in tail.iter_mut().zip(&source[t0..]) {
                    *slot += a * r;
                }
            }
        }
    }
}

/// `block_tiles` with AVX-512F: a tile's `BLOCK x 64` sums in sixteen registers, each source
/// vector loaded once for the block; per token the same multiplies and adds in the same order
/// (`_mm512_mul_ps` then `_mm512_add_ps`, never fused).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx512f")]
unsafe fn block_wide(s: &BlockSum, acc: &mut [f32]) {
    use std::arch::x86_64::*;
    const V: usize = 16;
    const TILE: usize = 4 * V;
    let t = s.tokens;
    let mut t0 = 0;
    while t0 + TILE <= t {
        let mut sum: [[__m512; 4]; BLOCK] = std::array::from_fn(|c| [_mm512_set1_ps(s.offsets[c]); 4]);
        for (j, source) in s.outside.chunks_exact(t).chain(s.own.chunks_exact(t)).enumerate() {
            let src = source[t0..t0 + TILE].as_ptr();
            // SAFETY: `src` points at TILE floats of the source row (sliced above).
            let x: [__m512; 4] = std::array::from_fn(|v| _mm512_loadu_ps(src.add(v * V)));
            for (c, row) in sum.iter_mut().enumerate() {
                let a = s.rows[c][j];
                if a != 0.0 {
                    let a = _mm512_set1_ps(a);
                    for v in 0..4 {
                        row[v] = _mm512_add_ps(row[v], _mm512_mul_ps(a, x[v]));
                    }
                }
            }
        }
        for (c, row) in sum.iter().enumerate() {
            for (v, &r) in row.iter().enumerate() {
                // SAFETY: `c * t + t0 + v * V + V <= BLOCK * t`, the length `acc` is given with.
                _mm512_storeu_ps(acc[c * t + t0 + v * V..].as_mut_ptr(), r);
            }
        }
        t0 += TILE;
    }
    if t0 < t {
        // the last, partial tile: the portable code's
        block_tail(s, acc, t0);
    }
}

/// One channel's conditional sum (invariant J1) and what it reads.
struct Sum<'s> {
    row: &'s [f32],
    offset: f32,
    outside: &'s [f32],
    own: &'s [f32],
    tokens: usize,
}

/// Tokens per tile (portable build; the AVX-512 build takes `WIDE_TILE`): the tile's
/// accumulators stay in registers across the whole sum instead of a load and a store per
/// coefficient, as independent chains that hide the adds' latency. Each token's sum keeps
/// J1's order, so the result depends neither on the tiling nor on the vector width.
const TILE: usize = 32;
const WIDE_TILE: usize = 128;

#[inline(always)]
fn sum_tiles<const T: usize>(s: &Sum, mu: &[f32], out: &mut [f32]) {
    let t = s.tokens;
    let mut t0 = 0;
    while t0 + T <= t {
        let acc = full_tile::<T>(s, t0);
        for ((o, &m), &c) in out[t0..t0 + T].iter_mut().zip(&mu[t0..t0 + T]).zip(&acc) {
            *o = m + c;
        }
        t0 += T;
    }
    if t0 < t {
        // the last, partial tile: accumulate in `out` itself
        let n = t - t0;
        let tail = &mut out[t0..];
        tail.fill(s.offset);
        let sources = s.outside.chunks_exact(t).chain(s.own.chunks_exact(t));
        for (&a, source) in s.row.iter().zip(sources) {
            if a != 0.0 {
                for (slot, &r) in tail.iter_mut().zip(&source[t0..t0 + n]) {
                    *slot += a * r;
                }
            }
        }
        for (o, &m) in tail.iter_mut().zip(&mu[t0..]) {
            *o += m; // float addition commutes exactly: mu + acc
        }
    }
}

/// The sums of tokens `t0..t0 + T`, in a local array the compiler keeps in registers.
#[inline(always)]
fn full_tile<const T: usize>(s: &Sum, t0: usize) -> [f32; T] {
    let t = s.tokens;
    let mut acc = [s.offset; T];
    let sources = s.outside.chunks_exact(t).chain(s.own.chunks_exact(t));
    for (&a, source) in s.row.iter().zip(sources) {
        if a == 0.0 {
            continue;
        }
        let src: &[f32; T] = source[t0..t0 + T].try_into().unwrap();
        for k in 0..T {
            acc[k] += a * src[k];
        }
    }
    acc
}

/// `sum_tiles` compiled for AVX2 and AVX-512F: the same operations in the same order per
/// token (multiplies and adds stay separate: Rust never contracts them), wider vectors.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx512f")]
unsafe fn sum_wide(s: &Sum, mu: &[f32], out: &mut [f32]) {
    sum_tiles::<WIDE_TILE>(s, mu, out)
}

/// Which kernel computes the joint sums here: `"avx512"` or `"portable"` (no AVX-512, or
/// `SPECKV_SIMD=0` or `avx2`, as for the other parts' kernels; the same bits, invariant J1).
pub fn kernel() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    if wide_kernels() {
        return "avx512";
    }
    "portable"
}

/// Whether the AVX-512 kernels of the joint sums and of a jointly coded chunk's per-run loops
/// (`codec::joint_runs`) run here: AVX2 and AVX-512F, unless `SPECKV_SIMD` is `0` or `avx2`.
#[cfg(target_arch = "x86_64")]
pub(crate) fn wide_kernels() -> bool {
    static WIDE: OnceLock<bool> = OnceLock::new();
    *WIDE.get_or_init(|| {
        let simd = std::env::var("SPECKV_SIMD").unwrap_or_default();
        !matches!(simd.trim(), "0" | "avx2") && is_x86_feature_detected!("avx2") && is_x86_feature_detected!("avx512f")
    })
}

/// `out[k] = value(x[k])` in float32 (NaN or an infinity for non-finite patterns, which
/// `residual` takes alike): for a run whose residuals are taken against two means
/// (`residuals_of`), one conversion pass instead of two.
#[inline(always)]
pub(crate) fn values_into<W: Word>(dtype: DType, x: &[W], out: &mut [f32]) {
    // one loop per way (a match inside the loop kept it from vectorising: ~2% of a decode)
    match Patterns::of(dtype) {
        Patterns::Own => out.iter_mut().zip(x).for_each(|(o, &w)| *o = Patterns::Own.value(w)),
        Patterns::Shift16 => out.iter_mut().zip(x).for_each(|(o, &w)| *o = Patterns::Shift16.value(w)),
        how => out.iter_mut().zip(x).for_each(|(o, &w)| *o = how.value(w)),
    }
}

/// `residuals` from `values_into`'s values: the same floats.
#[inline(always)]
pub(crate) fn residuals_of(values: &[f32], mu: &[f32], out: &mut [f32]) {
    for ((slot, &v), &m) in out.iter_mut().zip(values).zip(mu) {
        *slot = residual(v, m);
    }
}

/// `out[k] = value(x[k]) - mu[k]` in float32, 0 where that is not finite (invariant J1's `e`).
#[inline(always)]
pub fn residuals<W: Word>(dtype: DType, x: &[W], mu: &[f32], out: &mut [f32]) {
    let run = |how: Patterns, out: &mut [f32]| {
        for ((slot, &w), &m) in out.iter_mut().zip(x).zip(mu) {
            *slot = residual(how.value(w), m);
        }
    };
    // one loop per way, as `values_into`
    match Patterns::of(dtype) {
        Patterns::Own => run(Patterns::Own, out),
        Patterns::Shift16 => run(Patterns::Shift16, out),
        how => run(how, out),
    }
}

/// How a pattern becomes the float32 J1 takes its residual of.
#[derive(Clone, Copy)]
enum Patterns {
    /// Float32 patterns are their own value.
    Own,
    /// A bfloat16 pattern is the top half of its float32 (exact; a non-finite pattern becomes
    /// an infinity or a NaN, which `residual` maps to 0 as it does the table's NaN). A shift
    /// instead of a 256 KiB table: the table's loads missed the cache on every run.
    Shift16,
    /// Other narrow formats by their table (`values`).
    Table(&'static [f32]),
}

impl Patterns {
    fn of(dtype: DType) -> Patterns {
        match dtype {
            DType::BFloat16 => Patterns::Shift16,
            _ => values(dtype).map_or(Patterns::Own, Patterns::Table),
        }
    }

    #[inline(always)]
    fn value<W: Word>(self, w: W) -> f32 {
        match self {
            Patterns::Own => f32::from_bits(w.to_u32()),
            Patterns::Shift16 => f32::from_bits(w.to_u32() << 16),
            Patterns::Table(t) => t[w.to_u32() as usize],
        }
    }
}

/// J1's residual of one scalar: `v - m`, or 0 where that is not finite.
#[inline(always)]
fn residual(v: f32, m: f32) -> f32 {
    let r = v - m;
    if r.is_finite() {
        r
    } else {
        0.0
    }
}

/// Each pattern's value as float32 (exact for 8/16-bit formats; NaN for non-finite ones),
/// built once per format; `None` for float32 itself.
pub(crate) fn values(dtype: DType) -> Option<&'static [f32]> {
    static TABLES: [OnceLock<Vec<f32>>; 4] = [OnceLock::new(), OnceLock::new(), OnceLock::new(), OnceLock::new()];
    let slot = match dtype {
        DType::BFloat16 => 0,
        DType::Float16 => 1,
        DType::Float8E4M3Fn => 2,
        DType::Float8E5M2 => 3,
        DType::Float32 => return None,
    };
    Some(TABLES[slot].get_or_init(|| {
        (0..1u32 << dtype.bits())
            .map(|bits| crate::model::grid::finite_value(dtype, bits).unwrap_or(f32::NAN))
            .collect()
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// J1 written out token by token, the definition the kernels must match bit for bit.
    fn reference(j: &Joint, layer: usize, i: usize, mu: &[f32], own: &[f32]) -> Vec<f32> {
        let (t, e) = (j.tokens, j.outside_channels);
        let row = &j.coef[(layer * j.channels + i) * (e + j.channels)..][..e + i];
        (0..t)
            .map(|k| {
                let mut acc = j.offset[layer * j.channels + i];
                for (c, &a) in row.iter().enumerate() {
                    let r = if c < e { j.outside[(layer * e + c) * t + k] } else { own[(c - e) * t + k] };
                    if a != 0.0 {
                        acc += a * r;
                    }
                }
                mu[k] + acc
            })
            .collect()
    }

    #[test]
    fn the_kernels_compute_invariant_j1_bit_for_bit() {
        let mut seed = 1u64;
        let mut next = move || {
            seed = crate::test_env::lcg_step(seed);
            ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 3.0
        };
        for &(c, t, e) in &[(5usize, 200usize, 3usize), (3, 64, 0), (2, 7, 1), (4, 129, 2)] {
            let layers = 2;
            let outside: Vec<f32> = (0..layers * e * t).map(|_| next()).collect();
            let coef: Vec<f32> =
                (0..layers * c * (e + c)).map(|k| if k % 5 == 0 { 0.0 } else { next() * 1e-3 }).collect();
            let offset: Vec<f32> = (0..layers * c).map(|_| next()).collect();
            let j = Joint {
                channels: c,
                tokens: t,
                outside_channels: e,
                outside: &outside,
                coef: &coef,
                offset: &offset,
                integer: None,
            };
            let own: Vec<f32> = (0..c * t).map(|_| next() * 1e4).collect();
            let mu: Vec<f32> = (0..t).map(|_| next() * 1e-2).collect();
            for layer in 0..layers {
                for i in 0..c {
                    let mut out = vec![0f32; t];
                    j.conditional(layer, i, &mu, &own, &mut out);
                    let want = reference(&j, layer, i, &mu, &own);
                    assert!(out.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "c {c} t {t} e {e}");
                }
            }
        }
    }

    #[test]
    fn blocked_sums_compute_invariant_j1_bit_for_bit() {
        let mut seed = 7u64;
        let mut next = move || {
            seed = crate::test_env::lcg_step(seed);
            ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 3.0
        };
        for &(c, t, e) in &[(8usize, 200usize, 3usize), (4, 64, 0), (12, 7, 1), (8, 129, 2)] {
            let layers = 2;
            let outside: Vec<f32> = (0..layers * e * t).map(|_| next()).collect();
            let coef: Vec<f32> =
                (0..layers * c * (e + c)).map(|k| if k % 5 == 0 { 0.0 } else { next() * 1e-3 }).collect();
            let offset: Vec<f32> = (0..layers * c).map(|_| if next() > 1.0 { -0.0 } else { next() }).collect();
            let j = Joint {
                channels: c,
                tokens: t,
                outside_channels: e,
                outside: &outside,
                coef: &coef,
                offset: &offset,
                integer: None,
            };
            let own: Vec<f32> = (0..c * t).map(|_| next() * 1e4).collect();
            let mu: Vec<f32> = (0..t).map(|_| next() * 1e-2).collect();
            let mut acc = vec![0f32; BLOCK * t];
            for layer in 0..layers {
                for i0 in (0..c).step_by(BLOCK) {
                    j.block(layer, i0, &own, &mut acc);
                    // the portable tiles compute what the kernel this machine runs computes
                    let w = e + c;
                    let rows: [&[f32]; BLOCK] = std::array::from_fn(|k| &coef[(layer * c + i0 + k) * w..][..e + i0]);
                    let offsets: [f32; BLOCK] = std::array::from_fn(|k| offset[layer * c + i0 + k]);
                    let outside = &outside[layer * e * t..(layer + 1) * e * t];
                    let args = BlockSum { rows, offsets, outside, own: &own[..i0 * t], tokens: t };
                    let mut portable = vec![0f32; BLOCK * t];
                    block_tiles::<BLOCK_TILE>(&args, &mut portable);
                    assert!(portable.iter().zip(&acc).all(|(a, b)| a.to_bits() == b.to_bits()), "c {c} t {t} e {e}");
                    for i in i0..i0 + BLOCK {
                        let mut out = vec![0f32; t];
                        j.finish(layer, i, i0, &mu, &own, &acc[(i - i0) * t..(i - i0 + 1) * t], &mut out);
                        let want = reference(&j, layer, i, &mu, &own);
                        assert!(out.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "c {c} t {t} e {e}");
                    }
                }
            }
        }
    }

    #[test]
    fn residuals_are_exact_and_zero_where_not_finite() {
        let x: [u16; 4] = [0x3F80, 0xBFC0, 0x7F80, 0x7FC1]; // 1, -1.5, inf, NaN in bfloat16
        let mut out = [9.0; 4];
        residuals(DType::BFloat16, &x, &[0.25, 0.5, 0.0, 1.0], &mut out);
        assert_eq!(out, [0.75, -2.0, 0.0, 0.0]);
        let fp8: [u8; 3] = [0x38, 0x7F, 0xFE]; // 1.0, NaN, -448 in e4m3fn
        let mut out = [9.0; 3];
        residuals(DType::Float8E4M3Fn, &fp8, &[0.0, 0.0, -400.0], &mut out);
        assert_eq!(out, [1.0, 0.0, -48.0]);
    }

    #[test]
    fn conditional_means_follow_the_stated_order() {
        // 2 channels x 3 tokens, one outside channel
        let joint = Joint {
            channels: 2,
            tokens: 3,
            outside_channels: 1,
            outside: &[1.0, 2.0, 3.0],
            coef: &[0.5, 9.0, 9.0, 0.25, -1.0, 9.0],
            offset: &[0.125, 0.0],
            integer: None,
        };
        joint.check(6, 6).unwrap();
        let mut out = [0.0; 3];
        joint.conditional(0, 0, &[10.0, 20.0, 30.0], &[], &mut out);
        assert_eq!(out, [10.0 + 0.125 + 0.5, 20.0 + 0.125 + 1.0, 30.0 + 0.125 + 1.5]);
        joint.conditional(0, 1, &[0.0; 3], &[1.0, -1.0, 4.0], &mut out);
        assert_eq!(out, [0.25 - 1.0, 0.5 + 1.0, 0.75 - 4.0]);
        assert!(joint.check(6, 4).is_err());
        assert!(Joint { coef: &[0.0; 5], ..joint }.check(6, 6).is_err());
        assert_ne!(joint.digest(0), Joint { offset: &[0.125, -0.0], ..joint }.digest(0));
    }
}
