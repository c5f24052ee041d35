//! Channels grouped by their histograms into a chunk's tables (F2): the clustering and the
//! pooled counts of each group.

use super::*;

/// Channels a chunk of `scalars` holds under `period` (K in the module doc).
pub fn channels(period: usize, scalars: usize) -> usize {
    period.clamp(1, scalars.max(1))
}

/// Rounds of moving channels between tables, at most (they stop when nothing moves):
/// measured on the demo model's caches, 3 rounds leave 0.009 bit per scalar that 6 find.
pub(super) const ROUNDS: usize = 6;

/// Groups `k` channels into at most `groups` tables. `rows` holds each channel's counts of
/// the chunk's `used` symbols (`rows[c * used.len() + u]`, in `used` order). Channels sorted
/// by their mean magnitude code and cut into equal runs, then each moved to the table that
/// codes it in the fewest bits until nothing moves (`ROUNDS` at most). Integers only.
pub(super) fn cluster(rows: &[u32], k: usize, split: Split, used: &[u16], groups: usize) -> Vec<u8> {
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
pub(super) fn pool(rows: &[u32], u: usize, assign: &[u8], groups: usize) -> Vec<u32> {
    let mut pooled = vec![0u32; groups * u];
    for (r, &g) in rows.chunks(u).zip(assign) {
        for (p, &v) in pooled[g as usize * u..(g as usize + 1) * u].iter_mut().zip(r) {
            *p += v;
        }
    }
    pooled
}
