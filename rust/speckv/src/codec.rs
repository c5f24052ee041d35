//! The whole-tensor API: encode, decode, ideal code length, stream info.
//!
//! One concept per submodule: `encode` (a tensor into a stream, and its ideal code length),
//! `decode` (a stream back into its tensor), `lanes` (how a chunk's lanes are framed in its
//! payload), `joint_runs` (a jointly coded chunk's pass, channel by channel). This module holds
//! what they share: the options, the checks of a call's arguments and the stream's model.
use crate::chunk::{ModelKind, StreamModel};
use crate::dtype::DType;
use crate::error::{invalid, Error, Result};
use crate::format::header::{ChunkEntry, MAX_CHUNK_SCALARS, MAX_SCALARS};
use crate::hash::Hasher;
use crate::model::ModelParams;
use crate::prediction::{Prediction, MAX_NDIM};
use crate::token_scale::TokenScale;
use crate::words::Bits;

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

mod decoding;
mod encoding;
mod joint_runs;
mod lanes;

pub use decoding::{decode_chunks_into, decode_into, decode_parsed, decoded_len, info};
pub use encoding::{assemble_predicted, encode, ideal_bits};

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stream_model_takes_its_period_from_the_shape_and_refuses_bad_options() {
        let options = EncodeOptions::default();
        let model = |shape: &[u64], o: &EncodeOptions| stream_model(DType::BFloat16, shape, o, None);
        // the last dimension is the channel cycle, a 1-D stream one channel
        assert_eq!(model(&[4, 96], &options).unwrap().context_period, 96);
        assert_eq!(model(&[4096], &options).unwrap().context_period, 1);
        let wide = model(&[2, 1000], &options).unwrap();
        assert_eq!((wide.context_period, wide.raw_contexts), (1000, DEFAULT_RAW_CONTEXTS));
        let given = EncodeOptions { context_period: Some(7), ..EncodeOptions::default() };
        assert_eq!(model(&[4, 96], &given).unwrap().context_period, 7);
        for bad in [
            EncodeOptions { chunk_scalars: 0, ..EncodeOptions::default() },
            EncodeOptions { chunk_scalars: MAX_CHUNK_SCALARS + 1, ..EncodeOptions::default() },
            EncodeOptions { context_period: Some(0), ..EncodeOptions::default() },
        ] {
            assert!(matches!(model(&[4, 96], &bad), Err(Error::InvalidArgument(_))), "{bad:?}");
        }
        // the token scale belongs to joint streams only
        assert!(model(&[4, 96], &options).unwrap().token_scale.is_none());
    }

    #[test]
    fn shapes_are_checked_against_the_words_and_the_prediction() {
        let x = vec![0u16; 12];
        let n = checked_scalars(Bits::U16(&x), DType::BFloat16, &[3, 4], None).unwrap();
        assert_eq!(n, 12);
        assert!(checked_scalars(Bits::U16(&x), DType::BFloat16, &[5, 4], None).is_err(), "20 scalars, 12 words");
        assert!(checked_scalars(Bits::U8(&[0u8; 12]), DType::BFloat16, &[3, 4], None).is_err(), "bytes for bf16");
        assert!(shape_scalars(&[u64::MAX, 2]).is_err(), "an overflowing shape");
        assert!(shape_scalars(&[1; MAX_NDIM + 1]).is_err(), "too many dimensions");
    }
}
