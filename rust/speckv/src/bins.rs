//! The bins model: predicted scalars of 8- and 16-bit formats coded from static tables with
//! interleaved rANS, so that decoding a scalar is integer steps and table lookups, no CDF
//! (`FLAG_PREDICTED | FLAG_FAST_LANE`; the model is named `"bins"`). Two revisions, one per
//! format version (`Revision`): version 3 as first written, version 4 (what this build
//! writes) with B1's rounding shift, classes down to sigma = w / 16 and 16 rANS states.
//!
//! The exact model (`model::mixture`) integrates its mixture over each pattern's rounding
//! interval, scalar by scalar, and decodes by searching the CDF. The bins model instead cuts
//! the real line around the prediction into bins of width `w = 2^e` aligned to multiples of
//! `w`, codes the scalar's bin from a precomputed table, and its place inside the bin with raw
//! bits (where the values a bin holds are equally likely, which they are to within a
//! fraction of a percent when `w <= sigma / 4`).
//!
//! # Invariants (cited as B1-B5)
//!
//! * **B1 (the place).** From `mu` (float32) and the sigma code `c` (`model::ladder`) alone,
//!   in integers: `e = min(max(floor(c / 8) - 2, E(mu) - M, E_MIN), E_MAX)` where `E(mu)` is
//!   `mu`'s binary exponent (float32 field; none for zero and subnormals), `M` the format's
//!   mantissa bits and `E_MIN`/`E_MAX` its smallest and largest normal exponent: bins are a
//!   quarter to an eighth of sigma wide, never finer than the format's spacing at `mu`. Then
//!   `q = floor(mu * 2^(3 - e))` (exact, from `mu`'s bits); in version 4, where the format's
//!   spacing at `mu`, `s = 2^max(E(mu) - M, 1 - bias - M)`, is `w`, `w / 2` or `w / 4`, `q`
//!   moves by `s / 2` (4, 2 or 1 eighths of a bin) away from zero on `mu`'s side (the rounding
//!   shift, below). `base = q >> 3`, the phase `q & 7`, the class
//!   `clamp(c - 8 e, class_min, CLASS_MAX)` (sigma over `w` in eighths of an octave;
//!   `class_min` is -16 in version 3, -32 in version 4) and the table:
//!   `(class - class_min) * 8 + phase` below `CLASS_UNPHASED`, one table per class from there
//!   on (the phases' average). A non-finite `mu` places nothing: its scalar is its raw pattern
//!   in the bit stream, with no rANS step.
//!
//!   Why the shift: a table gives bin `b` the mass of `[b w, (b + 1) w)` around `mu`, but the
//!   values the bin holds are what the real line rounds to, `[b w - s / 2, (b + 1) w - s / 2)`
//!   on the positive side (mirrored on the negative). Where a bin holds one value (`w = s`, a
//!   prediction within an ulp or so) version 3's tables are half a bin off: a scalar predicted
//!   exactly cost a bit. Moving `mu` by `s / 2` makes the table's interval the values' own.
//! * **B2 (the bin).** Bin `b >= 0` holds the values in `[b w, (b + 1) w)`, bin `b < 0` their
//!   negatives, `(-(|b|) w, -(|b| - 1) w]`. The symbol is `k = b - base + HALF` when
//!   `0 <= k < 2 HALF` and the table gives it a frequency; anything else (and every NaN or
//!   infinity) is `ESCAPE`, followed by the raw pattern.
//! * **B3 (inside the bin).** For `|b| = j >= 1` of binade `t = floor(log2 j)`: `M - t` raw
//!   mantissa bits when `t <= M`, none above (such a bin holds one value or none). For
//!   `j = 0` (values below `w`, zero and subnormals included): the depth `d` of the value's
//!   exponent below `w`'s as `d` zero bits and a one, then the `M` mantissa bits; depths of
//!   `DEPTH_MAX` or more as `DEPTH_MAX` zero bits and the pattern's magnitude bits. Uniform
//!   density makes the unary depth exactly the right code.
//! * **B4 (the coder).** rANS with `S` states (32 in version 3, as in the fast lane; 16 in
//!   version 4) as in the fast lane (`fast_lane` F1, without raw bits in the slot): scalar `j`
//!   of a chunk (a step only where B1 placed it) goes to state `j mod S`; states live in
//!   `[2^16, 2^32)`, one 16-bit word at most per step, the encoder runs backwards; the decoder
//!   renormalises scalar by scalar in increasing `j`, so words are read in scalar order (the
//!   AVX-512 decoder steps sixteen scalars `j .. j + 16`, `j` a multiple of 16, and takes their
//!   words in lane order: the same words in the same order; raw bits too are read in scalar
//!   order). Each state ends a chunk as 4 bytes, about 16 bits of which carry nothing (every
//!   state starts at `2^16`, where the decoder must end): with 32 states that was 0.03 bits per
//!   scalar of a 24,576-scalar chunk (one layer of a 128-token block of the demo model), which
//!   16 states halve; the decoder is no slower (its time goes to B1 and B3, not the states'
//!   chains). Tables sum to `2^PRECISION`, the escape's frequency is `ESCAPE_FREQ` (so every
//!   step costs > 2^-12 / ln 2 bits: the header's scalars-per-byte bound holds), every slot
//!   decodes to a symbol with a frequency.
//! * **B5 (the ends).** Every state starts at `2^16` and the decoder must end with every state
//!   there, every word read and every raw bit read (the last byte's unused bits zero); a bin
//!   that holds no value or a pattern that is not finite fails the chunk as corrupt.
//!
//! The tables depend on the mixture's weights (`ModelParams`) only; the stream's table digest
//! covers them.
//!
//! # Chunk payload (little-endian)
//!
//! ```text
//! offset  size        field
//! 0       4 * S       the encoder's final states (u32 each)
//! ..      4           n: the rANS words (u32)
//! ..      2 * n       the words (u16 each), in the order the decoder reads them
//! ..      ..          the raw bits, in scalar order, least significant bit of each byte first
//! ```

