//! The fast lane: predictor-free coding of 8- and 16-bit formats with static tables, so that
//! decoding is table lookups and a multiply per scalar (format version 3, `FLAG_FAST_LANE`).
//!
//! The adaptive predictor-free model (`model::raw`) updates its counts after every scalar and
//! decodes through a range coder's division; this lane instead fixes, per chunk, a few tables
//! built from the chunk's own data, and codes with interleaved rANS (Duda's asymmetric numeral
//! systems) whose decoder has no division and no data-dependent branch.
//!
//! A scalar's pattern `w` of `W` bits splits into a symbol `h = w >> R` (the top `S` bits: sign
//! and exponent, for 16-bit formats also the top mantissa bits of float16) and `R` low bits
//! that are nearly uniform and go through the coder raw (`Split`). Channels differ: a KV cache
//! holds a few channels with large values and many with small ones, so each channel (scalar
//! `i` of the stream is channel `i mod period`, the period being the tensor's last dimension
//! unless told otherwise) codes its symbols with one of up to `MAX_TABLES` tables, the
//! encoder grouping channels whose symbol distributions are alike (`cluster`).
//!
//! # Invariants (cited as F1-F4)
//!
//! * **F1 (the step).** A state `x` lies in `[2^16, 2^32)` between symbols. With `B = P + R`
//!   (table precision plus raw bits, `B <= 16`), decoding takes `s = x mod 2^B`, looks up the
//!   table entry of slot `s >> R` (the symbol `h`, its frequency `f`, and `j`, the slot's rank
//!   among `h`'s slots), outputs `h << R | (s mod 2^R)`, and sets `x = f * (x >> B) + j`; if
//!   then `x < 2^16` it reads one 16-bit word: `x = x << 16 | word`. Encoding is the exact
//!   inverse, run backwards: if `x >= f << (32 - B)` it writes `x mod 2^16` and shifts `x`
//!   right by 16, then `x = (x / f) << B | (c + x mod f) << R | low`, `c` being `h`'s first
//!   slot. So one word at most per scalar, on either side.
//! * **F2 (the order).** Scalar `j` of a chunk goes to state `j mod STATES`; the decoder
//!   takes scalars in increasing `j`, each decoded and then renormalised, so words are read in
//!   scalar order. A vector kernel decodes sixteen consecutive scalars and then renormalises
//!   them in lane order: the same words in the same order, hence the same output, whatever
//!   the kernel or thread count.
//! * **F3 (the tables).** A table's frequencies are each at least 1, sum to `2^P`, and cover at
//!   least two symbols, so every slot decodes to some symbol (damaged bytes decode to wrong
//!   values, never out of bounds) and every scalar costs at least `-log2(1 - 2^-P)` bits,
//!   which keeps the header's bound on scalars per byte. `P >= S`, so a table can hold every
//!   symbol: any bit pattern is codable.
//! * **F4 (the ends).** Every state starts encoding at `2^16`; the decoder, started from the
//!   encoder's final states, must end with every state at `2^16` and every word read, else the
//!   chunk is corrupt.
//!
//! # Chunk payload (little-endian)
//!
//! ```text
//! offset  size            field
//! 0       1               G: tables (1..=MAX_TABLES)
//! 1       1               reserved, 0
//! 2       ..              G tables, each: n (u16, 2..=2^S), then n pairs (LEB128 each):
//!                         symbol (the first absolute, then the gap to the previous minus
//!                         one), frequency minus one
//! ..      ceil(K / 2)     table id of each of the K = min(period, scalars) channels the chunk
//!                         holds (channel k: scalars j with j mod K = k), 4 bits each, low
//!                         nibble first; an odd K leaves the last high nibble 0
//! ..      4 * STATES      the encoder's final states (u32 each)
//! ..      2 * words       the words (u16 each), in the order the decoder reads them
//! ```

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::words::Word;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;

/// Interleaved rANS states per chunk (two 16-lane vectors).
pub const STATES: usize = 32;
/// Most tables a chunk may hold (table ids are 4 bits).
pub const MAX_TABLES: usize = 16;
/// Tables the encoder aims for: more cost more table bytes than they save on a chunk of
/// `CHUNK_SCALARS` of a KV cache (measured on the demo model: 8 tables save ~0.3 b/s over one).
const TARGET_TABLES: usize = 8;
/// Scalars per chunk the fast lane is meant for: a 64K chunk keeps the tables' bytes near
/// 0.05 bit per scalar and is one head of a 1,024-token layer with 64 channels.
pub const CHUNK_SCALARS: u32 = 1 << 16;
/// The lower end of a state's range (F1), and every state's start and end (F4).
const LOW: u32 = 1 << 16;
/// The smallest payload a chunk can have: G, reserved, one table of two one-byte pairs, one
/// id byte, the states.
pub const MIN_CHUNK_LEN: usize = 2 + (2 + 4) + 1 + 4 * STATES;
/// Per-channel histograms are kept while `channels << S` stays within this; beyond it the
/// chunk uses one table.
const MAX_HISTOGRAM: usize = 1 << 20;

