//! The fast lane: predictor-free coding of 8- and 16-bit formats with static tables, so that
//! decoding is table lookups and a multiply per scalar (format version 3, `FLAG_FAST_LANE`).
//!
//! The adaptive predictor-free model (`model::raw`) updates its counts after every scalar and
//! decodes through a range coder's division; this lane instead fixes, per chunk, a few tables
//! built from the chunk's own data, and codes with interleaved rANS (Duda's asymmetric numeral
//! systems) whose decoder has no division and no data-dependent branch.
//!
//! A scalar's pattern `w` of `W` bits splits into a symbol `h = w >> R` (the top `S` bits: sign
//! and exponent, for 16-bit formats also the top mantissa bits of float16) and `R` low bits
//! that are nearly uniform and go through the coder raw (`Split`). Channels differ: a KV cache
//! holds a few channels with large values and many with small ones, so each channel (scalar
//! `i` of the stream is channel `i mod period`, the period being the tensor's last dimension
//! unless told otherwise) codes its symbols with one of up to `MAX_TABLES` tables, the
//! encoder grouping channels whose symbol distributions are alike (`cluster`).
//!
//! # Invariants (cited as F1-F4)
//!
//! * **F1 (the step).** A state `x` lies in `[2^16, 2^32)` between symbols. With `B = P + R`
//!   (table precision plus raw bits, `B <= 16`), decoding takes `s = x mod 2^B`, looks up the
//!   table entry of slot `s >> R` (the symbol `h`, its frequency `f`, and `j`, the slot's rank
//!   among `h`'s slots), outputs `h << R | (s mod 2^R)`, and sets `x = f * (x >> B) + j`; if
//!   then `x < 2^16` it reads one 16-bit word: `x = x << 16 | word`. Encoding is the exact
//!   inverse, run backwards: if `x >= f << (32 - B)` it writes `x mod 2^16` and shifts `x`
//!   right by 16, then `x = (x / f) << B | (c + x mod f) << R | low`, `c` being `h`'s first
//!   slot. So one word at most per scalar, on either side.
//! * **F2 (the order).** Scalar `j` of a chunk goes to state `j mod STATES`; the decoder
//!   takes scalars in increasing `j`, each decoded and then renormalised, so words are read in
//!   scalar order. A vector kernel decodes sixteen consecutive scalars and then renormalises
//!   them in lane order: the same words in the same order, hence the same output, whatever
//!   the kernel or thread count.
//! * **F3 (the tables).** A table's frequencies are each at least 1, sum to `2^P`, and cover at
//!   least two symbols, so every slot decodes to some symbol (damaged bytes decode to wrong
//!   values, never out of bounds) and every scalar costs at least `-log2(1 - 2^-P)` bits,
//!   which keeps the header's bound on scalars per byte. `P >= S`, so a table can hold every
//!   symbol: any bit pattern is codable.
//! * **F4 (the ends).** Every state starts encoding at `2^16`; the decoder, started from the
//!   encoder's final states, must end with every state at `2^16` and every word read, else the
//!   chunk is corrupt.
//!
//! # Chunk payload (little-endian)
//!
//! ```text
//! offset  size            field
//! 0       1               G: tables (1..=MAX_TABLES)
//! 1       1               reserved, 0
//! 2       ..              G tables, each: n (u16, 2..=2^S), then n pairs (LEB128 each):
//!                         symbol (the first absolute, then the gap to the previous minus
//!                         one), frequency minus one
//! ..      ceil(K / 2)     table id of each of the K = min(period, scalars) channels the chunk
//!                         holds (channel k: scalars j with j mod K = k), 4 bits each, low
//!                         nibble first; an odd K leaves the last high nibble 0
//! ..      4 * STATES      the encoder's final states (u32 each)
//! ..      2 * words       the words (u16 each), in the order the decoder reads them
//! ```

use crate::dtype::DType;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod bytes;
mod clusters;
mod decoder;
mod encoder;
mod table;