use crate::dtype::DType;

#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod avx512_encoder;
mod bits;
mod decoder;
mod encoder;
mod tables;

use bits::{BitReader, BitWriter};
use decoder::{finish, Cursor};
pub use decoder::{kernel, Decoder};
pub use encoder::Encoder;
pub use tables::BinTables;

/// The most interleaved rANS states of a chunk (version 3's; the fast lane's count).
const STATES: usize = 32;
const _: () = assert!(STATES == crate::fast_lane::STATES);
/// log2 of every table's total frequency.
pub const PRECISION: u32 = 14;
/// Bins per sigma, as log2 (B1: `w` is sigma / 4 to sigma / 8 wide).
const BINS_PER_SIGMA_LOG2: i32 = 2;
/// Bins each side of the prediction's bin that have a symbol.
const HALF: i64 = 64;
const ESCAPE: usize = 2 * HALF as usize;
const SYMBOLS: usize = ESCAPE + 1;
const ESCAPE_FREQ: u32 = 4;
const PHASE_BITS: u32 = 3;
const PHASES: usize = 1 << PHASE_BITS;
/// Classes: sigma / w from 2^(class_min / 8) (version 3: 2^-2, the format's spacing is 4x
/// sigma; version 4: 2^-4) to just under 2^3.
const CLASS_MAX: i32 = 8 * BINS_PER_SIGMA_LOG2 + 7;
/// Classes from here up (sigma at least `2^BINS_PER_SIGMA_LOG2` bins, where the phase moves the
/// distribution by less than a quarter sigma) share one table over every phase: a run of one
/// channel then reads one table, which stays in the first-level cache.
const CLASS_UNPHASED: i32 = 8 * BINS_PER_SIGMA_LOG2;
/// B3's deepest unary depth.
const DEPTH_MAX: u32 = 16;
/// Bins get a frequency while they lie within this many wide-component sigmas.
const SUPPORT_WIDE_SIGMAS: f64 = 4.0;
const LOW: u32 = 1 << 16;
/// A step's placeholder in the encoder's list: B1 placed nothing there.
const NO_STEP: u32 = u32::MAX;

