//! Any bytes as a stream and as a cache container: parsing and decoding answer with a typed
//! error or a result, never a panic, a hang or an allocation the bytes do not back; and the
//! output never depends on the thread count. Checksums are not compared in fuzz builds
//! (`hash::matches`), so everything behind them is reached.
#![no_main]

use libfuzzer_sys::fuzz_target;
use speckv::format::container::Container;
use speckv::{decode_chunks_into, info, BitsMut, Prediction, SigmaCodes};

/// Largest stream this target decodes (a header may claim up to 2^15 scalars per payload
/// byte; the bound keeps each run short, not the decoder safe).
const MAX_DECODED: u64 = 1 << 18;

fuzz_target!(|data: &[u8]| {
    if let Ok(container) = Container::parse(data) {
        // every stream it lists was parsed and sits inside the bytes
        for b in 0..container.blocks() {
            for s in 0..container.streams_per_block() {
                let Some(entry) = container.stream(b, s) else {
                    // only a layer that holds none of the block's tokens has no stream
                    assert!(container.per_layer() && container.layer_block_range(b, s / 2).is_empty());
                    continue;
                };
                assert!(entry.range.end <= data.len());
                assert_eq!(info(&data[entry.range.clone()]).ok().as_ref(), Some(&entry.header));
            }
        }
    }
    let Ok(header) = info(data) else { return };
    if header.n_scalars > MAX_DECODED {
        return;
    }
    // a prediction of the right size: its fingerprints will rarely match, which the decoder
    // must say (PredictionMismatch) rather than decode
    let n = header.n_scalars as usize;
    let mu = vec![0f32; n];
    let shape: Vec<usize> = header.shape.iter().map(|&d| d as usize).collect();
    let code = [0i16];
    let sigma = SigmaCodes::scalar(&code, &shape).expect("a parsed shape takes a scalar sigma");
    let prediction = Prediction { mu: &mu, sigma, joint: None };
    let prediction = header.predicted().then_some(&prediction);
    let chunks = header.chunks.len();
    for range in [None, Some(chunks / 2..chunks)] {
        let mut outputs = Vec::new();
        for threads in [1, 3] {
            let len = speckv::decoded_len(&header, range.clone()).expect("a range inside the stream");
            let mut out = vec![0u32; len];
            let result = match header.dtype.bits() {
                8 => {
                    let mut w = vec![0u8; len];
                    let r = decode_chunks_into(data, BitsMut::U8(&mut w), prediction, threads, range.clone());
                    out.iter_mut().zip(w).for_each(|(o, w)| *o = w as u32);
                    r
                }
                16 => {
                    let mut w = vec![0u16; len];
                    let r = decode_chunks_into(data, BitsMut::U16(&mut w), prediction, threads, range.clone());
                    out.iter_mut().zip(w).for_each(|(o, w)| *o = w as u32);
                    r
                }
                _ => decode_chunks_into(data, BitsMut::U32(&mut out), prediction, threads, range.clone()),
            };
            outputs.push(result.map(|_| out));
        }
        match (&outputs[0], &outputs[1]) {
            (Ok(a), Ok(b)) => assert_eq!(a, b, "output depends on the thread count"),
            (Err(_), Err(_)) => {}
            (a, b) => panic!("1 thread: {:?}, 3 threads: {:?}", a.is_ok(), b.is_ok()),
        }
    }
});
