//! The floating-point formats a stream can hold, and the integer views of their bit patterns.
//!
//! Everything the coder does happens on bit patterns, never on float values: a value is its
//! pattern, and "closeness" is the distance between *ordinals*, a signed integer that sorts like
//! the value (`ord(-0) = -1`, `ord(+0) = 0`, NaNs sort beyond the infinities). Near a prediction
//! `mu`, neighbouring floats are one ulp apart, so `ord(x) - ord(mu)` counts ulps.

use crate::error::{Error, Result};

/// A storage format of the coded scalars. The discriminant is the byte stored in the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DType {
    BFloat16 = 1,
    Float16 = 2,
    Float8E4M3Fn = 3,
    Float8E5M2 = 4,
    Float32 = 5,
}

impl DType {
    pub const ALL: [DType; 5] =
        [DType::BFloat16, DType::Float16, DType::Float8E4M3Fn, DType::Float8E5M2, DType::Float32];

    pub fn from_code(code: u8) -> Result<DType> {
        DType::ALL
            .into_iter()
            .find(|d| *d as u8 == code)
            .ok_or_else(|| Error::Unsupported(format!("unknown dtype code {code}")))
    }

    /// The name numpy / ml_dtypes use for it.
    pub fn name(self) -> &'static str {
        match self {
            DType::BFloat16 => "bfloat16",
            DType::Float16 => "float16",
            DType::Float8E4M3Fn => "float8_e4m3fn",
            DType::Float8E5M2 => "float8_e5m2",
            DType::Float32 => "float32",
        }
    }

    pub fn from_name(name: &str) -> Result<DType> {
        DType::ALL
            .into_iter()
            .find(|d| d.name() == name)
            .ok_or_else(|| Error::InvalidArgument(format!("unsupported dtype {name:?}")))
    }

    /// Bits in one scalar.
    pub fn bits(self) -> u32 {
        match self {
            DType::BFloat16 | DType::Float16 => 16,
            DType::Float8E4M3Fn | DType::Float8E5M2 => 8,
            DType::Float32 => 32,
        }
    }

    pub fn bytes(self) -> usize {
        self.bits() as usize / 8
    }

    /// Explicit mantissa (fraction) bits.
    pub fn mantissa_bits(self) -> u32 {
        match self {
            DType::BFloat16 => 7,
            DType::Float16 => 10,
            DType::Float8E4M3Fn => 3,
            DType::Float8E5M2 => 2,
            DType::Float32 => 23,
        }
    }

    pub fn exponent_bits(self) -> u32 {
        self.bits() - 1 - self.mantissa_bits()
    }

    pub fn exponent_bias(self) -> i32 {
        (1 << (self.exponent_bits() - 1)) - 1
    }

    /// All-ones mask of one scalar's bits.
    #[inline(always)]
    pub fn mask(self) -> u32 {
        if self.bits() == 32 {
            u32::MAX
        } else {
            (1u32 << self.bits()) - 1
        }
    }

    /// Signed ordinal of a bit pattern: monotone in the value for non-NaN patterns.
    #[inline(always)]
    pub fn ordinal(self, bits: u32) -> i64 {
        ordinal_of(bits, self.bits())
    }

    /// Inverse of [`DType::ordinal`]. Ordinals outside the format's range wrap (only a corrupt
    /// stream can produce them, and the chunk checksum reports it).
    #[inline(always)]
    pub fn from_ordinal(self, ord: i64) -> u32 {
        pattern_of(ord, self.bits())
    }

    /// The biased exponent field of a pattern.
    #[inline(always)]
    pub fn exponent_field(self, bits: u32) -> u32 {
        (bits >> self.mantissa_bits()) & ((1 << self.exponent_bits()) - 1)
    }

    /// log2 of the spacing between a value with this exponent field and its neighbours.
    /// Subnormals share the spacing of the smallest normal binade.
    pub fn ulp_log2(self, exponent_field: u32) -> i32 {
        exponent_field.max(1) as i32 - self.exponent_bias() - self.mantissa_bits() as i32
    }
}

/// Ordinal of a `width`-bit sign-magnitude pattern, without branches: a negative pattern's
/// ordinal `-magnitude - 1` is the bitwise complement of its magnitude.
#[inline(always)]
pub(crate) fn ordinal_of(bits: u32, width: u32) -> i64 {
    let bits = bits as i64;
    let sign = -((bits >> (width - 1)) & 1);
    (bits & ((1i64 << (width - 1)) - 1)) ^ sign
}

/// Inverse of `ordinal_of`; out-of-range ordinals wrap onto some pattern.
#[inline(always)]
pub(crate) fn pattern_of(ord: i64, width: u32) -> u32 {
    let sign = ord >> 63;
    let magnitude = (ord ^ sign) & ((1i64 << (width - 1)) - 1);
    (magnitude | (sign & (1i64 << (width - 1)))) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinal_round_trips_every_pattern_and_sorts_like_values() {
        for dtype in [DType::BFloat16, DType::Float16, DType::Float8E4M3Fn, DType::Float8E5M2] {
            for bits in 0..=dtype.mask() {
                assert_eq!(dtype.from_ordinal(dtype.ordinal(bits)), bits);
            }
        }
        let f32_ord = |v: f32| DType::Float32.ordinal(v.to_bits());
        let values = [f32::NEG_INFINITY, -1.5, -1e-40, -0.0, 0.0, 1e-40, 1.0, 1.0000001, f32::INFINITY];
        for w in values.windows(2) {
            assert!(f32_ord(w[0]) < f32_ord(w[1]), "{} !< {}", w[0], w[1]);
        }
        assert_eq!(f32_ord(1.0000001) - f32_ord(1.0), 1);
    }

    #[test]
    fn ulp_matches_the_spacing_of_neighbours() {
        let one = 1.0f32.to_bits();
        let e = DType::Float32.exponent_field(one);
        assert_eq!(DType::Float32.ulp_log2(e), -23);
        // bf16: 1.0 = 0x3F80, next = 0x3F81 = 1 + 2^-7
        assert_eq!(DType::BFloat16.ulp_log2(DType::BFloat16.exponent_field(0x3F80)), -7);
        // subnormals and the smallest normals share a spacing
        assert_eq!(DType::Float16.ulp_log2(0), DType::Float16.ulp_log2(1));
    }

    #[test]
    fn dtype_codes_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_code(d as u8).unwrap(), d);
            assert_eq!(DType::from_name(d.name()).unwrap(), d);
        }
        assert!(DType::from_code(0).is_err());
        assert!(DType::from_name("float64").is_err());
    }
}
