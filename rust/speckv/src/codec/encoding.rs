//! A tensor into a stream: its chunks coded on every thread, the header and index written;
//! and the ideal code length of the same coding, without a stream.

use super::joint_runs::{joint_fingerprint, joint_runs};
use super::lanes::join_lanes;
use super::{check_joint, checked_scalars, fingerprint_of, shape_scalars, stream_model, with_codes, EncodeOptions};
use crate::bins;
use crate::chunk::{ModelKind, PredictedModel, StreamModel, LANES};
use crate::coder::{IdealMeter, RangeEncoder, SymbolSink};
use crate::dtype::DType;
use crate::error::{invalid, Error, Result};
use crate::fast_lane;
use crate::format::header::{
    chunk_count, ChunkEntry, Header, FAST_LANE_VERSION, FLAG_FAST_LANE, FLAG_FAST_MODEL, FLAG_JOINT, FLAG_JOINT_INT,
    FLAG_PREDICTED, FLAG_TOKEN_SCALE, FLAG_TORCH_HINT,
};
use crate::hash::checksum;
use crate::joint::Joint;
use crate::model::ModelParams;
use crate::parallel::map_chunks;
use crate::prediction::{codes_and_fingerprint, Prediction};
use crate::words::{Bits, Word};

/// Codes scalars `range` of `x` into `lanes` (coders or meters), against the prediction if
/// any, and returns the chunk's prediction fingerprint (0 without one).
fn code_chunk<W: Word, S: SymbolSink, const N: usize>(
    model: &StreamModel,
    lanes: &mut [S; N],
    x: &[W],
    prediction: Option<&Prediction>,
    range: std::ops::Range<usize>,
) -> u64 {
    match prediction {
        Some(p @ Prediction { joint: Some(joint), .. }) => with_codes(|codes| {
            let plain = codes_and_fingerprint(&p.mu[range.clone()], &p.sigma, range.start, codes);
            // the encoder's words are only read; `joint_runs` takes a slice it may write
            let mut words = x[range.clone()].to_vec();
            let mut escapes = model.escapes();
            joint_runs(model, joint, &mut words, p.mu, codes, range.start, |run_x, corrected, run_codes| {
                model.encode_predicted_with(lanes, &mut escapes, run_x, corrected, run_codes);
            });
            joint_fingerprint(plain, joint, &range)
        }),
        Some(p) => {
            let mu = &p.mu[range.clone()];
            with_codes(|codes| {
                let fingerprint = codes_and_fingerprint(mu, &p.sigma, range.start, codes);
                model.encode_predicted(lanes, &x[range], mu, codes);
                fingerprint
            })
        }
        None => {
            model.encode_raw(lanes, &x[range.clone()], range.start);
            0
        }
    }
}

/// Encodes the scalars `x` (bit patterns of `dtype`, C order, `shape`) into a stream.
pub fn encode(
    x: Bits,
    dtype: DType,
    shape: &[u64],
    prediction: Option<&Prediction>,
    options: &EncodeOptions,
) -> Result<Vec<u8>> {
    let n = checked_scalars(x, dtype, shape, prediction)?;
    let model = stream_model(dtype, shape, options, prediction)?;
    if options.fast_lane {
        return encode_fast_lane(x, model, shape, prediction, options);
    }
    let chunk = options.chunk_scalars as usize;
    check_joint(dtype, n, chunk, prediction)?;
    if let (Some(p), ModelKind::Bins) = (prediction, options.model.for_dtype(dtype)) {
        return encode_bins(x, &model, shape, p, options);
    }
    let n_chunks = chunk_count(n as u64, options.chunk_scalars) as usize;
    let payloads: Vec<(Vec<u8>, u64)> = with_words!(x, |x| {
        map_chunks(options.threads, n_chunks, |i| {
            let range = i * chunk..((i + 1) * chunk).min(n);
            let words = range.len() * dtype.bits() as usize / (64 * LANES) + 4;
            let mut enc: [RangeEncoder; LANES] = std::array::from_fn(|_| RangeEncoder::with_capacity_words(words));
            let fingerprint = code_chunk(&model, &mut enc, x, prediction, range);
            Ok((join_lanes(enc), fingerprint))
        })?
    });
    let flags = if prediction.is_some() { FLAG_PREDICTED } else { 0 }
        | if prediction.is_some_and(|p| p.joint.is_some()) { FLAG_JOINT } else { 0 }
        | if prediction.is_some_and(|p| p.joint.is_some_and(|j| j.integer.is_some())) { FLAG_JOINT_INT } else { 0 }
        | if model.token_scale.is_some() { FLAG_TOKEN_SCALE } else { 0 }
        | if prediction.is_some() && options.model.for_dtype(dtype) == ModelKind::Fast { FLAG_FAST_MODEL } else { 0 };
    let payloads = payloads.iter().map(|(bytes, fingerprint)| (bytes.as_slice(), *fingerprint));
    write_stream(&model, shape, options, flags, payloads, n_chunks)
}