/// What a bins stream's format version fixes beyond the mixture's weights (B1, B4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Revision {
    /// The format version of the streams coded this way.
    pub version: u16,
    /// B1's lowest class.
    class_min: i32,
    /// B1's rounding shift.
    rounding: bool,
    /// B4's rANS states per chunk (the header's lanes byte), a power of two up to `STATES`.
    pub states: usize,
}

/// Version 3: no rounding shift, classes from sigma = w / 4, 32 states.
pub const V3: Revision = Revision { version: 3, class_min: -16, rounding: false, states: 32 };
/// Version 4: what this build writes.
pub const V4: Revision = Revision { version: 4, class_min: -32, rounding: true, states: 16 };
/// The revision `encode` writes.
pub const CURRENT: Revision = V4;

impl Revision {
    /// The revision of a format version (`None`: no bins stream has it).
    pub fn of_version(version: u16) -> Option<Revision> {
        [V3, V4].into_iter().find(|r| r.version == version)
    }

    /// The smallest payload: the states and the word count.
    pub fn min_chunk_len(self) -> usize {
        4 * self.states + 4
    }

    fn phased_tables(self) -> usize {
        (CLASS_UNPHASED - self.class_min) as usize * PHASES
    }

    /// Tables of this revision (B1).
    pub fn tables(self) -> usize {
        self.phased_tables() + (CLASS_MAX - CLASS_UNPHASED + 1) as usize
    }
}

/// A format's fields (B1, B3).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Layout {
    m: u32,
    e_bits: u32,
    bias: i32,
    /// Largest exponent field of finite values.
    field_max: u32,
    /// float8_e4m3fn: the all-ones exponent is finite but for an all-ones mantissa.
    e4m3: bool,
    width: u32,
}

impl Layout {
    pub(crate) fn of(dtype: DType) -> Option<Layout> {
        let (m, e_bits, bias, field_max, e4m3) = match dtype {
            DType::BFloat16 => (7, 8, 127, 254, false),
            DType::Float16 => (10, 5, 15, 30, false),
            DType::Float8E4M3Fn => (3, 4, 7, 15, true),
            DType::Float8E5M2 => (2, 5, 15, 30, false),
            DType::Float32 => return None,
        };
        Some(Layout { m, e_bits, bias, field_max, e4m3, width: 1 + e_bits + m })
    }

    #[inline(always)]
    fn finite(self, field: u32, mant: u32) -> bool {
        field <= self.field_max && !(self.e4m3 && field == 15 && mant == 7)
    }
}

/// B1's result for one scalar.
#[derive(Debug, Clone, Copy)]
struct Place {
    /// Exponent field of `w` (>= 1).
    fw: i32,
    base: i64,
    table: usize,
}

impl Place {
    /// Where B1 places nothing (a non-finite `mu`).
    const NONE: Place = Place { fw: 0, base: 0, table: usize::MAX };
}

/// B1.
#[inline(always)]
fn place(l: Layout, r: Revision, mu: f32, code: i16) -> Option<Place> {
    let bits = mu.to_bits();
    let f = ((bits >> 23) & 0xFF) as i32;
    if f == 0xFF {
        return None;
    }
    let code = code as i32;
    let e_sigma = (code >> 3) - BINS_PER_SIGMA_LOG2;
    let e_ulp = if f == 0 { i32::MIN / 2 } else { f - 127 - l.m as i32 };
    let e = e_sigma.max(e_ulp).max(1 - l.bias).min(l.field_max as i32 - l.bias);
    let mant = (bits & 0x7F_FFFF) | if f == 0 { 0 } else { 1 << 23 };
    let signed = if bits >> 31 != 0 { -(mant as i64) } else { mant as i64 };
    // mu = signed * 2^(max(f, 1) - 150); q = floor(mu * 2^(3 - e)): an arithmetic shift
    // floors; a left shift is exact (bounded: larger q only ever escape)
    let sh = f.max(1) - 150 + PHASE_BITS as i32 - e;
    let q = if sh >= 0 { signed << sh.min(30) } else { signed >> (-sh).min(63) };
    // the rounding shift: `w / s` is 1, 2 or 4 where `d` is 0, 1 or 2 (finer: below a phase)
    let d = e - e_ulp.max(1 - l.bias - l.m as i32);
    let q = if r.rounding && (0..=2).contains(&d) {
        let shift = 4i64 >> d;
        if bits >> 31 != 0 {
            q - shift
        } else {
            q + shift
        }
    } else {
        q
    };
    let class = (code - 8 * e).clamp(r.class_min, CLASS_MAX);
    let table = if class >= CLASS_UNPHASED {
        r.phased_tables() + (class - CLASS_UNPHASED) as usize
    } else {
        (class - r.class_min) as usize * PHASES + (q & 7) as usize
    };
    Some(Place { fw: e + l.bias, base: q >> PHASE_BITS, table })
}

