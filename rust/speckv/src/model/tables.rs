//! The bank of fixed-point tables: for every scale `s` on the ladder, the quantised CDF of the
//! mixture `w_n N(0, s^2) + w_w N(0, (k s)^2)` over integer residuals `d` in `[-R, R]`, plus an
//! ESCAPE symbol carrying `w_e` and whatever mass falls outside the window.
//!
//! Tables are built once per parameter set with `libm` (a pure-Rust libm, so the same bits on
//! every platform) and integer rounding; a digest of the bank goes into every stream and is
//! checked on decode, so a build that computed different tables cannot silently decode wrong.
//! Coding then only reads integers.

use std::sync::{Arc, OnceLock};

use super::params::{ModelParams, STEPS_PER_OCTAVE};
use crate::hash::Hasher;

/// Bits of the coarse slot -> symbol index that starts the decoder's search.
const LOOKUP_BITS: u32 = 10;
/// Every window has at least this half-width.
const MIN_RADIUS: i32 = 4;

/// One table, borrowed from the bank (for inspection; coding goes through
/// `TableBank::encode_interval` and `TableBank::decode_interval`).
#[derive(Debug, Clone, Copy)]
pub struct Table<'a> {
    /// Half-width `R`: symbols `0..=2R` are residuals `-R..=R`; symbol `2R + 1` is ESCAPE.
    pub radius: i32,
    /// `2R + 3` cumulative frequencies; `cdf[0] = 0`, last = `2^precision`.
    pub cdf: &'a [u32],
}

impl<'a> Table<'a> {
    #[inline(always)]
    pub fn escape_symbol(&self) -> usize {
        2 * self.radius as usize + 1
    }

    /// `(cum, freq)` of a symbol.
    #[inline(always)]
    pub fn interval(&self, symbol: usize) -> (u32, u32) {
        let lo = self.cdf[symbol];
        (lo, self.cdf[symbol + 1] - lo)
    }
}

/// Where one table lives in the bank's flat arrays.
#[derive(Debug, Clone, Copy)]
struct TableMeta {
    radius: i32,
    cdf_start: u32,
}

/// All tables of one parameter set, in flat arrays.
#[derive(Debug)]
pub struct TableBank {
    params: ModelParams,
    metas: Vec<TableMeta>,
    cdfs: Vec<u32>,
    lookups: Vec<u16>,
    digest: u64,
}

/// `Phi(b) - Phi(a)` for a standard normal, computed where it is accurate (in the tail that
/// does not contain zero, with erfc of positive arguments).
fn normal_mass(a: f64, b: f64) -> f64 {
    let r = std::f64::consts::FRAC_1_SQRT_2;
    if a >= 0.0 {
        0.5 * (libm::erfc(a * r) - libm::erfc(b * r))
    } else if b <= 0.0 {
        0.5 * (libm::erfc(-b * r) - libm::erfc(-a * r))
    } else {
        1.0 - 0.5 * (libm::erfc(-a * r) + libm::erfc(b * r))
    }
}

impl TableBank {
    /// The bank for `params`, built on first use and then shared.
    pub fn shared(params: &ModelParams) -> Arc<TableBank> {
        static CACHE: super::ParamsCache<TableBank> = OnceLock::new();
        super::shared(&CACHE, params, || TableBank::build(params))
    }

