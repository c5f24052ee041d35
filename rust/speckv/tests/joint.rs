//! The joint residual model: exact round trips on correlated residuals, the same bytes on any
//! thread count, fewer bits than coding each scalar alone, and refusal of other parameters.

use speckv::codec::EncodeOptions;
use speckv::joint::Joint;
use speckv::model::ladder::sigma_code;
use speckv::{
    decode_chunks_into, decode_into, encode, ideal_bits, info, Bits, BitsMut, DType, Error, Prediction, SigmaCodes,
    TokenScale,
};

mod common;

use common::{bf16, Rng};

const LAYERS: usize = 3;
const CHANNELS: usize = 6;
const TOKENS: usize = 40;

/// Residuals driven by one shared factor per token (so channels are correlated), channel-major
/// per layer; the exact conditional model of channel i given channel 0 is `e_i = w_i e_0 + noise`.
struct Case {
    x: Vec<u16>,
    mu: Vec<f32>,
    codes: Vec<i16>,
    coef: Vec<f32>,
    offset: Vec<f32>,
    plain_codes: Vec<i16>,
}

fn case(seed: u64) -> Case {
    let mut rng = Rng(seed);
    let n = LAYERS * CHANNELS * TOKENS;
    let (mut x, mut mu) = (vec![0u16; n], vec![0f32; n]);
    let weights: Vec<f32> = (0..CHANNELS).map(|i| 1.0 - 0.3 * i as f32).collect();
    for layer in 0..LAYERS {
        let factor: Vec<f32> = (0..TOKENS).map(|_| rng.normal() * 0.1).collect();
        for (c, w) in weights.iter().enumerate() {
            for (t, f) in factor.iter().enumerate() {
                let k = (layer * CHANNELS + c) * TOKENS + t;
                mu[k] = rng.normal();
                x[k] = bf16(mu[k] + w * f + 0.01 * rng.normal());
            }
        }
    }
    // channel 0 explains the rest: a[i][0] = w_i / w_0 (no outside channels)
    let mut coef = vec![0f32; LAYERS * CHANNELS * CHANNELS];
    for layer in 0..LAYERS {
        for i in 1..CHANNELS {
            coef[(layer * CHANNELS + i) * CHANNELS] = weights[i] / weights[0];
        }
    }
    let conditional = [sigma_code(0.1).unwrap()].into_iter().chain((1..CHANNELS).map(|_| sigma_code(0.012).unwrap()));
    let codes: Vec<i16> = conditional.collect();
    let plain_codes = (0..CHANNELS).map(|c| sigma_code(0.1 * weights[c].abs().max(0.1)).unwrap()).collect();
    Case { x, mu, codes, coef, offset: vec![0.0; LAYERS * CHANNELS], plain_codes }
}

fn joint(c: &Case) -> Joint<'_> {
    Joint {
        channels: CHANNELS,
        tokens: TOKENS,
        outside_channels: 0,
        outside: &[],
        coef: &c.coef,
        offset: &c.offset,
        integer: None,
    }
}

const SHAPE: [u64; 3] = [LAYERS as u64, CHANNELS as u64, TOKENS as u64];
const SIGMA_SHAPE: [usize; 3] = [LAYERS, CHANNELS, TOKENS];

fn sigma(codes: &[i16]) -> SigmaCodes<'_> {
    SigmaCodes::broadcast(codes, &[CHANNELS, 1], &SIGMA_SHAPE).unwrap()
}

