//! Typed views of the scalars' bit patterns: one, two or four bytes each.

use crate::dtype::DType;
use crate::error::{invalid, Result};

/// An element type holding one bit pattern.
pub trait Word: Copy + Send + Sync + Default + 'static {
    fn to_u32(self) -> u32;
    fn from_u32(v: u32) -> Self;
    fn as_bytes(slice: &[Self]) -> &[u8];
}

macro_rules! impl_word {
    ($t:ty) => {
        impl Word for $t {
            #[inline(always)]
            fn to_u32(self) -> u32 {
                self as u32
            }
            #[inline(always)]
            fn from_u32(v: u32) -> Self {
                v as $t
            }
            fn as_bytes(slice: &[Self]) -> &[u8] {
                // SAFETY:
                // - the pointer and length come from a valid slice of `$t`, a plain integer
                //   type with no padding and no invalid bit patterns, so every byte is
                //   initialised and readable as `u8`;
                // - `u8` has alignment 1, and the byte length `size_of_val(slice)` cannot
                //   overflow because the slice already occupies that many bytes;
                // - the returned slice borrows `slice`, so it cannot outlive the data.
                unsafe { std::slice::from_raw_parts(slice.as_ptr() as *const u8, std::mem::size_of_val(slice)) }
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
            return invalid(format!("{what}: {}-bit words given for {} ({} bits)", self.width_bits(), dtype.name(), dtype.bits()));
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
