//! Exact-model throughput on a KV-like bf16 workload (2,097,152 scalars: per-channel sigma
//! over two decades, 0.5% outliers at 20 sigma), Rust API, best of 7, 1 and 2 threads. The
//! README's "what each step bought" table comes from this, built at each commit:
//! `cargo run --release -p speckv --example throughput` (add `SPECKV_SIMD=avx2` or `=0` to
//! choose the kernels). It checks the round trip and prints bits per scalar too.

use speckv::codec::EncodeOptions;
use speckv::model::ladder::sigma_code;
use speckv::{decode_into, encode, Bits, BitsMut, DType, Prediction, SigmaCodes};
#[path = "../tests/common/mod.rs"]
mod common;
use common::kv_workload;
fn main() {
    let (rows, channels) = (8192, 256);
    let (x, mu, sig) = kv_workload(rows, channels);
    let codes: Vec<i16> = sig.iter().map(|&s| sigma_code(s).unwrap()).collect();
    let sigma = SigmaCodes::new(&codes, &[rows, channels], &[0, 1]).unwrap();
    let pred = Prediction { mu: &mu, sigma, joint: None };
    let shape = [rows as u64, channels as u64];
    let mut line = String::new();
    for threads in [1usize, 2] {
        let opts = EncodeOptions { threads, ..Default::default() };
        let stream = encode(Bits::U16(&x), DType::BFloat16, &shape, Some(&pred), &opts).unwrap();
        let mut out = vec![0u16; x.len()];
        let (mut et, mut dt) = (f64::MAX, f64::MAX);
        for _ in 0..7 {
            let t = std::time::Instant::now();
            let s2 = encode(Bits::U16(&x), DType::BFloat16, &shape, Some(&pred), &opts).unwrap();
            et = et.min(t.elapsed().as_secs_f64());
            assert_eq!(s2, stream);
            let t = std::time::Instant::now();
            decode_into(&stream, BitsMut::U16(&mut out), Some(&pred), threads).unwrap();
            dt = dt.min(t.elapsed().as_secs_f64());
        }
        assert_eq!(out, x);
        line += &format!("{}t enc {:.1} dec {:.1} ", threads, x.len() as f64 / et / 1e6, x.len() as f64 / dt / 1e6);
        if threads == 1 {
            line += &format!("bits {:.4} ", stream.len() as f64 * 8.0 / x.len() as f64);
        }
    }
    println!("{line}");
}
