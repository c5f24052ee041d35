//! Coding a bit pattern with no prediction: an adaptive model of sign+exponent, then an
//! adaptive model of the top mantissa bits, then the remaining mantissa bits uniformly. Any
//! pattern (NaN payloads, +-0, +-inf, subnormals) is representable. Used for escapes and, one
//! model per channel context, for the predictor-free mode.

use super::adaptive::AdaptiveModel;
use super::params::ModelParams;
use crate::coder::{RangeDecoder, SymbolSink};
use crate::dtype::DType;

/// Mantissa bits modelled adaptively; lower ones are close to uniform in practice.
const MODELLED_MANTISSA_BITS: u32 = 8;

#[derive(Debug, Clone)]
pub struct RawPatternModel {
    head: AdaptiveModel,
    mantissa: AdaptiveModel,
    mantissa_bits: u32,
    uniform_bits: u32,
}

impl RawPatternModel {
    pub fn new(dtype: DType, params: &ModelParams) -> RawPatternModel {
        let m = dtype.mantissa_bits();
        let modelled = m.min(MODELLED_MANTISSA_BITS);
        RawPatternModel {
            head: AdaptiveModel::new(1 << (dtype.bits() - m), params),
            mantissa: AdaptiveModel::new(1 << modelled, params),
            mantissa_bits: m,
            uniform_bits: m - modelled,
        }
    }

    #[inline]
    pub fn encode<S: SymbolSink>(&mut self, sink: &mut S, bits: u32) {
        self.head.encode(sink, (bits >> self.mantissa_bits) as usize);
        let mantissa = bits & ((1u32 << self.mantissa_bits) - 1);
        self.mantissa.encode(sink, (mantissa >> self.uniform_bits) as usize);
        sink.put_bits(mantissa & ((1u32 << self.uniform_bits) - 1), self.uniform_bits);
    }

    #[inline]
    pub fn decode(&mut self, dec: &mut RangeDecoder) -> u32 {
        let head = self.head.decode(dec) as u32;
        let top = self.mantissa.decode(dec) as u32;
        let low = dec.get_bits(self.uniform_bits);
        (head << self.mantissa_bits) | (top << self.uniform_bits) | low
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coder::RangeEncoder;

    #[test]
    fn every_pattern_round_trips() {
        let params = ModelParams::default();
        for dtype in DType::ALL {
            let patterns: Vec<u32> = if dtype.bits() <= 16 {
                (0..=dtype.mask()).collect()
            } else {
                [0u32, 0x8000_0000, 0x7F80_0000, 0xFF80_0000, 0x7FC0_0001, 0xFFBF_FFFF, 1, 0x807F_FFFF, 0x3F80_0000]
                    .to_vec()
            };
            let mut model = RawPatternModel::new(dtype, &params);
            let mut enc = RangeEncoder::new();
            for &p in &patterns {
                model.encode(&mut enc, p);
            }
            let bytes = enc.finish();
            let mut model = RawPatternModel::new(dtype, &params);
            let mut dec = RangeDecoder::new(&bytes);
            for &p in &patterns {
                assert_eq!(model.decode(&mut dec), p, "{dtype:?}");
            }
            assert!(dec.finished_cleanly());
        }
    }
}