// A table entry (decoder side) packs `f - 1`, the slot's rank `j` and the symbol `h`.
const ENTRY_BITS: u32 = 11;
const ENTRY_MASK: u32 = (1 << ENTRY_BITS) - 1;
const SYMBOL_SHIFT: u32 = 2 * ENTRY_BITS;

/// How a dtype's patterns split into a coded symbol and raw low bits (module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Split {
    /// `S`: the symbol's bits (the pattern's top bits).
    pub symbol_bits: u32,
    /// `R`: the low bits, coded raw.
    pub raw_bits: u32,
    /// `P`: the tables' precision (frequencies sum to `2^P`).
    pub precision: u32,
}

impl Split {
    /// The split for `dtype`, or `None` where the lane does not apply (float32).
    pub fn of(dtype: DType) -> Option<Split> {
        Split::for_width(dtype.bits())
    }

    /// The split for patterns of `bits` bits: a function of the width alone, so the coding
    /// loops, monomorphised per word type, see constants.
    pub const fn for_width(bits: u32) -> Option<Split> {
        match bits {
            // sign and 8 exponent bits (bfloat16), or sign, 5 exponent and 3 mantissa bits
            // (float16). Measured on the demo model's caches: a 10-bit symbol (one more
            // mantissa bit) saves ~0.07 bit but doubles the tables' bytes, a wash at 8 tables
            // per 64K chunk; 9-bit precision costs ~0.014 bit more than 12-bit, the price of
            // folding the 7 raw bits into one 16-bit slot (F1)
            16 => Some(Split { symbol_bits: 9, raw_bits: 7, precision: 9 }),
            8 => Some(Split { symbol_bits: 8, raw_bits: 0, precision: 10 }),
            _ => None,
        }
    }

    fn slot_bits(self) -> u32 {
        self.precision + self.raw_bits
    }
}

/// One table: its symbols in increasing order and their frequencies (F3).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Table {
    symbols: Vec<u16>,
    freqs: Vec<u16>,
}

/// `log2(x)` in 16.16 fixed point, to within 0.0015 (the encoder's estimates of bits): the
/// integer part from the leading zeros, the fraction from a table of `log2_exact` at the
/// mantissa's top 10 bits. Integers only, so the encoder's choices (and bytes) are the same on
/// every machine. `x >= 1`.
fn log2_q16(x: u64) -> u64 {
    static FRACTIONS: std::sync::OnceLock<Vec<u64>> = std::sync::OnceLock::new();
    let table = FRACTIONS.get_or_init(|| (0..1024u64).map(|i| log2_exact(1024 + i) - (10 << 16)).collect());
    let e = 63 - x.leading_zeros() as u64;
    let top = if e >= 10 { x >> (e - 10) } else { x << (10 - e) };
    (e << 16) + table[(top - 1024) as usize]
}

/// `log2(x)` in 16.16 fixed point by repeated squaring (rounded down). `x >= 1`.
fn log2_exact(x: u64) -> u64 {
    let e = 63 - x.leading_zeros() as u64;
    // the mantissa in [1, 2) as a 1.32 fixed-point number
    let mut m = ((x as u128) << 32 >> e) as u64;
    let mut frac = 0u64;
    for bit in (0..16).rev() {
        let sq = (m as u128 * m as u128) >> 32;
        if sq >= 2u128 << 32 {
            m = (sq >> 1) as u64;
            frac |= 1 << bit;
        } else {
            m = sq as u64;
        }
    }
    e << 16 | frac
}

/// Frequencies summing to `2^precision` for symbols with `counts` (all > 0, in symbol order),
/// each at least 1 (F3): proportional shares rounded down, the shortfall given to the most
/// frequent symbol, an excess taken one at a time from the largest frequencies.
fn quantize(counts: &[u32], precision: u32) -> Vec<u16> {
    let total: u64 = counts.iter().map(|&c| c as u64).sum();
    let m = 1u64 << precision;
    let mut f: Vec<u64> = counts.iter().map(|&c| (c as u64 * m / total).max(1)).collect();
    let sum: u64 = f.iter().sum();
    if sum < m {
        let top = (0..counts.len()).max_by_key(|&i| (counts[i], std::cmp::Reverse(i))).unwrap_or(0);
        f[top] += m - sum;
    } else if sum > m {
        let mut order: Vec<usize> = (0..f.len()).collect();
        order.sort_by_key(|&i| (std::cmp::Reverse(f[i]), i));
        let mut excess = sum - m;
        // `counts.len() <= 2^S <= 2^P`, so the frequencies above 1 can absorb any excess
        while excess > 0 {
            for &i in &order {
                if excess == 0 {
                    break;
                }
                if f[i] > 1 {
                    f[i] -= 1;
                    excess -= 1;
                }
            }
        }
    }
    f.into_iter().map(|v| v as u16).collect()
}

impl Table {
    /// The table for symbol `counts` (indexed by symbol, any length up to `2^S`).
    fn from_counts(counts: &[u32], split: Split) -> Table {
        let mut symbols: Vec<u16> = (0..counts.len()).filter(|&s| counts[s] > 0).map(|s| s as u16).collect();
        let mut used: Vec<u32> = symbols.iter().map(|&s| counts[s as usize]).collect();
        if symbols.is_empty() {
            symbols.push(0);
            used.push(1);
        }
        if symbols.len() == 1 {
            // F3: a second symbol with the least count, so that no symbol holds every slot
            let s = symbols[0];
            let other = s ^ 1;
            (symbols, used) =
                if other < s { (vec![other, s], vec![1, used[0]]) } else { (vec![s, other], vec![used[0], 1]) };
        }
        let freqs = quantize(&used, split.precision);
        Table { symbols, freqs }
    }

