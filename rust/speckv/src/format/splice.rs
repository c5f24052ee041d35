//! Streams cut and joined along the tensor's first dimension, by rewriting the header: a
//! codec can code a tensor slab by slab (a cache layer by layer, as its prediction comes)
//! and still write the one stream `encode` writes for the whole, and read back a few of its
//! chunks with a prediction of just those.
//!
//! What makes it exact: a chunk's payload and prediction fingerprint depend on its own
//! scalars, `mu` and sigma codes only (`prediction::codes_and_fingerprint`; a jointly coded
//! chunk adds its layers' parameter digests, which do not name the layers' positions,
//! `joint::Joint::digest`), never on where the chunk sits, except through the context of a
//! predictor-free scalar, `index % context_period` (`chunk::StreamModel::context`). A slab of
//! whole rows of a tensor of at least two dimensions starts at a multiple of its last
//! dimension, the context period, so that context is the same in the slab as in the whole.
//!
//! ```text
//! join([A: rows 0..a, whole chunks], [B: rows a..n])  ==  encode(rows 0..n)
//! cut(encode(rows 0..n), chunks i..j)                 ==  encode(the rows chunks i..j hold)
//! ```
//!
//! Payloads are copied as they are: their checksums are checked when they are decoded.

use std::ops::Range;

use crate::error::{invalid, Result};
use crate::format::header::{header_len, ChunkEntry, Header, FLAG_PREDICTED};
use crate::hash::Hasher;

/// Scalars in one row of the first dimension (a slab's unit), or an error for a tensor of
/// fewer than two dimensions (its context period is its length, which a slab changes).
fn row_scalars(h: &Header) -> Result<u64> {
    if h.shape.len() < 2 {
        return invalid("streams of tensors of fewer than two dimensions cannot be cut or joined");
    }
    Ok(h.shape[1..].iter().product())
}

/// Whether two streams were coded alike (everything but the first dimension and the chunks).
fn same_coding(a: &Header, b: &Header) -> bool {
    a.version == b.version
        && a.flags == b.flags
        && a.dtype == b.dtype
        && a.shape[1..] == b.shape[1..]
        && a.chunk_scalars == b.chunk_scalars
        && a.lanes == b.lanes
        && a.params == b.params
        && a.raw_contexts == b.raw_contexts
        && a.token_scale == b.token_scale
        && a.context_period == b.context_period
        && a.table_digest == b.table_digest
}

/// The stream of `template`'s coding with `rows` first-dimension rows of `row` scalars and the
/// chunks `pieces` (each a stream's bytes and the index entries of its chunks to take, in order).
fn write(template: &Header, rows: u64, row: u64, pieces: &[(&[u8], &[ChunkEntry])]) -> Vec<u8> {
    let n_chunks: usize = pieces.iter().map(|(_, c)| c.len()).sum();
    let mut shape = template.shape.clone();
    shape[0] = rows;
    let mut header = Header {
        shape,
        n_scalars: rows * row,
        fingerprint: 0,
        chunks: Vec::with_capacity(n_chunks),
        ..template.clone()
    };
    let mut offset = header_len(header.shape.len(), n_chunks) as u64;
    for &(_, chunks) in pieces {
        for c in chunks {
            header.chunks.push(ChunkEntry { offset, ..*c });
            offset += c.length as u64;
        }
    }
    if header.flags & FLAG_PREDICTED != 0 {
        // as `codec::write_stream` computes it
        let mut h = Hasher::new();
        for c in &header.chunks {
            h.update(&c.fingerprint.to_le_bytes());
        }
        header.fingerprint = h.finish();
    }
    let mut out = header.write();
    out.reserve_exact(offset as usize - out.len());
    for &(bytes, chunks) in pieces {
        for c in chunks {
            out.extend_from_slice(&bytes[c.offset as usize..c.offset as usize + c.length as usize]);
        }
    }
    out
}

/// Joins streams of consecutive slabs of one tensor (split along its first dimension) into
/// the stream `encode` writes for the whole: they must be coded alike (dtype, flags, model
/// parameters, chunk size, the other dimensions) and every one but the last must hold whole
/// chunks.
pub fn join(streams: &[&[u8]]) -> Result<Vec<u8>> {
    if streams.is_empty() {
        return invalid("join: no streams given");
    }
    let headers = streams.iter().map(|s| Header::parse(s)).collect::<Result<Vec<Header>>>()?;
    let template = &headers[0];
    let row = row_scalars(template)?;
    let mut rows = 0u64;
    for (i, h) in headers.iter().enumerate() {
        if h.shape.len() != template.shape.len() || !same_coding(template, h) {
            return invalid(format!("join: stream {i} is not coded like stream 0 (or holds other rows)"));
        }
        if i + 1 < headers.len() && !h.n_scalars.is_multiple_of(h.chunk_scalars as u64) {
            return invalid(format!("join: stream {i} ends inside a chunk; only the last may"));
        }
        rows = rows
            .checked_add(h.shape[0])
            .filter(|r| r.checked_mul(row).is_some_and(|n| n <= crate::format::header::MAX_SCALARS))
            .ok_or_else(|| crate::error::Error::InvalidArgument("join: the joined tensor is too large".into()))?;
    }
    let pieces: Vec<(&[u8], &[ChunkEntry])> =
        streams.iter().zip(&headers).map(|(s, h)| (*s, h.chunks.as_slice())).collect();
    Ok(write(template, rows, row, &pieces))
}

