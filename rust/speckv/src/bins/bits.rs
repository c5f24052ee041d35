//! B3's raw bits: written least significant first, read in place.

/// Raw bits, least significant first.
pub(super) struct BitWriter {
    pub(super) acc: u64,
    pub(super) n: u32,
    pub(super) out: Vec<u8>,
}

impl BitWriter {
    #[inline(always)]
    pub(super) fn put(&mut self, v: u32, n: u32) {
        self.acc |= (v as u64) << self.n;
        self.n += n;
        if self.n >= 32 {
            self.out.extend_from_slice(&(self.acc as u32).to_le_bytes());
            self.acc >>= 32;
            self.n -= 32;
        }
    }

    pub(super) fn finish(mut self) -> Vec<u8> {
        let bytes = self.n.div_ceil(8) as usize;
        self.out.extend_from_slice(&self.acc.to_le_bytes()[..bytes]);
        self.out
    }
}

/// Reads what `BitWriter` wrote; past the end it reads zeros (B5 then fails the chunk). The
/// chunk's bytes are read in place; only the last `TAIL` of them are copied, with zeros after,
/// so that every read is one unaligned load without copying the chunk.
pub(super) struct BitReader<'a> {
    pub(super) bytes: &'a [u8],
    /// `bytes[tail_from..]` then zeros.
    pub(super) tail: [u8; TAIL + 8],
    pub(super) tail_from: usize,
    pub(super) len_bits: usize,
    pub(super) pos: usize,
}

/// Bytes at the end of a chunk's raw bits that `BitReader` copies.
pub(super) const TAIL: usize = 64;

impl<'a> BitReader<'a> {
    pub(super) fn new(bytes: &'a [u8]) -> BitReader<'a> {
        let tail_from = bytes.len().saturating_sub(TAIL);
        let mut tail = [0u8; TAIL + 8];
        tail[..bytes.len() - tail_from].copy_from_slice(&bytes[tail_from..]);
        BitReader { bytes, tail, tail_from, len_bits: bytes.len() * 8, pos: 0 }
    }

    /// The 32 bits (or more) from bit `at` on.
    #[inline(always)]
    pub(super) fn peek_at(&self, at: usize) -> u64 {
        let byte = at >> 3;
        let word = if byte + 8 <= self.bytes.len() {
            u64::from_le_bytes(self.bytes[byte..byte + 8].try_into().unwrap())
        } else if byte >= self.bytes.len() {
            0
        } else {
            // within the last 8 bytes, which the tail holds (`TAIL >= 8`), zeros after
            let i = byte - self.tail_from;
            u64::from_le_bytes(self.tail[i..i + 8].try_into().unwrap())
        };
        word >> (at & 7)
    }

    /// `n <= 32` bits from bit `*at` on, moving `*at` past them.
    #[inline(always)]
    pub(super) fn read_at(&self, at: &mut usize, n: u32) -> u32 {
        let v = (self.peek_at(*at) & ((1u64 << n) - 1)) as u32;
        *at += n as usize;
        v
    }

    /// B5: every bit read, the rest of the last byte zero.
    pub(super) fn finished_cleanly(&self) -> bool {
        self.pos <= self.len_bits
            && self.len_bits - self.pos < 8
            && (self.len_bits == self.pos || self.bytes[self.pos >> 3] >> (self.pos & 7) == 0)
    }
}
