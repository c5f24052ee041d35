//! Replays the core decode calls of a restore, one thread, and prints their speed: the
//! calls as `benches/profile_restore.py --capture DIR` writes them (per call `i`: `i.stream`,
//! `i.mu` float32, `i.codes` int16 broadcast to every scalar, and for the joint model
//! `i.outside`, `i.coef`, `i.offset` float32 with `C T E` in `index.txt`, and with the joint
//! model's integer form `i.scale`, `i.icoef` int16, `i.unit` and a fifth field 1):
//! `cargo run --release --example decode_replay -- DIR [ROUNDS] [--reencode]` (`--reencode`:
//! the decoded caches coded again by this build first, then timed: a format revision's speed
//! and size on the same caches; `--encode`: that coding timed too, one thread, with a digest of
//! the streams it writes).
use speckv::joint::Joint;
use speckv::joint_integer::IntegerJoint;
use speckv::{decode_into, info, BitsMut, Prediction, SigmaCodes};

fn floats(path: &str) -> Vec<f32> {
    std::fs::read(path).unwrap().chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect()
}

/// The joint model's `C T E` and its `outside`, `coef` and `offset` arrays, and its integer
/// form's (`scale`, `icoef`, `unit`) where captured.
type JointArrays = (usize, usize, usize, Vec<f32>, Vec<f32>, Vec<f32>, Option<(Vec<f32>, Vec<i16>, Vec<f32>)>);

struct Call {
    index: usize,
    /// The tensor's shape (kept beside the call: `i.shape`).
    shape: Vec<usize>,
    stream: Vec<u8>,
    mu: Vec<f32>,
    codes: Vec<i16>,
    joint: Option<JointArrays>,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = args.get(1).expect("usage: decode_replay DIR [ROUNDS]");
    let rounds: usize = args.get(2).map_or(5, |r| r.parse().unwrap());
    let index = std::fs::read_to_string(format!("{dir}/index.txt")).unwrap();
    let mut calls: Vec<Call> = index
        .lines()
        .map(|line| {
            let f: Vec<usize> = line.split_whitespace().map(|v| v.parse().unwrap()).collect();
            let p = |ext: &str| format!("{dir}/{}.{ext}", f[0]);
            let codes = std::fs::read(p("codes")).unwrap();
            let stream = std::fs::read(p("stream")).unwrap();
            let shape: Vec<usize> = match info(&stream) {
                Ok(h) => {
                    let shape: Vec<usize> = h.shape.iter().map(|&d| d as usize).collect();
                    let text: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
                    std::fs::write(p("shape"), text.join(" ")).unwrap();
                    shape
                }
                Err(_) => std::fs::read_to_string(p("shape"))
                    .unwrap()
                    .split_whitespace()
                    .map(|d| d.parse().unwrap())
                    .collect(),
            };
            Call {
                index: f[0],
                shape,
                stream,
                mu: floats(&p("mu")),
                codes: codes.chunks_exact(2).map(|b| i16::from_le_bytes([b[0], b[1]])).collect(),
                joint: (f.len() >= 4).then(|| {
                    let integer = (f.len() == 5).then(|| {
                        let icoef = std::fs::read(p("icoef")).unwrap();
                        let icoef = icoef.chunks_exact(2).map(|b| i16::from_le_bytes([b[0], b[1]])).collect();
                        (floats(&p("scale")), icoef, floats(&p("unit")))
                    });
                    (f[1], f[2], f[3], floats(&p("outside")), floats(&p("coef")), floats(&p("offset")), integer)
                }),
            }
        })
        .collect();
    let encode = args.iter().any(|a| a == "--encode");
    if encode || args.iter().any(|a| a == "--reencode") {
        let mut best = f64::INFINITY;
        let mut streams: Vec<Vec<u8>> = Vec::new();
        let decoded: Vec<Vec<u16>> = calls.iter().map(|c| decoded_cache(dir, c)).collect();
        for _ in 0..if encode { rounds } else { 1 } {
            let t = std::time::Instant::now();
            streams = calls.iter().zip(&decoded).map(|(c, out)| reencode(c, out)).collect();
            best = best.min(t.elapsed().as_secs_f64());
        }
        if encode {
            let scalars: usize = calls.iter().map(|c| c.mu.len()).sum();
            let mut digest = speckv::hash::Hasher::new();
            streams.iter().for_each(|s| digest.update(s));
            println!(
                "{dir}: encode {:.0} Msym/s one thread ({:.1} ms), streams digest {:016x}",
                scalars as f64 / best / 1e6,
                best * 1e3,
                digest.finish()
            );
        }
        for (c, stream) in calls.iter_mut().zip(streams) {
            c.stream = stream;
        }
    }
    let scalars: usize = calls.iter().map(|c| c.mu.len()).sum();
    let bytes: usize = calls.iter().map(|c| c.stream.len()).sum();
    let mut outs: Vec<Vec<u8>> = calls.iter().map(|c| vec![0u8; 2 * c.mu.len()]).collect();
    let mut best = f64::INFINITY;
    for _ in 0..rounds {
        let t = std::time::Instant::now();
        for (c, out) in calls.iter().zip(outs.iter_mut()) {
            let out16: &mut [u16] = bytemuck_u16(out);
            with_prediction(c, |p| decode_into(&c.stream, BitsMut::U16(out16), Some(p), 1).unwrap());
        }
        best = best.min(t.elapsed().as_secs_f64());
    }
    let mut digest = speckv::hash::Hasher::new();
    for out in &outs {
        digest.update(out);
    }
    println!(
        "{dir}: {} calls, {scalars} scalars, {:.3} b/s, {:.0} Msym/s one thread ({:.1} ms), output digest {:016x} \
         [kernels {:?}]",
        calls.len(),
        bytes as f64 * 8.0 / scalars as f64,
        scalars as f64 / best / 1e6,
        best * 1e3,
        digest.finish(),
        speckv::kernel_report()
    );
}