/// `encode` with the bins model: every chunk coded by `bins::Encoder`, run by run as the
/// other models are (`joint_runs` with the joint model), and the header of `bins::CURRENT`'s version.
fn encode_bins(
    x: Bits,
    model: &StreamModel,
    shape: &[u64],
    p: &Prediction,
    options: &EncodeOptions,
) -> Result<Vec<u8>> {
    let PredictedModel::Bins { tables } = &model.predicted else {
        return invalid("bins: the stream model is not the bins model");
    };
    let (n, chunk, dtype) = (x.len(), options.chunk_scalars as usize, model.dtype);
    let n_chunks = chunk_count(n as u64, options.chunk_scalars) as usize;
    let payloads: Vec<(Vec<u8>, u64)> = with_words!(x, |x| {
        map_chunks(options.threads, n_chunks, |i| {
            let range = i * chunk..((i + 1) * chunk).min(n);
            let mut enc = bins::Encoder::new(dtype, tables.clone(), range.len())?;
            let fingerprint = with_codes(|codes| {
                let plain = codes_and_fingerprint(&p.mu[range.clone()], &p.sigma, range.start, codes);
                match &p.joint {
                    Some(joint) => {
                        let mut words = x[range.clone()].to_vec();
                        joint_runs(
                            model,
                            joint,
                            &mut words,
                            p.mu,
                            codes,
                            range.start,
                            |run_x, corrected, run_codes| enc.run(run_x, corrected, run_codes),
                        );
                        joint_fingerprint(plain, joint, &range)
                    }
                    None => {
                        enc.run(&x[range.clone()], &p.mu[range.clone()], codes);
                        plain
                    }
                }
            });
            Ok((enc.finish(), fingerprint))
        })?
    });
    let flags = FLAG_PREDICTED
        | FLAG_FAST_LANE
        | if p.joint.is_some() { FLAG_JOINT } else { 0 }
        | if p.joint.is_some_and(|j| j.integer.is_some()) { FLAG_JOINT_INT } else { 0 }
        | if model.token_scale.is_some() { FLAG_TOKEN_SCALE } else { 0 };
    let payloads = payloads.iter().map(|(bytes, fingerprint)| (bytes.as_slice(), *fingerprint));
    write_stream(model, shape, options, flags, payloads, n_chunks)
}

