//! Helpers shared by the integration tests and the benches: a tiny deterministic generator
//! (no dependency, never changes) and float-to-bfloat16 rounding.

#![allow(dead_code)]

pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A standard normal sample (Box-Muller).
    pub fn normal(&mut self) -> f32 {
        let u1 = (self.next() >> 11) as f64 / (1u64 << 53) as f64 + 1e-300;
        let u2 = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
    }
}

/// Round to nearest even, as ml_dtypes does for finite values.
pub fn bf16(v: f32) -> u16 {
    let b = v.to_bits();
    ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) as u16
}

/// The KV-like bf16 workload of the benches and the throughput harness: `rows x channels`
/// scalars `x = bf16(mu + noise)`, `mu ~ N(0, 1)`, per-channel sigma log-spaced over two decades
/// (0.003 to 0.3), 0.5% outliers at 20 sigma. Returns `(x, mu, sigma per channel)`.
pub fn kv_workload(rows: usize, channels: usize) -> (Vec<u16>, Vec<f32>, Vec<f32>) {
    let mut rng = Rng(42);
    let sig: Vec<f32> = (0..channels).map(|c| 0.003 * 100f32.powf(c as f32 / channels as f32)).collect();
    let (mut x, mut mu) = (Vec::new(), Vec::new());
    for _ in 0..rows {
        for s in &sig {
            let m = rng.normal();
            let mut noise = rng.normal() * s;
            if rng.next().is_multiple_of(200) {
                noise *= 20.0;
            }
            mu.push(m);
            x.push(bf16(m + noise));
        }
    }
    (x, mu, sig)
}
