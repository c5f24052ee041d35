//! The whole-tensor API: encode, decode, ideal code length, stream info.

use crate::bins;
use crate::chunk::{unclean_end, ModelKind, PredictedModel, StreamModel, LANES, LANES_V1};
use crate::coder::{IdealMeter, RangeDecoder, RangeEncoder, SymbolSink};
use crate::dtype::DType;
use crate::error::{invalid, Error, Result};
use crate::fast_lane;
use crate::format::header::{
    chunk_count, ChunkEntry, Header, FAST_LANE_VERSION, FLAG_FAST_LANE, FLAG_FAST_MODEL, FLAG_JOINT, FLAG_PREDICTED,
    FLAG_TOKEN_SCALE, FLAG_TORCH_HINT, MAX_CHUNK_SCALARS, MAX_SCALARS,
};
use crate::hash::{checksum, matches, Hasher};
use crate::joint::{residuals, residuals_of, values_into, Joint, BLOCK};
use crate::model::ModelParams;
use crate::parallel::{for_each_piece_mut, map_chunks};
use crate::prediction::{codes_and_fingerprint, Prediction, MAX_NDIM};
use crate::token_scale::{TokenEnergy, TokenScale};
use crate::words::{Bits, BitsMut, Word};

/// Scalars per chunk unless told otherwise: small enough for a layer to spread over threads,
/// large enough that the 32-byte index entry and the coder's last word cost < 0.05%.
pub const DEFAULT_CHUNK_SCALARS: u32 = 1 << 17;
/// Predictor-free contexts: one per channel up to this many.
pub const DEFAULT_RAW_CONTEXTS: usize = 64;

/// How to encode.
#[derive(Debug, Clone)]
pub struct EncodeOptions {
    pub threads: usize,
    pub chunk_scalars: u32,
    pub params: ModelParams,
    /// Sets `FLAG_TORCH_HINT` (a note for bindings; it changes nothing else).
    pub torch_hint: bool,
    /// The model predicted scalars are coded with.
    pub model: ModelKind,
    /// The adaptive token scale of streams coded with the joint model (ignored without one;
    /// `None` codes them with their calibrated sigmas).
    pub token_scale: Option<TokenScale>,
    /// Code a predictor-free 8/16-bit stream with the fast lane's static tables
    /// (`crate::fast_lane`, format version 3) instead of the adaptive model.
    pub fast_lane: bool,
    /// Scalars per channel cycle: scalar `i` is channel `i mod period` for the predictor-free
    /// contexts (`None`: the last dimension of a tensor of two or more, 1 for a 1-D stream).
    pub context_period: Option<u32>,
}

impl Default for EncodeOptions {
    fn default() -> Self {
        EncodeOptions {
            threads: 1,
            chunk_scalars: DEFAULT_CHUNK_SCALARS,
            params: ModelParams::default(),
            torch_hint: false,
            model: ModelKind::Exact,
            token_scale: Some(TokenScale::default()),
            fast_lane: false,
            context_period: None,
        }
    }
}

fn shape_scalars(shape: &[u64]) -> Result<u64> {
    if shape.len() > MAX_NDIM {
        return invalid(format!("x: {} dimensions (at most {MAX_NDIM})", shape.len()));
    }
    shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d).filter(|&p| p <= MAX_SCALARS))
        .ok_or_else(|| Error::InvalidArgument(format!("x: more than {MAX_SCALARS} scalars")))
}

fn check_prediction(shape: &[u64], n: usize, prediction: &Prediction) -> Result<()> {
    if prediction.mu.len() != n {
        return invalid(format!("mu: {} elements given, {n} expected", prediction.mu.len()));
    }
    let sigma_shape: Vec<u64> = prediction.sigma.shape().iter().map(|&d| d as u64).collect();
    if sigma_shape != shape {
        return invalid(format!("sigma: broadcast to {sigma_shape:?}, but x has shape {shape:?}"));
    }
    Ok(())
}

/// The joint model's checks against a stream of `n` scalars in chunks of `chunk`.
fn check_joint(dtype: DType, n: usize, chunk: usize, prediction: Option<&Prediction>) -> Result<()> {
    match prediction.and_then(|p| p.joint.as_ref()) {
        Some(_) if dtype.bits() > 16 => invalid("joint: the joint model codes 8- and 16-bit formats only"),
        Some(j) => j.check(n, chunk),
        None => Ok(()),
    }
}

