//! Adaptive counters with a virtual sliding window.
//!
//! Each symbol has a count. Coding symbol `s` adds `increment` to its count; every `period`
//! symbols every count decays, `C <- C - (C >> shift)`, and the CDF the coder reads is rebuilt
//! from the counts. Together that is the integer form of an exponentially decaying histogram
//! whose memory is about `period << shift` symbols: old statistics fade without ever being
//! stored. Encoder and decoder update at the same symbol, so nothing is transmitted.
//!
//! The CDF has a power-of-two total (`PRECISION`), every symbol keeps a frequency of at least
//! `min_freq`, and the most probable symbol leaves at least `2^4` to the others, which bounds
//! from below what a symbol costs (the container's limit on scalars per byte relies on it).

use crate::coder::{RangeDecoder, SymbolSink};
use crate::model::params::ModelParams;

/// log2 of the total of an adaptive model's CDF.
pub const PRECISION: u32 = 16;
const RESERVED_FOR_OTHERS: u32 = 16;

#[derive(Debug, Clone)]
pub struct AdaptiveModel {
    counts: Vec<u32>,
    cdf: Vec<u32>,
    min_freq: u32,
    increment: u32,
    period: u32,
    shift: u32,
    since_rebuild: u32,
}

impl AdaptiveModel {
    /// A model over `n` symbols (2 ..= 4096) starting from the uniform distribution.
    pub fn new(n: usize, params: &ModelParams) -> AdaptiveModel {
        assert!((2..=4096).contains(&n), "adaptive alphabets have 2..=4096 symbols");
        let min_freq = RESERVED_FOR_OTHERS.div_ceil(n as u32 - 1).max(1);
        let mut model = AdaptiveModel {
            counts: vec![1; n],
            cdf: vec![0; n + 1],
            min_freq,
            increment: params.adapt_increment as u32,
            period: params.adapt_period as u32,
            shift: params.adapt_shift as u32,
            since_rebuild: 0,
        };
        model.rebuild();
        model
    }

    pub fn len(&self) -> usize {
        self.counts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }

    /// Frequency (out of `2^PRECISION`) currently given to `symbol`.
    pub fn freq(&self, symbol: usize) -> u32 {
        self.cdf[symbol + 1] - self.cdf[symbol]
    }

    fn rebuild(&mut self) {
        let n = self.counts.len() as u64;
        let budget = (1u64 << PRECISION) - n * self.min_freq as u64;
        let sum: u64 = self.counts.iter().map(|&c| c as u64).sum();
        // One division per rebuild: each count <= sum, so count * scale <= budget << 32 < 2^64.
        let scale = (budget << 32) / sum;
        let mut acc = 0u32;
        let mut best = (0usize, 0u32);
        for (i, &c) in self.counts.iter().enumerate() {
            self.cdf[i] = acc;
            acc += self.min_freq + ((c as u64 * scale) >> 32) as u32;
            if c > best.1 {
                best = (i, c);
            }
        }
        // Rounding down leaves a few units; the most frequent symbol takes them.
        let leftover = (1u32 << PRECISION) - acc;
        for c in &mut self.cdf[best.0 + 1..] {
            *c += leftover;
        }
        self.cdf[self.counts.len()] = 1 << PRECISION;
    }

    #[inline]
    fn update(&mut self, symbol: usize) {
        self.counts[symbol] += self.increment;
        self.since_rebuild += 1;
        if self.since_rebuild == self.period {
            self.since_rebuild = 0;
            for c in &mut self.counts {
                *c -= *c >> self.shift;
            }
            self.rebuild();
        }
    }

    /// Codes `symbol` (< len) and adapts.
    #[inline]
    pub fn encode<S: SymbolSink>(&mut self, sink: &mut S, symbol: usize) {
        let lo = self.cdf[symbol];
        sink.put(lo, self.cdf[symbol + 1] - lo, PRECISION);
        self.update(symbol);
    }

    /// Decodes one symbol and adapts exactly as `encode` did.
    #[inline]
    pub fn decode(&mut self, dec: &mut RangeDecoder) -> usize {
        let q = dec.peek(PRECISION);
        let symbol = self.cdf.partition_point(|&c| c <= q) - 1;
        let lo = self.cdf[symbol];
        dec.consume(lo, self.cdf[symbol + 1] - lo);
        self.update(symbol);
        symbol
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coder::{IdealMeter, RangeEncoder};

    #[test]
    fn counts_forget_old_statistics() {
        let params = ModelParams::default();
        let mut m = AdaptiveModel::new(8, &params);
        let mut meter = IdealMeter::default();
        for _ in 0..5000 {
            m.encode(&mut meter, 3);
        }
        assert!(m.freq(3) > (1 << PRECISION) * 9 / 10);
        assert!(m.freq(3) <= (1 << PRECISION) - RESERVED_FOR_OTHERS);
        for _ in 0..5000 {
            m.encode(&mut meter, 5);
        }
        assert!(m.freq(5) > (1 << PRECISION) * 9 / 10, "the window slid to the new symbol");
        for s in 0..8 {
            assert!(m.freq(s) >= 1);
        }
    }

    #[test]
    fn decoder_follows_the_encoder() {
        let params = ModelParams::default();
        let symbols: Vec<usize> = (0..20_000u64).map(|i| ((i * i * 7 + i / 100) % 37) as usize).collect();
        let mut enc_model = AdaptiveModel::new(37, &params);
        let mut enc = RangeEncoder::new();
        for &s in &symbols {
            enc_model.encode(&mut enc, s);
        }
        let bytes = enc.finish();
        let mut dec_model = AdaptiveModel::new(37, &params);
        let mut dec = RangeDecoder::new(&bytes);
        for &s in &symbols {
            assert_eq!(dec_model.decode(&mut dec), s);
        }
        assert!(dec.finished_cleanly());
    }

    #[test]
    fn adapts_to_a_skewed_source_close_to_its_entropy() {
        let params = ModelParams::default();
        let mut m = AdaptiveModel::new(4, &params);
        let mut meter = IdealMeter::default();
        // p = (1/2, 1/4, 1/8, 1/8): entropy 1.75 bits
        let pattern = [0usize, 1, 0, 2, 0, 1, 0, 3];
        let n = 80_000;
        for i in 0..n {
            m.encode(&mut meter, pattern[i % 8]);
        }
        let per_symbol = meter.bits / n as f64;
        assert!((per_symbol - 1.75).abs() < 0.03, "{per_symbol} bits/symbol");
    }
}