    /// Bits per symbol (16.16 fixed point), symbol by symbol.
    fn bits(&self, split: Split) -> Vec<u64> {
        let top = (split.precision as u64) << 16;
        self.freqs.iter().map(|&f| top - log2_q16(f as u64)).collect()
    }

    /// Bits this table spends on symbol `counts` (16.16 fixed point), given its `bits`.
    fn cost(&self, bits: &[u64], counts: &[u32]) -> u64 {
        self.symbols.iter().zip(bits).map(|(&s, &b)| counts.get(s as usize).copied().unwrap_or(0) as u64 * b).sum()
    }

    fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&(self.symbols.len() as u16).to_le_bytes());
        let mut prev: Option<u16> = None;
        for (&s, &f) in self.symbols.iter().zip(&self.freqs) {
            write_varint(out, prev.map_or(s, |p| s - p - 1) as u32);
            write_varint(out, f as u32 - 1);
            prev = Some(s);
        }
    }

    /// Reads and validates a table (F3).
    fn read(r: &mut &[u8], split: Split) -> Result<Table> {
        let head = take(r, 2)?;
        let n = u16::from_le_bytes([head[0], head[1]]) as usize;
        if n < 2 || n > 1 << split.symbol_bits {
            return Err(bad(format!("a table of {n} symbols")));
        }
        let (mut symbols, mut freqs) = (Vec::with_capacity(n), Vec::with_capacity(n));
        let mut next = 0u32;
        let mut total = 0u32;
        for _ in 0..n {
            let s = next + read_varint(r)?;
            let f = read_varint(r)? + 1;
            if s >= 1 << split.symbol_bits || f >= 1 << split.precision {
                return Err(bad("a table's symbol or frequency is out of range"));
            }
            total += f;
            symbols.push(s as u16);
            freqs.push(f as u16);
            next = s + 1;
        }
        if total != 1 << split.precision {
            return Err(bad(format!("a table's frequencies sum to {total}, not {}", 1u32 << split.precision)));
        }
        Ok(Table { symbols, freqs })
    }

    /// The decoder's entries, one per slot (F1).
    fn entries(&self, lut: &mut Vec<u32>) {
        for (&h, &f) in self.symbols.iter().zip(&self.freqs) {
            for j in 0..f as u32 {
                lut.push((f as u32 - 1) | j << ENTRY_BITS | (h as u32) << SYMBOL_SHIFT);
            }
        }
    }
}

fn bad(msg: impl Into<String>) -> Error {
    Error::Corrupt(format!("fast lane: {}", msg.into()))
}

fn take<'a>(r: &mut &'a [u8], n: usize) -> Result<&'a [u8]> {
    if r.len() < n {
        return Err(bad("truncated chunk"));
    }
    let (head, rest) = r.split_at(n);
    *r = rest;
    Ok(head)
}

