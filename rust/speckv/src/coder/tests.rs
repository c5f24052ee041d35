use super::*;

#[path = "../../tests/common/mod.rs"]
mod common;
use common::Rng as SplitMix;

/// A skewed distribution with total 2^precision and every frequency >= 1.
fn skewed_cdf(n: u32, precision: u32) -> Vec<u32> {
    let total = 1u64 << precision;
    let weights: Vec<u64> = (0..n as u64).map(|i| 1 + 1000 / (1 + i * i)).collect();
    let sum: u64 = weights.iter().sum();
    let mut freqs: Vec<u64> = weights.iter().map(|w| (w * (total - n as u64) / sum) + 1).collect();
    let used: u64 = freqs.iter().sum();
    freqs[0] += total - used;
    let mut cdf = vec![0u32];
    for f in freqs {
        cdf.push(cdf.last().unwrap() + f as u32);
    }
    cdf
}

fn sample(cdf: &[u32], rng: &mut SplitMix, precision: u32) -> usize {
    let q = (rng.next() >> (64 - precision)) as u32;
    cdf.partition_point(|&c| c <= q) - 1
}

fn decode_symbol(dec: &mut RangeDecoder, cdf: &[u32], precision: u32) -> usize {
    let q = dec.peek(precision);
    let s = cdf.partition_point(|&c| c <= q) - 1;
    dec.consume(cdf[s], cdf[s + 1] - cdf[s]);
    s
}

#[test]
fn round_trip_mixed_precisions_and_raw_bits() {
    let mut rng = SplitMix(7);
    let tables: Vec<(u32, Vec<u32>)> =
        [1u32, 8, 12, 16, 24].iter().map(|&p| (p, skewed_cdf(2.min(1 << p), p))).collect();
    let big = skewed_cdf(300, 24);
    let mut enc = RangeEncoder::new();
    let mut script = Vec::new();
    for i in 0..200_000u32 {
        match i % 3 {
            0 => {
                let s = sample(&big, &mut rng, 24);
                enc.put(big[s], big[s + 1] - big[s], 24);
                script.push((0u8, s as u32));
            }
            1 => {
                let (p, cdf) = &tables[(rng.next() % tables.len() as u64) as usize];
                let s = sample(cdf, &mut rng, *p);
                enc.put(cdf[s], cdf[s + 1] - cdf[s], *p);
                script.push((1 + tables.iter().position(|t| t.0 == *p).unwrap() as u8, s as u32));
            }
            _ => {
                let nbits = (rng.next() % 33) as u32;
                let v = (rng.next() as u32) & ((1u64 << nbits) - 1) as u32;
                enc.put_bits(v, nbits);
                script.push((100 + nbits as u8, v));
            }
        }
    }
    let bytes = enc.finish();
    let mut dec = RangeDecoder::new(&bytes);
    for &(kind, expected) in &script {
        let got = match kind {
            0 => decode_symbol(&mut dec, &big, 24) as u32,
            k if k >= 100 => dec.get_bits((k - 100) as u32),
            k => {
                let (p, cdf) = &tables[(k - 1) as usize];
                decode_symbol(&mut dec, cdf, *p) as u32
            }
        };
        assert_eq!(got, expected);
    }
    assert!(dec.finished_cleanly());
}

#[test]
fn overhead_over_ideal_is_below_a_tenth_of_a_percent_on_a_million_symbols() {
    let mut rng = SplitMix(11);
    let cdf = skewed_cdf(64, 24);
    let mut enc = RangeEncoder::new();
    let mut meter = IdealMeter::default();
    for _ in 0..1_000_000 {
        let s = sample(&cdf, &mut rng, 24);
        enc.put(cdf[s], cdf[s + 1] - cdf[s], 24);
        meter.put(cdf[s], cdf[s + 1] - cdf[s], 24);
    }
    let coded_bits = enc.finish().len() as f64 * 8.0;
    let overhead = coded_bits / meter.bits - 1.0;
    assert!(overhead < 0.001, "overhead {overhead}");
    assert!(overhead > -1e-6, "coded below the ideal: {overhead}");
}

