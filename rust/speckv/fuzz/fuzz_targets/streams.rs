//! Structured: a tensor of any dtype and bit patterns, a prediction of any floats (NaN and
//! infinities too), any sigma codes, a joint model with any coefficients, any model
//! parameters and chunk size, or the fast lane with any channel period. Whatever `encode` accepts must decode to the same bits on any
//! thread count, with the same bytes from any thread count, and so must its second half of
//! chunks alone. Then the stream is damaged (bytes xored anywhere; checksums are not compared
//! in fuzz builds, `hash::matches`), and decoding it must answer with a result or a typed
//! error, never a panic or a hang.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use speckv::codec::EncodeOptions;
use speckv::joint::Joint;
use speckv::model::ModelParams;
use speckv::{
    decode_chunks_into, decode_into, decoded_len, encode, info, Bits, BitsMut, DType, ModelKind, Prediction,
    SigmaCodes, TokenScale,
};

/// Model parameters, mapped onto `ModelParams::validate`'s ranges and one step past each end
/// (so most are accepted, and every bound is tried).
#[derive(Debug, Arbitrary)]
struct Params {
    table_precision: u8,
    min_scale_log2: i8,
    max_scale_log2: i8,
    window_scales: u8,
    weight_narrow: u16,
    weight_wide: u16,
    weight_escape: u16,
    wide_factor: u8,
    adapt_increment: u16,
    adapt_period: u16,
    adapt_shift: u8,
}

impl Params {
    fn near_valid(&self) -> ModelParams {
        let escape = 15 + self.weight_escape % 2048;
        let wide = self.weight_wide % (65536 - escape as u32) as u16;
        let narrow = (65536 - escape as u32 - wide as u32) as u16 ^ (self.weight_narrow & 1);
        ModelParams {
            table_precision: 11 + self.table_precision % 15,
            min_scale_log2: -9 + self.min_scale_log2.rem_euclid(11),
            max_scale_log2: self.max_scale_log2.rem_euclid(10),
            window_scales: 3 + self.window_scales % 63,
            weight_narrow: narrow,
            weight_wide: wide,
            weight_escape: escape,
            wide_factor: self.wide_factor % 18,
            adapt_increment: self.adapt_increment % 1026,
            adapt_period: 15 + self.adapt_period % 16372,
            adapt_shift: self.adapt_shift % 17,
        }
    }
}

#[derive(Debug, Arbitrary)]
struct Case {
    dtype: u8,
    /// shape `[layers, channels, tokens]`, each small
    layers: u8,
    channels: u8,
    tokens: u8,
    chunk: u16,
    /// the predicted model: exact, fast or bins
    model: u8,
    predicted: bool,
    /// predictor-free streams through the fast lane, with this channel period
    fast_lane: Option<u8>,
    /// joint model with this many outside channels (0..=2)
    joint: Option<u8>,
    token_scale: Option<(u8, u8)>,
    params: Option<Params>,
    threads: u8,
    words: Vec<u32>,
    /// mu = the scalar's own value plus `noise * 2^-shift`, or any float bits
    noise: Vec<i8>,
    raw_mu: Option<Vec<u32>>,
    codes: Vec<i16>,
    coef: Vec<f32>,
    edits: Vec<(u16, u8)>,
}

/// A pattern's value (mu near it makes streams that exercise the model, not only escapes).
fn value(dtype: DType, bits: u32) -> f32 {
    match dtype {
        DType::Float32 => f32::from_bits(bits),
        DType::BFloat16 => f32::from_bits(bits << 16),
        _ => {
            let (e, m) = (dtype.exponent_bits(), dtype.mantissa_bits());
            let sign = if bits >> (e + m) & 1 == 1 { -1.0 } else { 1.0 };
            let exp = (bits >> m) & ((1 << e) - 1);
            let frac = (bits & ((1 << m) - 1)) as f32 / (1 << m) as f32;
            let magnitude = if exp == 0 {
                frac * 2f32.powi(1 - dtype.exponent_bias())
            } else {
                (1.0 + frac) * 2f32.powi(exp as i32 - dtype.exponent_bias())
            };
            sign * magnitude
        }
    }
}

fn cycle<T: Copy>(source: &[T], n: usize, default: T) -> Vec<T> {
    (0..n).map(|i| if source.is_empty() { default } else { source[i % source.len()] }).collect()
}