/// Fingerprint of a jointly coded chunk: the plain one (mu and sigma codes) and the digest of
/// each of its layers' joint parameters.
fn joint_fingerprint(plain: u64, joint: &Joint, range: &std::ops::Range<usize>) -> u64 {
    let mut h = Hasher::new();
    h.update(&plain.to_le_bytes());
    for layer in range.start / joint.layer_scalars()..range.end.div_ceil(joint.layer_scalars()) {
        h.update(&joint.digest(layer).to_le_bytes());
    }
    h.finish()
}

/// Codes (or, with `decode`, decodes) a chunk of whole layers channel by channel, each
/// channel's run of tokens against its conditional mu (`crate::joint`, invariant J1) and, with
/// a token scale, sigma codes scaled per token (`crate::token_scale`, invariant J3); `x` and
/// `codes` are the chunk's, `mu` the whole tensor's. One pass serves both directions, so
/// encoder and decoder cannot disagree on the order.
///
/// Where the CPU has AVX-512, the per-run loops (the conditional mu's last terms, the values
/// and residuals, the token scale's codes and energy) are compiled for it: ~12% of a joint
/// stream's decode. The floats are the same: IEEE operations give one result whatever the
/// instruction, and Rust never fuses a multiply and an add unless asked (J1).
fn joint_runs<W: Word>(
    model: &StreamModel,
    joint: &Joint,
    x: &mut [W],
    mu: &[f32],
    codes: &[i16],
    start: usize,
    code_run: impl FnMut(&mut [W], &[f32], &[i16]),
) {
    #[cfg(target_arch = "x86_64")]
    if crate::joint::wide_kernels() {
        // SAFETY: `wide_kernels()` checked at run time that this CPU has AVX2 and AVX-512F,
        // the features `joint_runs_wide` is compiled for.
        unsafe { joint_runs_wide(model, joint, x, mu, codes, start, code_run) };
        return;
    }
    joint_runs_body(model, joint, x, mu, codes, start, code_run)
}

/// `joint_runs_body` compiled for AVX2 and AVX-512F.
///
/// # Safety
/// The CPU must have AVX2 and AVX-512F (`crate::joint::wide_kernels`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl,avx512dq")]
unsafe fn joint_runs_wide<W: Word>(
    model: &StreamModel,
    joint: &Joint,
    x: &mut [W],
    mu: &[f32],
    codes: &[i16],
    start: usize,
    code_run: impl FnMut(&mut [W], &[f32], &[i16]),
) {
    joint_runs_body(model, joint, x, mu, codes, start, code_run)
}

/// `joint_runs`' one implementation, inlined into each variant.
#[inline(always)]
fn joint_runs_body<W: Word>(
    model: &StreamModel,
    joint: &Joint,
    x: &mut [W],
    mu: &[f32],
    codes: &[i16],
    start: usize,
    mut code_run: impl FnMut(&mut [W], &[f32], &[i16]),
) {
    let (t, per_layer, dtype) = (joint.tokens, joint.layer_scalars(), model.dtype);
    let mut own = vec![0f32; per_layer];
    let mut corrected = vec![0f32; t];
    // channels in whole blocks take their first terms together (`Joint::block`)
    let blocked = joint.channels / BLOCK * BLOCK;
    let mut block = vec![0f32; BLOCK * t];
    // with a token scale: the scaled codes and the run's values (taken against two means)
    let mut energy = model.token_scale.map(|s| (TokenEnergy::new(s, t), vec![0i16; t], vec![0f32; t]));
    for local in (0..x.len()).step_by(per_layer) {
        let layer = (start + local) / per_layer;
        if joint.is_plain(layer) {
            // invariant J2: the layer against mu as it is, one run
            let run = local..local + per_layer;
            code_run(&mut x[run.clone()], &mu[start + run.start..start + run.end], &codes[run]);
            continue;
        }
        if let Some((e, _, _)) = &mut energy {
            e.reset();
        }
        for i in 0..joint.channels {
            let run = local + i * t..local + (i + 1) * t;
            let base = &mu[start + run.start..start + run.end];
            if i < blocked {
                let i0 = i / BLOCK * BLOCK;
                if i == i0 {
                    joint.block(layer, i0, &own, &mut block);
                }
                joint.finish(layer, i, i0, base, &own, &block[(i - i0) * t..(i - i0 + 1) * t], &mut corrected);
            } else {
                joint.conditional(layer, i, base, &own, &mut corrected);
            }
            let calibrated = &codes[run.clone()];
            let own_run = &mut own[i * t..(i + 1) * t];
            match &mut energy {
                Some((e, scaled, values)) => {
                    e.codes(i, calibrated, scaled);
                    code_run(&mut x[run.clone()], &corrected, scaled);
                    values_into(dtype, &x[run], values);
                    e.add(values, &corrected, calibrated);
                    residuals_of(values, base, own_run);
                }
                None => {
                    code_run(&mut x[run.clone()], &corrected, calibrated);
                    residuals(dtype, &x[run], base, own_run);
                }
            }
        }
    }
}

