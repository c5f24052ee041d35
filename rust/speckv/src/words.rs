//! Typed views of the scalars' bit patterns: one, two or four bytes each.

use crate::dtype::{ordinal_of, pattern_of, DType};
use crate::error::{invalid, Result};

/// An element type holding one bit pattern.
pub trait Word: Copy + Send + Sync + Default + 'static {
    /// Width of the pattern, which is also the dtype's width.
    const BITS: u32;
    fn to_u32(self) -> u32;

    /// Signed ordinal of the pattern (see `DType::ordinal`).
    #[inline(always)]
    fn ordinal(self) -> i64 {
        ordinal_of(self.to_u32(), Self::BITS)
    }

    /// Inverse of `ordinal`; out-of-range ordinals wrap onto some pattern.
    #[inline(always)]
    fn from_ordinal(ord: i64) -> Self {
        Self::from_u32(pattern_of(ord, Self::BITS))
    }

    fn from_u32(v: u32) -> Self;
}

macro_rules! impl_word {
    ($t:ty) => {
        impl Word for $t {
            const BITS: u32 = <$t>::BITS;
            #[inline(always)]
            fn to_u32(self) -> u32 {
                self as u32
            }
            #[inline(always)]
            fn from_u32(v: u32) -> Self {
                v as $t
            }
        }
    };
}
impl_word!(u8);
impl_word!(u16);
impl_word!(u32);

/// Read-only bit patterns of a whole tensor, in C order.
#[derive(Debug, Clone, Copy)]
pub enum Bits<'a> {
    U8(&'a [u8]),
    U16(&'a [u16]),
    U32(&'a [u32]),
}

/// Writable bit patterns of a whole tensor, in C order.
#[derive(Debug)]
pub enum BitsMut<'a> {
    U8(&'a mut [u8]),
    U16(&'a mut [u16]),
    U32(&'a mut [u32]),
}

impl Bits<'_> {
    pub fn len(&self) -> usize {
        match self {
            Bits::U8(s) => s.len(),
            Bits::U16(s) => s.len(),
            Bits::U32(s) => s.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn width_bits(&self) -> u32 {
        match self {
            Bits::U8(_) => 8,
            Bits::U16(_) => 16,
            Bits::U32(_) => 32,
        }
    }

    /// Checks that these patterns can hold `dtype` and has `n` elements; `what` names the
    /// argument in the error.
    pub fn check(&self, dtype: DType, n: usize, what: &str) -> Result<()> {
        if self.width_bits() != dtype.bits() {
            return invalid(format!(
                "{what}: {}-bit words given for {} ({} bits)",
                self.width_bits(),
                dtype.name(),
                dtype.bits()
            ));
        }
        if self.len() != n {
            return invalid(format!("{what}: {} elements given, {n} expected", self.len()));
        }
        Ok(())
    }
}

impl BitsMut<'_> {
    pub fn len(&self) -> usize {
        match self {
            BitsMut::U8(s) => s.len(),
            BitsMut::U16(s) => s.len(),
            BitsMut::U32(s) => s.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn width_bits(&self) -> u32 {
        match self {
            BitsMut::U8(_) => 8,
            BitsMut::U16(_) => 16,
            BitsMut::U32(_) => 32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn word_ordinals_match_dtype_ordinals() {
        for bits in 0..=u16::MAX {
            assert_eq!(bits.ordinal(), DType::BFloat16.ordinal(bits as u32));
            assert_eq!(u16::from_ordinal(bits.ordinal()), bits);
        }
        for bits in 0..=u8::MAX {
            assert_eq!(bits.ordinal(), DType::Float8E4M3Fn.ordinal(bits as u32));
            assert_eq!(u8::from_ordinal(bits.ordinal()), bits);
        }
        for bits in [0u32, 1, 0x7F80_0000, 0x8000_0000, 0xFFFF_FFFF, 0x3F80_0001] {
            assert_eq!(bits.ordinal(), DType::Float32.ordinal(bits));
            assert_eq!(u32::from_ordinal(bits.ordinal()), bits);
        }
    }
}
