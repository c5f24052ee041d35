//! The whole-tensor codec: encode, decode (into a new array or a caller's buffer), the ideal
//! code length, a stream's header facts, and streams assembled from chunks coded elsewhere.

use numpy::{PyArray1, PyReadonlyArray1, PyReadwriteArray1};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use speckv::codec::EncodeOptions;
use speckv::format::Header;
use speckv::BitsMut;

use crate::args::*;
use crate::errors::*;

/// Encodes flat bit patterns `x` of `dtype` and `shape`; see `speckv.encode`.
#[pyfunction]
#[pyo3(signature = (x, dtype_name, shape, options, prediction=None))]
pub(crate) fn encode<'py>(
    py: Python<'py>,
    x: &Bound<'py, PyAny>,
    dtype_name: &str,
    shape: Vec<u64>,
    options: OptionsIn,
    prediction: Option<PredictionIn<'py>>,
) -> PyResult<Bound<'py, PyBytes>> {
    let dtype = dtype(dtype_name)?;
    let x = Words::extract(x, "x")?;
    let x_bits = x.bits("x")?;
    let opts = options.encode_options()?;
    let stream = with_prediction(py, prediction, &shape, value_error, |prediction| {
        py.allow_threads(|| speckv::encode(x_bits, dtype, &shape, prediction, &opts)).map_err(to_py)
    })?;
    Ok(PyBytes::new(py, &stream))
}

/// Ideal code length in bits under exactly the model `encode` uses (its options but the
/// fast lane's and the context period's, which the adaptive model's measure ignores).
#[pyfunction]
#[pyo3(signature = (x, dtype_name, shape, options, prediction=None))]
pub(crate) fn ideal_bits<'py>(
    py: Python<'py>,
    x: &Bound<'py, PyAny>,
    dtype_name: &str,
    shape: Vec<u64>,
    options: OptionsIn,
    prediction: Option<PredictionIn<'py>>,
) -> PyResult<f64> {
    let dtype = dtype(dtype_name)?;
    let x = Words::extract(x, "x")?;
    let x_bits = x.bits("x")?;
    let opts = options.encode_options()?;
    with_prediction(py, prediction, &shape, value_error, |prediction| {
        py.allow_threads(|| speckv::ideal_bits(x_bits, dtype, &shape, prediction, &opts)).map_err(to_py)
    })
}

/// Decodes `data` (a uint8 array over the stream): parses the header once, allocates the
/// flat output words, decodes into them with the GIL released. Returns `(words, info)`, with
/// `info` as `speckv.info` gives it.
#[pyfunction]
#[pyo3(signature = (data, prediction=None, threads=1, chunks=None))]
pub(crate) fn decode<'py>(
    py: Python<'py>,
    data: PyReadonlyArray1<'py, u8>,
    prediction: Option<PredictionIn<'py>>,
    threads: usize,
    chunks: Option<(usize, usize)>,
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyDict>)> {
    let stream = data.as_slice().map_err(|_| PyValueError::new_err("data must be contiguous"))?;
    let header = py.allow_threads(|| Header::parse(stream)).map_err(to_py)?;
    let range = chunks.map(|(a, b)| a..b);
    let n = speckv::decoded_len(&header, range.clone()).map_err(to_py)?;
    let shape = header.shape.clone();
    let words = with_prediction(py, prediction, &shape, mismatch_error, |prediction| {
        macro_rules! run {
            ($t:ty, $variant:ident) => {{
                let mut words = vec![<$t>::default(); n];
                py.allow_threads(|| {
                    speckv::decode_parsed(stream, &header, BitsMut::$variant(&mut words), prediction, threads, range)
                })
                .map_err(to_py)?;
                PyArray1::from_vec(py, words).into_any()
            }};
        }
        Ok(match header.dtype.bits() {
            8 => run!(u8, U8),
            16 => run!(u16, U16),
            _ => run!(u32, U32),
        })
    })?;
    Ok((words, header_dict(py, &header, stream.len())?))
}

/// One stream's decoded words, whichever their width.
enum Decoded {
    U8(Vec<u8>),
    U16(Vec<u16>),
    U32(Vec<u32>),
}