/// Chunks `chunks` of `stream` as a stream of their own: the rows of the first dimension they
/// hold, decodable with a prediction of just those rows. The range must start and end on row
/// boundaries.
pub fn cut(stream: &[u8], chunks: Range<usize>) -> Result<Vec<u8>> {
    let h = Header::parse(stream)?;
    let row = row_scalars(&h)?;
    if chunks.start > chunks.end || chunks.end > h.chunks.len() {
        return invalid(format!("cut: chunks {chunks:?} are not within the stream's {} chunks", h.chunks.len()));
    }
    let (start, end) = if chunks.is_empty() {
        (0, 0)
    } else {
        (h.chunk_scalar_range(chunks.start).start as u64, h.chunk_scalar_range(chunks.end - 1).end as u64)
    };
    if row == 0 || !start.is_multiple_of(row) || !end.is_multiple_of(row) {
        return invalid(format!("cut: chunks {chunks:?} do not start and end on rows of {row} scalars"));
    }
    Ok(write(&h, (end - start) / row, row, &[(stream, &h.chunks[chunks])]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{encode, EncodeOptions};
    use crate::dtype::DType;
    use crate::prediction::{Prediction, SigmaCodes};
    use crate::words::Bits;

    fn stream(rows: std::ops::Range<usize>, predicted: bool, chunk: u32) -> Vec<u8> {
        let (cols, inner) = (3usize, 8usize);
        let scalars = rows.start * cols * inner..rows.end * cols * inner;
        let words: Vec<u16> = scalars.clone().map(|i| (0x3F80 + (i * 2654435761 % 97)) as u16).collect();
        let mu: Vec<f32> = scalars.map(|i| 1.0 + (i % 7) as f32 * 0.01).collect();
        let codes = [-16i16];
        let shape = [rows.len() as u64, cols as u64, inner as u64];
        let dims: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
        let sigma = SigmaCodes::scalar(&codes, &dims).unwrap();
        let p = Prediction { mu: &mu, sigma, joint: None };
        let options = EncodeOptions { chunk_scalars: chunk, ..Default::default() };
        encode(Bits::U16(&words), DType::BFloat16, &shape, predicted.then_some(&p), &options).unwrap()
    }

    #[test]
    fn joined_slabs_are_the_whole_stream() {
        for predicted in [true, false] {
            // rows of 24 scalars, chunks of 48: slabs of even rows hold whole chunks
            let whole = stream(0..7, predicted, 48);
            let parts = [stream(0..2, predicted, 48), stream(2..6, predicted, 48), stream(6..7, predicted, 48)];
            let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
            assert_eq!(join(&refs).unwrap(), whole, "predicted: {predicted}");
            assert_eq!(cut(&whole, 1..3).unwrap(), parts[1]);
            assert_eq!(cut(&whole, 3..4).unwrap(), parts[2]);
            assert_eq!(join(&[&whole[..]]).unwrap(), whole);
        }
    }

    #[test]
    fn misfits_are_refused() {
        let a = stream(0..1, true, 48); // half a chunk
        let b = stream(1..3, true, 48);
        assert!(join(&[&a, &b]).is_err(), "a slab ending inside a chunk");
        assert!(join(&[&stream(0..2, true, 48), &stream(2..4, false, 48)]).is_err(), "coded otherwise");
        assert!(join(&[&stream(0..2, true, 48), &stream(2..4, true, 24)]).is_err(), "other chunks");
        assert!(join(&[]).is_err());
        let odd = stream(0..4, true, 36); // chunks of 1.5 rows
        assert!(cut(&odd, 0..1).is_err(), "a chunk ending inside a row");
        assert!(cut(&odd, 0..2).is_ok());
        assert!(cut(&odd, 2..5).is_err(), "past the end");
        let flat = encode(Bits::U16(&[1, 2, 3]), DType::BFloat16, &[3], None, &EncodeOptions::default()).unwrap();
        assert!(cut(&flat, 0..1).is_err() && join(&[&flat]).is_err(), "one dimension");
        assert!(join(&[&b"SPKV"[..]]).is_err(), "not a stream");
    }
}