use bytes::{bad, read_varint, take, write_varint};
pub use clusters::channels;
use clusters::{cluster, pool};
use decoder::vector_kernel;
pub(crate) use decoder::Chunk;
pub use decoder::{decode_chunk, kernel};
pub use encoder::encode_chunk;
use encoder::split_of;
use table::{log2_q16, Table};

/// Interleaved rANS states per chunk (two 16-lane vectors).
pub const STATES: usize = 32;
/// Most tables a chunk may hold (table ids are 4 bits).
pub const MAX_TABLES: usize = 16;
/// Tables the encoder aims for: more cost more table bytes than they save on a chunk of
/// `CHUNK_SCALARS` of a KV cache (measured on the demo model: 8 tables save ~0.3 b/s over one).
const TARGET_TABLES: usize = 8;
/// Scalars per chunk the fast lane is meant for: a 64K chunk keeps the tables' bytes near
/// 0.05 bit per scalar and is one head of a 1,024-token layer with 64 channels.
pub const CHUNK_SCALARS: u32 = 1 << 16;
/// The lower end of a state's range (F1), and every state's start and end (F4).
const LOW: u32 = 1 << 16;
/// The smallest payload a chunk can have: G, reserved, one table of two one-byte pairs, one
/// id byte, the states.
pub const MIN_CHUNK_LEN: usize = 2 + (2 + 4) + 1 + 4 * STATES;
/// Per-channel histograms are kept while `channels << S` stays within this; beyond it the
/// chunk uses one table.
const MAX_HISTOGRAM: usize = 1 << 20;

// A table entry (decoder side) packs `f - 1`, the slot's rank `j` and the symbol `h`.
const ENTRY_BITS: u32 = 11;
const ENTRY_MASK: u32 = (1 << ENTRY_BITS) - 1;
const SYMBOL_SHIFT: u32 = 2 * ENTRY_BITS;

/// How a dtype's patterns split into a coded symbol and raw low bits (module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Split {
    /// `S`: the symbol's bits (the pattern's top bits).
    pub symbol_bits: u32,
    /// `R`: the low bits, coded raw.
    pub raw_bits: u32,
    /// `P`: the tables' precision (frequencies sum to `2^P`).
    pub precision: u32,
}

impl Split {
    /// The split for `dtype`, or `None` where the lane does not apply (float32).
    pub fn of(dtype: DType) -> Option<Split> {
        Split::for_width(dtype.bits())
    }

    /// The split for patterns of `bits` bits: a function of the width alone, so the coding
    /// loops, monomorphised per word type, see constants.
    pub const fn for_width(bits: u32) -> Option<Split> {
        match bits {
            // sign and 8 exponent bits (bfloat16), or sign, 5 exponent and 3 mantissa bits
            // (float16). Measured on the demo model's caches: a 10-bit symbol (one more
            // mantissa bit) saves ~0.07 bit but doubles the tables' bytes, a wash at 8 tables
            // per 64K chunk; 9-bit precision costs ~0.014 bit more than 12-bit, the price of
            // folding the 7 raw bits into one 16-bit slot (F1)
            16 => Some(Split { symbol_bits: 9, raw_bits: 7, precision: 9 }),
            8 => Some(Split { symbol_bits: 8, raw_bits: 0, precision: 10 }),
            _ => None,
        }
    }

    fn slot_bits(self) -> u32 {
        self.precision + self.raw_bits
    }
}

#[cfg(test)]
mod tests {
    use super::decoder::{decode_from, parse_chunk};
    use super::encoder::{encode_with, Coding, Scratch};
    use super::table::log2_exact;
    use super::*;
    use crate::error::Error;
    use crate::words::Word;

    fn lcg(seed: u64) -> impl FnMut() -> u64 {
        let mut s = seed;
        move || {
            s = crate::test_env::lcg_step(s);
            s >> 33
        }
    }