#[test]
fn joint_streams_round_trip_on_any_thread_count_and_cost_less() {
    let c = case(1);
    let pred = Prediction { mu: &c.mu, sigma: sigma(&c.codes), joint: Some(joint(&c)) };
    let mut opts = EncodeOptions { chunk_scalars: (CHANNELS * TOKENS) as u32, ..Default::default() };
    let one = encode(Bits::U16(&c.x), DType::BFloat16, &SHAPE, Some(&pred), &opts).unwrap();
    opts.threads = 3;
    assert_eq!(encode(Bits::U16(&c.x), DType::BFloat16, &SHAPE, Some(&pred), &opts).unwrap(), one);
    for threads in [1, 2, 3] {
        let mut out = vec![0u16; c.x.len()];
        decode_into(&one, BitsMut::U16(&mut out), Some(&pred), threads).unwrap();
        assert_eq!(out, c.x);
    }
    // one layer alone
    let mut layer = vec![0u16; CHANNELS * TOKENS];
    decode_chunks_into(&one, BitsMut::U16(&mut layer), Some(&pred), 1, Some(2..3)).unwrap();
    assert_eq!(layer, c.x[2 * CHANNELS * TOKENS..]);
    // against the same data coded scalar by scalar with per-channel sigma
    let plain = Prediction { mu: &c.mu, sigma: sigma(&c.plain_codes), joint: None };
    let joint_bits = ideal_bits(Bits::U16(&c.x), DType::BFloat16, &SHAPE, Some(&pred), &opts).unwrap();
    let plain_bits = ideal_bits(Bits::U16(&c.x), DType::BFloat16, &SHAPE, Some(&plain), &opts).unwrap();
    assert!(joint_bits < 0.8 * plain_bits, "{joint_bits} vs {plain_bits}");
}

#[test]
fn other_parameters_and_missing_models_are_refused() {
    let c = case(2);
    let pred = Prediction { mu: &c.mu, sigma: sigma(&c.codes), joint: Some(joint(&c)) };
    let opts = EncodeOptions { chunk_scalars: (CHANNELS * TOKENS) as u32, ..Default::default() };
    let data = encode(Bits::U16(&c.x), DType::BFloat16, &SHAPE, Some(&pred), &opts).unwrap();
    let mut out = vec![0u16; c.x.len()];
    let mut other = c.coef.clone();
    other[CHANNELS * CHANNELS + CHANNELS] += 0.5; // layer 1, channel 1
    let wrong = Prediction { joint: Some(Joint { coef: &other, ..joint(&c) }), ..pred.clone() };
    let r = decode_into(&data, BitsMut::U16(&mut out), Some(&wrong), 1);
    assert!(matches!(r, Err(Error::PredictionMismatch(m)) if m.contains("chunk 1")));
    let none = Prediction { joint: None, ..pred.clone() };
    assert!(matches!(decode_into(&data, BitsMut::U16(&mut out), Some(&none), 1), Err(Error::PredictionMismatch(_))));
    let plain = encode(Bits::U16(&c.x), DType::BFloat16, &SHAPE, Some(&none), &opts).unwrap();
    assert!(matches!(decode_into(&plain, BitsMut::U16(&mut out), Some(&pred), 1), Err(Error::PredictionMismatch(_))));
    // chunks that split a layer, arrays of the wrong size, float32
    let split = EncodeOptions { chunk_scalars: (CHANNELS * TOKENS / 2) as u32, ..Default::default() };
    let r = encode(Bits::U16(&c.x), DType::BFloat16, &SHAPE, Some(&pred), &split);
    assert!(matches!(r, Err(Error::InvalidArgument(m)) if m.contains("whole layers")));
    let short = Prediction { joint: Some(Joint { offset: &c.offset[1..], ..joint(&c) }), ..pred.clone() };
    assert!(matches!(
        encode(Bits::U16(&c.x), DType::BFloat16, &SHAPE, Some(&short), &opts),
        Err(Error::InvalidArgument(_))
    ));
    let words: Vec<u32> = c.mu.iter().map(|m| m.to_bits()).collect();
    assert!(matches!(
        encode(Bits::U32(&words), DType::Float32, &SHAPE, Some(&pred), &opts),
        Err(Error::InvalidArgument(m)) if m.contains("8- and 16-bit")
    ));
}