/// The options' checks and the layout facts shared by encode and ideal_bits.
fn stream_model(
    dtype: DType,
    shape: &[u64],
    options: &EncodeOptions,
    prediction: Option<&Prediction>,
) -> Result<StreamModel> {
    if options.chunk_scalars == 0 || options.chunk_scalars > MAX_CHUNK_SCALARS {
        return invalid(format!("chunk size must be in 1..={MAX_CHUNK_SCALARS}"));
    }
    let (params, kind) = (options.params, options.model);
    params.validate().map_err(|m| Error::InvalidArgument(format!("model parameters: {m}")))?;
    let period = match options.context_period {
        Some(0) => return invalid("context period must be at least 1"),
        Some(p) => p as usize,
        // a 1-D stream has no channel dimension: one channel, never one per scalar (the
        // Python API finds a flattened cache's period from its words: `speckv._channels`)
        None if shape.len() < 2 => 1,
        None => shape.last().copied().unwrap_or(1).max(1) as usize,
    };
    let mut model = StreamModel::new(dtype, params, kind, period.min(DEFAULT_RAW_CONTEXTS), period);
    if prediction.is_some_and(|p| p.joint.is_some()) {
        if let Some(scale) = options.token_scale {
            scale.check()?;
            model.token_scale = Some(scale);
        }
    }
    Ok(model)
}

/// Dispatches on the word width, binding `$x` to `&[u8]`, `&[u16]` or `&[u32]`.
macro_rules! with_words {
    ($bits:expr, |$x:ident| $body:expr) => {
        match $bits {
            Bits::U8($x) => $body,
            Bits::U16($x) => $body,
            Bits::U32($x) => $body,
        }
    };
}

/// A chunk's payload (format version 2): the lengths in bytes of every lane but the last, as
/// LEB128 varints (two or three bytes for a typical lane instead of four), then every lane's
/// coded bytes (see `chunk`; a lane's last word may be short, `RangeEncoder::finish`).
fn join_lanes<const N: usize>(lanes: [RangeEncoder; N]) -> Vec<u8> {
    let words = lanes.map(RangeEncoder::finish);
    let mut out = Vec::with_capacity(5 * (N - 1) + words.iter().map(Vec::len).sum::<usize>());
    for w in &words[..N - 1] {
        let mut len = w.len() as u32;
        while len >= 0x80 {
            out.push(len as u8 | 0x80);
            len >>= 7;
        }
        out.push(len as u8);
    }
    for w in &words {
        out.extend_from_slice(w);
    }
    out
}

/// Reads a LEB128 varint of at most 5 bytes that fits a u32, advancing `bytes`.
fn read_varint(bytes: &mut &[u8]) -> Option<u32> {
    let mut value = 0u64;
    for i in 0..5 {
        let (&b, rest) = bytes.split_first()?;
        *bytes = rest;
        value |= ((b & 0x7F) as u64) << (7 * i);
        if b & 0x80 == 0 {
            return u32::try_from(value).ok();
        }
    }
    None
}

