//! One table of the fast lane (F3): its symbols and frequencies, quantised from counts, and
//! how it is written and read.

use crate::error::Result;

use super::*;

/// One table: its symbols in increasing order and their frequencies (F3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Table {
    pub(super) symbols: Vec<u16>,
    pub(super) freqs: Vec<u16>,
}

/// `log2(x)` in 16.16 fixed point, to within 0.0015 (the encoder's estimates of bits): the
/// integer part from the leading zeros, the fraction from a table of `log2_exact` at the
/// mantissa's top 10 bits. Integers only, so the encoder's choices (and bytes) are the same on
/// every machine. `x >= 1`.
pub(super) fn log2_q16(x: u64) -> u64 {
    static FRACTIONS: std::sync::OnceLock<Vec<u64>> = std::sync::OnceLock::new();
    let table = FRACTIONS.get_or_init(|| (0..1024u64).map(|i| log2_exact(1024 + i) - (10 << 16)).collect());
    let e = 63 - x.leading_zeros() as u64;
    let top = if e >= 10 { x >> (e - 10) } else { x << (10 - e) };
    (e << 16) + table[(top - 1024) as usize]
}

/// `log2(x)` in 16.16 fixed point by repeated squaring (rounded down). `x >= 1`.
pub(super) fn log2_exact(x: u64) -> u64 {
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
pub(super) fn quantize(counts: &[u32], precision: u32) -> Vec<u16> {
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
    pub(super) fn from_counts(counts: &[u32], split: Split) -> Table {
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
    pub(super) fn bits(&self, split: Split) -> Vec<u64> {
        let top = (split.precision as u64) << 16;
        self.freqs.iter().map(|&f| top - log2_q16(f as u64)).collect()
    }

    /// Bits this table spends on symbol `counts` (16.16 fixed point), given its `bits`.
    pub(super) fn cost(&self, bits: &[u64], counts: &[u32]) -> u64 {
        self.symbols.iter().zip(bits).map(|(&s, &b)| counts.get(s as usize).copied().unwrap_or(0) as u64 * b).sum()
    }

    pub(super) fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&(self.symbols.len() as u16).to_le_bytes());
        let mut prev: Option<u16> = None;
        for (&s, &f) in self.symbols.iter().zip(&self.freqs) {
            write_varint(out, prev.map_or(s, |p| s - p - 1) as u32);
            write_varint(out, f as u32 - 1);
            prev = Some(s);
        }
    }

    /// Reads and validates a table (F3).
    pub(super) fn read(r: &mut &[u8], split: Split) -> Result<Table> {
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
    pub(super) fn entries(&self, lut: &mut Vec<u32>) {
        for (&h, &f) in self.symbols.iter().zip(&self.freqs) {
            for j in 0..f as u32 {
                lut.push((f as u32 - 1) | j << ENTRY_BITS | (h as u32) << SYMBOL_SHIFT);
            }
        }
    }
}