/// B2-B3 for a finite pattern: `(bin, raw bits, their count)`; `None` for a bin too far out.
#[inline(always)]
fn bin_of(l: Layout, w: u32, fw: i32) -> Option<(i64, u32, u32)> {
    let m = l.m;
    let mant = w & ((1 << m) - 1);
    let f = ((w >> m) & ((1 << l.e_bits) - 1)) as i32;
    let negative = (w >> (m + l.e_bits)) & 1 == 1;
    let (j, raw, n) = if f < fw {
        let d = (fw - 1 - f) as u32;
        if d < DEPTH_MAX {
            (0i64, (1 << d) | (mant << (d + 1)), d + 1 + m)
        } else {
            (0, (w & ((1 << (m + l.e_bits)) - 1)) << DEPTH_MAX, DEPTH_MAX + l.e_bits + m)
        }
    } else {
        let t = (f - fw) as u32;
        if t > 20 {
            return None;
        }
        if t <= m {
            (((1 << t) | (mant >> (m - t))) as i64, mant & ((1 << (m - t)) - 1), m - t)
        } else {
            ((((1 << m) | mant) as i64) << (t - m), 0, 0)
        }
    };
    Some((if negative { -j - 1 } else { j }, raw, n))
}

#[cfg(test)]
mod tests {
    use super::tables::Coding;
    use super::*;
    use crate::model::ModelParams;
    use crate::words::Word;

    fn lcg(seed: u64) -> impl FnMut() -> u64 {
        let mut s = seed;
        move || {
            s = crate::test_env::lcg_step(s);
            s >> 11
        }
    }

    fn roundtrip<W: Word + PartialEq + std::fmt::Debug>(
        r: Revision,
        dtype: DType,
        x: &[W],
        mu: &[f32],
        codes: &[i16],
    ) -> usize {
        let tables = BinTables::shared(&ModelParams::default(), r);
        let mut enc = Encoder::new(dtype, tables.clone(), x.len()).unwrap();
        let cut = x.len() / 3;
        enc.run(&x[..cut], &mu[..cut], &codes[..cut]);
        enc.run(&x[cut..], &mu[cut..], &codes[cut..]);
        let bytes = enc.finish();
        let mut out = vec![W::default(); x.len()];
        let mut dec = Decoder::new(dtype, &tables, &bytes).unwrap();
        dec.run(&mut out[..cut], &mu[..cut], &codes[..cut]);
        dec.run(&mut out[cut..], &mu[cut..], &codes[cut..]);
        dec.finish().unwrap();
        assert_eq!(out, x, "{}", dtype.name());
        bytes.len()
    }

    #[test]
    fn the_quotient_is_the_division_for_every_frequency() {
        let mut next = lcg(5);
        for f in 1..1u32 << PRECISION {
            let c = Coding::new(f, 0);
            let edges = [0u32, 1, f - 1, f, f + 1, u32::MAX, u32::MAX - 1, u32::MAX / f * f, (u32::MAX / f) * f - 1];
            for x in edges.into_iter().chain((0..100).map(|_| next() as u32)) {
                assert_eq!(c.quotient(x), x / f, "x = {x}, f = {f}");
            }
        }
    }

    #[test]
    fn tables_sum_to_the_precision_and_every_slot_has_a_symbol() {
        for r in [V3, V4] {
            tables_are_whole(r);
        }
    }

