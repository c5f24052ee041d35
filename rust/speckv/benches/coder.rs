//! Criterion benches: table-bank construction, the raw range coder, and whole-tensor
//! encode/decode on a KV-like workload (1 thread and 2 threads).

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use speckv::codec::EncodeOptions;
use speckv::coder::{RangeDecoder, RangeEncoder, SymbolSink};
use speckv::model::ladder::sigma_code;
use speckv::model::{ModelParams, TableBank};
use speckv::{decode_into, encode, Bits, BitsMut, DType, ModelKind, Prediction, SigmaCodes};

#[path = "../tests/common/mod.rs"]
mod common;

use common::{kv_workload, Rng};

fn workload(rows: usize, channels: usize) -> (Vec<u16>, Vec<f32>, Vec<i16>) {
    let (x, mu, sig) = kv_workload(rows, channels);
    (x, mu, sig.iter().map(|&s| sigma_code(s).unwrap()).collect())
}

fn benches(c: &mut Criterion) {
    c.bench_function("table_bank_build", |b| b.iter(|| TableBank::build(black_box(&ModelParams::default()))));

    let n = 1 << 20;
    let mut g = c.benchmark_group("range_coder");
    g.throughput(Throughput::Elements(n as u64));
    let mut rng = Rng(1);
    let syms: Vec<u32> = (0..n).map(|_| (rng.next() % 4000) as u32).collect();
    g.bench_function("encode_uniform_4096", |b| {
        b.iter(|| {
            let mut e = RangeEncoder::new();
            for &s in &syms {
                e.put(s << 12, 1 << 12, 24);
            }
            e.finish()
        })
    });
    let mut e = RangeEncoder::new();
    for &s in &syms {
        e.put(s << 12, 1 << 12, 24);
    }
    let coded = e.finish();
    g.bench_function("decode_uniform_4096", |b| {
        b.iter(|| {
            let mut d = RangeDecoder::new(&coded);
            let mut acc = 0u32;
            for _ in 0..n {
                let q = d.peek(24) >> 12;
                d.consume(q << 12, 1 << 12);
                acc = acc.wrapping_add(q);
            }
            acc
        })
    });
    g.finish();

    let (rows, ch) = (4096, 256);
    let (x, mu, codes) = workload(rows, ch);
    let sigma = SigmaCodes::new(&codes, &[rows, ch], &[0, 1]).unwrap();
    let pred = Prediction { mu: &mu, sigma, joint: None };
    let shape = [rows as u64, ch as u64];
    let mut g = c.benchmark_group("kv_bf16");
    g.throughput(Throughput::Elements(x.len() as u64));
    g.sample_size(10);
    for (threads, model) in
        [(1usize, ModelKind::Exact), (2, ModelKind::Exact), (1, ModelKind::Fast), (2, ModelKind::Fast)]
    {
        let opts = EncodeOptions { threads, model, ..Default::default() };
        let tag = if model == ModelKind::Fast { "fast_" } else { "" };
        g.bench_function(format!("{tag}encode_{threads}t"), |b| {
            b.iter(|| encode(Bits::U16(&x), DType::BFloat16, &shape, Some(&pred), &opts).unwrap())
        });
        let stream = encode(Bits::U16(&x), DType::BFloat16, &shape, Some(&pred), &opts).unwrap();
        let mut out = vec![0u16; x.len()];
        g.bench_function(format!("{tag}decode_{threads}t"), |b| {
            b.iter(|| decode_into(&stream, BitsMut::U16(&mut out), Some(&pred), threads).unwrap())
        });
    }
    g.bench_function("encode_predictor_free_1t", |b| {
        b.iter(|| encode(Bits::U16(&x), DType::BFloat16, &shape, None, &EncodeOptions::default()).unwrap())
    });
    g.finish();

    // The same workload stored as fp8 (e4m3), the exact model: 8-bit formats have no window
    // to compute, so this measures the guess, `cum` and coder steps alone.
    let x8: Vec<u8> = x.iter().map(|&b| fp8_e4m3(f32::from_bits((b as u32) << 16))).collect();
    let mut g = c.benchmark_group("kv_fp8");
    g.throughput(Throughput::Elements(x8.len() as u64));
    g.sample_size(10);
    let opts = EncodeOptions::default();
    g.bench_function("encode_1t", |b| {
        b.iter(|| encode(Bits::U8(&x8), DType::Float8E4M3Fn, &shape, Some(&pred), &opts).unwrap())
    });
    let stream = encode(Bits::U8(&x8), DType::Float8E4M3Fn, &shape, Some(&pred), &opts).unwrap();
    let mut out = vec![0u8; x8.len()];
    g.bench_function("decode_1t", |b| b.iter(|| decode_into(&stream, BitsMut::U8(&mut out), Some(&pred), 1).unwrap()));
    g.finish();
}

/// Nearest float8 e4m3fn pattern of `v` (saturating; good enough for a bench workload).
fn fp8_e4m3(v: f32) -> u8 {
    let sign = if v.is_sign_negative() { 0x80u8 } else { 0 };
    let a = v.abs().min(448.0);
    if a < 2f32.powi(-9) {
        return sign;
    }
    let e = a.log2().floor().max(-6.0);
    let m = ((a / 2f32.powf(e) - if e > -6.0 || a >= 2f32.powi(-6) { 1.0 } else { 0.0 }) * 8.0).round();
    let (e, m) = if m >= 8.0 { (e + 1.0, 0.0) } else { (e, m) };
    let field = if a < 2f32.powi(-6) { 0 } else { (e as i32 + 7) as u8 };
    (sign | field << 3 | m as u8).min(sign | 0x7E)
}

criterion_group!(coder, benches);
criterion_main!(coder);