#[test]
fn outside_channels_condition_the_stream() {
    // the "values" stream conditioned on the "keys" residuals given from outside
    let c = case(3);
    let mut rng = Rng(30);
    let outside: Vec<f32> = (0..LAYERS * TOKENS).map(|_| rng.normal() * 0.1).collect();
    let mut coef = vec![0f32; LAYERS * CHANNELS * (CHANNELS + 1)];
    for (k, v) in coef.iter_mut().enumerate() {
        *v = ((k % 7) as f32 - 3.0) * 0.01;
    }
    let j = Joint {
        channels: CHANNELS,
        tokens: TOKENS,
        outside_channels: 1,
        outside: &outside,
        coef: &coef,
        offset: &c.offset,
        integer: None,
    };
    let pred = Prediction { mu: &c.mu, sigma: sigma(&c.codes), joint: Some(j) };
    let opts = EncodeOptions { chunk_scalars: (2 * CHANNELS * TOKENS) as u32, ..Default::default() };
    let data = encode(Bits::U16(&c.x), DType::BFloat16, &SHAPE, Some(&pred), &opts).unwrap();
    let mut out = vec![0u16; c.x.len()];
    decode_into(&data, BitsMut::U16(&mut out), Some(&pred), 2).unwrap();
    assert_eq!(out, c.x);
}

#[test]
fn layers_without_coefficients_are_coded_as_they_are() {
    // invariant J2: an all-zero layer codes like the plain model (one run, mu itself), here
    // checked on the ideal code length, and still round trips next to a conditioned layer
    let c = case(4);
    let mut coef = c.coef.clone();
    coef[..CHANNELS * CHANNELS].fill(0.0); // layer 0 plain
    let j = Joint { coef: &coef, ..joint(&c) };
    let pred = Prediction { mu: &c.mu, sigma: sigma(&c.codes), joint: Some(j) };
    assert!(j.is_plain(0) && !j.is_plain(1));
    let opts = EncodeOptions { chunk_scalars: (CHANNELS * TOKENS) as u32, ..Default::default() };
    let data = encode(Bits::U16(&c.x), DType::BFloat16, &SHAPE, Some(&pred), &opts).unwrap();
    let mut out = vec![0u16; c.x.len()];
    decode_into(&data, BitsMut::U16(&mut out), Some(&pred), 2).unwrap();
    assert_eq!(out, c.x);
    let layer = CHANNELS * TOKENS;
    let shape = [1u64, CHANNELS as u64, TOKENS as u64];
    let one = SigmaCodes::broadcast(&c.codes, &[CHANNELS, 1], &[1, CHANNELS, TOKENS]).unwrap();
    let plain = Prediction { mu: &c.mu[..layer], sigma: one.clone(), joint: None };
    let zero = [0f32; CHANNELS * CHANNELS];
    let no_offset = [0f32; CHANNELS];
    let j0 = Joint { coef: &zero, offset: &no_offset, ..joint(&c) };
    let as_joint = Prediction { mu: &c.mu[..layer], sigma: one, joint: Some(j0) };
    let x0 = Bits::U16(&c.x[..layer]);
    let a = ideal_bits(x0, DType::BFloat16, &shape, Some(&plain), &opts).unwrap();
    let b = ideal_bits(x0, DType::BFloat16, &shape, Some(&as_joint), &opts).unwrap();
    assert_eq!(a, b);
}

