//! Decode speed of the bins model against the exact model, plain and with the joint model,
//! single-threaded, on a synthetic layer shaped like the demo model's (192 channels x 512
//! tokens per layer, values conditioned on the keys): `cargo run --release --example
//! bins_speed`.
use speckv::joint::Joint;
use speckv::model::ladder::sigma_code;
use speckv::{decode_into, encode, Bits, BitsMut, DType, EncodeOptions, ModelKind, Prediction, SigmaCodes, TokenScale};

fn main() {
    let (layers, c, t) = (4usize, 192usize, 512usize);
    let n = layers * c * t;
    let mut seed = 1u64;
    let mut next = move || {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (seed >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut x = vec![0u16; n];
    let mu = vec![0f32; n];
    let mut codes = vec![0i16; layers * c];
    for (i, slot) in x.iter_mut().enumerate() {
        let ch = (i / t) % c;
        let sigma = 0.05 * (1.0 + (ch % 7) as f64);
        let u: f64 = (0..12).map(|_| next()).sum::<f64>() - 6.0;
        let v = (sigma * u) as f32;
        *slot = ((v.to_bits() + 0x7FFF + ((v.to_bits() >> 16) & 1)) >> 16) as u16;
        codes[i / t] = sigma_code(sigma as f32).unwrap();
    }
    let offset = vec![0f32; layers * c];
    let outside: Vec<f32> = (0..layers * c * t).map(|_| next() as f32 - 0.5).collect();
    let shape = [layers as u64, c as u64, t as u64];
    let sigma = SigmaCodes::broadcast(&codes, &[layers, c, 1], &[layers, c, t]).unwrap();
    // a third of the coefficients non-zero (the calibrated ones are dense; zeros are skipped)
    let coef: Vec<f32> = (0..layers * c * 2 * c).map(|k| if k % 3 != 3 { 1e-3 } else { 0.0 }).collect();
    for (name, e) in [("plain", None), ("joint E=0", Some(0)), ("joint E=C (values)", Some(c))] {
        let joint = e.map(|e| Joint {
            channels: c,
            tokens: t,
            outside_channels: e,
            outside: &outside[..layers * e * t],
            coef: &coef[..layers * c * (e + c)],
            offset: &offset,
            integer: None,
        });
        let p = Prediction { mu: &mu, sigma: sigma.clone(), joint };
        for model in [ModelKind::Exact, ModelKind::Bins] {
            let options = EncodeOptions {
                model,
                chunk_scalars: (c * t) as u32,
                token_scale: Some(TokenScale::default()),
                ..Default::default()
            };
            let stream = encode(Bits::U16(&x), DType::BFloat16, &shape, Some(&p), &options).unwrap();
            let mut out = vec![0u16; n];
            let reps = 5;
            let start = std::time::Instant::now();
            for _ in 0..reps {
                decode_into(&stream, BitsMut::U16(&mut out), Some(&p), 1).unwrap();
            }
            let el = start.elapsed().as_secs_f64();
            assert_eq!(out, x);
            println!(
                "{name:20} {:6}: {:.3} b/s, decode {:.0} Msym/s (one thread)",
                model.name(),
                stream.len() as f64 * 8.0 / n as f64,
                (n * reps) as f64 / el / 1e6
            );
        }
    }
}
