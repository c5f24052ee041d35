//! Codes one chunk with the fast lane: its tables chosen, written, and the scalars coded
//! backwards through the rANS states (F1-F4).

use crate::error::{Error, Result};
use crate::words::Word;

use super::*;

/// The encoder's constants for one (table, symbol) of frequency `f` and first slot `c` (F1).
///
/// `x / f` without a division: with `magic = ceil(2^44 / f)`, every `x < 2^32` has
/// `x / f = x * magic >> 44` (the product overshoots `x / f` by less than `2^32 / 2^44`, and
/// `x / f` falls short of the next integer by at least `1 / f > 2^-12`, as `f < 2^11`). Then
/// the step `(x / f) << B | (c + x mod f) << R | low` equals
/// `((x + c) << R | low) + (x / f) * cmpl` with `cmpl = (2^P - f) << R`.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Coding {
    /// States at or above this are renormalised first: `f << (32 - B)`.
    pub(super) limit: u32,
    pub(super) start: u32,
    pub(super) cmpl: u32,
    pub(super) magic: u64,
}

/// The fixed shift of `Coding::quotient`.
pub(super) const QUOTIENT_SHIFT: u32 = 44;

impl Coding {
    pub(super) fn new(f: u32, c: u32, split: Split) -> Coding {
        let magic = (1u64 << QUOTIENT_SHIFT).div_ceil(f as u64);
        let cmpl = ((1u32 << split.precision) - f) << split.raw_bits;
        Coding { limit: f << (32 - split.slot_bits()), start: c, cmpl, magic }
    }

    #[inline(always)]
    pub(super) fn quotient(self, x: u32) -> u32 {
        ((x as u128 * self.magic as u128) >> QUOTIENT_SHIFT) as u32
    }
}

/// The encoder's view of a chunk's tables: `Coding` per (table, symbol), and the same as
/// `f | c << 16` for the vector encoder.
pub(crate) struct EncodeTables {
    pub(super) width: usize,
    pub(super) coding: Vec<Coding>,
    pub(crate) packed: Vec<u32>,
}

impl EncodeTables {
    pub(super) fn new(tables: &[Table], split: Split) -> EncodeTables {
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
pub(super) fn choose_tables<W: Word>(x: &[W], k: usize, split: Split, scratch: &mut Scratch) -> (Vec<Table>, Vec<u8>) {
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
pub(super) struct Scratch {
    pub(super) hist: Vec<u32>,
    pub(super) rows: Vec<u32>,
    pub(super) words: Vec<u16>,
}

/// The split of `W`'s patterns, or the error for a width the lane does not code.
pub(super) fn split_of<W: Word>() -> Result<Split> {
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
pub(super) fn encode_with<W: Word>(
    x: &[W],
    split: Split,
    period: usize,
    scratch: &mut Scratch,
    vector: bool,
) -> Vec<u8> {
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
