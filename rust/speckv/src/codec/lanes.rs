//! How a chunk's lanes are framed in its payload (format versions 1 and 2).

use crate::coder::{RangeDecoder, RangeEncoder};

/// A chunk's payload (format version 2): the lengths in bytes of every lane but the last, as
/// LEB128 varints (two or three bytes for a typical lane instead of four), then every lane's
/// coded bytes (see `chunk`; a lane's last word may be short, `RangeEncoder::finish`).
pub(super) fn join_lanes<const N: usize>(lanes: [RangeEncoder; N]) -> Vec<u8> {
    let words = lanes.map(RangeEncoder::finish);
    let mut out = Vec::with_capacity(5 * (N - 1) + words.iter().map(Vec::len).sum::<usize>());
    for w in &words[..N - 1] {
        let mut len = w.len() as u32;
        while len >= 0x80 {
            out.push(len as u8 | 0x80);
            len >>= 7;
        }
        out.push(len as u8);
    }
    for w in &words {
        out.extend_from_slice(w);
    }
    out
}

/// Reads a LEB128 varint of at most 5 bytes that fits a u32, advancing `bytes`.
fn read_varint(bytes: &mut &[u8]) -> Option<u32> {
    let mut value = 0u64;
    for i in 0..5 {
        let (&b, rest) = bytes.split_first()?;
        *bytes = rest;
        value |= ((b & 0x7F) as u64) << (7 * i);
        if b & 0x80 == 0 {
            return u32::try_from(value).ok();
        }
    }
    None
}

/// Inverse of `join_lanes` (and of version 1's `[lane-0 length in bytes: u32 LE]` layout):
/// `None` when the lengths do not fit the payload.
pub(super) fn split_lanes<const N: usize>(payload: &[u8], version: u16) -> Option<[RangeDecoder<'_>; N]> {
    let mut rest = payload;
    let mut lengths = [0usize; N];
    for len in lengths.iter_mut().take(N - 1) {
        *len = if version == 1 {
            let head: [u8; 4] = rest.get(..4)?.try_into().ok()?;
            rest = &rest[4..];
            u32::from_le_bytes(head) as usize
        } else {
            read_varint(&mut rest)? as usize
        };
    }
    let mut parts: [&[u8]; N] = [&[]; N];
    for (i, part) in parts.iter_mut().enumerate() {
        let len = if i + 1 < N { lengths[i] } else { rest.len() };
        // Version 1 lanes are whole words; version 2 lanes may end in a short word.
        if (version == 1 && !len.is_multiple_of(4)) || len > rest.len() {
            return None;
        }
        (*part, rest) = rest.split_at(len);
    }
    Some(parts.map(RangeDecoder::new))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coder::SymbolSink;

    /// Lanes of `counts[i]` raw 16-bit values each (lane `i`'s `k`-th is `i * 1000 + k`).
    fn lanes<const N: usize>(counts: [u32; N]) -> [RangeEncoder; N] {
        std::array::from_fn(|i| {
            let mut e = RangeEncoder::new();
            for k in 0..counts[i] {
                e.put_bits((i as u32 * 1000 + k) & 0xFFFF, 16);
            }
            e
        })
    }

    fn read_back<const N: usize>(decoders: &mut [RangeDecoder<'_>; N], counts: [u32; N]) {
        for (i, d) in decoders.iter_mut().enumerate() {
            for k in 0..counts[i] {
                assert_eq!(d.get_bits(16), (i as u32 * 1000 + k) & 0xFFFF, "lane {i} value {k}");
            }
            assert!(d.finished_cleanly(), "lane {i}");
        }
    }

    #[test]
    fn lanes_framed_by_varints_split_back_into_the_same_lanes() {
        // empty, short and long lanes: one- to three-byte varints
        for counts in [[0, 0, 0, 0], [1, 70, 0, 3], [9000, 1, 40_000, 2], [64, 63, 65, 200]] {
            let payload = join_lanes(lanes(counts));
            let mut decoders = split_lanes::<4>(&payload, 2).expect("a payload join_lanes wrote");
            read_back(&mut decoders, counts);
        }
    }

    #[test]
    fn a_varint_is_read_to_its_end_and_refused_past_five_bytes_or_u32() {
        let mut bytes: &[u8] = &[0xE5, 0x8E, 0x26, 0x01];
        assert_eq!(read_varint(&mut bytes), Some(624_485));
        assert_eq!(bytes, &[0x01]);
        let mut max: &[u8] = &[0xFF, 0xFF, 0xFF, 0xFF, 0x0F];
        assert_eq!(read_varint(&mut max), Some(u32::MAX));
        for bad in [&[0xFF, 0xFF, 0xFF, 0xFF, 0x10][..], &[0x80; 6], &[0x80, 0x80]] {
            let mut b = bad;
            assert_eq!(read_varint(&mut b), None, "{bad:?}");
        }
    }

    #[test]
    fn version_1_payloads_hold_whole_words_after_a_u32_length() {
        // version 1: `[lane-0 length: u32 LE]`, then whole 4-byte words per lane
        let mut payload = 8u32.to_le_bytes().to_vec();
        payload.extend([0u8; 8 + 12]);
        assert!(split_lanes::<2>(&payload, 1).is_some());
        assert!(split_lanes::<2>(&payload[..payload.len() - 2], 1).is_none(), "lane 1 of 10 bytes");
        let mut short = 3u32.to_le_bytes().to_vec();
        short.extend([0u8; 8]);
        assert!(split_lanes::<2>(&short, 1).is_none(), "a lane of 3 bytes is not whole words");
        assert!(split_lanes::<2>(&payload[..3], 1).is_none(), "a length cut short");
    }

    #[test]
    fn lengths_past_the_payload_are_refused() {
        let payload = join_lanes(lanes([10, 10, 10, 10]));
        let mut lying = payload.clone();
        lying[0] = 0x7F; // lane 0 claims 127 bytes
        assert!(split_lanes::<4>(&lying[..20.min(lying.len())], 2).is_none());
        assert!(split_lanes::<4>(&[0x80], 2).is_none(), "a varint cut short");
        assert!(split_lanes::<4>(&payload[..1], 2).is_none());
    }
}
