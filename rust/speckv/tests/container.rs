//! The cache container: layout round trip, layer addressing, and hostile bytes (every
//! truncation and single-byte change is refused with an error, never a panic).

use speckv::codec::EncodeOptions;
use speckv::format::container::{self, Container, StreamLayers, FLAG_LAYER_TOKENS, FLAG_PER_LAYER};
use speckv::{decode_chunks_into, encode, Bits, BitsMut, DType, Error};

mod common;

use common::{bf16, Rng};

const LAYERS: u64 = 3;
const HEADS: u64 = 2;
const DIM: u64 = 8;

/// A predictor-free stream of a block's keys or values, `[layers, 1, heads, tokens, dim]`,
/// `chunks_per_layer` chunks a layer; and its words.
fn block_stream(tokens: u64, chunks_per_layer: u64, seed: u64) -> (Vec<u8>, Vec<u16>) {
    let mut rng = Rng(seed);
    let shape = [LAYERS, 1, HEADS, tokens, DIM];
    let n: u64 = shape.iter().product();
    let x: Vec<u16> = (0..n).map(|_| bf16(rng.normal())).collect();
    let layer = n / LAYERS;
    let opts = EncodeOptions { chunk_scalars: (layer / chunks_per_layer) as u32, ..Default::default() };
    (encode(Bits::U16(&x), DType::BFloat16, &shape, None, &opts).unwrap(), x)
}

/// Two blocks (4 + 3 tokens) of keys and values.
fn sample() -> (Vec<u8>, Vec<Vec<u16>>) {
    let mut streams = Vec::new();
    let mut words = Vec::new();
    for (i, tokens) in [4, 4, 3, 3].into_iter().enumerate() {
        let (s, w) = block_stream(tokens, 2, i as u64);
        streams.push(s);
        words.push(w);
    }
    let refs: Vec<&[u8]> = streams.iter().map(|s| s.as_slice()).collect();
    (container::write(false, LAYERS as u32, 4, 7, None, b"{\"mode\":\"bf16\"}", &refs).unwrap(), words)
}

#[test]
fn a_container_addresses_every_block_layer_and_kv() {
    let (bytes, words) = sample();
    let c = Container::parse(&bytes).unwrap();
    assert_eq!((c.layers, c.block_tokens, c.tokens, c.blocks(), c.streams_per_block()), (3, 4, 7, 2, 2));
    assert_eq!(&bytes[c.metadata.clone()], b"{\"mode\":\"bf16\"}");
    assert_eq!(c.block_range(1), 4..7);
    for b in 0..2 {
        for kv in 0..2 {
            let entry = c.stream(b, kv).unwrap();
            assert_eq!(entry.layers, Some(StreamLayers::ChunksPerLayer(2)));
            let layer_len = words[2 * b + kv].len() / LAYERS as usize;
            for layer in 0..LAYERS {
                // one layer of one block, decoded alone
                let (chunks, skip) = entry.layers.unwrap().chunks_of(layer);
                assert_eq!(skip, 0);
                let mut out = vec![0u16; layer_len];
                let stream = &bytes[entry.range.clone()];
                let range = Some(chunks.start as usize..chunks.end as usize);
                decode_chunks_into(stream, BitsMut::U16(&mut out), None, 1, range).unwrap();
                let l = layer as usize;
                assert_eq!(out, words[2 * b + kv][l * layer_len..(l + 1) * layer_len]);
            }
        }
    }
}

#[test]
fn layers_per_chunk_streams_address_their_layers() {
    let (s, _) = block_stream(4, 1, 9);
    let whole = EncodeOptions { chunk_scalars: (2 * HEADS * 4 * DIM) as u32, ..Default::default() };
    let mut rng = Rng(3);
    let x: Vec<u16> = (0..LAYERS * HEADS * 4 * DIM).map(|_| bf16(rng.normal())).collect();
    let two = encode(Bits::U16(&x), DType::BFloat16, &[LAYERS, 1, HEADS, 4, DIM], None, &whole).unwrap();
    let bytes = container::write(false, LAYERS as u32, 4, 4, None, b"", &[&two, &s]).unwrap();
    let c = Container::parse(&bytes).unwrap();
    let layers = c.stream(0, 0).unwrap().layers.unwrap();
    assert_eq!(layers, StreamLayers::LayersPerChunk(2));
    assert_eq!(layers.chunks_of(2), (1..2, 0));
    assert_eq!(layers.chunks_of(1), (0..1, 1));
}