fn write_varint(out: &mut Vec<u8>, mut v: u32) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// LEB128, at most three bytes (every field it reads is below 2^21).
fn read_varint(r: &mut &[u8]) -> Result<u32> {
    let mut v = 0u32;
    for i in 0..3 {
        let b = take(r, 1)?[0];
        v |= ((b & 0x7F) as u32) << (7 * i);
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(bad("a table field is too long"))
}

/// Channels a chunk of `scalars` holds under `period` (K in the module doc).
pub fn channels(period: usize, scalars: usize) -> usize {
    period.clamp(1, scalars.max(1))
}

/// Rounds of moving channels between tables, at most (they stop when nothing moves):
/// measured on the demo model's caches, 3 rounds leave 0.009 bit per scalar that 6 find.
const ROUNDS: usize = 6;

/// Groups `k` channels into at most `groups` tables. `rows` holds each channel's counts of
/// the chunk's `used` symbols (`rows[c * used.len() + u]`, in `used` order). Channels sorted
/// by their mean magnitude code and cut into equal runs, then each moved to the table that
/// codes it in the fewest bits until nothing moves (`ROUNDS` at most). Integers only.
fn cluster(rows: &[u32], k: usize, split: Split, used: &[u16], groups: usize) -> Vec<u8> {
    let u = used.len();
    let magnitude = (1u32 << (split.symbol_bits - 1)) - 1;
    let row = |c: usize| &rows[c * u..(c + 1) * u];
    let mut key: Vec<(u64, usize)> = (0..k)
        .map(|c| {
            let (sum, n) = used
                .iter()
                .zip(row(c))
                .fold((0u64, 0u64), |(s, n), (&h, &v)| (s + (h as u32 & magnitude) as u64 * v as u64, n + v as u64));
            ((sum << 16) / n.max(1), c)
        })
        .collect();
    key.sort_unstable();
    let mut assign = vec![0u8; k];
    for (rank, &(_, c)) in key.iter().enumerate() {
        assign[c] = (rank * groups / k) as u8;
    }
    // on many channels the rounds are what encoding costs: at most about 4 operations per
    // scalar of the chunk on them (every round on the demo model's 64 channels)
    let scalars: u64 = rows.iter().map(|&v| v as u64).sum();
    let per_round = (k * u * groups) as u64;
    let rounds = (4 * scalars / per_round.max(1)).clamp(1, ROUNDS as u64);
    for _ in 0..rounds {
        // each group's pooled counts, and its cost per symbol (16.16 bits); a symbol the group
        // lacks costs the table's precision
        let pooled = pool(rows, u, &assign, groups);
        // (u32: at most 24 bits in 16.16, so the products below are u32 x u32, which vectorise)
        let costs: Vec<u32> = pooled
            .chunks(u)
            .flat_map(|p| {
                let top = log2_q16(p.iter().map(|&v| v as u64).sum::<u64>().max(1));
                p.iter().map(move |&v| {
                    (if v == 0 { (split.precision as u64) << 16 } else { top - log2_q16(v as u64) }) as u32
                })
            })
            .collect();
        let mut moved = false;
        for (c, slot) in assign.iter_mut().enumerate() {
            let r = row(c);
            let best = (0..groups)
                .min_by_key(|&g| {
                    let bits: u64 = r.iter().zip(&costs[g * u..(g + 1) * u]).map(|(&v, &b)| v as u64 * b as u64).sum();
                    (bits, g)
                })
                .unwrap_or(0) as u8;
            if best != *slot {
                *slot = best;
                moved = true;
            }
        }
        if !moved {
            break;
        }
    }
    assign
}

/// The counts of each of `groups` groups: the sum of its channels' `rows` (`u` wide).
fn pool(rows: &[u32], u: usize, assign: &[u8], groups: usize) -> Vec<u32> {
    let mut pooled = vec![0u32; groups * u];
    for (r, &g) in rows.chunks(u).zip(assign) {
        for (p, &v) in pooled[g as usize * u..(g as usize + 1) * u].iter_mut().zip(r) {
            *p += v;
        }
    }
    pooled
}

/// The encoder's constants for one (table, symbol) of frequency `f` and first slot `c` (F1).
///
/// `x / f` without a division: with `magic = ceil(2^44 / f)`, every `x < 2^32` has
/// `x / f = x * magic >> 44` (the product overshoots `x / f` by less than `2^32 / 2^44`, and
/// `x / f` falls short of the next integer by at least `1 / f > 2^-12`, as `f < 2^11`). Then
/// the step `(x / f) << B | (c + x mod f) << R | low` equals
/// `((x + c) << R | low) + (x / f) * cmpl` with `cmpl = (2^P - f) << R`.
#[derive(Debug, Clone, Copy, Default)]
struct Coding {
    /// States at or above this are renormalised first: `f << (32 - B)`.
    limit: u32,
    start: u32,
    cmpl: u32,
    magic: u64,
}

/// The fixed shift of `Coding::quotient`.
const QUOTIENT_SHIFT: u32 = 44;

impl Coding {
    fn new(f: u32, c: u32, split: Split) -> Coding {
        let magic = (1u64 << QUOTIENT_SHIFT).div_ceil(f as u64);
        let cmpl = ((1u32 << split.precision) - f) << split.raw_bits;
        Coding { limit: f << (32 - split.slot_bits()), start: c, cmpl, magic }
    }

    #[inline(always)]
    fn quotient(self, x: u32) -> u32 {
        ((x as u128 * self.magic as u128) >> QUOTIENT_SHIFT) as u32
    }
}

/// The encoder's view of a chunk's tables: `Coding` per (table, symbol), and the same as
/// `f | c << 16` for the vector encoder.
pub(crate) struct EncodeTables {
    width: usize,
    coding: Vec<Coding>,
    pub(crate) packed: Vec<u32>,
}

impl EncodeTables {
    fn new(tables: &[Table], split: Split) -> EncodeTables {
        let width = 1usize << split.symbol_bits;
        let mut coding = vec![Coding::default(); tables.len() * width];
        // symbols a table lacks never occur in its channels; 1 keeps the vector code's
        // division defined in lanes it discards
        let mut packed = vec![1u32; tables.len() * width];
        for (t, table) in tables.iter().enumerate() {
            let mut c = 0u32;
            for (&s, &f) in table.symbols.iter().zip(&table.freqs) {
                coding[t * width + s as usize] = Coding::new(f as u32, c, split);
                packed[t * width + s as usize] = f as u32 | c << 16;
                c += f as u32;
            }
        }
        EncodeTables { width, coding, packed }
    }
}

/// Tables and channel ids for the chunk `x` of `k` channels (module doc): per-channel
/// histograms grouped by `cluster`, kept only where they beat a single table, bytes counted.
fn choose_tables<W: Word>(x: &[W], k: usize, split: Split, scratch: &mut Scratch) -> (Vec<Table>, Vec<u8>) {
    let Scratch { hist, rows, .. } = scratch;
    let width = 1usize << split.symbol_bits;
    let shift = split.raw_bits;
    // per-channel counts where they fit (else one histogram: one table), symbol-major: the
    // few symbols a chunk uses keep their counters together in the cache, and consecutive
    // scalars (different channels) do not wait on each other's counters
    let chans = if k * width > MAX_HISTOGRAM { 1 } else { k };
    hist.clear();
    hist.resize(width * chans, 0);
    for run in x.chunks(chans) {
        for (c, w) in run.iter().enumerate() {
            hist[(w.to_u32() >> shift) as usize * chans + c] += 1;
        }
    }
    let all: Vec<u32> = hist.chunks(chans).map(|counts| counts.iter().sum()).collect();
    let single = vec![Table::from_counts(&all, split)];
    if chans == 1 {
        return (single, vec![0; k]);
    }
    let used: Vec<u16> = (0..width).filter(|&h| all[h] > 0).map(|h| h as u16).collect();
    let u = used.len();
    rows.clear();
    rows.resize(k * u, 0);
    for (i, &h) in used.iter().enumerate() {
        for (c, &v) in hist[h as usize * k..(h as usize + 1) * k].iter().enumerate() {
            rows[c * u + i] = v;
        }
    }
    let assign = cluster(rows, k, split, &used, TARGET_TABLES.min(k));
    // renumber the groups that kept channels, in order of first use
    let mut number = [u8::MAX; MAX_TABLES];
    let mut ids = Vec::with_capacity(k);
    let mut groups = 0u8;
    for &g in &assign {
        if number[g as usize] == u8::MAX {
            number[g as usize] = groups;
            groups += 1;
        }
        ids.push(number[g as usize]);
    }
    let pooled = pool(rows, u, &ids, groups as usize);
    let mut counts = vec![0u32; width];
    let tables: Vec<Table> = pooled
        .chunks(u)
        .map(|p| {
            for (&h, &v) in used.iter().zip(p) {
                counts[h as usize] = v;
            }
            Table::from_counts(&counts, split)
        })
        .collect();
    let table_bytes = |ts: &[Table]| {
        let mut out = Vec::new();
        ts.iter().for_each(|t| t.write(&mut out));
        out.len() as u64
    };
    // a group's cost is its table's bits on its pooled counts
    let grouped: u64 = tables
        .iter()
        .zip(pooled.chunks(u))
        .map(|(t, p)| {
            for (&h, &v) in used.iter().zip(p) {
                counts[h as usize] = v;
            }
            t.cost(&t.bits(split), &counts)
        })
        .sum::<u64>()
        + ((table_bytes(&tables) + k.div_ceil(2) as u64) << 19);
    let one = single[0].cost(&single[0].bits(split), &all) + ((table_bytes(&single) + k.div_ceil(2) as u64) << 19);
    if grouped < one {
        (tables, ids)
    } else {
        (single, vec![0; k])
    }
}

/// A thread's buffers for the histograms and words of the chunks it codes, reused from chunk
/// to chunk: fresh ones would cost a map, page faults and an unmap per chunk.
#[derive(Default)]
struct Scratch {
    hist: Vec<u32>,
    rows: Vec<u32>,
    words: Vec<u16>,
}

/// The split of `W`'s patterns, or the error for a width the lane does not code.
fn split_of<W: Word>() -> Result<Split> {
    Split::for_width(W::BITS)
        .ok_or_else(|| Error::InvalidArgument(format!("fast lane: {}-bit patterns (8 or 16 expected)", W::BITS)))
}

/// Codes one chunk `x` (8- or 16-bit patterns) of a stream whose channel period is `period`.
pub fn encode_chunk<W: Word>(x: &[W], period: usize) -> Result<Vec<u8>> {
    let split = split_of::<W>()?;
    thread_local! {
        static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch::default());
    }
    Ok(SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut scratch) => {
            let out = encode_with(x, split, period, &mut scratch, vector_kernel());
            if scratch.words.capacity() > 4 * CHUNK_SCALARS as usize {
                *scratch = Scratch::default();
            }
            out
        }
        Err(_) => encode_with(x, split, period, &mut Scratch::default(), vector_kernel()),
    }))
}