    fn tables_are_whole(r: Revision) {
        let t = BinTables::shared(&ModelParams::default(), r);
        for table in 0..r.tables() {
            let row = &t.entries[table * SYMBOLS..(table + 1) * SYMBOLS];
            let sum: u32 = row.iter().map(|e| e & 0xFFFF).sum();
            assert_eq!(sum, 1 << PRECISION, "table {table}");
            assert_eq!(row[ESCAPE] & 0xFFFF, ESCAPE_FREQ);
            assert!(row.iter().filter(|&&e| e & 0xFFFF > 0).count() >= 3, "table {table}");
            let slots = &t.lut[table << PRECISION..(table + 1) << PRECISION];
            for (slot, &s) in slots.iter().enumerate() {
                let e = row[s as usize];
                assert!((e >> 16..(e >> 16) + (e & 0xFFFF)).contains(&(slot as u32)));
            }
        }
    }

    #[test]
    fn every_pattern_round_trips_against_many_predictions() {
        let mut next = lcg(9);
        for dtype in [DType::BFloat16, DType::Float16] {
            let n = 1 << 16;
            let x: Vec<u16> = (0..n).map(|i| i as u16).collect();
            let mu: Vec<f32> = (0..n)
                .map(|i| match i % 5 {
                    0 => f32::from_bits(next() as u32),
                    1 => 0.0,
                    2 => (next() % 2000) as f32 / 100.0 - 10.0,
                    3 => f32::NAN,
                    _ => -1e-30,
                })
                .collect();
            let codes: Vec<i16> = (0..n).map(|_| (next() % 2040) as i16 - 1016).collect();
            for r in [V3, V4] {
                roundtrip(r, dtype, &x, &mu, &codes);
            }
        }
        for dtype in [DType::Float8E4M3Fn, DType::Float8E5M2] {
            let n = 256 * 40;
            let x: Vec<u8> = (0..n).map(|i| i as u8).collect();
            let mu: Vec<f32> = (0..n).map(|i| ((i / 256) as f32 - 20.0) * 0.37).collect();
            let codes: Vec<i16> = (0..n).map(|i| ((i / 256) as i16 - 20) * 5).collect();
            for r in [V3, V4] {
                roundtrip(r, dtype, &x, &mu, &codes);
            }
        }
    }

    /// B1's rounding shift: scalars predicted to well within an ulp (a model's own layer
    /// recomputed by other kernels) cost next to nothing in version 4; version 3's tables put
    /// the value's bin half a bin off and paid most of a bit for each.
    #[test]
    fn exact_predictions_cost_next_to_nothing_from_version_4() {
        let mut next = lcg(12);
        let n = 1 << 16;
        let x: Vec<u16> = (0..n).map(|_| (0x3C00 + (next() % 0x0800) as u16) | ((next() % 2) << 15) as u16).collect();
        // mu within a sixteenth of an ulp of the value, sigma a sixteenth of an ulp
        let mu: Vec<f32> = x
            .iter()
            .map(|&w| {
                let v = f32::from_bits((w as u32) << 16);
                v + v.abs() * ((next() % 17) as f32 - 8.0) / (8.0 * 16.0 * 128.0)
            })
            .collect();
        let codes: Vec<i16> =
            mu.iter().map(|&m| crate::model::ladder::sigma_code(m.abs() / (16.0 * 128.0)).unwrap()).collect();
        let v3 = roundtrip(V3, DType::BFloat16, &x, &mu, &codes) as f64 * 8.0 / n as f64;
        let v4 = roundtrip(V4, DType::BFloat16, &x, &mu, &codes) as f64 * 8.0 / n as f64;
        assert!(v4 < 0.05, "version 4: {v4} bits per scalar");
        assert!(v3 > 0.5, "version 3: {v3} bits per scalar");
    }