    fn roundtrip<W: Word + PartialEq + std::fmt::Debug>(x: &[W], period: usize) -> usize {
        let split = split_of::<W>().unwrap();
        let bytes = encode_chunk(x, period).unwrap();
        let mut out = vec![W::default(); x.len()];
        decode_chunk(&bytes, period, &mut out).unwrap();
        assert_eq!(out, x);
        let mut portable = vec![W::default(); x.len()];
        let mut c = parse_chunk(&bytes, split, period, x.len()).unwrap();
        let pos = decode_from(&mut c, split, &mut portable, 0, 0).unwrap();
        assert_eq!(pos, c.n_words());
        assert_eq!(portable, x);
        bytes.len()
    }

    #[test]
    fn log2_is_exact_at_powers_of_two_and_close_elsewhere() {
        for e in 0..40 {
            assert_eq!(log2_exact(1 << e), e << 16);
            assert_eq!(log2_q16(1 << e), e << 16);
        }
        for x in [3u64, 5, 7, 1000, 65535, 123456789] {
            let want = (x as f64).log2() * 65536.0;
            assert!((log2_exact(x) as f64 - want).abs() <= 2.0, "{x}");
            assert!((log2_q16(x) as f64 - want).abs() <= 65536.0 / 700.0, "{x}");
        }
    }

    #[test]
    fn the_encoders_quotient_is_the_division_for_every_state() {
        let split = Split::of(DType::Float8E4M3Fn).unwrap();
        let mut next = lcg(11);
        for f in 1..1u32 << split.precision {
            let code = Coding::new(f, 0, split);
            let edges = [0u32, 1, f - 1, f, f + 1, u32::MAX, u32::MAX - 1, u32::MAX / f * f, (u32::MAX / f) * f - 1];
            for x in edges.into_iter().chain((0..200).map(|_| next() as u32 ^ (next() as u32) << 16)) {
                assert_eq!(code.quotient(x), x / f, "x = {x}, f = {f}");
            }
        }
    }

    #[test]
    fn quantized_tables_keep_every_symbol_and_sum_to_the_precision() {
        let split = Split::of(DType::BFloat16).unwrap();
        for counts in [vec![1u32; 512], vec![1000000, 1, 1, 1], vec![5], vec![0, 0, 7], vec![3, 0, 0, 0, 1000]] {
            let t = Table::from_counts(&counts, split);
            assert!(t.symbols.len() >= 2);
            assert_eq!(t.freqs.iter().map(|&f| f as u32).sum::<u32>(), 1 << split.precision);
            assert!(t.freqs.iter().all(|&f| f >= 1));
            for (s, &c) in counts.iter().enumerate() {
                assert!(c == 0 || t.symbols.contains(&(s as u16)));
            }
        }
    }

    #[test]
    fn the_vector_encoder_writes_the_portable_bytes() {
        if !crate::test_env::have("avx512", vector_kernel(), "no AVX-512 here, only the portable encoder runs") {
            return;
        }
        let mut next = lcg(5);
        for n in [32usize, 33, 64, 1000, 4096, 70001] {
            for period in [1usize, 7, 16, 64, 100] {
                let x: Vec<u16> = (0..n).map(|j| 0x3c00 + ((next() % 300) as u16) * (1 + (j % 3) as u16)).collect();
                let split = split_of::<u16>().unwrap();
                let portable = encode_with(&x, split, period, &mut Scratch::default(), false);
                assert_eq!(encode_with(&x, split, period, &mut Scratch::default(), true), portable, "{n} {period}");
                let y: Vec<u8> = x.iter().map(|&v| v as u8).collect();
                let split = split_of::<u8>().unwrap();
                let portable = encode_with(&y, split, period, &mut Scratch::default(), false);
                assert_eq!(encode_with(&y, split, period, &mut Scratch::default(), true), portable, "{n} {period}");
            }
        }
    }

