//! The bins model's tables (B4): every class's and phase's bin frequencies from the mixture's
//! weights, built once per revision and shared, with both sides' views.

use std::sync::{Arc, OnceLock};

use crate::hash::Hasher;
use crate::model::ModelParams;

use super::*;

/// The encoder's division by a frequency: `x / f == (x * ceil(2^48 / f)) >> 48` for every
/// `x < 2^32` and `f < 2^16` (the error `x * (ceil - 2^48 / f) / 2^48 < 2^-16 < 1 / f` cannot
/// carry the quotient past an integer; tested for every frequency).
pub(super) const QUOTIENT_SHIFT: u32 = 48;

/// `repr(C)`: the vector encoder gathers `magic` from its place in the array
/// (`MAGIC_AT`, `CODING_BYTES`).
#[derive(Debug, Clone, Copy, Default)]
#[repr(C)]
pub(super) struct Coding {
    /// States at or above this are renormalised first: `f << (32 - PRECISION)`.
    pub(super) limit: u32,
    pub(super) freq: u32,
    pub(super) start: u32,
    pub(super) magic: u64,
}

/// `Coding`'s size and where its `magic` sits, for the vector encoder's gathers.
pub(super) const CODING_BYTES: usize = 24;
pub(super) const MAGIC_AT: usize = 16;
const _: () = assert!(std::mem::size_of::<Coding>() == CODING_BYTES);
const _: () = assert!(std::mem::offset_of!(Coding, magic) == MAGIC_AT);

impl Coding {
    pub(super) fn new(freq: u32, start: u32) -> Coding {
        Coding { limit: freq << (32 - PRECISION), freq, start, magic: (1u64 << QUOTIENT_SHIFT).div_ceil(freq as u64) }
    }

    #[inline(always)]
    pub(super) fn quotient(self, x: u32) -> u32 {
        ((x as u128 * self.magic as u128) >> QUOTIENT_SHIFT) as u32
    }
}

/// Every table of a revision (B4), both sides' views.
#[derive(Debug)]
pub struct BinTables {
    pub(super) revision: Revision,
    /// Per table, `2^PRECISION` slots: the symbol of each.
    pub(super) lut: Vec<u8>,
    /// Per (table, symbol): `freq | start << 16`.
    pub(super) entries: Vec<u32>,
    pub(super) coding: Vec<Coding>,
    pub(super) digest: u64,
}

pub(super) fn normal_cdf(z: f64) -> f64 {
    0.5 * libm::erfc(-z * std::f64::consts::FRAC_1_SQRT_2)
}

/// Frequencies summing to `total` for `masses` (0 means no frequency), each supported one at
/// least 1: floors of the proportional shares, the shortfall to the largest, an excess taken
/// one at a time from the largest frequencies above 1.
pub(super) fn quantize(masses: &[f64], total: u32) -> Vec<u32> {
    let sum: f64 = masses.iter().sum();
    let mut f: Vec<u32> =
        masses.iter().map(|&p| if p > 0.0 { (libm::floor(p / sum * total as f64) as u32).max(1) } else { 0 }).collect();
    let have: u32 = f.iter().sum();
    let top = (0..f.len()).max_by_key(|&i| (f[i], std::cmp::Reverse(i))).unwrap_or(0);
    if have < total {
        f[top] += total - have;
    } else {
        let mut excess = have - total;
        while excess > 0 {
            // the floors exceed `total` by at most one per symbol, which the largest absorb
            let i = (0..f.len()).max_by_key(|&i| (f[i], std::cmp::Reverse(i))).unwrap_or(0);
            f[i] -= 1;
            excess -= 1;
        }
    }
    f
}

impl BinTables {
    /// The tables of `revision` for `params`' mixture, built on first use and then shared.
    pub fn shared(params: &ModelParams, revision: Revision) -> Arc<BinTables> {
        static CACHE_V3: crate::model::ParamsCache<BinTables> = OnceLock::new();
        static CACHE_V4: crate::model::ParamsCache<BinTables> = OnceLock::new();
        let cache = if revision == V3 { &CACHE_V3 } else { &CACHE_V4 };
        crate::model::shared(cache, params, || BinTables::build(params, revision))
    }

    pub fn build(params: &ModelParams, revision: Revision) -> BinTables {
        let r = revision;
        let (wn, ww) = (params.weight_narrow as f64, params.weight_wide as f64);
        let wide = params.wide_factor as f64;
        let mix = |z: f64| (wn * normal_cdf(z) + ww * normal_cdf(z / wide)) / (wn + ww);
        let support = SUPPORT_WIDE_SIGMAS * wide;
        let slots = 1usize << PRECISION;
        // 4 bytes past the last slot: the vector decoder reads each slot as a 4-byte gather
        let mut lut = vec![0u8; r.tables() * slots + 4];
        let mut entries = vec![0u32; r.tables() * SYMBOLS];
        let mut coding = vec![Coding::default(); r.tables() * SYMBOLS];
        let mut h = Hasher::new();
        for v in [PRECISION, BINS_PER_SIGMA_LOG2 as u32, HALF as u32, ESCAPE_FREQ, DEPTH_MAX] {
            h.update(&v.to_le_bytes());
        }
        // version 3's digest is what its streams carry: only later revisions add their rule
        if r != V3 {
            for v in [r.version as u32, r.class_min as u32, r.rounding as u32, r.states as u32] {
                h.update(&v.to_le_bytes());
            }
        }
        // bin k's mass at the middle of each phase; `class`: sigma / w in eighths of an octave
        let masses = |class: i32, phase: usize| -> Vec<f64> {
            let phase = (phase as f64 + 0.5) / PHASES as f64;
            // the bin's width in sigmas
            let ratio = libm::exp2(-(class as f64) / 8.0);
            (-HALF..HALF)
                .map(|k| {
                    let z0 = (k as f64 - phase) * ratio;
                    let z1 = z0 + ratio;
                    if z1 > -support && z0 < support {
                        (mix(z1) - mix(z0)).max(1e-300)
                    } else {
                        0.0
                    }
                })
                .collect()
        };
        for t in 0..r.tables() {
            let masses: Vec<f64> = if t < r.phased_tables() {
                masses(r.class_min + (t / PHASES) as i32, t % PHASES)
            } else {
                // the average over the phases (a bin's mass where the phase is not looked at)
                let class = CLASS_UNPHASED + (t - r.phased_tables()) as i32;
                let all: Vec<Vec<f64>> = (0..PHASES).map(|p| masses(class, p)).collect();
                (0..all[0].len()).map(|k| all.iter().map(|m| m[k]).sum::<f64>() / PHASES as f64).collect()
            };
            let mut freqs = quantize(&masses, (1 << PRECISION) - ESCAPE_FREQ);
            freqs.push(ESCAPE_FREQ);
            let mut start = 0u32;
            for (s, &f) in freqs.iter().enumerate() {
                entries[t * SYMBOLS + s] = f | start << 16;
                if f > 0 {
                    coding[t * SYMBOLS + s] = Coding::new(f, start);
                    lut[t * slots + start as usize..t * slots + (start + f) as usize].fill(s as u8);
                }
                h.update(&(f as u16).to_le_bytes());
                start += f;
            }
        }
        BinTables { revision, lut, entries, coding, digest: h.finish() }
    }

    pub fn digest(&self) -> u64 {
        self.digest
    }

    pub fn revision(&self) -> Revision {
        self.revision
    }
}