#[test]
fn the_token_scale_follows_each_tokens_size_and_the_stream_records_it() {
    // residuals whose size depends on the token (x1/8 or x4 of the shared noise): the token
    // scale learns it from the channels coded first, and the decoder reads its knobs from the
    // header
    let mut c = case(5);
    let mut rng = Rng(50);
    for layer in 0..LAYERS {
        for t in 0..TOKENS {
            let size = if t % 3 == 0 { 4.0 } else { 0.125 };
            for ch in 0..CHANNELS {
                let k = (layer * CHANNELS + ch) * TOKENS + t;
                c.x[k] = bf16(c.mu[k] + size * 0.012 * rng.normal());
            }
        }
    }
    // a joint layer (not J2-plain) whose mean correction does nothing measurable
    c.coef.fill(0.0);
    c.offset.fill(1e-9);
    c.codes.fill(sigma_code(0.012).unwrap());
    let pred = Prediction { mu: &c.mu, sigma: sigma(&c.codes), joint: Some(joint(&c)) };
    let on = EncodeOptions { chunk_scalars: (CHANNELS * TOKENS) as u32, ..Default::default() };
    let off = EncodeOptions { token_scale: None, ..on.clone() };
    let wide = EncodeOptions { token_scale: Some(TokenScale { prior: 1, clamp: 255 }), ..on.clone() };
    let mut sizes = vec![];
    for opts in [&on, &off, &wide] {
        let data = encode(Bits::U16(&c.x), DType::BFloat16, &SHAPE, Some(&pred), opts).unwrap();
        assert_eq!(info(&data).unwrap().token_scale, opts.token_scale);
        for threads in [1, 3] {
            let mut out = vec![0u16; c.x.len()];
            decode_into(&data, BitsMut::U16(&mut out), Some(&pred), threads).unwrap();
            assert_eq!(out, c.x);
        }
        let mut layer = vec![0u16; CHANNELS * TOKENS];
        decode_chunks_into(&data, BitsMut::U16(&mut layer), Some(&pred), 1, Some(1..2)).unwrap();
        assert_eq!(layer, c.x[CHANNELS * TOKENS..2 * CHANNELS * TOKENS]);
        sizes.push(ideal_bits(Bits::U16(&c.x), DType::BFloat16, &SHAPE, Some(&pred), opts).unwrap());
    }
    assert!(sizes[0] < 0.9 * sizes[1], "token scale {} vs calibrated sigmas {}", sizes[0], sizes[1]);
    assert_ne!(sizes[0], sizes[2], "the knobs change the model");
    // the knobs are range-checked on both sides
    let zero = EncodeOptions { token_scale: Some(TokenScale { prior: 0, clamp: 25 }), ..on.clone() };
    let r = encode(Bits::U16(&c.x), DType::BFloat16, &SHAPE, Some(&pred), &zero);
    assert!(matches!(r, Err(Error::InvalidArgument(m)) if m.contains("token scale")));
    let mut data = encode(Bits::U16(&c.x), DType::BFloat16, &SHAPE, Some(&pred), &on).unwrap();
    let knobs = 24 + 8 * SHAPE.len() + 16 + 2; // header offset +18, after the shape and parameters
    assert_eq!(&data[knobs..knobs + 2], &[4, 25]);
    data[knobs] = 0;
    assert!(matches!(info(&data), Err(Error::Corrupt(m)) if m.contains("token scale")));
}

#[test]
fn jointly_coded_layers_coded_apart_join_into_the_whole_stream() {
    // a codec codes a cache layer by layer as its prediction comes (`format::splice`): each
    // layer with its own slice of the parameters, token scale on, joined afterwards
    let c = case(4);
    let layer = CHANNELS * TOKENS;
    let opts = EncodeOptions { chunk_scalars: layer as u32, ..Default::default() };
    let pred = Prediction { mu: &c.mu, sigma: sigma(&c.codes), joint: Some(joint(&c)) };
    let whole = encode(Bits::U16(&c.x), DType::BFloat16, &SHAPE, Some(&pred), &opts).unwrap();
    let rows = CHANNELS * CHANNELS;
    let one_shape = [1u64, CHANNELS as u64, TOKENS as u64];
    let parts: Vec<Vec<u8>> = (0..LAYERS)
        .map(|l| {
            let j = Joint {
                coef: &c.coef[l * rows..(l + 1) * rows],
                offset: &c.offset[l * CHANNELS..(l + 1) * CHANNELS],
                ..joint(&c)
            };
            let sigma = SigmaCodes::broadcast(&c.codes, &[CHANNELS, 1], &[1, CHANNELS, TOKENS]).unwrap();
            let p = Prediction { mu: &c.mu[l * layer..(l + 1) * layer], sigma, joint: Some(j) };
            encode(Bits::U16(&c.x[l * layer..(l + 1) * layer]), DType::BFloat16, &one_shape, Some(&p), &opts).unwrap()
        })
        .collect();
    let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
    assert_eq!(speckv::format::splice::join(&refs).unwrap(), whole);
    for (l, part) in parts.iter().enumerate() {
        assert_eq!(&speckv::format::splice::cut(&whole, l..l + 1).unwrap(), part);
    }
}