#[test]
fn carries_ripple_through_saturated_words() {
    // Symbols at the very top of the range push `low` up against the carry boundary.
    let mut enc = RangeEncoder::new();
    let total = 1u32 << 24;
    let mut script = Vec::new();
    for i in 0..50_000u32 {
        let (cum, freq) = if i % 7 == 0 { (0, 1) } else { (total - 2, 2) };
        enc.put(cum, freq, 24);
        script.push((cum, freq));
    }
    let bytes = enc.finish();
    let mut dec = RangeDecoder::new(&bytes);
    for &(cum, freq) in &script {
        let q = dec.peek(24);
        assert!(q >= cum && q < cum + freq);
        dec.consume(cum, freq);
    }
    assert!(dec.finished_cleanly());
}

#[test]
fn empty_stream_is_one_byte() {
    // The whole interval is open: its point with the most trailing zeros is 0, and of the
    // final word only its top byte is written.
    let bytes = RangeEncoder::new().finish();
    assert_eq!(bytes, [0]);
    let dec = RangeDecoder::new(&bytes);
    assert!(dec.finished_cleanly());
}

#[test]
fn short_last_words_decode_as_their_high_bytes() {
    // Every trimmed length: the decoder must see the same point as from the whole word.
    let mut rng = SplitMix(11);
    let cdf = skewed_cdf(40, 24);
    let mut lengths = std::collections::BTreeSet::new();
    for n in 0..400 {
        let symbols: Vec<usize> = (0..n % 37).map(|_| (rng.next() % 40) as usize).collect();
        let mut enc = RangeEncoder::new();
        for &s in &symbols {
            enc.put(cdf[s], cdf[s + 1] - cdf[s], 24);
        }
        let bytes = enc.finish();
        lengths.insert(bytes.len() % 4);
        let mut dec = RangeDecoder::new(&bytes);
        for &s in &symbols {
            assert_eq!(decode_symbol(&mut dec, &cdf, 24), s);
        }
        assert!(dec.finished_cleanly(), "{n} symbols, {} bytes", bytes.len());
        if bytes.len().is_multiple_of(4) {
            // A whole extra word after whole words decodes the same, and is a tail.
            let mut longer = bytes.clone();
            longer.extend_from_slice(&[0; 4]);
            let mut dec = RangeDecoder::new(&longer);
            for &s in &symbols {
                assert_eq!(decode_symbol(&mut dec, &cdf, 24), s);
            }
            assert!(!dec.finished_cleanly());
        }
    }
    assert_eq!(lengths.len(), 4, "every short length occurs: {lengths:?}");
}

#[test]
fn golden_words_pin_the_coder() {
    let mut enc = RangeEncoder::new();
    for (cum, freq, p) in [(0u32, 3u32, 2u32), (100, 50, 8), (1 << 20, 1 << 10, 24), (5, 1, 3), (0xABCD, 1, 16)] {
        enc.put(cum, freq, p);
    }
    let bytes = enc.finish();
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(hex, GOLDEN_HEX, "the coder's output changed: that is a format change");
    let mut dec = RangeDecoder::new(&bytes);
    for (cum, freq, p) in [(0u32, 3u32, 2u32), (100, 50, 8), (1 << 20, 1 << 10, 24)] {
        let q = dec.peek(p);
        assert!(q >= cum && q < cum + freq);
        dec.consume(cum, freq);
    }
    assert_eq!(dec.get_bits(3), 5);
    assert_eq!(dec.get_bits(16), 0xABCD);
    assert!(dec.finished_cleanly());
}

const GOLDEN_HEX: &str = "556a584d50";

#[test]
fn garbage_never_panics() {
    let mut rng = SplitMix(3);
    let cdf = skewed_cdf(40, 24);
    for len in 0..64 {
        let junk: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        let mut dec = RangeDecoder::new(&junk);
        for _ in 0..1000 {
            let s = decode_symbol(&mut dec, &cdf, 24);
            assert!(s < 40);
            dec.get_bits(13);
        }
    }
}