/// `split` is `split_of::<W>()`: constants once this is monomorphised and inlined.
#[inline(always)]
fn encode_with<W: Word>(x: &[W], split: Split, period: usize, scratch: &mut Scratch, vector: bool) -> Vec<u8> {
    let k = channels(period, x.len());
    let (tables, ids) = choose_tables(x, k, split, scratch);
    let enc = EncodeTables::new(&tables, split);
    let r = split.raw_bits;
    let raw_mask = (1u32 << r) - 1;
    let mut state = [LOW; STATES];
    // at most one word per scalar (F1), and room for a vector store's sixteen; written
    // without a branch, which the coin-flip renormalisation would mispredict half the time
    let words = &mut scratch.words;
    words.clear();
    words.resize(x.len() + 16, 0);
    let mut n_words = 0usize;
    // per channel, the offset of its table's codings
    let base: Vec<usize> = ids.iter().map(|&t| t as usize * enc.width).collect();
    // the vector encoder takes the whole steps of STATES scalars, after (backwards: before)
    // the last partial step, which the scalar loop codes first
    let whole = if vector { x.len() / STATES * STATES } else { 0 };
    // F1, backwards; F2: scalar j in state j mod STATES, channel j mod k
    let mut channel = x.len().saturating_sub(1) % k;
    for j in (whole..x.len()).rev() {
        let w = x[j].to_u32();
        let code = enc.coding[base[channel] + (w >> r) as usize];
        channel = if channel == 0 { k - 1 } else { channel - 1 };
        let s = &mut state[j % STATES];
        let emit = *s >= code.limit;
        words[n_words] = *s as u16;
        n_words += emit as usize;
        *s >>= 16 * emit as u32;
        let q = code.quotient(*s);
        *s = ((s.wrapping_add(code.start) << r) | (w & raw_mask)).wrapping_add(q.wrapping_mul(code.cmpl));
    }
    #[cfg(target_arch = "x86_64")]
    if whole > 0 && avx512::enabled() {
        let wrapped: Vec<u32> = (0..k + 16).map(|c| base[c % k] as u32).collect();
        // SAFETY: `enabled` checked for AVX-512F; `words` has x.len() + 16 entries and at
        // most one word per scalar is written before `n_words`.
        n_words = unsafe { avx512::encode(&x[..whole], split, &enc.packed, &wrapped, &mut state, words, n_words) };
    }
    let words = &words[..n_words];
    let mut out = Vec::with_capacity(2 + 64 * tables.len() + k / 2 + 4 * STATES + 2 * words.len());
    out.push(tables.len() as u8);
    out.push(0);
    for t in &tables {
        t.write(&mut out);
    }
    for pair in ids.chunks(2) {
        out.push(pair[0] | pair.get(1).map_or(0, |&hi| hi << 4));
    }
    for s in state {
        out.extend_from_slice(&s.to_le_bytes());
    }
    // the encoder wrote the words last to first
    for w in words.iter().rev() {
        out.extend_from_slice(&w.to_le_bytes());
    }
    out
}