/// `encode` with `options.fast_lane`: every chunk coded by `fast_lane::encode_chunk`.
fn encode_fast_lane(
    x: Bits,
    mut model: StreamModel,
    shape: &[u64],
    prediction: Option<&Prediction>,
    options: &EncodeOptions,
) -> Result<Vec<u8>> {
    if prediction.is_some() {
        return invalid("fast_lane: the fast lane codes predictor-free streams (no mu/sigma)");
    }
    if fast_lane::Split::of(model.dtype).is_none() {
        return invalid(format!("fast_lane: {} is not an 8- or 16-bit format", model.dtype.name()));
    }
    let (n, chunk, period) = (x.len(), options.chunk_scalars as usize, model.context_period);
    let n_chunks = chunk_count(n as u64, options.chunk_scalars) as usize;
    let payloads: Vec<Vec<u8>> = with_words!(x, |x| {
        map_chunks(options.threads, n_chunks, |i| {
            fast_lane::encode_chunk(&x[i * chunk..((i + 1) * chunk).min(n)], period)
        })?
    });
    // the header's predictor-free contexts and model parameters are unused: 1 and the defaults
    model.raw_contexts = 1;
    let options = EncodeOptions { params: ModelParams::default(), ..options.clone() };
    let payloads = payloads.iter().map(|bytes| (bytes.as_slice(), 0));
    write_stream(&model, shape, &options, FLAG_FAST_LANE, payloads, n_chunks)
}

/// The stream of `payloads` (each chunk's bytes and prediction fingerprint, in order): the
/// header `encode` writes for `model`, `options` and `flags` (with `FLAG_TORCH_HINT` from the
/// options), then the payloads.
fn write_stream<'a>(
    model: &StreamModel,
    shape: &[u64],
    options: &EncodeOptions,
    flags: u16,
    payloads: impl Iterator<Item = (&'a [u8], u64)> + Clone,
    n_chunks: usize,
) -> Result<Vec<u8>> {
    let predicted = flags & FLAG_PREDICTED != 0;
    let fast = flags & FLAG_FAST_LANE != 0;
    let mut header = Header {
        version: match (fast, predicted) {
            (true, true) => bins::CURRENT.version,
            (true, false) => FAST_LANE_VERSION,
            (false, _) => crate::format::FORMAT_VERSION,
        },
        flags: flags | if options.torch_hint { FLAG_TORCH_HINT } else { 0 },
        dtype: model.dtype,
        shape: shape.to_vec(),
        chunk_scalars: options.chunk_scalars,
        n_scalars: shape.iter().product(),
        lanes: match (fast, predicted) {
            (true, true) => bins::CURRENT.states as u8,
            (true, false) => fast_lane::STATES as u8,
            (false, _) => LANES as u8,
        },
        params: options.params,
        raw_contexts: model.raw_contexts as u16,
        token_scale: model.token_scale,
        context_period: model.context_period.min(u32::MAX as usize) as u32,
        table_digest: if predicted { model.table_digest() } else { 0 },
        fingerprint: 0,
        chunks: Vec::with_capacity(n_chunks),
    };
    let mut offset = crate::format::header::header_len(shape.len(), n_chunks) as u64;
    for (bytes, fingerprint) in payloads.clone() {
        let length = u32::try_from(bytes.len()).map_err(|_| Error::InvalidArgument("chunk too large".into()))?;
        header.chunks.push(ChunkEntry { offset, length, checksum: checksum(bytes), fingerprint });
        offset += length as u64;
    }
    if predicted {
        header.fingerprint = fingerprint_of(&header.chunks);
    }
    let mut stream = header.write();
    stream.reserve_exact(offset as usize - stream.len());
    for (bytes, _) in payloads {
        stream.extend_from_slice(bytes);
    }
    Ok(stream)
}