    #[test]
    fn close_predictions_cost_few_bits() {
        // bf16 values of N(mu, 0.1) around mu = 0.3: about log2(sigma sqrt(2 pi e) / ulp)
        let mut next = lcg(3);
        let n = 1 << 16;
        let mu = vec![0.3f32; n];
        let codes = vec![crate::model::ladder::sigma_code(0.1).unwrap(); n];
        let x: Vec<u16> = (0..n)
            .map(|_| {
                let u: f64 = (1..=12).map(|_| (next() % 1_000_000) as f64 / 1e6).sum::<f64>() - 6.0;
                let v = (0.3 + 0.1 * u) as f32;
                (v.to_bits().wrapping_add(0x7FFF + ((v.to_bits() >> 16) & 1)) >> 16) as u16
            })
            .collect();
        // the sample's own entropy (an underestimate of the source's at this sample size)
        let mut counts = std::collections::HashMap::new();
        for &w in &x {
            *counts.entry(w).or_insert(0u32) += 1;
        }
        let entropy: f64 = counts.values().map(|&c| -(c as f64 / n as f64) * (c as f64 / n as f64).log2()).sum();
        for r in [V3, V4] {
            let bits = roundtrip(r, DType::BFloat16, &x, &mu, &codes) as f64 * 8.0 / n as f64;
            assert!(bits < entropy + 0.15, "{bits} bits per scalar, entropy {entropy}");
            assert!(bits > entropy - 0.01, "{bits} bits per scalar, entropy {entropy}");
        }
    }

    /// Every kernel decodes the same scalars: the AVX-512 one with VBMI's byte permutation and
    /// with a gather for the raw bits, and the portable one (against the encoder's input).
    #[test]
    fn the_vector_kernels_agree_with_the_portable_decoder() {
        let mut next = lcg(21);
        let n = 40_000;
        // values around mu at several sigmas and signs, zero bins and escapes among them
        let mu: Vec<f32> =
            (0..n).map(|i| if i % 97 == 0 { 0.0 } else { ((next() % 4000) as f32 - 2000.0) / 500.0 }).collect();
        let codes: Vec<i16> =
            (0..n).map(|i| crate::model::ladder::sigma_code(0.01 + (i % 13) as f32 * 0.2).unwrap()).collect();
        let x: Vec<u16> = mu
            .iter()
            .map(|&m| {
                let v = m + ((next() % 2001) as f32 - 1000.0) / 400.0;
                if next().is_multiple_of(500) {
                    next() as u16
                } else {
                    (v.to_bits() >> 16) as u16
                }
            })
            .collect();
        let tables = BinTables::shared(&ModelParams::default(), CURRENT);
        let mut enc = Encoder::new(DType::BFloat16, tables.clone(), n).unwrap();
        enc.run(&x, &mu, &codes);
        let bytes = enc.finish();
        let decode = |how: &str| {
            let mut out = vec![0u16; n];
            let mut dec = Decoder::new(DType::BFloat16, &tables, &bytes).unwrap();
            // runs of uneven lengths: groups start off their states' alignment too
            let mut at = 0;
            for len in [5usize, 16, 333, 4096, n] {
                let end = (at + len).min(n);
                match how {
                    "portable" => dec.run_portable(&mut out[at..end], &mu[at..end], &codes[at..end]),
                    // SAFETY: only asked for where `avx2_present()` (below).
                    #[cfg(target_arch = "x86_64")]
                    "avx2" => unsafe { dec.run_avx2(&mut out[at..end], &mu[at..end], &codes[at..end]) },
                    _ => dec.run(&mut out[at..end], &mu[at..end], &codes[at..end]),
                }
                at = end;
            }
            dec.finish().unwrap();
            out
        };
        assert_eq!(decode("portable"), x);
        assert_eq!(decode("auto"), x);
        #[cfg(target_arch = "x86_64")]
        if crate::test_env::have("avx2", decoder::avx2_present(), "no AVX2 (with BMI and LZCNT) here") {
            assert_eq!(decode("avx2"), x);
        }
        #[cfg(target_arch = "x86_64")]
        {
            avx512::NO_VBMI.with(|v| v.set(true));
            let gathered = decode("auto");
            avx512::NO_VBMI.with(|v| v.set(false));
            assert_eq!(gathered, x);
        }
    }

