//! B3's raw bits: written least significant first, read in place.

/// Raw bits, least significant first. Fewer than 8 bits wait in `acc`; every `put` writes
/// the accumulator's 8 bytes past the end of `out` and keeps its whole bytes, so that it has no
/// branch on when a word is full (which bits flush is data: a branch on it mispredicted often).
pub(super) struct BitWriter {
    pub(super) acc: u64,
    pub(super) n: u32,
    pub(super) out: Vec<u8>,
}

impl BitWriter {
    /// Appends the `n` low bits of `v` (`v < 2^n`, `n <= 32`).
    #[inline(always)]
    pub(super) fn put(&mut self, v: u32, n: u32) {
        self.put_all(&[v], &[n]);
    }

    /// `put` of each `(v, n)` in turn, with the writer's fields in registers (through
    /// `&mut self`, every write to `out` could alias them, and one `put` at a time kept them
    /// in memory). Each value ORs into fewer than 8 waiting bits, at most 39 in all.
    #[inline(always)]
    pub(super) fn put_all<const N: usize>(&mut self, v: &[u32; N], n: &[u32; N]) {
        let (mut acc, mut bits) = (self.acc, self.n);
        let mut len = self.out.len();
        // each `put` keeps at most 4 whole bytes and writes 8 from where it keeps them
        self.out.reserve(4 * N + 8);
        let out = self.out.as_mut_ptr();
        for (&v, &n) in v.iter().zip(n) {
            debug_assert!(n <= 32 && (v as u64) < 1u64 << n);
            acc |= (v as u64) << bits;
            bits += n;
            // SAFETY: `len` has grown by at most 4 per value since the `reserve`, so the 8
            // bytes from it are inside the capacity.
            unsafe { (out.add(len) as *mut u64).write_unaligned(acc.to_le()) };
            len += (bits >> 3) as usize;
            acc >>= bits & !7;
            bits &= 7;
        }
        // SAFETY: the bytes up to `len` were written above (or before).
        unsafe { self.out.set_len(len) };
        (self.acc, self.n) = (acc, bits);
    }

    pub(super) fn finish(mut self) -> Vec<u8> {
        let bytes = self.n.div_ceil(8) as usize;
        self.out.extend_from_slice(&self.acc.to_le_bytes()[..bytes]);
        self.out
    }
}

/// Reads what `BitWriter` wrote; past the end it reads zeros (B5 then fails the chunk). The
/// chunk's bytes are read in place; only the last `TAIL` of them are copied, with `WINDOW`
/// zeros after, so that every read is one unaligned load without copying the chunk, and
/// `window` gives `WINDOW` bytes from any byte up to the chunk's end.
pub(super) struct BitReader<'a> {
    pub(super) bytes: &'a [u8],
    /// `bytes[tail_from..]` then zeros.
    pub(super) tail: [u8; TAIL + WINDOW],
    pub(super) tail_from: usize,
    pub(super) len_bits: usize,
    pub(super) pos: usize,
}

/// Bytes at the end of a chunk's raw bits that `BitReader` copies.
pub(super) const TAIL: usize = 64;
/// Bytes `BitReader::window` makes readable from its byte.
pub(super) const WINDOW: usize = 64;
const _: () = assert!(TAIL >= WINDOW);

impl<'a> BitReader<'a> {
    pub(super) fn new(bytes: &'a [u8]) -> BitReader<'a> {
        let tail_from = bytes.len().saturating_sub(TAIL);
        let mut tail = [0u8; TAIL + WINDOW];
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

    /// A pointer to byte `byte` (at most the chunk's length) with `WINDOW` bytes readable
    /// from it: the chunk's own, or near its end the tail's copy, zeros past the end.
    #[inline(always)]
    pub(super) fn window(&self, byte: usize) -> *const u8 {
        debug_assert!(byte <= self.bytes.len());
        if byte + WINDOW <= self.bytes.len() {
            // SAFETY: `byte + WINDOW <= len`: inside the chunk.
            unsafe { self.bytes.as_ptr().add(byte) }
        } else {
            // `byte > len - WINDOW >= tail_from` (`TAIL >= WINDOW`), or `tail_from` is 0: the
            // tail holds `bytes[byte..]` from `byte - tail_from <= TAIL`, then zeros up to
            // `TAIL + WINDOW`
            self.tail[byte - self.tail_from..].as_ptr()
        }
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
