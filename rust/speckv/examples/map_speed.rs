//! Times the integer maps' sums (invariant M1) at the demo model's shapes, one thread and two,
//! with the kernel this process picks (`SPECKV_AMX=0` / `SPECKV_SIMD=avx2|0` pick others):
//! `cargo run --release --example map_speed [ROWS]`. Prints the kernel, G multiply-adds a
//! second and a digest of the outputs (the same for every kernel).
use speckv::linear_map::{kernel_name, LinearMap};

fn main() {
    let rows: usize = std::env::args().nth(1).map_or(512, |r| r.parse().unwrap());
    let mut s: u64 = 1;
    let mut next = move || {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (s >> 33) as u32
    };
    let mut digest = speckv::hash::Hasher::new();
    for (features, outputs) in [(768usize, 384usize), (192, 192)] {
        let w: Vec<i16> = (0..features * outputs).map(|_| (next() % 20001) as i16 - 10000).collect();
        let shift: Vec<i32> = (0..features).map(|_| 10).collect();
        let m = LinearMap::new(features, outputs, &shift, &w, &vec![0.5; outputs], &vec![20; outputs]).unwrap();
        let x: Vec<f32> = (0..rows * features).map(|_| (next() % 20000) as f32 / 1000.0 - 10.0).collect();
        let mut y = vec![0f32; rows * outputs];
        for threads in [1, 2] {
            let mut best = f64::INFINITY;
            for _ in 0..20 {
                let t = std::time::Instant::now();
                m.apply(&x, rows, &mut y, threads).unwrap();
                best = best.min(t.elapsed().as_secs_f64());
            }
            let macs = (rows * features * outputs) as f64;
            println!(
                "{} {rows}x{features}->{outputs}, {threads} thread(s): {:.3} ms, {:.1} G multiply-adds/s",
                kernel_name(),
                best * 1e3,
                macs / best / 1e9
            );
        }
        digest.update(&y.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>());
    }
    println!("output digest {:016x}", digest.finish());
}