    /// Short chunks: their groups read the raw bits near the chunk's end from the reader's
    /// copy (`BitReader::window`), zero bins and their depths among them; every length decodes
    /// to the encoder's input with each kernel.
    #[test]
    fn short_chunks_decode_alike_with_every_kernel() {
        let mut next = lcg(44);
        let tables = BinTables::shared(&ModelParams::default(), CURRENT);
        for n in [16usize, 32, 33, 48, 64, 100, 160, 255, 400, 1000] {
            let mu: Vec<f32> = (0..n).map(|_| ((next() % 400) as f32 - 200.0) / 100.0).collect();
            let codes: Vec<i16> =
                (0..n).map(|i| crate::model::ladder::sigma_code(0.02 + (i % 5) as f32 * 0.3).unwrap()).collect();
            // a third near zero (zero bins, some deep), the rest around mu
            let x: Vec<u16> = mu
                .iter()
                .map(|&m| match next() % 3 {
                    0 => ((m * 1e-3 * (next() % 7) as f32).to_bits() >> 16) as u16,
                    _ => ((m + ((next() % 201) as f32 - 100.0) / 300.0).to_bits() >> 16) as u16,
                })
                .collect();
            let mut enc = Encoder::new(DType::BFloat16, tables.clone(), n).unwrap();
            enc.run(&x, &mu, &codes);
            let bytes = enc.finish();
            for portable in [false, true] {
                let mut out = vec![0u16; n];
                let mut dec = Decoder::new(DType::BFloat16, &tables, &bytes).unwrap();
                if portable {
                    dec.run_portable(&mut out, &mu, &codes);
                } else {
                    dec.run(&mut out, &mu, &codes);
                }
                dec.finish().unwrap();
                assert_eq!(out, x, "{n} scalars, portable: {portable}");
            }
        }
    }

    /// The AVX-512 encoder writes the portable encoder's bytes: every format and revision,
    /// runs of uneven lengths (groups off the states' alignment), predictions that are not
    /// finite or far out (their groups go scalar by scalar), every kind of bin (zero bins,
    /// deep ones, above the binade, escapes, patterns that are not finite).
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn the_vector_encoder_writes_the_portable_bytes() {
        if !avx512::enabled() {
            eprintln!("skipped: no AVX-512F here");
            return;
        }
        let mut next = lcg(31);
        for (dtype, width) in
            [(DType::BFloat16, 16), (DType::Float16, 16), (DType::Float8E4M3Fn, 8), (DType::Float8E5M2, 8)]
        {
            let n = 20_000;
            let mu: Vec<f32> = (0..n)
                .map(|i| match i % 211 {
                    0 => f32::NAN,
                    1 => 1e30,
                    2 => -0.0,
                    3 => 1e-41,
                    _ => ((next() % 4000) as f32 - 2000.0) / 500.0,
                })
                .collect();
            let codes: Vec<i16> = (0..n)
                .map(|i| match i % 7 {
                    0 => (next() % 2040) as i16 - 1016,
                    _ => crate::model::ladder::sigma_code(0.001 + (i % 13) as f32 * 0.2).unwrap(),
                })
                .collect();
            let pattern = |v: f32| match dtype {
                DType::BFloat16 => v.to_bits() >> 16,
                DType::Float16 => half_bits(v),
                _ => (v.to_bits() >> 24) ^ (v.to_bits() >> 20 & 7),
            };
            let x: Vec<u32> = mu
                .iter()
                .map(|&m| match next() % 50 {
                    0 => next() as u32 & ((1 << width) - 1),
                    1 => 0,
                    2 => pattern(m * 1e-6),
                    _ => pattern(m + ((next() % 2001) as f32 - 1000.0) / 400.0) & ((1 << width) - 1),
                })
                .collect();
            for r in [V3, V4] {
                let tables = BinTables::shared(&ModelParams::default(), r);
                let code = |vector: bool| {
                    let mut enc = Encoder::new(dtype, tables.clone(), n).unwrap();
                    let mut at = 0;
                    for len in [5usize, 16, 333, 17, 4096, n] {
                        let end = (at + len).min(n);
                        if width == 16 {
                            let words: Vec<u16> = x[at..end].iter().map(|&w| w as u16).collect();
                            enc.run_with(&words, &mu[at..end], &codes[at..end], vector);
                        } else {
                            let words: Vec<u8> = x[at..end].iter().map(|&w| w as u8).collect();
                            enc.run_with(&words, &mu[at..end], &codes[at..end], vector);
                        }
                        at = end;
                    }
                    enc
                };
                let (portable, vector) = (code(false), code(true));
                assert_eq!(portable.steps, vector.steps, "{} v{}", dtype.name(), r.version);
                let mixed = code(true).finish_with(false);
                let want = portable.finish_with(false);
                assert_eq!(mixed, want, "{} v{}: the vector run's bits", dtype.name(), r.version);
                assert_eq!(vector.finish_with(true), want, "{} v{}: the vector steps", dtype.name(), r.version);
                if crate::test_env::have("avx2", decoder::avx2_present(), "no AVX2 (with BMI and LZCNT) here") {
                    // the portable code compiled for AVX2 (`Encoder::run_avx2`, `finish_avx2`)
                    let mut enc = Encoder::new(dtype, tables.clone(), n).unwrap();
                    let mut at = 0;
                    for len in [5usize, 16, 333, 17, 4096, n] {
                        let end = (at + len).min(n);
                        // SAFETY: AVX2 with BMI and LZCNT checked just above.
                        unsafe {
                            if width == 16 {
                                let words: Vec<u16> = x[at..end].iter().map(|&w| w as u16).collect();
                                enc.run_avx2(&words, &mu[at..end], &codes[at..end]);
                            } else {
                                let words: Vec<u8> = x[at..end].iter().map(|&w| w as u8).collect();
                                enc.run_avx2(&words, &mu[at..end], &codes[at..end]);
                            }
                        }
                        at = end;
                    }
                    // SAFETY: as above.
                    assert_eq!(unsafe { enc.finish_avx2() }, want, "{} v{}: AVX2", dtype.name(), r.version);
                }
            }
        }
    }