/// A parsed chunk, ready to decode.
pub(crate) struct Chunk<'a> {
    /// Every table's entries, `2^P` each, back to back (F1).
    pub(crate) lut: Vec<u32>,
    /// Offset into `lut` of channel `k`'s table, for `k < K + 16` (channel `k mod K`), so
    /// sixteen consecutive scalars read their offsets with one unaligned load.
    pub(crate) base: Vec<u32>,
    pub(crate) states: [u32; STATES],
    /// The words, two bytes each.
    pub(crate) words: &'a [u8],
}

impl Chunk<'_> {
    pub(crate) fn word(&self, i: usize) -> Option<u32> {
        let b = self.words.get(2 * i..2 * i + 2)?;
        Some(u16::from_le_bytes([b[0], b[1]]) as u32)
    }

    pub(crate) fn n_words(&self) -> usize {
        self.words.len() / 2
    }
}

/// Parses and validates a chunk of `scalars` scalars (F3; the layout in the module doc).
pub(crate) fn parse_chunk(bytes: &[u8], split: Split, period: usize, scalars: usize) -> Result<Chunk<'_>> {
    let mut r = bytes;
    let head = take(&mut r, 2)?;
    let g = head[0] as usize;
    if g == 0 || g > MAX_TABLES || head[1] != 0 {
        return Err(bad(format!("{g} tables (1..={MAX_TABLES}), reserved byte {}", head[1])));
    }
    let mut lut = Vec::with_capacity(g << split.precision);
    for _ in 0..g {
        Table::read(&mut r, split)?.entries(&mut lut);
    }
    let k = channels(period, scalars);
    let ids = take(&mut r, k.div_ceil(2))?;
    let mut base = Vec::with_capacity(k + 16);
    for c in 0..k + 16 {
        let c = c % k;
        let id = (ids[c / 2] >> (4 * (c % 2))) & 0xF;
        if id as usize >= g {
            return Err(bad(format!("channel {c} uses table {id} of {g}")));
        }
        base.push((id as u32) << split.precision);
    }
    if k % 2 == 1 && ids[k / 2] >> 4 != 0 {
        return Err(bad("the unused half of the last id byte is not zero"));
    }
    let mut states = [0u32; STATES];
    for s in states.iter_mut() {
        let b = take(&mut r, 4)?;
        *s = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        if *s < LOW {
            return Err(bad("a coder state below its range"));
        }
    }
    if !r.len().is_multiple_of(2) {
        return Err(bad("the words end in half a word"));
    }
    Ok(Chunk { lut, base, states, words: r })
}

/// Decodes scalars `from..out.len()` of a parsed chunk one at a time (F1, F2), from word
/// `pos`; returns the position after the last word read.
/// `split` is `split_of::<W>()`.
#[inline(always)]
pub(crate) fn decode_from<W: Word>(
    c: &mut Chunk,
    split: Split,
    out: &mut [W],
    from: usize,
    mut pos: usize,
) -> Result<usize> {
    let (r, b) = (split.raw_bits, split.slot_bits());
    let (slot_mask, raw_mask) = ((1u32 << b) - 1, (1u32 << r) - 1);
    let k = c.base.len() - 16;
    let mut channel = from % k;
    for (j, o) in out.iter_mut().enumerate().skip(from) {
        let s = c.states[j % STATES];
        let slot = s & slot_mask;
        let e = c.lut[(c.base[channel] + (slot >> r)) as usize];
        channel += 1;
        if channel == k {
            channel = 0;
        }
        *o = W::from_u32((e >> SYMBOL_SHIFT) << r | (slot & raw_mask));
        let next = ((e & ENTRY_MASK) + 1) * (s >> b) + ((e >> ENTRY_BITS) & ENTRY_MASK);
        // without a branch (the renormalisation is a coin flip a predictor would miss half
        // the time): past the last word it reads 0, and the position past the end fails the
        // call below, whatever was written to `out`
        let need = next < LOW;
        let word = c.word(pos).unwrap_or(0);
        c.states[j % STATES] = if need { next << 16 | word } else { next };
        pos += need as usize;
    }
    if pos > c.n_words() {
        return Err(bad("the words run out before the scalars"));
    }
    Ok(pos)
}

