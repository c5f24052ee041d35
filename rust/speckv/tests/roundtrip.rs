//! Whole-stream round trips, determinism across thread counts, and hostile input.

use speckv::codec::EncodeOptions;
use speckv::model::ladder::sigma_code;
use speckv::{
    decode_chunks_into, decode_into, encode, ideal_bits, info, Bits, BitsMut, DType, Error, ModelKind, Prediction,
    SigmaCodes,
};

mod common;

use common::{bf16, Rng};

/// KV-like data: per-channel sigma, x = mu + noise, a few outliers.
fn kv_like(rows: usize, channels: usize, seed: u64) -> (Vec<u16>, Vec<f32>, Vec<i16>) {
    let mut rng = Rng(seed);
    let sig: Vec<f32> = (0..channels).map(|c| 0.01 * 10f32.powf(2.0 * c as f32 / channels as f32)).collect();
    let mut x = Vec::new();
    let mut mu = Vec::new();
    for _ in 0..rows {
        for s in &sig {
            let m = rng.normal() * 2.0;
            let mut v = m + rng.normal() * s;
            if rng.next().is_multiple_of(200) {
                v = m + rng.normal() * 50.0 * s;
            }
            mu.push(m);
            x.push(bf16(v));
        }
    }
    let codes = sig.iter().map(|&s| sigma_code(s).unwrap()).collect();
    (x, mu, codes)
}

#[test]
fn predicted_bf16_round_trips_identically_on_any_thread_count() {
    for model in [ModelKind::Exact, ModelKind::Fast] {
        predicted_bf16_round_trip(model);
    }
}

fn predicted_bf16_round_trip(model: ModelKind) {
    let (rows, ch) = (3000, 64);
    let (x, mu, codes) = kv_like(rows, ch, 1);
    let shape = [rows as u64, ch as u64];
    let sigma = SigmaCodes::new(&codes, &[rows, ch], &[0, 1]).unwrap();
    let pred = Prediction { mu: &mu, sigma, joint: None };
    let mut opts = EncodeOptions { chunk_scalars: 20_000, model, ..Default::default() };
    let one = encode(Bits::U16(&x), DType::BFloat16, &shape, Some(&pred), &opts).unwrap();
    opts.threads = 3;
    let three = encode(Bits::U16(&x), DType::BFloat16, &shape, Some(&pred), &opts).unwrap();
    assert_eq!(one, three);
    for threads in [1, 2, 5] {
        let mut out = vec![0u16; x.len()];
        decode_into(&one, BitsMut::U16(&mut out), Some(&pred), threads).unwrap();
        assert_eq!(out, x);
    }
    // any run of chunks decodes on its own to the same scalars
    for (a, b) in [(0usize, 1usize), (3, 5), (9, 10), (4, 4)] {
        let range = a * 20_000..(b * 20_000).min(x.len());
        let mut part = vec![0u16; range.len()];
        decode_chunks_into(&one, BitsMut::U16(&mut part), Some(&pred), 2, Some(a..b)).unwrap();
        assert_eq!(part, x[range]);
    }
    let mut wrong = vec![0u16; 5];
    assert!(decode_chunks_into(&one, BitsMut::U16(&mut wrong), Some(&pred), 1, Some(0..1)).is_err());
    assert!(decode_chunks_into(&one, BitsMut::U16(&mut wrong), Some(&pred), 1, Some(2..11)).is_err());
    let ideal = ideal_bits(Bits::U16(&x), DType::BFloat16, &shape, Some(&pred), &opts).unwrap();
    let header = info(&one).unwrap();
    let payload: u64 = header.chunks.iter().map(|c| c.length as u64).sum();
    let ratio = payload as f64 * 8.0 / ideal;
    assert!(ratio < 1.003 && ratio > 0.999, "coded / ideal = {ratio}");
    let bits_per_scalar = ideal / x.len() as f64;
    assert!(bits_per_scalar < 10.0, "{bits_per_scalar} bits/scalar");
}

#[test]
fn predictor_free_round_trips_every_dtype() {
    let mut rng = Rng(9);
    for dtype in DType::ALL {
        let n = 10_000usize;
        let shape = [100u64, 100];
        let mut out_ok = true;
        match dtype.bits() {
            8 => {
                let x: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
                let s = encode(Bits::U8(&x), dtype, &shape, None, &EncodeOptions::default()).unwrap();
                let mut out = vec![0u8; n];
                decode_into(&s, BitsMut::U8(&mut out), None, 2).unwrap();
                out_ok &= out == x;
            }
            16 => {
                let x: Vec<u16> = (0..n).map(|_| rng.next() as u16).collect();
                let s = encode(Bits::U16(&x), dtype, &shape, None, &EncodeOptions::default()).unwrap();
                let mut out = vec![0u16; n];
                decode_into(&s, BitsMut::U16(&mut out), None, 2).unwrap();
                out_ok &= out == x;
            }
            _ => {
                let x: Vec<u32> = (0..n).map(|_| rng.next() as u32).collect();
                let s = encode(Bits::U32(&x), dtype, &shape, None, &EncodeOptions::default()).unwrap();
                let mut out = vec![0u32; n];
                decode_into(&s, BitsMut::U32(&mut out), None, 2).unwrap();
                out_ok &= out == x;
            }
        }
        assert!(out_ok, "{dtype:?}");
    }
}