    /// Builds every table. `params` must have passed `ModelParams::validate`.
    pub fn build(params: &ModelParams) -> TableBank {
        let precision = params.table_precision as u32;
        let total = 1u64 << precision;
        let w_narrow = params.weight_narrow as f64 / 65536.0;
        let w_wide = params.weight_wide as f64 / 65536.0;
        let mut bank =
            TableBank { params: *params, metas: Vec::new(), cdfs: Vec::new(), lookups: Vec::new(), digest: 0 };
        for t in 0..params.n_tables() {
            let code = params.min_scale_code() + t as i32;
            let scale = libm::exp2(code as f64 / STEPS_PER_OCTAVE as f64);
            let wide = scale * params.wide_factor as f64;
            let radius = (libm::ceil(params.window_scales as f64 * scale) as i32).max(MIN_RADIUS);
            let n = 2 * radius as usize + 2;
            let mut freqs = Vec::with_capacity(n);
            for d in -radius..=radius {
                let (a, b) = (d as f64 - 0.5, d as f64 + 0.5);
                let mass = w_narrow * normal_mass(a / scale, b / scale) + w_wide * normal_mass(a / wide, b / wide);
                freqs.push((libm::floor(mass * total as f64 + 0.5) as u64).max(1));
            }
            let in_window: u64 = freqs.iter().sum();
            freqs.push(total.saturating_sub(in_window).max(1));
            // Rounding leaves the sum a little off; the residual goes to (or comes from) the
            // most probable symbols, from the centre outwards, keeping every frequency >= 1.
            let sum: u64 = freqs.iter().sum();
            let mut excess = sum as i64 - total as i64;
            let centre = radius as usize;
            let mut k = 0usize;
            while excess != 0 {
                let i = if k.is_multiple_of(2) { centre + k / 2 } else { centre - k.div_ceil(2) };
                if excess < 0 {
                    freqs[i] += (-excess) as u64;
                    excess = 0;
                } else {
                    let take = (freqs[i] - 1).min(excess as u64);
                    freqs[i] -= take;
                    excess -= take as i64;
                }
                k += 1;
            }
            let start = bank.cdfs.len();
            bank.metas.push(TableMeta { radius, cdf_start: start as u32 });
            bank.cdfs.push(0);
            let mut acc = 0u64;
            for f in &freqs {
                acc += f;
                bank.cdfs.push(acc as u32);
            }
            debug_assert_eq!(acc, total);
            let cdf = &bank.cdfs[start..];
            let mut symbol = 0usize;
            for slot in 0..1u64 << LOOKUP_BITS {
                let q = (slot << (precision - LOOKUP_BITS)) as u32;
                while cdf[symbol + 1] <= q {
                    symbol += 1;
                }
                bank.lookups.push(symbol as u16);
            }
        }
        let mut h = Hasher::new();
        for meta in &bank.metas {
            h.update(&meta.radius.to_le_bytes());
        }
        for c in &bank.cdfs {
            h.update(&c.to_le_bytes());
        }
        bank.digest = h.finish();
        bank
    }

    pub fn params(&self) -> &ModelParams {
        &self.params
    }

    /// Digest of every table's radius and CDF.
    pub fn digest(&self) -> u64 {
        self.digest
    }

    pub fn len(&self) -> usize {
        self.metas.len()
    }

    pub fn is_empty(&self) -> bool {
        self.metas.is_empty()
    }

    /// The encoder's one question: `(cum, freq)` of residual `symbol - R` in table `index`,
    /// or of ESCAPE when the residual falls outside the window. Returns whether it escaped.
    #[inline(always)]
    pub fn encode_interval(&self, index: usize, residual: i64) -> (u32, u32, bool) {
        let meta = self.metas[index];
        let symbol = residual + meta.radius as i64;
        let escape = 2 * meta.radius as usize + 1;
        let (s, escaped) =
            if symbol >= 0 && (symbol as usize) < escape { (symbol as usize, false) } else { (escape, true) };
        let i = meta.cdf_start as usize + s;
        let lo = self.cdfs[i];
        (lo, self.cdfs[i + 1] - lo, escaped)
    }