    #[test]
    fn the_avx2_decoder_decodes_as_the_portable_code() {
        if !crate::test_env::have("avx2", is_x86_feature_detected!("avx2"), "no AVX2 here") {
            return;
        }
        /// One chunk of `x` through the AVX2 kernel and then the portable code.
        fn check<W: Word + PartialEq + std::fmt::Debug>(x: &[W], period: usize) {
            let split = split_of::<W>().unwrap();
            let bytes = encode_chunk(x, period).unwrap();
            let mut c = parse_chunk(&bytes, split, period, x.len()).unwrap();
            let mut out = vec![W::default(); x.len()];
            // SAFETY: the caller detected AVX2.
            let (done, pos) = unsafe { avx2::decode(&mut c, split, &mut out) };
            // 16-bit chunks carry enough words for the kernel's first step from 64 scalars on
            assert!(W::BITS != 16 || x.len() < 64 || done > 0, "the kernel did not run ({})", x.len());
            assert_eq!(decode_from(&mut c, split, &mut out, done, pos).unwrap(), c.n_words());
            assert_eq!(out, x, "{} {period}", x.len());
            assert!(c.states.iter().all(|&s| s == LOW));
        }
        let mut next = lcg(8);
        for n in [32usize, 64, 65, 1000, 4096, 70001] {
            for period in [1usize, 3, 16, 64, 100] {
                let x: Vec<u16> = (0..n).map(|j| 0x3c00 + ((next() % 300) as u16) * (1 + (j % 3) as u16)).collect();
                check(&x, period);
                check(&x.iter().map(|&v| v as u8).collect::<Vec<u8>>(), period);
            }
        }
    }

    #[test]
    fn float32_is_refused() {
        assert!(matches!(encode_chunk(&[1u32, 2], 1), Err(Error::InvalidArgument(_))));
        assert!(matches!(decode_chunk(&[0u8; 200], 1, &mut [0u32; 2]), Err(Error::InvalidArgument(_))));
    }

    #[test]
    fn every_pattern_and_length_round_trips() {
        let mut next = lcg(7);
        for n in [0usize, 1, 2, 15, 16, 17, 31, 32, 33, 63, 64, 65, 1000, 4099] {
            for period in [1usize, 3, 16, 64, 100] {
                let x: Vec<u16> = (0..n).map(|_| next() as u16).collect();
                roundtrip(&x, period);
                let y: Vec<u8> = (0..n).map(|_| next() as u8).collect();
                roundtrip(&y, period);
            }
        }
        let all: Vec<u16> = (0..=u16::MAX).collect();
        roundtrip(&all, 64);
        let all8: Vec<u8> = (0..=255u8).cycle().take(5000).collect();
        roundtrip(&all8, 7);
        // one value everywhere (F3's second symbol) and channels of different scales
        roundtrip(&vec![0x3f80u16; 70000], 64);
        roundtrip(&vec![0u8; 70000], 64);
        let scaled: Vec<u16> = (0..65536)
            .map(|j| {
                let v = ((next() % 2000) as f32 - 1000.0) * (1 + j % 64) as f32 * 1e-3;
                (v.to_bits() >> 16) as u16
            })
            .collect();
        let grouped = roundtrip(&scaled, 64);
        let single = roundtrip(&scaled, 1);
        assert!(grouped < single, "per-channel tables should pay here: {grouped} vs {single}");
    }

    #[test]
    fn damaged_chunks_are_refused_or_decode_without_panicking() {
        let mut next = lcg(3);
        let x: Vec<u16> = (0..3000).map(|_| 0x3c00 + (next() % 700) as u16).collect();
        let bytes = encode_chunk(&x, 64).unwrap();
        let mut out = vec![0u16; x.len()];
        for cut in [0, 1, 2, 5, bytes.len() / 2, bytes.len() - 1] {
            assert!(decode_chunk(&bytes[..cut], 64, &mut out).is_err());
        }
        let mut caught = 0;
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x5a;
            // must return (an error, or other values where F4 cannot see the flip: a
            // stream's chunk checksum catches those), never panic or read out of bounds
            caught += decode_chunk(&b, 64, &mut out).is_err() as usize;
        }
        assert!(caught > bytes.len() / 2, "F4 caught only {caught} of {} flips", bytes.len());
    }
}
