//! Decodes one chunk of the bins model, run by run: the AVX-512 groups where they run
//! (`avx512`), one scalar at a time elsewhere, the same output (B1-B5).

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::words::Word;

use super::*;

/// The decoder's positions while it runs: the scalar (B4's `j`), the next word, the next raw
/// bit, and whether a decoded bin held no value (B5).
#[derive(Debug, Clone, Copy)]
pub(super) struct Cursor {
    pub(super) j: usize,
    pub(super) pos: usize,
    pub(super) at: usize,
    pub(super) broken: bool,
}

/// One scalar, portably: B1, its rANS step (B4), then `finish`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) fn decode_one(
    l: Layout,
    tables: &BinTables,
    words: &[u8],
    raw: &BitReader<'_>,
    states: &mut [u32; STATES],
    cur: &mut Cursor,
    m: f32,
    c: i16,
) -> u32 {
    let Some(p) = place(l, tables.revision, m, c) else {
        cur.j += 1;
        return raw.read_at(&mut cur.at, l.width);
    };
    let symbol = step(tables, words, states, cur, p.table);
    finish(l, raw, &mut cur.at, &mut cur.broken, p, symbol)
}

/// B4's decoding step of scalar `cur.j` with `table`; returns the symbol.
#[inline(always)]
pub(super) fn step(
    tables: &BinTables,
    words: &[u8],
    states: &mut [u32; STATES],
    cur: &mut Cursor,
    table: usize,
) -> usize {
    // `states` is a power of two (`Revision`)
    let lane = cur.j & (tables.revision.states - 1);
    let s = states[lane];
    let slot = s & ((1u32 << PRECISION) - 1);
    let symbol = tables.lut[(table << PRECISION) | slot as usize] as usize;
    let e = tables.entries[table * SYMBOLS + symbol];
    let next = (e & 0xFFFF) * (s >> PRECISION) + slot - (e >> 16);
    let need = next < LOW;
    // past the last word it reads 0; `Decoder::finish` then refuses the chunk
    let word = match words.get(2 * cur.pos..2 * cur.pos + 2) {
        Some(b) => u16::from_le_bytes([b[0], b[1]]) as u32,
        None => 0,
    };
    states[lane] = if need { next << 16 | word } else { next };
    cur.pos += need as usize;
    cur.j += 1;
    symbol
}

/// A placed scalar's pattern from its symbol: the escape's raw pattern, or its bin's (B2-B3).
#[inline(always)]
pub(super) fn finish(
    l: Layout,
    raw: &BitReader<'_>,
    at: &mut usize,
    broken: &mut bool,
    p: Place,
    symbol: usize,
) -> u32 {
    if symbol == ESCAPE {
        raw.read_at(at, l.width)
    } else {
        pattern(l, raw, at, broken, p, symbol as i64 - HALF)
    }
}

/// B2-B3 backwards: the pattern of bin `base + k`, its raw bits read from `raw` at `at`;
/// `broken` is set where the bin holds no value of the format (B5).
#[inline(always)]
pub(super) fn pattern(l: Layout, raw: &BitReader<'_>, at: &mut usize, broken: &mut bool, p: Place, k: i64) -> u32 {
    let b = p.base + k;
    let negative = b < 0;
    let j = if negative { -b - 1 } else { b };
    let (field, mant) = if j == 0 {
        let d = ((raw.peek_at(*at) as u32) | 1 << DEPTH_MAX).trailing_zeros();
        if d < DEPTH_MAX {
            *at += d as usize + 1;
            let f = p.fw - 1 - d as i32;
            *broken |= f < 0;
            (f.max(0) as u32, raw.read_at(at, l.m))
        } else {
            *at += DEPTH_MAX as usize;
            let magnitude = raw.read_at(at, l.e_bits + l.m);
            let f = magnitude >> l.m;
            // the canonical form only: shallower depths have their own code
            *broken |= f as i32 > p.fw - 1 - DEPTH_MAX as i32;
            (f, magnitude & ((1 << l.m) - 1))
        }
    } else if j >= 1 << 21 {
        *broken = true;
        (0, 0)
    } else {
        let t = 63 - j.leading_zeros();
        let f = p.fw as u32 + t;
        if t <= l.m {
            (f, ((j as u32 - (1 << t)) << (l.m - t)) | raw.read_at(at, l.m - t))
        } else {
            *broken |= j & ((1 << (t - l.m)) - 1) != 0;
            (f, ((j >> (t - l.m)) as u32).wrapping_sub(1 << l.m) & ((1 << l.m) - 1))
        }
    };
    *broken |= field >= 1 << l.e_bits || !l.finite(field, mant);
    (negative as u32) << (l.m + l.e_bits) | (field & ((1 << l.e_bits) - 1)) << l.m | mant
}