#[test]
fn the_writer_refuses_streams_that_do_not_fit_the_layout() {
    let (s4, _) = block_stream(4, 1, 1);
    let (s3, _) = block_stream(3, 1, 2);
    // wrong count, wrong token count, per-layer flag with stacked streams, chunks straddling
    let cases: Vec<(bool, u64, Vec<&[u8]>)> =
        vec![(false, 4, vec![&s4]), (false, 4, vec![&s4, &s3]), (true, 4, vec![&s4; 6]), (false, 8, vec![&s4; 2])];
    for (per_layer, tokens, streams) in cases {
        let r = container::write(per_layer, LAYERS as u32, 4, tokens, None, b"", &streams);
        assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
    }
    let mut rng = Rng(5);
    let x: Vec<u16> = (0..LAYERS * HEADS * 4 * DIM).map(|_| bf16(rng.normal())).collect();
    let odd = EncodeOptions { chunk_scalars: 40, ..Default::default() };
    let straddling = encode(Bits::U16(&x), DType::BFloat16, &[LAYERS, 1, HEADS, 4, DIM], None, &odd).unwrap();
    let r = container::write(false, LAYERS as u32, 4, 4, None, b"", &[&straddling, &s4]);
    assert!(matches!(r, Err(Error::InvalidArgument(m)) if m.contains("straddle")));
}

#[test]
fn per_layer_containers_hold_a_stream_per_layer_and_kv() {
    let mut rng = Rng(7);
    let mut streams = Vec::new();
    for layer in 0..LAYERS {
        for _kv in 0..2 {
            let heads = 1 + layer; // layers of different shapes
            let x: Vec<u16> = (0..heads * 5 * DIM).map(|_| bf16(rng.normal())).collect();
            let opts = EncodeOptions::default();
            streams.push(encode(Bits::U16(&x), DType::BFloat16, &[1, heads, 5, DIM], None, &opts).unwrap());
        }
    }
    let refs: Vec<&[u8]> = streams.iter().map(|s| s.as_slice()).collect();
    let bytes = container::write(true, LAYERS as u32, 256, 5, None, b"", &refs).unwrap();
    let c = Container::parse(&bytes).unwrap();
    assert_eq!(c.flags, FLAG_PER_LAYER);
    assert_eq!((c.blocks(), c.streams_per_block()), (1, 6));
    assert_eq!(c.stream(0, 5).unwrap().header.shape, vec![1, 3, 5, DIM]);
    assert!(c.stream(0, 5).unwrap().layers.is_none());
}

/// Pinned bytes of the fixed part: a layout change must be a version change.
#[test]
fn the_fixed_header_layout_is_pinned() {
    let (bytes, _) = sample();
    assert_eq!(&bytes[..4], b"SPKC");
    assert_eq!(u16::from_le_bytes([bytes[4], bytes[5]]), 2);
    assert_eq!(u16::from_le_bytes([bytes[6], bytes[7]]), 0);
    assert_eq!(u32::from_le_bytes(bytes[8..12].try_into().unwrap()), 3);
    assert_eq!(u32::from_le_bytes(bytes[12..16].try_into().unwrap()), 4);
    assert_eq!(u64::from_le_bytes(bytes[16..24].try_into().unwrap()), 7);
    assert_eq!(u32::from_le_bytes(bytes[24..28].try_into().unwrap()), 15);
    // the first stream starts right after index, metadata and checksum
    let first = u64::from_le_bytes(bytes[32..40].try_into().unwrap());
    assert_eq!(first, 32 + 16 * 4 + 15 + 8);
    assert_eq!(&bytes[first as usize..first as usize + 4], b"SPKV");
}

#[test]
fn every_truncation_and_byte_change_is_an_error_not_a_panic() {
    let (bytes, _) = sample();
    let head_end = u64::from_le_bytes(bytes[32..40].try_into().unwrap()) as usize;
    for n in 0..bytes.len() {
        assert!(Container::parse(&bytes[..n]).is_err(), "truncated to {n}");
    }
    // every byte of the container's own header, and a sample of the streams' headers
    let stream_heads = (head_end..bytes.len()).step_by(7);
    for i in (0..head_end).chain(stream_heads) {
        for flip in [0x01u8, 0x80, 0xFF] {
            let mut bad = bytes.clone();
            bad[i] ^= flip;
            // a change inside a chunk payload parses (chunk checksums are checked on decode)
            if let Err(e) = Container::parse(&bad) {
                assert!(!matches!(e, Error::InvalidArgument(_) | Error::PredictionMismatch(_)), "{e}");
            }
        }
    }
    for i in 0..head_end {
        let mut bad = bytes.clone();
        bad[i] ^= 0x40;
        assert!(Container::parse(&bad).is_err(), "byte {i} changed");
    }
}

#[test]
fn other_versions_and_magics_are_unsupported() {
    let (mut bytes, _) = sample();
    bytes[4] = 1;
    assert!(matches!(Container::parse(&bytes), Err(Error::Unsupported(m)) if m.contains("version 1")));
    assert!(matches!(Container::parse(b"SPKV...."), Err(Error::Unsupported(_))));
}