/// The integer form's arrays (`speckv::joint_integer::build`) of a case whose residuals have
/// sigma 0.1 on channel 0 and about 0.012 on the rest.
fn integer_arrays(c: &Case) -> (Vec<f32>, Vec<i16>, Vec<f32>) {
    let sigma: Vec<f32> = (0..LAYERS * CHANNELS).map(|k| if k % CHANNELS == 0 { 0.1 } else { 0.012 }).collect();
    speckv::joint_integer::build(CHANNELS, 0, &c.coef, &sigma).unwrap()
}

#[test]
fn the_integer_form_round_trips_on_any_thread_count_and_model_and_costs_about_the_float_forms_bits() {
    use speckv::format::header::{FLAG_JOINT, FLAG_JOINT_INT};
    use speckv::joint_integer::IntegerJoint;
    use speckv::ModelKind;
    let c = case(7);
    let (scale, coef, unit) = integer_arrays(&c);
    let integer = IntegerJoint { scale: &scale, coef: &coef, unit: &unit };
    let with = Joint { integer: Some(integer), ..joint(&c) };
    let pred = Prediction { mu: &c.mu, sigma: sigma(&c.codes), joint: Some(with) };
    let float = Prediction { joint: Some(joint(&c)), ..pred.clone() };
    for model in [ModelKind::Exact, ModelKind::Bins] {
        for scale in [None, Some(TokenScale::default())] {
            let mut opts = EncodeOptions {
                chunk_scalars: (CHANNELS * TOKENS) as u32,
                model,
                token_scale: scale,
                ..Default::default()
            };
            let one = encode(Bits::U16(&c.x), DType::BFloat16, &SHAPE, Some(&pred), &opts).unwrap();
            let flags = info(&one).unwrap().flags;
            assert_eq!(flags & (FLAG_JOINT | FLAG_JOINT_INT), FLAG_JOINT | FLAG_JOINT_INT);
            opts.threads = 3;
            assert_eq!(encode(Bits::U16(&c.x), DType::BFloat16, &SHAPE, Some(&pred), &opts).unwrap(), one);
            for threads in [1, 2, 3] {
                let mut out = vec![0u16; c.x.len()];
                decode_into(&one, BitsMut::U16(&mut out), Some(&pred), threads).unwrap();
                assert_eq!(out, c.x, "{model:?} {scale:?} threads {threads}");
            }
            // without the integer arrays the stream is refused, not misread
            let mut out = vec![0u16; c.x.len()];
            let err = decode_into(&one, BitsMut::U16(&mut out), Some(&float), 1).unwrap_err();
            assert!(matches!(err, Error::PredictionMismatch(_)), "{err:?}");
            // a float-form stream decodes as before even where the integer arrays are given
            let old = encode(Bits::U16(&c.x), DType::BFloat16, &SHAPE, Some(&float), &opts).unwrap();
            assert_eq!(info(&old).unwrap().flags & FLAG_JOINT_INT, 0);
            decode_into(&old, BitsMut::U16(&mut out), Some(&pred), 2).unwrap();
            assert_eq!(out, c.x);
            // other integer coefficients: refused by the chunks' fingerprints
            let mut other = coef.clone();
            other[CHANNELS] += 1; // layer 0: channel 1's coefficient on channel 0
            let wrong = Joint { integer: Some(IntegerJoint { coef: &other, ..integer }), ..joint(&c) };
            let wrong = Prediction { joint: Some(wrong), ..pred.clone() };
            let err = decode_into(&one, BitsMut::U16(&mut out), Some(&wrong), 1).unwrap_err();
            assert!(matches!(err, Error::PredictionMismatch(_)), "{err:?}");
        }
    }
    let opts = EncodeOptions { chunk_scalars: (CHANNELS * TOKENS) as u32, ..Default::default() };
    let int_bits = ideal_bits(Bits::U16(&c.x), DType::BFloat16, &SHAPE, Some(&pred), &opts).unwrap();
    let float_bits = ideal_bits(Bits::U16(&c.x), DType::BFloat16, &SHAPE, Some(&float), &opts).unwrap();
    assert!((int_bits - float_bits).abs() < 0.005 * float_bits, "{int_bits} vs {float_bits}");
}