/// The call's cache, decoded from the captured stream, kept beside the call the first time
/// (a later build may no longer read the captured stream's revision).
fn decoded_cache(dir: &str, c: &Call) -> Vec<u16> {
    let kept = format!("{dir}/{}.x", c.index);
    match std::fs::read(&kept) {
        Ok(b) => b.chunks_exact(2).map(|w| u16::from_le_bytes([w[0], w[1]])).collect(),
        Err(_) => {
            let mut out = vec![0u16; c.mu.len()];
            with_prediction(c, |p| decode_into(&c.stream, BitsMut::U16(&mut out), Some(p), 1).unwrap());
            std::fs::write(&kept, out.iter().flat_map(|w| w.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
            out
        }
    }
}

/// The cache coded again by this build with the captured stream's options, one thread.
fn reencode(c: &Call, out: &[u16]) -> Vec<u8> {
    let header = info(&c.stream).unwrap();
    let options = speckv::EncodeOptions {
        model: speckv::ModelKind::Bins,
        chunk_scalars: header.chunk_scalars,
        params: header.params,
        token_scale: header.token_scale,
        threads: 1,
        ..Default::default()
    };
    with_prediction(c, |p| {
        speckv::encode(speckv::Bits::U16(out), header.dtype, &header.shape, Some(p), &options).unwrap()
    })
}

/// Runs `f` with the call's prediction.
fn with_prediction<R>(c: &Call, f: impl FnOnce(&Prediction) -> R) -> R {
    let shape = &c.shape;
    let mut strides = vec![1usize; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * shape[d + 1];
    }
    let sigma = SigmaCodes::new(&c.codes, shape, &strides).unwrap();
    let joint = c.joint.as_ref().map(|(channels, tokens, e, outside, coef, offset, integer)| Joint {
        channels: *channels,
        tokens: *tokens,
        outside_channels: *e,
        outside,
        coef,
        offset,
        integer: integer.as_ref().map(|(scale, coef, unit)| IntegerJoint { scale, coef, unit }),
    });
    f(&Prediction { mu: &c.mu, sigma, joint })
}

fn bytemuck_u16(b: &mut [u8]) -> &mut [u16] {
    // SAFETY: the buffer is a whole number of u16 and Vec<u8> from the global allocator is
    // at least 8-byte aligned for these sizes; `align_to_mut` checks and we assert it.
    let (head, mid, tail) = unsafe { b.align_to_mut::<u16>() };
    assert!(head.is_empty() && tail.is_empty());
    mid
}