/// Inverse of `join_lanes` (and of version 1's `[lane-0 length in bytes: u32 LE]` layout):
/// `None` when the lengths do not fit the payload.
fn split_lanes<const N: usize>(payload: &[u8], version: u16) -> Option<[RangeDecoder<'_>; N]> {
    let mut rest = payload;
    let mut lengths = [0usize; N];
    for len in lengths.iter_mut().take(N - 1) {
        *len = if version == 1 {
            let head: [u8; 4] = rest.get(..4)?.try_into().ok()?;
            rest = &rest[4..];
            u32::from_le_bytes(head) as usize
        } else {
            read_varint(&mut rest)? as usize
        };
    }
    let mut parts: [&[u8]; N] = [&[]; N];
    for (i, part) in parts.iter_mut().enumerate() {
        let len = if i + 1 < N { lengths[i] } else { rest.len() };
        // Version 1 lanes are whole words; version 2 lanes may end in a short word.
        if (version == 1 && !len.is_multiple_of(4)) || len > rest.len() {
            return None;
        }
        (*part, rest) = rest.split_at(len);
    }
    Some(parts.map(RangeDecoder::new))
}

fn fingerprint_of(chunks: &[ChunkEntry]) -> u64 {
    let mut h = Hasher::new();
    for c in chunks {
        h.update(&c.fingerprint.to_le_bytes());
    }
    h.finish()
}

/// Number of scalars in `shape`, after checking that `x` and the prediction fit it.
fn checked_scalars(x: Bits, dtype: DType, shape: &[u64], prediction: Option<&Prediction>) -> Result<usize> {
    let n = shape_scalars(shape)? as usize;
    x.check(dtype, n, "x")?;
    if let Some(p) = prediction {
        check_prediction(shape, n, p)?;
    }
    Ok(n)
}