pub(super) fn bad(msg: impl Into<String>) -> Error {
    Error::Corrupt(format!("bins: {}", msg.into()))
}

/// Decodes one chunk, run by run, in the encoder's order.
pub struct Decoder<'a> {
    pub(super) layout: Layout,
    pub(super) tables: &'a BinTables,
    /// The revision's `S` states first (`STATES` at most).
    pub(super) states: [u32; STATES],
    pub(super) words: &'a [u8],
    pub(super) pos: usize,
    pub(super) bits: BitReader<'a>,
    /// Scalars decoded so far (B4's `j`).
    pub(super) j: usize,
    /// A bin without a value or a pattern that is not finite was decoded (B5).
    pub(super) broken: bool,
    /// A run's places and symbols (reused from run to run).
    pub(super) places: Vec<Place>,
    pub(super) symbols: Vec<u8>,
}

impl<'a> Decoder<'a> {
    pub fn new(dtype: DType, tables: &'a BinTables, bytes: &'a [u8]) -> Result<Decoder<'a>> {
        let layout = Layout::of(dtype).ok_or_else(|| bad(format!("{} is not an 8- or 16-bit format", dtype.name())))?;
        let r = tables.revision;
        if bytes.len() < r.min_chunk_len() {
            return Err(bad("the chunk is shorter than its states"));
        }
        let mut states = [LOW; STATES];
        for (s, b) in states[..r.states].iter_mut().zip(bytes.chunks_exact(4)) {
            *s = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            if *s < LOW {
                return Err(bad("a coder state below its range"));
            }
        }
        let n = u32::from_le_bytes(bytes[4 * r.states..r.min_chunk_len()].try_into().unwrap()) as usize;
        let rest = &bytes[r.min_chunk_len()..];
        if n > rest.len() / 2 {
            return Err(bad(format!("{n} words in {} bytes", rest.len())));
        }
        let (words, raw) = rest.split_at(2 * n);
        Ok(Decoder {
            layout,
            tables,
            states,
            words,
            pos: 0,
            bits: BitReader::new(raw),
            j: 0,
            broken: false,
            places: Vec::new(),
            symbols: Vec::new(),
        })
    }

    /// The next `out.len()` scalars, against `mu` and their sigma codes (the same for every
    /// kernel: `avx512` where it runs, else `run_avx2` where AVX2 is, else `run_portable`).
    pub fn run<W: Word>(&mut self, out: &mut [W], mu: &[f32], codes: &[i16]) {
        #[cfg(target_arch = "x86_64")]
        {
            if avx512::enabled() {
                self.run_vector(out, mu, codes);
                return;
            }
            if avx2_enabled() {
                // SAFETY: `avx2_enabled()` checked at run time that this CPU has AVX2, BMI1,
                // BMI2, LZCNT and POPCNT.
                unsafe { self.run_avx2(out, mu, codes) };
                return;
            }
        }
        self.run_portable(out, mu, codes)
    }

    /// `run_portable` compiled with AVX2 and the scalar bit instructions beside it available
    /// to the compiler (B3's leading and trailing zero counts as `lzcnt`/`tzcnt`, where the
    /// baseline build needs `bsr`/`bsf` and a test for zero; variable shifts without `cl`).
    /// The same code, so the same output; measured 61-63 -> 66-67 Msym/s on `map` caches
    /// (`docs/benchmarks/restore-profile.md`).
    ///
    /// # Safety
    /// The CPU must have AVX2, BMI1, BMI2, LZCNT and POPCNT (`avx2_enabled`).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt")]
    pub(super) unsafe fn run_avx2<W: Word>(&mut self, out: &mut [W], mu: &[f32], codes: &[i16]) {
        self.run_portable(out, mu, codes)
    }

    /// `run` with the AVX-512 groups where they apply, one scalar at a time elsewhere.
    #[cfg(target_arch = "x86_64")]
    pub(super) fn run_vector<W: Word>(&mut self, out: &mut [W], mu: &[f32], codes: &[i16]) {
        let (l, tables, words) = (self.layout, self.tables, self.words);
        let mut cur = Cursor { j: self.j, pos: self.pos, at: self.bits.pos, broken: self.broken };
        let mut states = self.states;
        let n = out.len().min(mu.len()).min(codes.len());
        let mut i = 0;
        while i < n {
            if cur.j.is_multiple_of(16) && n - i >= 16 {
                // SAFETY: `avx512::enabled()` checked for AVX-512F; `cur.j` is a multiple of 16.
                let done = unsafe {
                    avx512::groups(
                        l,
                        tables,
                        words,
                        &self.bits,
                        &mut states,
                        &mut cur,
                        &mut out[i..n],
                        &mu[i..n],
                        &codes[i..n],
                    )
                };
                if done > 0 {
                    i += done;
                    continue;
                }
            }
            out[i] = W::from_u32(decode_one(l, tables, words, &self.bits, &mut states, &mut cur, mu[i], codes[i]));
            i += 1;
        }
        self.states = states;
        (self.j, self.pos, self.bits.pos) = (cur.j, cur.pos, cur.at);
        self.broken = cur.broken || cur.pos > words.len() / 2;
    }

    /// `run` in three passes that each keep the processor busy: every scalar's place (B1),
    /// then the rANS steps alone (a short loop whose 32 independent chains overlap), then the
    /// patterns and raw bits. Inlined, so that `run_avx2` compiles it for its features.
    #[inline(always)]
    pub(super) fn run_portable<W: Word>(&mut self, out: &mut [W], mu: &[f32], codes: &[i16]) {
        let l = self.layout;
        let n = out.len();
        let places = &mut self.places;
        places.clear();
        let r = self.tables.revision;
        places.extend(mu.iter().zip(codes).map(|(&m, &c)| place(l, r, m, c).unwrap_or(Place::NONE)));
        let symbols = &mut self.symbols;
        symbols.clear();
        symbols.resize(n, 0);
        let (tables, words, raw) = (self.tables, self.words, &self.bits);
        let mut cur = Cursor { j: self.j, pos: self.pos, at: raw.pos, broken: self.broken };
        let mut states = self.states;
        for (sym, p) in symbols.iter_mut().zip(places.iter()) {
            if p.table == Place::NONE.table {
                cur.j += 1;
            } else {
                *sym = step(tables, words, &mut states, &mut cur, p.table) as u8;
            }
        }
        for ((o, p), &symbol) in out.iter_mut().zip(places.iter()).zip(symbols.iter()) {
            *o = W::from_u32(if p.table == Place::NONE.table {
                raw.read_at(&mut cur.at, l.width)
            } else {
                finish(l, raw, &mut cur.at, &mut cur.broken, *p, symbol as usize)
            });
        }
        self.states = states;
        (self.j, self.pos, self.bits.pos) = (cur.j, cur.pos, cur.at);
        self.broken = cur.broken || cur.pos > words.len() / 2;
    }

    /// B5, after the chunk's last run.
    pub fn finish(&self) -> Result<()> {
        if self.broken {
            return Err(bad("a decoded bin holds no value of the format"));
        }
        if 2 * self.pos != self.words.len() || self.states.iter().any(|&s| s != LOW) || !self.bits.finished_cleanly() {
            return Err(bad("coded data does not end where its scalars do"));
        }
        Ok(())
    }
}

/// Which kernel decodes the bins model here: `"avx512"`, `"avx2"` (the portable code compiled
/// for AVX2, `Decoder::run_avx2`; also under `SPECKV_SIMD=avx2`) or `"portable"` (another
/// architecture, no AVX2, or `SPECKV_SIMD=0`). The same output.
pub fn kernel() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        if avx512::enabled() {
            return "avx512";
        }
        if avx2_enabled() {
            return "avx2";
        }
    }
    "portable"
}

/// True when `run_avx2` runs here: `avx2_present()` and `SPECKV_SIMD` is not `0`.
#[cfg(target_arch = "x86_64")]
pub(super) fn avx2_enabled() -> bool {
    static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ENABLED.get_or_init(|| std::env::var("SPECKV_SIMD").map_or(true, |v| v.trim() != "0") && avx2_present())
}

/// True when this processor has AVX2 with BMI1, BMI2, LZCNT and POPCNT (every AVX2 processor
/// since Haswell): what `run_avx2` needs.
#[cfg(target_arch = "x86_64")]
pub(super) fn avx2_present() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("bmi1")
        && is_x86_feature_detected!("bmi2")
        && is_x86_feature_detected!("lzcnt")
        && is_x86_feature_detected!("popcnt")
}