/// Decodes several predicted streams in one call, each against its own prediction: `items`
/// are `(data, prediction)` as `decode` takes them. The streams are decoded on `threads`
/// threads, one stream a thread at a time, each on its share of the threads where there are
/// fewer streams (the same words as `decode` of each: a stream's words never depend on who
/// decodes it). Returns each stream's flat words; its shape is its
/// prediction's, its format the dtype named beside it. The first failing stream's error is raised (`PredictionMismatchError`,
/// `CorruptStreamError`, ...). A walk over a prompt's blocks makes one call a layer instead of
/// one a block: what each call costs besides its decode (the Python between, the threads'
/// wake-up) is paid once.
#[pyfunction]
#[pyo3(signature = (items, threads=1))]
pub(crate) fn decode_many<'py>(
    py: Python<'py>,
    items: Vec<(PyReadonlyArray1<'py, u8>, PredictionIn<'py>)>,
    threads: usize,
) -> PyResult<Vec<(Bound<'py, PyAny>, &'static str)>> {
    if threads == 0 {
        return Err(SpeckvError::new_err("threads must be at least 1"));
    }
    let (datas, given): (Vec<_>, Vec<_>) = items.into_iter().unzip();
    let mut streams = Vec::with_capacity(datas.len());
    let mut parts = Vec::with_capacity(datas.len());
    for (data, prediction) in datas.iter().zip(given) {
        let stream = data.as_slice().map_err(|_| PyValueError::new_err("data must be contiguous"))?;
        let header = py.allow_threads(|| Header::parse(stream)).map_err(to_py)?;
        if !header.predicted() {
            return Err(PyValueError::new_err("decode_many: a stream is not predicted; use decode"));
        }
        streams.push((stream, header));
        parts.push(PredictionIn::parts(Some(prediction))?);
    }
    let codes = parts
        .iter()
        .map(|(args, _)| args.as_ref().ok_or_else(|| PyValueError::new_err("decode_many: every stream needs mu")))
        .map(|a| a.and_then(|a| a.codes(py)))
        .collect::<PyResult<Vec<_>>>()?;
    let predictions = parts
        .iter()
        .zip(&codes)
        .zip(&streams)
        .map(|(((args, joint), codes), (_, header))| {
            // `codes` was made above from the same `args`: both are there
            let p = args.as_ref().map(|a| a.prediction(codes, &header.shape, mismatch_error)).transpose()?;
            with_joint(p, joint)?.ok_or_else(|| PyValueError::new_err("decode_many: every stream needs mu"))
        })
        .collect::<PyResult<Vec<_>>>()?;
    // fewer streams than threads: each stream's chunks on its share of them
    let inner = (threads / streams.len().max(1)).max(1);
    let decoded = py
        .allow_threads(|| {
            speckv::parallel::map_chunks(threads.min(streams.len()).max(1), streams.len(), |i| {
                let (stream, header) = &streams[i];
                let n = header.n_scalars as usize;
                let p = Some(&predictions[i]);
                macro_rules! run {
                    ($t:ty, $variant:ident) => {{
                        let mut words = vec![<$t>::default(); n];
                        speckv::decode_parsed(stream, header, BitsMut::$variant(&mut words), p, inner, None)?;
                        Decoded::$variant(words)
                    }};
                }
                Ok(match header.dtype.bits() {
                    8 => run!(u8, U8),
                    16 => run!(u16, U16),
                    _ => run!(u32, U32),
                })
            })
        })
        .map_err(to_py)?;
    Ok(decoded
        .into_iter()
        .zip(&streams)
        .map(|(d, (_, header))| {
            let words = match d {
                Decoded::U8(w) => PyArray1::from_vec(py, w).into_any(),
                Decoded::U16(w) => PyArray1::from_vec(py, w).into_any(),
                Decoded::U32(w) => PyArray1::from_vec(py, w).into_any(),
            };
            (words, header.dtype.name())
        })
        .collect())
}

/// Decodes a predictor-free stream into `out`, a writable, contiguous 1-D uint8 array of
/// exactly the stream's bytes (a slot of a serving engine's host buffer): no output is
/// allocated and nothing is copied after decoding. The stream's words are written in native
/// byte order, as `decode` returns them. `out` must be aligned to the word (2 or 4 bytes for
/// 16- or 32-bit streams); a predicted stream is refused (`decode` takes its prediction).
#[pyfunction]
#[pyo3(signature = (data, out, threads=1))]
pub(crate) fn decode_into<'py>(
    py: Python<'py>,
    data: PyReadonlyArray1<'py, u8>,
    mut out: PyReadwriteArray1<'py, u8>,
    threads: usize,
) -> PyResult<()> {
    let stream = data.as_slice().map_err(|_| PyValueError::new_err("data must be contiguous"))?;
    let bytes = out.as_slice_mut().map_err(|_| PyValueError::new_err("out must be contiguous"))?;
    let header = py.allow_threads(|| Header::parse(stream)).map_err(to_py)?;
    if header.predicted() {
        return Err(PyValueError::new_err("decode_into: the stream is predicted; use decode with its prediction"));
    }
    let width = header.dtype.bits() as usize / 8;
    let n = speckv::decoded_len(&header, None).map_err(to_py)?;
    if bytes.len() != n * width {
        return Err(PyValueError::new_err(format!(
            "out: {} bytes, the stream holds {} scalars of {} bytes",
            bytes.len(),
            n,
            width
        )));
    }
    macro_rules! run {
        ($t:ty, $variant:ident) => {{
            // SAFETY: u16 and u32 have no invalid bit patterns and any byte content is a valid
            // word; `align_to_mut` only reinterprets the aligned middle, and an unaligned `out`
            // (a non-empty prefix or suffix) is refused before anything is written.
            let (head, words, tail) = unsafe { bytes.align_to_mut::<$t>() };
            if !head.is_empty() || !tail.is_empty() {
                return Err(PyValueError::new_err("out: not aligned to the stream's words"));
            }
            py.allow_threads(|| speckv::decode_parsed(stream, &header, BitsMut::$variant(words), None, threads, None))
                .map_err(to_py)?;
        }};
    }
    match width {
        1 => py
            .allow_threads(|| speckv::decode_parsed(stream, &header, BitsMut::U8(bytes), None, threads, None))
            .map_err(to_py)?,
        2 => run!(u16, U16),
        _ => run!(u32, U32),
    }
    Ok(())
}