/// Runs `f` with this thread's buffer for a chunk's sigma codes. Reused from chunk to chunk:
/// a fresh 256 KiB buffer per chunk costs a map, page faults and an unmap, which the threads
/// of a pool then queue for in the kernel.
fn with_codes<R>(f: impl FnOnce(&mut Vec<i16>) -> R) -> R {
    thread_local! {
        static CODES: std::cell::RefCell<Vec<i16>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    CODES.with(|cell| match cell.try_borrow_mut() {
        Ok(mut codes) => {
            let out = f(&mut codes);
            // Keep a default-sized buffer between calls, not whatever a huge chunk needed.
            if codes.capacity() > 2 * DEFAULT_CHUNK_SCALARS as usize {
                *codes = Vec::new();
            }
            out
        }
        // Only reachable if `f` re-entered this function on the same thread.
        Err(_) => f(&mut Vec::new()),
    })
}

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

/// Parses and validates a stream's header.
pub fn info(stream: &[u8]) -> Result<Header> {
    Header::parse(stream)
}

fn decode_words<W: Word, const N: usize>(
    stream: &[u8],
    header: &Header,
    model: &StreamModel,
    out: &mut [W],
    prediction: Option<&Prediction>,
    threads: usize,
    first_chunk: usize,
) -> Result<()> {
    let chunk = header.chunk_scalars as usize;
    let payload = |i: usize| {
        let c = &header.chunks[i];
        &stream[c.offset as usize..c.offset as usize + c.length as usize]
    };
    // Each chunk is checked before it is decoded: its checksum, then the fingerprint of the
    // decoder's own integer predictions against the encoder's. A failure anywhere fails the
    // whole call, so no partly decoded output is ever handed back.
    for_each_piece_mut(threads, out, chunk, |piece_index, piece| {
        let i = first_chunk + piece_index;
        let bytes = payload(i);
        if !matches(bytes, header.chunks[i].checksum) {
            return Err(Error::Checksum(format!("chunk {i} of {}", header.chunks.len())));
        }
        let start = i * chunk;
        let mut dec = split_lanes::<N>(bytes, header.version)
            .ok_or_else(|| Error::Corrupt(format!("chunk {i}: bad lane length")))?;
        match prediction {
            Some(p) => {
                let mu = &p.mu[start..start + piece.len()];
                with_codes(|codes| {
                    let mut fp = codes_and_fingerprint(mu, &p.sigma, start, codes);
                    if let Some(joint) = &p.joint {
                        fp = joint_fingerprint(fp, joint, &(start..start + piece.len()));
                    }
                    if fp != header.chunks[i].fingerprint {
                        return Err(Error::PredictionMismatch(format!(
                            "the mu/sigma given differ from the encoder's (chunk {i}, scalars {start}..{})",
                            start + piece.len()
                        )));
                    }
                    match &p.joint {
                        Some(joint) => {
                            let mut escapes = model.escapes();
                            joint_runs(model, joint, piece, p.mu, codes, start, |run_x, corrected, run_codes| {
                                model.decode_predicted_with(&mut dec, &mut escapes, run_x, corrected, run_codes);
                            })
                        }
                        None => model.decode_predicted(&mut dec, piece, mu, codes),
                    }
                    Ok(())
                })?
            }
            None => model.decode_raw(&mut dec, piece, start),
        }
        if dec.iter().all(|d| d.finished_cleanly()) {
            Ok(())
        } else {
            Err(unclean_end(i))
        }
    })
}

/// Decodes the bins-model chunks of `stream` from `first_chunk` on into `out`, each checked
/// against its checksum and its prediction fingerprint first (as `decode_words`).
fn decode_bins<W: Word>(
    stream: &[u8],
    header: &Header,
    model: &StreamModel,
    out: &mut [W],
    p: &Prediction,
    threads: usize,
    first_chunk: usize,
) -> Result<()> {
    let PredictedModel::Bins { tables } = &model.predicted else {
        return invalid("bins: the stream model is not the bins model");
    };
    let chunk = header.chunk_scalars as usize;
    for_each_piece_mut(threads, out, chunk, |piece_index, piece| {
        let i = first_chunk + piece_index;
        let c = &header.chunks[i];
        let bytes = &stream[c.offset as usize..c.offset as usize + c.length as usize];
        if !matches(bytes, c.checksum) {
            return Err(Error::Checksum(format!("chunk {i} of {}", header.chunks.len())));
        }
        let start = i * chunk;
        let mu = &p.mu[start..start + piece.len()];
        let in_chunk = |e: Error| match e {
            Error::Corrupt(m) => Error::Corrupt(format!("chunk {i}: {m}")),
            other => other,
        };
        with_codes(|codes| {
            let mut fp = codes_and_fingerprint(mu, &p.sigma, start, codes);
            if let Some(joint) = &p.joint {
                fp = joint_fingerprint(fp, joint, &(start..start + piece.len()));
            }
            if fp != c.fingerprint {
                return Err(Error::PredictionMismatch(format!(
                    "the mu/sigma given differ from the encoder's (chunk {i}, scalars {start}..{})",
                    start + piece.len()
                )));
            }
            let mut dec = bins::Decoder::new(header.dtype, tables, bytes).map_err(in_chunk)?;
            match &p.joint {
                Some(joint) => joint_runs(model, joint, piece, p.mu, codes, start, |run_x, corrected, run_codes| {
                    dec.run(run_x, corrected, run_codes)
                }),
                None => dec.run(piece, mu, codes),
            }
            dec.finish().map_err(in_chunk)
        })
    })
}

/// Decodes the fast-lane chunks of `stream` from `first_chunk` on into `out`, each checked
/// against its checksum first.
fn decode_fast_lane<W: Word>(
    stream: &[u8],
    header: &Header,
    out: &mut [W],
    threads: usize,
    first_chunk: usize,
) -> Result<()> {
    let period = header.context_period as usize;
    for_each_piece_mut(threads, out, header.chunk_scalars as usize, |piece_index, piece| {
        let i = first_chunk + piece_index;
        let c = &header.chunks[i];
        let bytes = &stream[c.offset as usize..c.offset as usize + c.length as usize];
        if !matches(bytes, c.checksum) {
            return Err(Error::Checksum(format!("chunk {i} of {}", header.chunks.len())));
        }
        fast_lane::decode_chunk(bytes, period, piece).map_err(|e| match e {
            Error::Corrupt(m) => Error::Corrupt(format!("chunk {i}: {m}")),
            other => other,
        })
    })
}

/// Decodes `stream` into `out` (as many words as the stream has scalars, of its dtype's
/// width). `prediction` must be the one the stream was made with. Returns the header.
pub fn decode_into(stream: &[u8], out: BitsMut, prediction: Option<&Prediction>, threads: usize) -> Result<Header> {
    decode_chunks_into(stream, out, prediction, threads, None)
}

/// Like `decode_into`, for the chunks in `chunks` only (all when `None`): `out` holds just
/// their scalars, in order, while `prediction` still covers the whole tensor. Chunks outside
/// the range are neither read nor checked, so a reader can take one layer of a cache whose
/// chunks are its layers.
pub fn decode_chunks_into(
    stream: &[u8],
    out: BitsMut,
    prediction: Option<&Prediction>,
    threads: usize,
    chunks: Option<std::ops::Range<usize>>,
) -> Result<Header> {
    let header = Header::parse(stream)?;
    decode_parsed(stream, &header, out, prediction, threads, chunks)?;
    Ok(header)
}

/// Scalars that decoding `chunks` (all when `None`) of a stream with `header` produces, after
/// checking that the range is within the stream.
pub fn decoded_len(header: &Header, chunks: Option<std::ops::Range<usize>>) -> Result<usize> {
    let chunks = chunks.unwrap_or(0..header.chunks.len());
    if chunks.start > chunks.end || chunks.end > header.chunks.len() {
        return invalid(format!("chunks: {chunks:?} is not within the stream's {} chunks", header.chunks.len()));
    }
    Ok(if chunks.is_empty() {
        0
    } else {
        header.chunk_scalar_range(chunks.end - 1).end - header.chunk_scalar_range(chunks.start).start
    })
}

/// `decode_chunks_into` for a header the caller has already parsed from `stream` (bindings
/// parse once, size their output from it, then decode).
pub fn decode_parsed(
    stream: &[u8],
    header: &Header,
    out: BitsMut,
    prediction: Option<&Prediction>,
    threads: usize,
    chunks: Option<std::ops::Range<usize>>,
) -> Result<()> {
    let n = header.n_scalars as usize;
    let wanted = decoded_len(header, chunks.clone())?;
    let chunks = chunks.unwrap_or(0..header.chunks.len());
    if out.width_bits() != header.dtype.bits() || out.len() != wanted {
        return invalid(format!(
            "out: {} words of {} bits given; chunks {chunks:?} hold {wanted} {} scalars",
            out.len(),
            out.width_bits(),
            header.dtype.name()
        ));
    }
    match (header.predicted(), prediction) {
        (true, None) => {
            return Err(Error::PredictionMismatch("the stream was coded with mu/sigma; give the same to decode".into()))
        }
        (false, Some(_)) => {
            return Err(Error::PredictionMismatch("the stream was coded without mu/sigma; give none to decode".into()))
        }
        (_, Some(p)) => {
            check_prediction(&header.shape, n, p)?;
            match (header.flags & FLAG_JOINT != 0, p.joint.is_some()) {
                (true, false) => {
                    return Err(Error::PredictionMismatch(
                        "the stream was coded with a joint residual model; give the same to decode".into(),
                    ))
                }
                (false, true) => {
                    return Err(Error::PredictionMismatch(
                        "the stream was coded without a joint residual model; give none to decode".into(),
                    ))
                }
                _ => check_joint(header.dtype, n, header.chunk_scalars as usize, prediction)?,
            }
        }
        _ => {}
    }
    if header.fast_lane() && header.predicted() {
        let Some(p) = prediction else {
            return Err(Error::PredictionMismatch(
                "the stream was coded with mu/sigma; give the same to decode".into(),
            ));
        };
        let mut model = StreamModel::new(header.dtype, header.params, ModelKind::Bins, 1, 1);
        model.token_scale = header.token_scale;
        // `Header::parse` admits a predicted fast-lane stream only at a bins revision's version
        let revision = bins::Revision::of_version(header.version)
            .ok_or_else(|| Error::Corrupt(format!("no bins revision has version {}", header.version)))?;
        model.predicted = PredictedModel::Bins { tables: bins::BinTables::shared(&header.params, revision) };
        if model.table_digest() != header.table_digest {
            return Err(Error::Unsupported(
                "the stream's probability tables differ from the ones this build computes".into(),
            ));
        }
        if fingerprint_of(&header.chunks) != header.fingerprint {
            return Err(Error::Corrupt("prediction fingerprint disagrees with the chunk index".into()));
        }
        return match out {
            BitsMut::U8(o) => decode_bins(stream, header, &model, o, p, threads, chunks.start),
            BitsMut::U16(o) => decode_bins(stream, header, &model, o, p, threads, chunks.start),
            BitsMut::U32(_) => Err(Error::Corrupt("the bins model does not code float32".into())),
        };
    }
    if header.fast_lane() {
        return match out {
            BitsMut::U8(o) => decode_fast_lane(stream, header, o, threads, chunks.start),
            BitsMut::U16(o) => decode_fast_lane(stream, header, o, threads, chunks.start),
            BitsMut::U32(_) => Err(Error::Corrupt("the fast lane does not code float32".into())),
        };
    }
    let mut model = StreamModel::new(
        header.dtype,
        header.params,
        header.model().unwrap_or_default(),
        header.raw_contexts as usize,
        header.context_period as usize,
    );
    model.token_scale = header.token_scale;
    if header.predicted() {
        if model.table_digest() != header.table_digest {
            return Err(Error::Unsupported(
                "the stream's probability tables differ from the ones this build computes".into(),
            ));
        }
        if fingerprint_of(&header.chunks) != header.fingerprint {
            return Err(Error::Corrupt("prediction fingerprint disagrees with the chunk index".into()));
        }
    }
    // `Header::parse` admits exactly these lane counts.
    macro_rules! decode_lanes {
        ($n:expr) => {
            match out {
                BitsMut::U8(o) => decode_words::<_, $n>(stream, header, &model, o, prediction, threads, chunks.start),
                BitsMut::U16(o) => decode_words::<_, $n>(stream, header, &model, o, prediction, threads, chunks.start),
                BitsMut::U32(o) => decode_words::<_, $n>(stream, header, &model, o, prediction, threads, chunks.start),
            }
        };
    }
    match header.lanes as usize {
        LANES_V1 => decode_lanes!(LANES_V1),
        _ => decode_lanes!(LANES),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The runs a pass over a chunk hands its coder: each run's conditional mu and sigma
    /// codes, as bits.
    fn runs_of(wide: bool, model: &StreamModel, joint: &Joint, x: &mut [u16], mu: &[f32], codes: &[i16]) -> Vec<u32> {
        let mut seen = Vec::new();
        let record = |_: &mut [u16], corrected: &[f32], run_codes: &[i16]| {
            seen.extend(corrected.iter().map(|v| v.to_bits()));
            seen.extend(run_codes.iter().map(|&c| c as u16 as u32));
        };
        if wide {
            joint_runs(model, joint, x, mu, codes, 0, record);
        } else {
            joint_runs_body(model, joint, x, mu, codes, 0, record);
        }
        seen
    }

    #[test]
    fn joint_runs_compiled_for_avx512_hand_the_coder_the_portable_runs() {
        #[cfg(target_arch = "x86_64")]
        if !crate::test_env::have("avx512", crate::joint::wide_kernels(), "no AVX-512 here, only the portable runs") {
            return;
        }
        let mut seed = 11u64;
        let mut next = move || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 40) as u32
        };
        let (c, t, layers) = (9usize, 37usize, 2usize);
        let n = layers * c * t;
        // bfloat16 patterns of every kind, infinities and NaNs among them
        let mut x: Vec<u16> = (0..n).map(|_| next() as u16).collect();
        let mu: Vec<f32> = (0..n).map(|_| f32::from_bits(((next() as u16) as u32) << 16) * 0.5).collect();
        let codes: Vec<i16> = (0..n).map(|k| if k % 3 == 0 { 120 } else { 100 + (next() % 200) as i16 }).collect();
        let small = |v: u32| (v % 2000) as f32 * 1e-3 - 1.0;
        let coef: Vec<f32> = (0..layers * c * c).map(|k| if k % 4 == 0 { 0.0 } else { small(next()) }).collect();
        let offset: Vec<f32> = (0..layers * c).map(|_| small(next())).collect();
        let joint = Joint { channels: c, tokens: t, outside_channels: 0, outside: &[], coef: &coef, offset: &offset };
        for scale in [None, Some(TokenScale::default())] {
            let mut model = StreamModel::new(DType::BFloat16, ModelParams::default(), ModelKind::Bins, 1, 1);
            model.token_scale = scale;
            let wide = runs_of(true, &model, &joint, &mut x.clone(), &mu, &codes);
            let portable = runs_of(false, &model, &joint, &mut x, &mu, &codes);
            assert_eq!(wide.len(), 2 * n);
            assert!(wide == portable, "token scale {scale:?}");
        }
    }
}