fn small_stream(model: ModelKind) -> (Vec<u8>, Vec<u16>, Vec<f32>, Vec<i16>) {
    let (x, mu, codes) = kv_like(20, 16, 5);
    let sigma = SigmaCodes::new(&codes, &[20, 16], &[0, 1]).unwrap();
    let pred = Prediction { mu: &mu, sigma, joint: None };
    let opts = EncodeOptions { chunk_scalars: 100, model, ..Default::default() };
    let s = encode(Bits::U16(&x), DType::BFloat16, &[20, 16], Some(&pred), &opts).unwrap();
    (s, x, mu, codes)
}

#[test]
fn every_bit_flip_and_truncation_is_reported() {
    let (stream, x, mu, codes) = small_stream(ModelKind::Exact);
    flips_and_truncations(stream, x, mu, codes);
    let (stream, x, mu, codes) = small_stream(ModelKind::Fast);
    flips_and_truncations(stream, x, mu, codes);
}

fn flips_and_truncations(stream: Vec<u8>, x: Vec<u16>, mu: Vec<f32>, codes: Vec<i16>) {
    let sigma = SigmaCodes::new(&codes, &[20, 16], &[0, 1]).unwrap();
    let pred = Prediction { mu: &mu, sigma, joint: None };
    let mut out = vec![0u16; x.len()];
    for byte in 0..stream.len() {
        for bit in 0..8 {
            let mut s = stream.clone();
            s[byte] ^= 1 << bit;
            match decode_into(&s, BitsMut::U16(&mut out), Some(&pred), 1) {
                Ok(_) => assert_eq!(out, x, "flip at {byte}.{bit} decoded to something else"),
                Err(Error::InvalidArgument(m)) => {
                    panic!("flip at {byte}.{bit} blamed the caller: {m}")
                }
                Err(_) => {}
            }
        }
    }
    for len in 0..stream.len() {
        assert!(decode_into(&stream[..len], BitsMut::U16(&mut out), Some(&pred), 1).is_err());
    }
    let mut longer = stream.clone();
    longer.extend_from_slice(&[0, 0, 0, 0]);
    assert!(decode_into(&longer, BitsMut::U16(&mut out), Some(&pred), 1).is_err());
}

#[test]
fn perturbed_prediction_is_a_mismatch() {
    let (stream, x, mut mu, codes) = small_stream(ModelKind::Exact);
    mu[77] += 0.25;
    let sigma = SigmaCodes::new(&codes, &[20, 16], &[0, 1]).unwrap();
    let pred = Prediction { mu: &mu, sigma, joint: None };
    let mut out = vec![0u16; x.len()];
    let err = decode_into(&stream, BitsMut::U16(&mut out), Some(&pred), 1).unwrap_err();
    assert!(matches!(err, Error::PredictionMismatch(_)), "{err}");
    let err = decode_into(&stream, BitsMut::U16(&mut out), None, 1).unwrap_err();
    assert!(matches!(err, Error::PredictionMismatch(_)), "{err}");
}

/// A forger who recomputes the header checksum gets past the first line of defence: every
/// field must still be validated before it sizes anything, and nothing may panic or hang.
#[test]
fn forged_headers_never_panic() {
    use speckv::format::header::header_len;
    use speckv::hash::checksum;

    for model in [ModelKind::Exact, ModelKind::Fast] {
        let (stream, x, mu, codes) = small_stream(model);
        let h = info(&stream).unwrap();
        let len = header_len(h.shape.len(), h.chunks.len());
        let sigma = SigmaCodes::new(&codes, &[20, 16], &[0, 1]).unwrap();
        let pred = Prediction { mu: &mu, sigma, joint: None };
        let mut out = vec![0u16; x.len()];
        let mut rng = Rng(77);
        for _ in 0..20_000 {
            let mut s = stream.clone();
            for _ in 0..1 + rng.next() % 3 {
                let at = 6 + (rng.next() as usize) % (len - 14);
                s[at] = match rng.next() % 4 {
                    0 => 0,
                    1 => 0xFF,
                    _ => rng.next() as u8,
                };
            }
            let sum = checksum(&s[..len - 8]);
            s[len - 8..len].copy_from_slice(&sum.to_le_bytes());
            // Either refused, or decoded; the chunk checksums, the prediction fingerprint and
            // the table digest make the latter possible only when the mutation changed nothing
            // that matters, so what comes out is the original, bit for bit.
            out.fill(0);
            if decode_into(&s, BitsMut::U16(&mut out), Some(&pred), 1).is_ok() {
                let header = info(&s).unwrap();
                assert_eq!(header.n_scalars, x.len() as u64);
                assert_eq!(out, x, "a forged header decoded to other values");
            }
            let _ = decode_into(&s, BitsMut::U16(&mut out), None, 1);
        }
    }
}