    /// float16's pattern of `v` (truncated; enough for test data).
    #[cfg(target_arch = "x86_64")]
    fn half_bits(v: f32) -> u32 {
        let b = v.to_bits();
        let sign = (b >> 16) & 0x8000;
        let e = ((b >> 23) & 0xFF) as i32 - 127 + 15;
        if e >= 31 {
            return sign | 0x7C00;
        }
        if e <= 0 {
            return sign;
        }
        sign | (e as u32) << 10 | ((b >> 13) & 0x3FF)
    }

    /// `BitReader` reads the chunk in place and its last bytes from a copy: every position,
    /// straddling the two and past the end, reads what the bytes hold (zeros after them).
    #[test]
    fn the_bit_reader_reads_every_position() {
        let mut next = lcg(8);
        for len in [0usize, 1, 7, 8, 9, 63, 64, 65, 200] {
            let bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            let r = BitReader::new(&bytes);
            for at in 0..(len + 10) * 8 {
                let want = (0..32).fold(0u64, |acc, k| {
                    let bit = at + k;
                    let b = bytes.get(bit / 8).map_or(0, |&byte| (byte >> (bit % 8)) & 1);
                    acc | (b as u64) << k
                });
                assert_eq!(r.peek_at(at) & 0xFFFF_FFFF, want, "len {len}, at {at}");
            }
        }
    }

    #[test]
    fn damaged_chunks_are_refused_or_decode_without_panicking() {
        for r in [V3, V4] {
            damaged_chunks_of(r);
        }
    }

    fn damaged_chunks_of(r: Revision) {
        let tables = BinTables::shared(&ModelParams::default(), r);
        let mut next = lcg(4);
        let n = 3000;
        let x: Vec<u16> = (0..n).map(|_| next() as u16).collect();
        let mu: Vec<f32> = (0..n).map(|_| (next() % 100) as f32 / 10.0).collect();
        let codes = vec![0i16; n];
        let mut enc = Encoder::new(DType::BFloat16, tables.clone(), n).unwrap();
        enc.run(&x, &mu, &codes);
        let bytes = enc.finish();
        let mut out = vec![0u16; n];
        for cut in [0, 10, r.min_chunk_len(), bytes.len() / 2, bytes.len() - 1] {
            let r = Decoder::new(DType::BFloat16, &tables, &bytes[..cut]).and_then(|mut d| {
                d.run(&mut out, &mu, &codes);
                d.finish()
            });
            assert!(r.is_err(), "cut at {cut}");
        }
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 1 << (i % 8);
            if let Ok(mut d) = Decoder::new(DType::BFloat16, &tables, &b) {
                d.run(&mut out, &mu, &codes);
                let _ = d.finish();
            }
        }
    }
}