/// Whether the vector kernels run here.
fn vector_kernel() -> bool {
    #[cfg(target_arch = "x86_64")]
    return avx512::enabled();
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Which kernel decodes the fast lane here: `"avx512"`, `"avx2"` or `"portable"` (same
/// output; `SPECKV_SIMD=avx2` stops at AVX2, `SPECKV_SIMD=0` forces the portable code).
pub fn kernel() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    if avx512::enabled() {
        return "avx512";
    } else if avx2::enabled() {
        return "avx2";
    }
    "portable"
}

/// Decodes one chunk into `out` (its scalars), checking F4.
pub fn decode_chunk<W: Word>(bytes: &[u8], period: usize, out: &mut [W]) -> Result<()> {
    let split = split_of::<W>()?;
    let mut c = parse_chunk(bytes, split, period, out.len())?;
    let (mut done, mut pos) = (0usize, 0usize);
    #[cfg(target_arch = "x86_64")]
    if avx512::enabled() {
        // SAFETY: `enabled` checked that this processor has AVX-512F.
        (done, pos) = unsafe { avx512::decode(&mut c, split, out) };
    } else if avx2::enabled() {
        // SAFETY: `enabled` checked that this processor has AVX2.
        (done, pos) = unsafe { avx2::decode(&mut c, split, out) };
    }
    let pos = decode_from(&mut c, split, out, done, pos)?;
    if pos != c.n_words() || c.states.iter().any(|&s| s != LOW) {
        return Err(bad("coded data does not end where its scalars do"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: u64) -> impl FnMut() -> u64 {
        let mut s = seed;
        move || {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            s >> 33
        }
    }

    fn roundtrip<W: Word + PartialEq + std::fmt::Debug>(x: &[W], period: usize) -> usize {
        let split = split_of::<W>().unwrap();
        let bytes = encode_chunk(x, period).unwrap();
        let mut out = vec![W::default(); x.len()];
        decode_chunk(&bytes, period, &mut out).unwrap();
        assert_eq!(out, x);
        let mut portable = vec![W::default(); x.len()];
        let mut c = parse_chunk(&bytes, split, period, x.len()).unwrap();
        let pos = decode_from(&mut c, split, &mut portable, 0, 0).unwrap();
        assert_eq!(pos, c.n_words());
        assert_eq!(portable, x);
        bytes.len()
    }

    #[test]
    fn log2_is_exact_at_powers_of_two_and_close_elsewhere() {
        for e in 0..40 {
            assert_eq!(log2_exact(1 << e), e << 16);
            assert_eq!(log2_q16(1 << e), e << 16);
        }
        for x in [3u64, 5, 7, 1000, 65535, 123456789] {
            let want = (x as f64).log2() * 65536.0;
            assert!((log2_exact(x) as f64 - want).abs() <= 2.0, "{x}");
            assert!((log2_q16(x) as f64 - want).abs() <= 65536.0 / 700.0, "{x}");
        }
    }

    #[test]
    fn the_encoders_quotient_is_the_division_for_every_state() {
        let split = Split::of(DType::Float8E4M3Fn).unwrap();
        let mut next = lcg(11);
        for f in 1..1u32 << split.precision {
            let code = Coding::new(f, 0, split);
            let edges = [0u32, 1, f - 1, f, f + 1, u32::MAX, u32::MAX - 1, u32::MAX / f * f, (u32::MAX / f) * f - 1];
            for x in edges.into_iter().chain((0..200).map(|_| next() as u32 ^ (next() as u32) << 16)) {
                assert_eq!(code.quotient(x), x / f, "x = {x}, f = {f}");
            }
        }
    }

    #[test]
    fn quantized_tables_keep_every_symbol_and_sum_to_the_precision() {
        let split = Split::of(DType::BFloat16).unwrap();
        for counts in [vec![1u32; 512], vec![1000000, 1, 1, 1], vec![5], vec![0, 0, 7], vec![3, 0, 0, 0, 1000]] {
            let t = Table::from_counts(&counts, split);
            assert!(t.symbols.len() >= 2);
            assert_eq!(t.freqs.iter().map(|&f| f as u32).sum::<u32>(), 1 << split.precision);
            assert!(t.freqs.iter().all(|&f| f >= 1));
            for (s, &c) in counts.iter().enumerate() {
                assert!(c == 0 || t.symbols.contains(&(s as u16)));
            }
        }
    }

    #[test]
    fn the_vector_encoder_writes_the_portable_bytes() {
        if !crate::test_env::have("avx512", vector_kernel(), "no AVX-512 here, only the portable encoder runs") {
            return;
        }
        let mut next = lcg(5);
        for n in [32usize, 33, 64, 1000, 4096, 70001] {
            for period in [1usize, 7, 16, 64, 100] {
                let x: Vec<u16> = (0..n).map(|j| 0x3c00 + ((next() % 300) as u16) * (1 + (j % 3) as u16)).collect();
                let split = split_of::<u16>().unwrap();
                let portable = encode_with(&x, split, period, &mut Scratch::default(), false);
                assert_eq!(encode_with(&x, split, period, &mut Scratch::default(), true), portable, "{n} {period}");
                let y: Vec<u8> = x.iter().map(|&v| v as u8).collect();
                let split = split_of::<u8>().unwrap();
                let portable = encode_with(&y, split, period, &mut Scratch::default(), false);
                assert_eq!(encode_with(&y, split, period, &mut Scratch::default(), true), portable, "{n} {period}");
            }
        }
    }

    #[test]
    fn the_avx2_decoder_decodes_as_the_portable_code() {
        if !crate::test_env::have("avx2", is_x86_feature_detected!("avx2"), "no AVX2 here") {
            return;
        }
        /// One chunk of `x` through the AVX2 kernel and then the portable code.
        fn check<W: Word + PartialEq + std::fmt::Debug>(x: &[W], period: usize) {
            let split = split_of::<W>().unwrap();
            let bytes = encode_chunk(x, period).unwrap();
            let mut c = parse_chunk(&bytes, split, period, x.len()).unwrap();
            let mut out = vec![W::default(); x.len()];
            // SAFETY: the caller detected AVX2.
            let (done, pos) = unsafe { avx2::decode(&mut c, split, &mut out) };
            // 16-bit chunks carry enough words for the kernel's first step from 64 scalars on
            assert!(W::BITS != 16 || x.len() < 64 || done > 0, "the kernel did not run ({})", x.len());
            assert_eq!(decode_from(&mut c, split, &mut out, done, pos).unwrap(), c.n_words());
            assert_eq!(out, x, "{} {period}", x.len());
            assert!(c.states.iter().all(|&s| s == LOW));
        }
        let mut next = lcg(8);
        for n in [32usize, 64, 65, 1000, 4096, 70001] {
            for period in [1usize, 3, 16, 64, 100] {
                let x: Vec<u16> = (0..n).map(|j| 0x3c00 + ((next() % 300) as u16) * (1 + (j % 3) as u16)).collect();
                check(&x, period);
                check(&x.iter().map(|&v| v as u8).collect::<Vec<u8>>(), period);
            }
        }
    }

    #[test]
    fn float32_is_refused() {
        assert!(matches!(encode_chunk(&[1u32, 2], 1), Err(Error::InvalidArgument(_))));
        assert!(matches!(decode_chunk(&[0u8; 200], 1, &mut [0u32; 2]), Err(Error::InvalidArgument(_))));
    }

    #[test]
    fn every_pattern_and_length_round_trips() {
        let mut next = lcg(7);
        for n in [0usize, 1, 2, 15, 16, 17, 31, 32, 33, 63, 64, 65, 1000, 4099] {
            for period in [1usize, 3, 16, 64, 100] {
                let x: Vec<u16> = (0..n).map(|_| next() as u16).collect();
                roundtrip(&x, period);
                let y: Vec<u8> = (0..n).map(|_| next() as u8).collect();
                roundtrip(&y, period);
            }
        }
        let all: Vec<u16> = (0..=u16::MAX).collect();
        roundtrip(&all, 64);
        let all8: Vec<u8> = (0..=255u8).cycle().take(5000).collect();
        roundtrip(&all8, 7);
        // one value everywhere (F3's second symbol) and channels of different scales
        roundtrip(&vec![0x3f80u16; 70000], 64);
        roundtrip(&vec![0u8; 70000], 64);
        let scaled: Vec<u16> = (0..65536)
            .map(|j| {
                let v = ((next() % 2000) as f32 - 1000.0) * (1 + j % 64) as f32 * 1e-3;
                (v.to_bits() >> 16) as u16
            })
            .collect();
        let grouped = roundtrip(&scaled, 64);
        let single = roundtrip(&scaled, 1);
        assert!(grouped < single, "per-channel tables should pay here: {grouped} vs {single}");
    }

    #[test]
    fn damaged_chunks_are_refused_or_decode_without_panicking() {
        let mut next = lcg(3);
        let x: Vec<u16> = (0..3000).map(|_| 0x3c00 + (next() % 700) as u16).collect();
        let bytes = encode_chunk(&x, 64).unwrap();
        let mut out = vec![0u16; x.len()];
        for cut in [0, 1, 2, 5, bytes.len() / 2, bytes.len() - 1] {
            assert!(decode_chunk(&bytes[..cut], 64, &mut out).is_err());
        }
        let mut caught = 0;
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x5a;
            // must return (an error, or other values where F4 cannot see the flip: a
            // stream's chunk checksum catches those), never panic or read out of bounds
            caught += decode_chunk(&b, 64, &mut out).is_err() as usize;
        }
        assert!(caught > bytes.len() / 2, "F4 caught only {caught} of {} flips", bytes.len());
    }
}