#[test]
fn huge_counts_are_refused_before_allocating() {
    let (bytes, _) = sample();
    let mut bad = bytes[..40].to_vec();
    bad[16..24].copy_from_slice(&(1u64 << 32).to_le_bytes()); // 2^32 tokens in blocks of 4
    assert!(matches!(Container::parse(&bad), Err(Error::Corrupt(m)) if m.contains("index")));
    let mut bad = bytes.clone();
    bad[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(Container::parse(&bad), Err(Error::Corrupt(_))));
}

/// A per-layer container whose layers hold the last 7, 5 and 2 of 7 tokens (sliding windows),
/// in blocks of 4: layer 2 holds no token of block 0; layer 1 holds tokens 2..4 of it.
fn windowed() -> (Vec<u8>, Vec<Option<Vec<u16>>>) {
    let counts = [7u64, 5, 2];
    let mut rng = Rng(11);
    let (mut streams, mut words) = (Vec::new(), Vec::new());
    for b in 0..2u64 {
        for &n in &counts {
            let (start, end) = ((4 * b).max(7 - n), (4 * b + 4).min(7));
            for _kv in 0..2 {
                if start >= end {
                    streams.push(Vec::new());
                    words.push(None);
                    continue;
                }
                let shape = [1, HEADS, end - start, DIM];
                let x: Vec<u16> = (0..shape.iter().product::<u64>()).map(|_| bf16(rng.normal())).collect();
                let opts = EncodeOptions::default();
                streams.push(encode(Bits::U16(&x), DType::BFloat16, &shape, None, &opts).unwrap());
                words.push(Some(x));
            }
        }
    }
    let refs: Vec<&[u8]> = streams.iter().map(|s| s.as_slice()).collect();
    (container::write(true, LAYERS as u32, 4, 7, Some(&counts), b"{}", &refs).unwrap(), words)
}

#[test]
fn layers_of_different_token_counts_hold_their_last_tokens() {
    let (bytes, words) = windowed();
    let c = Container::parse(&bytes).unwrap();
    assert_eq!(c.flags, FLAG_PER_LAYER | FLAG_LAYER_TOKENS);
    assert_eq!(c.layer_tokens, vec![7, 5, 2]);
    assert_eq!((c.layer_block_range(0, 1), c.layer_block_range(0, 2)), (2..4, 4..4));
    assert_eq!(c.layer_block_range(1, 2), 5..7);
    for (i, want) in words.iter().enumerate() {
        let (b, s) = (i / 6, i % 6);
        match (c.stream(b, s), want) {
            (None, None) => {}
            (Some(entry), Some(want)) => {
                let mut out = vec![0u16; want.len()];
                decode_chunks_into(&bytes[entry.range.clone()], BitsMut::U16(&mut out), None, 1, None).unwrap();
                assert_eq!(&out, want);
            }
            (got, want) => panic!("block {b} stream {s}: {:?} vs {:?}", got.is_some(), want.is_some()),
        }
    }
    // the table sits between the fixed fields and the index
    assert_eq!(u64::from_le_bytes(bytes[40..48].try_into().unwrap()), 5);
}

#[test]
fn windowed_containers_refuse_what_does_not_fit() {
    let (s, _) = block_stream(4, 1, 1);
    // a table on a stacked layout, a table of the wrong length, a layer longer than the prompt
    for (per_layer, counts) in [(false, vec![4u64, 4, 4]), (true, vec![4, 4]), (true, vec![4, 4, 5])] {
        let r = container::write(per_layer, LAYERS as u32, 4, 4, Some(&counts), b"", &[s.as_slice(); 6]);
        assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
    }
    // a stream where the layer holds none of the block's tokens, or none where it holds some
    let (bytes, _) = windowed();
    let c = Container::parse(&bytes).unwrap();
    let mut refs: Vec<&[u8]> =
        c.streams.iter().map(|e| e.as_ref().map_or(&b""[..], |e| &bytes[e.range.clone()])).collect();
    let one = refs[0];
    refs[4] = one;
    let r = container::write(true, LAYERS as u32, 4, 7, Some(&[7, 5, 2]), b"", &refs);
    assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
    refs[4] = b"";
    refs[2] = b"";
    let r = container::write(true, LAYERS as u32, 4, 7, Some(&[7, 5, 2]), b"", &refs);
    assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
    // every truncation and flipped byte of the header is an error, never a panic
    let head_end = u64::from_le_bytes(bytes[56..64].try_into().unwrap()) as usize;
    for n in 0..bytes.len() {
        assert!(Container::parse(&bytes[..n]).is_err(), "truncated to {n}");
    }
    for i in 0..head_end {
        let mut bad = bytes.clone();
        bad[i] ^= 0x40;
        assert!(Container::parse(&bad).is_err(), "byte {i} changed");
    }
}