/// Header facts of a stream, validated.
#[pyfunction]
pub(crate) fn info<'py>(py: Python<'py>, data: PyReadonlyArray1<'py, u8>) -> PyResult<Bound<'py, PyDict>> {
    let stream = data.as_slice().map_err(|_| PyValueError::new_err("data must be contiguous"))?;
    let h = py.allow_threads(|| Header::parse(stream)).map_err(to_py)?;
    header_dict(py, &h, stream.len())
}

pub(crate) fn header_dict<'py>(py: Python<'py>, h: &Header, stream_len: usize) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("version", h.version)?;
    d.set_item("dtype", h.dtype.name())?;
    d.set_item("shape", h.shape.clone())?;
    d.set_item("predicted", h.predicted())?;
    d.set_item("torch_hint", h.flags & speckv::format::header::FLAG_TORCH_HINT != 0)?;
    d.set_item("model", h.model_name())?;
    d.set_item(
        "lane",
        if h.predicted() {
            None
        } else if h.fast_lane() {
            Some("fast")
        } else {
            Some("adaptive")
        },
    )?;
    d.set_item("joint", h.flags & speckv::format::header::FLAG_JOINT != 0)?;
    d.set_item("joint_integer", h.flags & speckv::format::header::FLAG_JOINT_INT != 0)?;
    d.set_item("token_scale", h.token_scale.map(|s| (s.prior, s.clamp)))?;
    d.set_item("lanes", h.lanes)?;
    d.set_item("n_scalars", h.n_scalars)?;
    d.set_item("chunk_scalars", h.chunk_scalars)?;
    d.set_item("chunks", h.chunks.len())?;
    let payload: u64 = h.chunks.iter().map(|c| c.length as u64).sum();
    d.set_item("payload_bytes", payload)?;
    d.set_item("chunk_bytes", h.chunks.iter().map(|c| c.length).collect::<Vec<u32>>())?;
    d.set_item("header_bytes", stream_len as u64 - payload)?;
    d.set_item("total_bytes", stream_len)?;
    d.set_item("raw_bytes", h.n_scalars * h.dtype.bytes() as u64)?;
    let bits = if h.n_scalars > 0 { stream_len as f64 * 8.0 / h.n_scalars as f64 } else { 0.0 };
    d.set_item("bits_per_scalar", bits)?;
    d.set_item("table_digest", format!("{:016x}", h.table_digest))?;
    d.set_item("fingerprint", format!("{:016x}", h.fingerprint))?;
    Ok(d)
}

/// Chunks coded elsewhere as Python passes them: `(payload, lengths, fingerprints)`, every
/// chunk's payload back to back, one length and one plain prediction fingerprint per chunk.
#[derive(FromPyObject)]
pub(crate) struct ChunksIn<'py>(PyReadonlyArray1<'py, u8>, PyReadonlyArray1<'py, u32>, PyReadonlyArray1<'py, u64>);

/// The stream `encode` writes (exact model, default parameters) from chunks coded elsewhere:
/// every chunk's payload back to back, with one length and one plain prediction fingerprint
/// per chunk (`chunks`), and for a jointly coded stream `joint`: its joint model's arguments
/// (the outside residuals may be empty) and its token scale (`speckv::codec::assemble_predicted`).
#[pyfunction]
#[pyo3(signature = (dtype_name, shape, chunk_scalars, chunks, torch_hint=false, joint=None))]
pub(crate) fn assemble_predicted<'py>(
    py: Python<'py>,
    dtype_name: &str,
    shape: Vec<u64>,
    chunk_scalars: u32,
    chunks: ChunksIn<'py>,
    torch_hint: bool,
    joint: Option<(JointArgs<'py>, Option<(u8, u8)>)>,
) -> PyResult<Bound<'py, PyBytes>> {
    let dtype = dtype(dtype_name)?;
    let ChunksIn(payload, lengths, fingerprints) = chunks;
    let (joint, token_scale) = match joint {
        Some((joint, token_scale)) => (Some(joint), token_scale),
        None => (None, None),
    };
    let contiguous = |_| PyValueError::new_err("payload, lengths, fingerprints and joint arrays must be contiguous");
    let (payload, lengths, fingerprints) = (
        payload.as_slice().map_err(contiguous)?,
        lengths.as_slice().map_err(contiguous)?,
        fingerprints.as_slice().map_err(contiguous)?,
    );
    let joint = joint.as_ref().map(|j| joint_of(j, "joint: arrays")).transpose()?;
    let opts = EncodeOptions { torch_hint, ..options(1, chunk_scalars, "exact", None, token_scale)? };
    let stream = py
        .allow_threads(|| {
            speckv::assemble_predicted(dtype, &shape, &opts, payload, lengths, fingerprints, joint.as_ref())
        })
        .map_err(to_py)?;
    Ok(PyBytes::new(py, &stream))
}