fuzz_target!(|case: Case| {
    let dtype = DType::ALL[case.dtype as usize % DType::ALL.len()];
    let (layers, channels, tokens) =
        (1 + case.layers as usize % 4, 1 + case.channels as usize % 6, 1 + case.tokens as usize % 48);
    let n = layers * channels * tokens;
    let shape = [layers as u64, channels as u64, tokens as u64];
    let x: Vec<u32> = cycle(&case.words, n, 0).into_iter().map(|w| w & dtype.mask()).collect();
    let mu: Vec<f32> = match &case.raw_mu {
        Some(bits) => cycle(bits, n, 0).into_iter().map(f32::from_bits).collect(),
        None => {
            let noise = cycle(&case.noise, n, 0);
            x.iter().zip(noise).map(|(&w, e)| value(dtype, w) + e as f32 / 64.0).collect()
        }
    };
    let width = case.joint.map_or(0, |e| e as usize % 3);
    let codes = cycle(&case.codes, channels, 0);
    let sigma = SigmaCodes::broadcast(&codes, &[channels, 1], &[layers, channels, tokens]).expect("codes per channel");
    let outside: Vec<f32> = cycle(&case.coef, layers * width * tokens, 0.5);
    let coef: Vec<f32> = cycle(&case.coef, layers * channels * (width + channels), 0.0);
    let offset: Vec<f32> = cycle(&case.coef, layers * channels, 0.0).iter().map(|c| c / 4.0).collect();
    // every other joint case in the integer form (J4), its sigmas from the same bytes
    let sigmas: Vec<f32> = cycle(&case.coef, layers * (width + channels), 1.0);
    let form = case
        .joint
        .filter(|e| e / 3 % 2 == 1)
        .map(|_| speckv::joint_integer::build(channels, width, &coef, &sigmas).expect("whole layers"));
    let joint = case.joint.map(|_| Joint {
        channels,
        tokens,
        outside_channels: width,
        outside: &outside,
        coef: &coef,
        offset: &offset,
        integer: form.as_ref().map(|(scale, coef, unit)| speckv::joint_integer::IntegerJoint { scale, coef, unit }),
    });
    let prediction = Prediction { mu: &mu, sigma, joint };
    let prediction = case.predicted.then_some(&prediction);
    let mut options = EncodeOptions {
        threads: 1,
        chunk_scalars: 1 + case.chunk as u32 % (2 * n as u32),
        torch_hint: false,
        model: [ModelKind::Exact, ModelKind::Fast, ModelKind::Bins][case.model as usize % 3],
        token_scale: case.token_scale.map(|(prior, clamp)| TokenScale { prior, clamp }),
        fast_lane: case.fast_lane.is_some(),
        context_period: case.fast_lane.map(|p| 1 + p as u32 % 70),
        ..Default::default()
    };
    if case.joint.is_some() {
        // whole layers per chunk, as the joint model asks
        options.chunk_scalars = ((1 + case.chunk as usize % layers) * channels * tokens) as u32;
    }
    if let Some(p) = &case.params {
        options.params = p.near_valid();
    }
    let words = Words::of(dtype, &x);
    let Ok(stream) = encode(words.bits(), dtype, &shape, prediction, &options) else { return };
    options.threads = 2 + case.threads as usize % 3;
    let again = encode(words.bits(), dtype, &shape, prediction, &options).expect("accepted on one thread");
    assert!(again == stream, "the bytes depend on the thread count");
    for threads in [1, options.threads] {
        let mut out = Words::zeros(dtype, n);
        decode_into(&stream, out.bits_mut(), prediction, threads).expect("its own stream decodes");
        assert!(out.words() == x, "round trip is not exact");
    }
    // the second half of its chunks alone, as a reader of one layer decodes them
    let header = info(&stream).expect("its own header parses");
    let part = header.chunks.len() / 2..header.chunks.len();
    let first = header.chunk_scalar_range(part.start).start;
    let len = decoded_len(&header, Some(part.clone())).expect("a range of its own chunks");
    let mut out = Words::zeros(dtype, len);
    decode_chunks_into(&stream, out.bits_mut(), prediction, 2, Some(part)).expect("its own chunks decode");
    assert!(out.words() == x[first..first + len], "a range of chunks does not decode exactly");
    if case.edits.is_empty() {
        return;
    }
    let mut damaged = stream.clone();
    for &(at, xor) in &case.edits {
        let at = at as usize % damaged.len();
        damaged[at] ^= xor;
    }
    let mut out = Words::zeros(dtype, n);
    if decode_into(&damaged, out.bits_mut(), prediction, 1).is_ok() && damaged == stream {
        assert!(out.words() == x);
    }
});

/// The tensor in its own word width.
enum Words {
    U8(Vec<u8>),
    U16(Vec<u16>),
    U32(Vec<u32>),
}

impl Words {
    fn of(dtype: DType, x: &[u32]) -> Words {
        match dtype.bits() {
            8 => Words::U8(x.iter().map(|&w| w as u8).collect()),
            16 => Words::U16(x.iter().map(|&w| w as u16).collect()),
            _ => Words::U32(x.to_vec()),
        }
    }
    fn zeros(dtype: DType, n: usize) -> Words {
        Words::of(dtype, &vec![0; n])
    }
    fn bits(&self) -> Bits<'_> {
        match self {
            Words::U8(w) => Bits::U8(w),
            Words::U16(w) => Bits::U16(w),
            Words::U32(w) => Bits::U32(w),
        }
    }
    fn bits_mut(&mut self) -> BitsMut<'_> {
        match self {
            Words::U8(w) => BitsMut::U8(w),
            Words::U16(w) => BitsMut::U16(w),
            Words::U32(w) => BitsMut::U32(w),
        }
    }
    fn words(&self) -> Vec<u32> {
        match self {
            Words::U8(w) => w.iter().map(|&w| w as u32).collect(),
            Words::U16(w) => w.iter().map(|&w| w as u32).collect(),
            Words::U32(w) => w.clone(),
        }
    }
}