/// The stream `encode` writes for a prediction coded with the exact model, from chunks coded
/// elsewhere (the CUDA module, `cuda/speckv_coder.cuh`): `payload` holds every chunk's bytes
/// back to back, `lengths` and `fingerprints` one entry per chunk of `chunk_scalars` scalars.
/// The fingerprints are the plain ones (mu and sigma codes, `codes_and_fingerprint`); with
/// `joint` (its `outside` may be empty: only the layout and the parameters' digests are read)
/// they are mixed with the layers' digests as `encode` does, and the header records the joint
/// model and the options' token scale. The chunks' bytes are taken as they are (a decoder
/// checks them as it reads them); only the layout is checked here.
pub fn assemble_predicted(
    dtype: DType,
    shape: &[u64],
    options: &EncodeOptions,
    payload: &[u8],
    lengths: &[u32],
    fingerprints: &[u64],
    joint: Option<&Joint>,
) -> Result<Vec<u8>> {
    if dtype.bits() > 16 || options.model != ModelKind::Exact {
        return invalid("chunks coded elsewhere use the exact model, for 8- and 16-bit formats");
    }
    let n = shape_scalars(shape)?;
    let mut model = stream_model(dtype, shape, options, None)?;
    let n_chunks = chunk_count(n, options.chunk_scalars) as usize;
    if lengths.len() != n_chunks || fingerprints.len() != n_chunks {
        return invalid(format!(
            "{n_chunks} chunks of {} scalars expected, {} lengths and {} fingerprints given",
            options.chunk_scalars,
            lengths.len(),
            fingerprints.len()
        ));
    }
    if lengths.iter().map(|&l| l as u64).sum::<u64>() != payload.len() as u64 {
        return invalid("payload: its length is not the sum of the chunks' lengths");
    }
    let mut flags = FLAG_PREDICTED;
    let mut prints = fingerprints.to_vec();
    if let Some(j) = joint {
        // chunks coded elsewhere (the GPU) take the float form's sums (J1)
        let j = &Joint { integer: None, ..*j };
        j.check_parameters(n as usize, options.chunk_scalars as usize)?;
        flags |= FLAG_JOINT;
        if let Some(scale) = options.token_scale {
            scale.check()?;
            model.token_scale = Some(scale);
            flags |= FLAG_TOKEN_SCALE;
        }
        let chunk = options.chunk_scalars as usize;
        for (i, print) in prints.iter_mut().enumerate() {
            *print = joint_fingerprint(*print, j, &(i * chunk..((i + 1) * chunk).min(n as usize)));
        }
    }
    let mut chunks = Vec::with_capacity(n_chunks);
    let mut rest = payload;
    for (&length, &fingerprint) in lengths.iter().zip(&prints) {
        let (bytes, tail) = rest.split_at(length as usize);
        chunks.push((bytes, fingerprint));
        rest = tail;
    }
    write_stream(&model, shape, options, flags, chunks.iter().copied(), n_chunks)
}

/// Bits the model asks for, summed over every scalar: what a perfect coder driven by exactly
/// the model of `encode` would spend on the payloads (no header, no coder overhead).
pub fn ideal_bits(
    x: Bits,
    dtype: DType,
    shape: &[u64],
    prediction: Option<&Prediction>,
    options: &EncodeOptions,
) -> Result<f64> {
    let n = checked_scalars(x, dtype, shape, prediction)?;
    let model = stream_model(dtype, shape, options, prediction)?;
    if options.fast_lane {
        return invalid(
            "fast_lane: ideal_bits measures the adaptive and predicted models; encode to measure the fast lane",
        );
    }
    if prediction.is_some() && options.model.for_dtype(dtype) == ModelKind::Bins {
        return invalid("bins: ideal_bits measures the range-coded models; encode to measure the bins model");
    }
    let chunk = options.chunk_scalars as usize;
    check_joint(dtype, n, chunk, prediction)?;
    let n_chunks = n.div_ceil(chunk);
    let per_chunk: Vec<f64> = with_words!(x, |x| {
        map_chunks(options.threads, n_chunks, |i| {
            let range = i * chunk..((i + 1) * chunk).min(n);
            let mut meter: [IdealMeter; LANES] = Default::default();
            code_chunk(&model, &mut meter, x, prediction, range);
            Ok(meter.iter().map(|m| m.bits).sum::<f64>())
        })?
    });
    Ok(per_chunk.iter().sum())
}