    /// The decoder's one question: which symbol of table `index` covers slot `q`
    /// (`q < 2^precision`)? Returns `(residual, cum, freq, escaped)`.
    #[inline(always)]
    pub fn decode_interval(&self, index: usize, q: u32) -> (i64, u32, u32, bool) {
        let meta = self.metas[index];
        let escape = 2 * meta.radius as usize + 1;
        let cdf = &self.cdfs[meta.cdf_start as usize..meta.cdf_start as usize + escape + 2];
        let lookup = &self.lookups[index << LOOKUP_BITS..(index + 1) << LOOKUP_BITS];
        let slot = (q >> (self.params.table_precision as u32 - LOOKUP_BITS)) as usize;
        let mut lo = lookup[slot] as usize;
        let mut hi = lookup.get(slot + 1).map_or(escape, |&next| next as usize);
        // Invariant: cdf[lo] <= q < cdf[hi + 1].
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if cdf[mid] <= q {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        let (cum, next) = (cdf[lo], cdf[lo + 1]);
        (lo as i64 - meta.radius as i64, cum, next - cum, lo == escape)
    }

    #[inline(always)]
    pub fn table(&self, index: usize) -> Table<'_> {
        let meta = self.metas[index];
        let start = meta.cdf_start as usize;
        Table { radius: meta.radius, cdf: &self.cdfs[start..start + 2 * meta.radius as usize + 3] }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_table_is_a_valid_distribution_and_find_inverts_interval() {
        let bank = TableBank::build(&ModelParams::default());
        let total = 1u32 << 24;
        assert_eq!(bank.len(), ModelParams::default().n_tables());
        for t in 0..bank.len() {
            let table = bank.table(t);
            assert_eq!(table.cdf.len(), 2 * table.radius as usize + 3);
            assert_eq!(*table.cdf.last().unwrap(), total);
            for s in 0..=table.escape_symbol() {
                let (cum, freq) = table.interval(s);
                assert!(freq >= 1, "table {t} symbol {s} has zero frequency");
                for q in [cum, cum + freq / 2, cum + freq - 1] {
                    let (residual, c, f, escaped) = bank.decode_interval(t, q);
                    assert_eq!((c, f), (cum, freq));
                    assert_eq!(escaped, s == table.escape_symbol());
                    assert_eq!(residual, s as i64 - table.radius as i64);
                }
            }
            // symmetric around zero and decreasing away from it
            let r = table.radius as usize;
            for k in 1..=r {
                assert_eq!(table.interval(r + k).1, table.interval(r - k).1, "table {t} asymmetric at {k}");
                assert!(table.interval(r + k).1 <= table.interval(r + k - 1).1);
            }
        }
    }

    #[test]
    fn tables_track_the_continuous_mixture() {
        let params = ModelParams::default();
        let bank = TableBank::build(&params);
        // At s = 8 ulps the narrow component's peak is about 0.95 / (8 sqrt(2 pi)).
        let t = (3 * STEPS_PER_OCTAVE - params.min_scale_code()) as usize;
        let table = bank.table(t);
        let p0 = table.interval(table.radius as usize).1 as f64 / (1u64 << 24) as f64;
        let (wn, ww, we) = (
            params.weight_narrow as f64 / 65536.0,
            params.weight_wide as f64 / 65536.0,
            params.weight_escape as f64 / 65536.0,
        );
        let expected = wn * normal_mass(-0.5 / 8.0, 0.5 / 8.0) + ww * normal_mass(-0.5 / 24.0, 0.5 / 24.0);
        assert!((p0 / expected - 1.0).abs() < 1e-5, "{p0} vs {expected}");
        let escape = table.interval(table.escape_symbol()).1 as f64 / (1u64 << 24) as f64;
        assert!((escape - we).abs() < 5e-5, "escape {escape}");
    }

    #[test]
    fn digest_is_pinned() {
        // A changed digest means every existing stream is refused: bump the format version.
        let bank = TableBank::build(&ModelParams::default());
        assert_eq!(bank.digest(), PINNED_DIGEST, "digest now {:#x}", bank.digest());
    }

    const PINNED_DIGEST: u64 = 0xf059_2b70_01ef_f83a;
}
