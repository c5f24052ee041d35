//! Thin PyO3 binding of the speckv core. Every function is: extract the arguments, release the
//! GIL, call the core, map the error. Array conversion (dtypes, broadcasting, torch) lives in
//! the Python package; here arrays arrive as flat, C-contiguous integer arrays.

use numpy::{PyArray1, PyArrayMethods, PyReadonlyArray1, PyReadwriteArray1};
use pyo3::create_exception;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::{PyBytes, PyDict};

use speckv::codec::EncodeOptions;
use speckv::format::container::{self, Container, StreamLayers};
use speckv::format::Header;
use speckv::model::ladder;
use speckv::model::ModelParams;
use speckv::{Bits, BitsMut, DType, Error, ModelKind, Prediction, SigmaCodes, TokenScale};

create_exception!(_speckv, SpeckvError, PyValueError, "Base class of every error speckv raises.");
create_exception!(_speckv, CorruptStreamError, SpeckvError, "The bytes are not a valid speckv stream.");
create_exception!(_speckv, ChecksumError, CorruptStreamError, "A checksum did not match: the stream was altered.");
create_exception!(
    _speckv,
    UnsupportedStreamError,
    CorruptStreamError,
    "Not a speckv stream, or a format version or feature this build cannot read."
);
create_exception!(
    _speckv,
    PredictionMismatchError,
    SpeckvError,
    "The mu/sigma given to decode are not the ones the stream was encoded with."
);

fn to_py(err: Error) -> PyErr {
    match err {
        Error::InvalidArgument(m) => SpeckvError::new_err(m),
        Error::Unsupported(m) => UnsupportedStreamError::new_err(m),
        Error::Corrupt(m) => CorruptStreamError::new_err(m),
        Error::Checksum(m) => ChecksumError::new_err(m),
        Error::PredictionMismatch(m) => PredictionMismatchError::new_err(m),
    }
}

/// A flat read-only integer array of one of the three word widths.
enum Words<'py> {
    U8(PyReadonlyArray1<'py, u8>),
    U16(PyReadonlyArray1<'py, u16>),
    U32(PyReadonlyArray1<'py, u32>),
}

impl<'py> Words<'py> {
    fn extract(obj: &Bound<'py, PyAny>, what: &str) -> PyResult<Self> {
        if let Ok(a) = obj.downcast::<PyArray1<u16>>() {
            return Ok(Words::U16(a.try_readonly()?));
        }
        if let Ok(a) = obj.downcast::<PyArray1<u8>>() {
            return Ok(Words::U8(a.try_readonly()?));
        }
        if let Ok(a) = obj.downcast::<PyArray1<u32>>() {
            return Ok(Words::U32(a.try_readonly()?));
        }
        Err(PyTypeError::new_err(format!("{what}: expected a 1-D uint8, uint16 or uint32 numpy array")))
    }

    fn bits(&self, what: &str) -> PyResult<Bits<'_>> {
        let not_contiguous = |_| PyValueError::new_err(format!("{what}: array must be C-contiguous"));
        Ok(match self {
            Words::U8(a) => Bits::U8(a.as_slice().map_err(not_contiguous)?),
            Words::U16(a) => Bits::U16(a.as_slice().map_err(not_contiguous)?),
            Words::U32(a) => Bits::U32(a.as_slice().map_err(not_contiguous)?),
        })
    }
}

fn dtype(name: &str) -> PyResult<DType> {
    DType::from_name(name).map_err(|e| PyTypeError::new_err(format!("dtype: {e}")))
}

/// A sigma argument: positive float32 values, or sigma codes already computed (the integer
/// coding parameters; see `speckv::model::ladder::sigma_code`).
enum SigmaValues<'py> {
    Floats(PyReadonlyArray1<'py, f32>),
    Codes(PyReadonlyArray1<'py, i16>),
}

impl<'py> SigmaValues<'py> {
    fn extract(obj: &Bound<'py, PyAny>) -> PyResult<Self> {
        if let Ok(a) = obj.downcast::<PyArray1<f32>>() {
            return Ok(SigmaValues::Floats(a.try_readonly()?));
        }
        if let Ok(a) = obj.downcast::<PyArray1<i16>>() {
            return Ok(SigmaValues::Codes(a.try_readonly()?));
        }
        Err(PyTypeError::new_err("sigma: expected a 1-D float32 (values) or int16 (codes) numpy array"))
    }
}

/// Extracted prediction arguments: `mu` (flat float32, with its shape) and sigma (flat, with
/// the shape it broadcasts from). `prediction()` turns them into the core's integer coding
/// parameters, against the tensor's shape.
struct PredictionArgs<'py> {
    mu: PyReadonlyArray1<'py, f32>,
    mu_shape: Vec<usize>,
    sigma: SigmaValues<'py>,
    sigma_shape: Vec<usize>,
}

/// Sigma codes owned by the call (computed from float sigma) or borrowed from the caller.
enum Codes<'a> {
    Owned(Vec<i16>),
    Borrowed(&'a [i16]),
}

impl Codes<'_> {
    fn as_slice(&self) -> &[i16] {
        match self {
            Codes::Owned(v) => v,
            Codes::Borrowed(s) => s,
        }
    }
}

impl<'py> PredictionArgs<'py> {
    fn extract(
        mu: Option<PyReadonlyArray1<'py, f32>>,
        mu_shape: Option<Vec<usize>>,
        sigma: Option<&Bound<'py, PyAny>>,
        sigma_shape: Option<Vec<usize>>,
    ) -> PyResult<Option<Self>> {
        match (mu, mu_shape, sigma, sigma_shape) {
            (None, None, None, None) => Ok(None),
            (Some(mu), Some(mu_shape), Some(sigma), Some(sigma_shape)) => {
                Ok(Some(PredictionArgs { mu, mu_shape, sigma: SigmaValues::extract(sigma)?, sigma_shape }))
            }
            _ => Err(PyValueError::new_err("mu, mu_shape, sigma and sigma_shape go together")),
        }
    }

    /// Sigma codes (computed here from float values, GIL released) for `prediction`.
    fn codes(&self, py: Python<'_>) -> PyResult<Codes<'_>> {
        let contiguous = |_| PyValueError::new_err("sigma must be C-contiguous");
        match &self.sigma {
            SigmaValues::Floats(a) => {
                let values = a.as_slice().map_err(contiguous)?;
                let codes = py
                    .allow_threads(|| {
                        values.iter().map(|&s| ladder::sigma_code(s)).collect::<Result<Vec<i16>, Error>>()
                    })
                    .map_err(|e| SpeckvError::new_err(format!("sigma: {e}")))?;
                Ok(Codes::Owned(codes))
            }
            SigmaValues::Codes(a) => Ok(Codes::Borrowed(a.as_slice().map_err(contiguous)?)),
        }
    }

    /// The prediction for a tensor of `shape`: `mu` must have exactly that shape (a mismatch
    /// is `mismatch`'s error), sigma must broadcast to it.
    fn prediction<'a>(
        &'a self,
        codes: &'a Codes<'a>,
        shape: &[u64],
        mismatch: fn(String) -> PyErr,
    ) -> PyResult<Prediction<'a>> {
        let shape: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
        if self.mu_shape != shape {
            return Err(mismatch(format!("mu: shape {:?} differs from the shape {shape:?} of x", self.mu_shape)));
        }
        let sigma = SigmaCodes::broadcast(codes.as_slice(), &self.sigma_shape, &shape).map_err(to_py)?;
        let mu = self.mu.as_slice().map_err(|_| PyValueError::new_err("mu must be C-contiguous"))?;
        Ok(Prediction { mu, sigma, joint: None })
    }
}

/// `(channels, tokens, outside_channels, outside, coef, offset)`: the joint residual model's
/// arguments (`speckv::joint::Joint`), float32 arrays flat.
type JointArgs<'py> =
    (usize, usize, usize, PyReadonlyArray1<'py, f32>, PyReadonlyArray1<'py, f32>, PyReadonlyArray1<'py, f32>);

/// `prediction` with the joint model of `joint` (borrowing its arrays), if any.
fn with_joint<'a>(
    prediction: Option<Prediction<'a>>,
    joint: &'a Option<JointArgs<'_>>,
) -> PyResult<Option<Prediction<'a>>> {
    let (Some(mut p), Some((channels, tokens, outside_channels, outside, coef, offset))) = (prediction.clone(), joint)
    else {
        if joint.is_some() {
            return Err(SpeckvError::new_err("joint: the joint model needs mu and sigma"));
        }
        return Ok(prediction);
    };
    let contiguous = |_| PyValueError::new_err("joint: arrays must be C-contiguous");
    p.joint = Some(speckv::joint::Joint {
        channels: *channels,
        tokens: *tokens,
        outside_channels: *outside_channels,
        outside: outside.as_slice().map_err(contiguous)?,
        coef: coef.as_slice().map_err(contiguous)?,
        offset: offset.as_slice().map_err(contiguous)?,
    });
    Ok(Some(p))
}

fn options(
    threads: usize,
    chunk_scalars: u32,
    model: &str,
    weights: Option<(u16, u16, u16)>,
    token_scale: Option<(u8, u8)>,
) -> PyResult<EncodeOptions> {
    let mut params = ModelParams::default();
    if let Some((narrow, wide, escape)) = weights {
        (params.weight_narrow, params.weight_wide, params.weight_escape) = (narrow, wide, escape);
        params.validate().map_err(|m| SpeckvError::new_err(format!("weights: {m}")))?;
    }
    let model = ModelKind::from_name(model)
        .ok_or_else(|| SpeckvError::new_err(format!("model: expected 'exact', 'fast' or 'bins', got {model:?}")))?;
    let token_scale = token_scale.map(|(prior, clamp)| TokenScale { prior, clamp });
    if let Some(scale) = token_scale {
        scale.validate().map_err(SpeckvError::new_err)?;
    }
    Ok(EncodeOptions { threads, chunk_scalars, model, params, token_scale, ..Default::default() })
}

fn value_error(m: String) -> PyErr {
    SpeckvError::new_err(m)
}

fn mismatch_error(m: String) -> PyErr {
    PredictionMismatchError::new_err(m)
}

/// Encodes flat bit patterns `x` of `dtype` and `shape`; see `speckv.encode`.
#[pyfunction]
#[pyo3(signature = (x, dtype_name, shape, mu=None, mu_shape=None, sigma=None, sigma_shape=None, threads=1, chunk_scalars=speckv::codec::DEFAULT_CHUNK_SCALARS, torch_hint=false, model="exact", weights=None, joint=None, token_scale=None, fast_lane=false, context_period=None))]
#[allow(clippy::too_many_arguments)]
fn encode<'py>(
    py: Python<'py>,
    x: &Bound<'py, PyAny>,
    dtype_name: &str,
    shape: Vec<u64>,
    mu: Option<PyReadonlyArray1<'py, f32>>,
    mu_shape: Option<Vec<usize>>,
    sigma: Option<&Bound<'py, PyAny>>,
    sigma_shape: Option<Vec<usize>>,
    threads: usize,
    chunk_scalars: u32,
    torch_hint: bool,
    model: &str,
    weights: Option<(u16, u16, u16)>,
    joint: Option<JointArgs<'py>>,
    token_scale: Option<(u8, u8)>,
    fast_lane: bool,
    context_period: Option<u32>,
) -> PyResult<Bound<'py, PyBytes>> {
    let dtype = dtype(dtype_name)?;
    let x = Words::extract(x, "x")?;
    let args = PredictionArgs::extract(mu, mu_shape, sigma, sigma_shape)?;
    let codes = args.as_ref().map(|a| a.codes(py)).transpose()?;
    let prediction = match (&args, &codes) {
        (Some(a), Some(c)) => Some(a.prediction(c, &shape, value_error)?),
        _ => None,
    };
    let prediction = with_joint(prediction, &joint)?;
    let x_bits = x.bits("x")?;
    let opts = EncodeOptions {
        torch_hint,
        fast_lane,
        context_period,
        ..options(threads, chunk_scalars, model, weights, token_scale)?
    };
    let stream =
        py.allow_threads(|| speckv::encode(x_bits, dtype, &shape, prediction.as_ref(), &opts)).map_err(to_py)?;
    Ok(PyBytes::new(py, &stream))
}

/// Ideal code length in bits under exactly the model `encode` uses.
#[pyfunction]
#[pyo3(signature = (x, dtype_name, shape, mu=None, mu_shape=None, sigma=None, sigma_shape=None, threads=1, chunk_scalars=speckv::codec::DEFAULT_CHUNK_SCALARS, model="exact", weights=None, joint=None, token_scale=None))]
#[allow(clippy::too_many_arguments)]
fn ideal_bits<'py>(
    py: Python<'py>,
    x: &Bound<'py, PyAny>,
    dtype_name: &str,
    shape: Vec<u64>,
    mu: Option<PyReadonlyArray1<'py, f32>>,
    mu_shape: Option<Vec<usize>>,
    sigma: Option<&Bound<'py, PyAny>>,
    sigma_shape: Option<Vec<usize>>,
    threads: usize,
    chunk_scalars: u32,
    model: &str,
    weights: Option<(u16, u16, u16)>,
    joint: Option<JointArgs<'py>>,
    token_scale: Option<(u8, u8)>,
) -> PyResult<f64> {
    let dtype = dtype(dtype_name)?;
    let x = Words::extract(x, "x")?;
    let args = PredictionArgs::extract(mu, mu_shape, sigma, sigma_shape)?;
    let codes = args.as_ref().map(|a| a.codes(py)).transpose()?;
    let prediction = match (&args, &codes) {
        (Some(a), Some(c)) => Some(a.prediction(c, &shape, value_error)?),
        _ => None,
    };
    let prediction = with_joint(prediction, &joint)?;
    let x_bits = x.bits("x")?;
    let opts = options(threads, chunk_scalars, model, weights, token_scale)?;
    py.allow_threads(|| speckv::ideal_bits(x_bits, dtype, &shape, prediction.as_ref(), &opts)).map_err(to_py)
}

/// Decodes `data` (a uint8 array over the stream): parses the header once, allocates the
/// flat output words, decodes into them with the GIL released. Returns `(words, info)`, with
/// `info` as `speckv.info` gives it.
#[pyfunction]
#[pyo3(signature = (data, mu=None, mu_shape=None, sigma=None, sigma_shape=None, threads=1, chunks=None, joint=None))]
#[allow(clippy::too_many_arguments)]
fn decode<'py>(
    py: Python<'py>,
    data: PyReadonlyArray1<'py, u8>,
    mu: Option<PyReadonlyArray1<'py, f32>>,
    mu_shape: Option<Vec<usize>>,
    sigma: Option<&Bound<'py, PyAny>>,
    sigma_shape: Option<Vec<usize>>,
    threads: usize,
    chunks: Option<(usize, usize)>,
    joint: Option<JointArgs<'py>>,
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyDict>)> {
    let stream = data.as_slice().map_err(|_| PyValueError::new_err("data must be contiguous"))?;
    let header = py.allow_threads(|| Header::parse(stream)).map_err(to_py)?;
    let args = PredictionArgs::extract(mu, mu_shape, sigma, sigma_shape)?;
    let codes = args.as_ref().map(|a| a.codes(py)).transpose()?;
    let prediction = match (&args, &codes) {
        (Some(a), Some(c)) => Some(a.prediction(c, &header.shape, mismatch_error)?),
        _ => None,
    };
    let prediction = with_joint(prediction, &joint)?;
    let range = chunks.map(|(a, b)| a..b);
    let n = speckv::decoded_len(&header, range.clone()).map_err(to_py)?;
    macro_rules! run {
        ($t:ty, $variant:ident) => {{
            let mut words = vec![<$t>::default(); n];
            py.allow_threads(|| {
                speckv::decode_parsed(
                    stream,
                    &header,
                    BitsMut::$variant(&mut words),
                    prediction.as_ref(),
                    threads,
                    range,
                )
            })
            .map_err(to_py)?;
            PyArray1::from_vec(py, words).into_any()
        }};
    }
    let words = match header.dtype.bits() {
        8 => run!(u8, U8),
        16 => run!(u16, U16),
        _ => run!(u32, U32),
    };
    Ok((words, header_dict(py, &header, stream.len())?))
}

/// Decodes a predictor-free stream into `out`, a writable, contiguous 1-D uint8 array of
/// exactly the stream's bytes (a slot of a serving engine's host buffer): no output is
/// allocated and nothing is copied after decoding. The stream's words are written in native
/// byte order, as `decode` returns them. `out` must be aligned to the word (2 or 4 bytes for
/// 16- or 32-bit streams); a predicted stream is refused (`decode` takes its prediction).
#[pyfunction]
#[pyo3(signature = (data, out, threads=1))]
fn decode_into<'py>(
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
fn info<'py>(py: Python<'py>, data: PyReadonlyArray1<'py, u8>) -> PyResult<Bound<'py, PyDict>> {
    let stream = data.as_slice().map_err(|_| PyValueError::new_err("data must be contiguous"))?;
    let h = py.allow_threads(|| Header::parse(stream)).map_err(to_py)?;
    header_dict(py, &h, stream.len())
}

fn header_dict<'py>(py: Python<'py>, h: &Header, stream_len: usize) -> PyResult<Bound<'py, PyDict>> {
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

/// The checksum of a store entry's payload under `key` (`speckv::hash::keyed_checksum`),
/// computed without the GIL.
#[pyfunction]
fn entry_checksum(py: Python<'_>, key: &[u8], payload: PyBackedBytes) -> u64 {
    py.allow_threads(|| speckv::hash::keyed_checksum(key, &payload))
}

/// Streams of consecutive slabs of one tensor joined into the stream of the whole
/// (`speckv::format::splice::join`).
#[pyfunction]
fn stream_join<'py>(py: Python<'py>, streams: Vec<PyBackedBytes>) -> PyResult<Bound<'py, PyBytes>> {
    let out = py
        .allow_threads(|| {
            // borrowed from the Python bytes, not copied
            let refs: Vec<&[u8]> = streams.iter().map(|s| &s[..]).collect();
            speckv::format::splice::join(&refs)
        })
        .map_err(to_py)?;
    Ok(PyBytes::new(py, &out))
}

/// Chunks `start..stop` of a stream as a stream of their own (`speckv::format::splice::cut`).
#[pyfunction]
fn stream_cut<'py>(
    py: Python<'py>,
    data: PyReadonlyArray1<'py, u8>,
    start: usize,
    stop: usize,
) -> PyResult<Bound<'py, PyBytes>> {
    let stream = data.as_slice().map_err(|_| PyValueError::new_err("data must be contiguous"))?;
    let out = py.allow_threads(|| speckv::format::splice::cut(stream, start..stop)).map_err(to_py)?;
    Ok(PyBytes::new(py, &out))
}

/// Wraps block-major `streams` in a cache container (`speckv::format::container`).
#[pyfunction]
#[pyo3(signature = (per_layer, layers, block_tokens, tokens, metadata, streams, layer_tokens=None))]
#[allow(clippy::too_many_arguments)]
fn container_write<'py>(
    py: Python<'py>,
    per_layer: bool,
    layers: u32,
    block_tokens: u32,
    tokens: u64,
    metadata: &[u8],
    streams: Vec<PyBackedBytes>,
    layer_tokens: Option<Vec<u64>>,
) -> PyResult<Bound<'py, PyBytes>> {
    let out = py
        .allow_threads(|| {
            let refs: Vec<&[u8]> = streams.iter().map(|s| &s[..]).collect();
            container::write(per_layer, layers, block_tokens, tokens, layer_tokens.as_deref(), metadata, &refs)
        })
        .map_err(to_py)?;
    Ok(PyBytes::new(py, &out))
}

/// A cache container's layout, validated: its fields, metadata bytes, and each stream's
/// byte range and header facts (block-major).
#[pyfunction]
fn container_info<'py>(py: Python<'py>, data: PyReadonlyArray1<'py, u8>) -> PyResult<Bound<'py, PyDict>> {
    let bytes = data.as_slice().map_err(|_| PyValueError::new_err("data must be contiguous"))?;
    let c = py.allow_threads(|| Container::parse(bytes)).map_err(to_py)?;
    let d = PyDict::new(py);
    d.set_item("version", c.version)?;
    d.set_item("layout", if c.per_layer() { "per-layer" } else { "stacked" })?;
    d.set_item("layers", c.layers)?;
    d.set_item("block_tokens", c.block_tokens)?;
    d.set_item("tokens", c.tokens)?;
    d.set_item("blocks", c.blocks())?;
    d.set_item("streams_per_block", c.streams_per_block())?;
    d.set_item("metadata", PyBytes::new(py, &bytes[c.metadata.clone()]))?;
    d.set_item("total_bytes", bytes.len())?;
    d.set_item("layer_tokens", c.layer_tokens.clone())?;
    let streams = pyo3::types::PyList::empty(py);
    for s in &c.streams {
        // a layer that holds none of its block's tokens has no stream there
        let Some(s) = s else {
            streams.append(py.None())?;
            continue;
        };
        let e = header_dict(py, &s.header, s.range.len())?;
        e.set_item("offset", s.range.start)?;
        e.set_item("length", s.range.len())?;
        let (per_chunk, per_layer) = match s.layers {
            Some(StreamLayers::LayersPerChunk(n)) => (n, 1),
            Some(StreamLayers::ChunksPerLayer(n)) => (1, n),
            None => (1, s.header.chunks.len() as u64),
        };
        e.set_item("layers_per_chunk", per_chunk)?;
        e.set_item("chunks_per_layer", per_layer)?;
        streams.append(e)?;
    }
    d.set_item("streams", streams)?;
    Ok(d)
}

/// `round(8 log2 sigma)` of each float32 sigma, as int16; raises naming `sigma`.
#[pyfunction]
fn sigma_codes<'py>(py: Python<'py>, sigma: PyReadonlyArray1<'py, f32>) -> PyResult<Bound<'py, PyArray1<i16>>> {
    let values = sigma.as_slice().map_err(|_| PyValueError::new_err("sigma must be contiguous"))?;
    let codes = py
        .allow_threads(|| values.iter().map(|&s| ladder::sigma_code(s)).collect::<Result<Vec<i16>, Error>>())
        .map_err(|e| SpeckvError::new_err(format!("sigma: {e}")))?;
    Ok(PyArray1::from_vec(py, codes))
}

/// Sigma codes of `sqrt(s^2 + (r * mu)^2)` for a `[..., heads, tokens, dim]` prediction `mu`
/// with per-channel `s` and `r` (`[heads, dim]`, flattened): the cache codec's relative sigma
/// in one pass. Each step is one correctly rounded float32 operation in the order of the
/// codec's torch expression `sqrt(s * s + (r * mu) ** 2)` (Rust never fuses a multiply and an
/// add on its own), so the codes equal `sigma_codes` of that tensor.
#[pyfunction]
fn relative_sigma_codes<'py>(
    py: Python<'py>,
    mu: PyReadonlyArray1<'py, f32>,
    s: PyReadonlyArray1<'py, f32>,
    r: PyReadonlyArray1<'py, f32>,
    heads: usize,
    tokens: usize,
    dim: usize,
) -> PyResult<Bound<'py, PyArray1<i16>>> {
    let contiguous = |_| PyValueError::new_err("mu, s and r must be contiguous");
    let (mu, s, r) =
        (mu.as_slice().map_err(contiguous)?, s.as_slice().map_err(contiguous)?, r.as_slice().map_err(contiguous)?);
    let channels = heads.checked_mul(dim).ok_or_else(|| SpeckvError::new_err("heads * dim overflows"))?;
    let block = channels.checked_mul(tokens).ok_or_else(|| SpeckvError::new_err("heads * tokens * dim overflows"))?;
    if s.len() != channels || r.len() != channels || block == 0 || mu.len() % block != 0 {
        return Err(SpeckvError::new_err(format!(
            "relative_sigma_codes: mu has {} values, s {} and r {}, for heads {heads} x tokens {tokens} x dim {dim}",
            mu.len(),
            s.len(),
            r.len()
        )));
    }
    let codes = py
        .allow_threads(|| ladder::relative_codes(mu, s, r, heads, tokens, dim))
        .map_err(|e| SpeckvError::new_err(format!("sigma: {e}")))?;
    Ok(PyArray1::from_vec(py, codes))
}

/// `value(x) - mu` per scalar in float32, 0 where not finite: the residuals the joint model
/// conditions on (`speckv::joint::residuals`), computed here so that encoder and decoder use
/// the same ones.
#[pyfunction]
fn residuals<'py>(
    py: Python<'py>,
    x: &Bound<'py, PyAny>,
    dtype_name: &str,
    mu: PyReadonlyArray1<'py, f32>,
) -> PyResult<Bound<'py, PyArray1<f32>>> {
    let dtype = dtype(dtype_name)?;
    let words = Words::extract(x, "x")?;
    let bits = words.bits("x")?;
    let mu = mu.as_slice().map_err(|_| PyValueError::new_err("mu must be C-contiguous"))?;
    if bits.len() != mu.len() || bits.width_bits() != dtype.bits() {
        return Err(SpeckvError::new_err(format!(
            "residuals: {} words of x for {} values of mu",
            bits.len(),
            mu.len()
        )));
    }
    let mut out = vec![0f32; mu.len()];
    py.allow_threads(|| match bits {
        Bits::U8(x) => speckv::joint::residuals(dtype, x, mu, &mut out),
        Bits::U16(x) => speckv::joint::residuals(dtype, x, mu, &mut out),
        Bits::U32(x) => speckv::joint::residuals(dtype, x, mu, &mut out),
    });
    Ok(PyArray1::from_vec(py, out))
}

/// The exact model's tables for `dtype` (8 or 16 bits) with the default model parameters, as
/// arrays and numbers: what the CUDA module's coder reads (`cuda/speckv_coder.cuh`,
/// `ExactTables`), so it codes with exactly the core's tables.
#[pyfunction]
fn exact_tables<'py>(py: Python<'py>, dtype_name: &str) -> PyResult<Bound<'py, PyDict>> {
    let dtype = dtype(dtype_name)?;
    let p = ModelParams::default();
    let t = speckv::exact_tables(dtype, &p).map_err(to_py)?;
    let d = PyDict::new(py);
    d.set_item("nodes", PyArray1::from_vec(py, t.nodes))?;
    d.set_item("edges", PyArray1::from_vec(py, t.edges))?;
    d.set_item("sigmas", PyArray1::from_vec(py, t.sigmas))?;
    d.set_item("values", PyArray1::from_vec(py, t.values))?;
    d.set_item("half_width", t.half_width)?;
    d.set_item("g_max", t.g_max)?;
    d.set_item("precision", t.precision)?;
    d.set_item("min_ordinal", t.min_ordinal)?;
    d.set_item("max_ordinal", t.max_ordinal)?;
    d.set_item("exponent_bias", t.exponent_bias)?;
    d.set_item("width", t.width)?;
    d.set_item("mantissa_bits", t.mantissa_bits)?;
    d.set_item("max_magnitude", t.max_magnitude)?;
    d.set_item("adapt_increment", p.adapt_increment)?;
    d.set_item("adapt_period", p.adapt_period)?;
    d.set_item("adapt_shift", p.adapt_shift)?;
    d.set_item("digest", t.digest)?;
    Ok(d)
}

/// The stream `encode` writes (exact model, default parameters) from chunks coded elsewhere:
/// every chunk's payload back to back, with one length and one plain prediction fingerprint
/// per chunk, and for a jointly coded stream its joint model (the outside residuals may be
/// empty) and token scale (`speckv::codec::assemble_predicted`).
#[pyfunction]
#[pyo3(signature = (dtype_name, shape, chunk_scalars, payload, lengths, fingerprints, torch_hint=false, joint=None, token_scale=None))]
#[allow(clippy::too_many_arguments)]
fn assemble_predicted<'py>(
    py: Python<'py>,
    dtype_name: &str,
    shape: Vec<u64>,
    chunk_scalars: u32,
    payload: PyReadonlyArray1<'py, u8>,
    lengths: PyReadonlyArray1<'py, u32>,
    fingerprints: PyReadonlyArray1<'py, u64>,
    torch_hint: bool,
    joint: Option<JointArgs<'py>>,
    token_scale: Option<(u8, u8)>,
) -> PyResult<Bound<'py, PyBytes>> {
    let dtype = dtype(dtype_name)?;
    let contiguous = |_| PyValueError::new_err("payload, lengths, fingerprints and joint arrays must be contiguous");
    let (payload, lengths, fingerprints) = (
        payload.as_slice().map_err(contiguous)?,
        lengths.as_slice().map_err(contiguous)?,
        fingerprints.as_slice().map_err(contiguous)?,
    );
    let joint = match &joint {
        Some((channels, tokens, outside_channels, outside, coef, offset)) => Some(speckv::joint::Joint {
            channels: *channels,
            tokens: *tokens,
            outside_channels: *outside_channels,
            outside: outside.as_slice().map_err(contiguous)?,
            coef: coef.as_slice().map_err(contiguous)?,
            offset: offset.as_slice().map_err(contiguous)?,
        }),
        None => None,
    };
    let opts = EncodeOptions { torch_hint, ..options(1, chunk_scalars, "exact", None, token_scale)? };
    let stream = py
        .allow_threads(|| {
            speckv::assemble_predicted(dtype, &shape, &opts, payload, lengths, fingerprints, joint.as_ref())
        })
        .map_err(to_py)?;
    Ok(PyBytes::new(py, &stream))
}

/// Exact per-channel calibration sums of a `[..., heads, tokens, dim]` cache (flat float32
/// arrays `t`, `p`, `p8`, `q`; `speckv::stats`): `[3 statistics][heads * dim][3 limbs]` of
/// 192-bit fixed-point integers, flat.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn channel_sums<'py>(
    py: Python<'py>,
    t: PyReadonlyArray1<'py, f32>,
    p: PyReadonlyArray1<'py, f32>,
    p8: PyReadonlyArray1<'py, f32>,
    q: PyReadonlyArray1<'py, f32>,
    scale: f64,
    heads: usize,
    tokens: usize,
    dim: usize,
) -> PyResult<Bound<'py, PyArray1<u64>>> {
    let contiguous = |_| PyValueError::new_err("t, p, p8 and q must be contiguous");
    let (t, p, p8, q) = (
        t.as_slice().map_err(contiguous)?,
        p.as_slice().map_err(contiguous)?,
        p8.as_slice().map_err(contiguous)?,
        q.as_slice().map_err(contiguous)?,
    );
    let block = heads.checked_mul(tokens).and_then(|v| v.checked_mul(dim));
    if block.is_none_or(|b| b == 0 || t.len() % b != 0) || [p.len(), p8.len(), q.len()].iter().any(|&n| n != t.len()) {
        return Err(SpeckvError::new_err(format!(
            "channel_sums: {} values (p {}, p8 {}, q {}) for heads {heads} x tokens {tokens} x dim {dim}",
            t.len(),
            p.len(),
            p8.len(),
            q.len()
        )));
    }
    let sums = py.allow_threads(|| speckv::stats::channel_sums(t, p, p8, q, scale, heads, tokens, dim));
    let flat: Vec<u64> = sums.iter().flat_map(|s| s.iter().flatten().copied()).collect();
    Ok(PyArray1::from_vec(py, flat))
}

/// Which kernels code the exact model here: "avx2" or "portable" (same bytes either way).
#[pyfunction]
fn kernels() -> &'static str {
    speckv::kernels()
}

/// The kernel each part of the core runs here (`speckv::kernel_report`), as (part, kernel).
#[pyfunction]
fn kernel_report() -> Vec<(&'static str, &'static str)> {
    speckv::kernel_report().to_vec()
}

/// A calibrated integer linear map (`speckv::linear_map`): the layer-wise predictor's maps,
/// the same bits on every machine, SIMD width and thread count.
#[pyclass(name = "LinearMap", module = "speckv._speckv", frozen)]
struct PyLinearMap {
    inner: speckv::linear_map::LinearMap,
}

#[pymethods]
impl PyLinearMap {
    /// `weights`: `features x outputs` row-major (i16, never -32768); `shift` per feature and
    /// `scale_shift` per output: powers of two (see the core's invariant M1).
    #[new]
    fn new(
        py: Python<'_>,
        features: usize,
        outputs: usize,
        shift: PyReadonlyArray1<'_, i32>,
        weights: PyReadonlyArray1<'_, i16>,
        bias: PyReadonlyArray1<'_, f32>,
        scale_shift: PyReadonlyArray1<'_, i32>,
    ) -> PyResult<Self> {
        let contiguous = || PyValueError::new_err("linear map: arrays must be contiguous");
        let (s, w, b, o) = (
            shift.as_slice().map_err(|_| contiguous())?,
            weights.as_slice().map_err(|_| contiguous())?,
            bias.as_slice().map_err(|_| contiguous())?,
            scale_shift.as_slice().map_err(|_| contiguous())?,
        );
        let inner =
            py.allow_threads(|| speckv::linear_map::LinearMap::new(features, outputs, s, w, b, o)).map_err(to_py)?;
        Ok(PyLinearMap { inner })
    }

    #[getter]
    fn features(&self) -> usize {
        self.inner.features()
    }

    #[getter]
    fn outputs(&self) -> usize {
        self.inner.outputs()
    }

    /// `y` (`rows x outputs`, flat float32) for `x` (`rows x features`, flat float32).
    #[pyo3(signature = (x, rows, threads=1))]
    fn apply<'py>(
        &self,
        py: Python<'py>,
        x: PyReadonlyArray1<'py, f32>,
        rows: usize,
        threads: usize,
    ) -> PyResult<Bound<'py, PyArray1<f32>>> {
        let x = x.as_slice().map_err(|_| PyValueError::new_err("linear map: x must be contiguous"))?;
        // the output is sized from `rows` only once `x` has shown that many rows
        if x.len() != rows.saturating_mul(self.inner.features()) {
            return Err(SpeckvError::new_err(format!(
                "linear map: {} inputs given for {rows} rows of {} features",
                x.len(),
                self.inner.features()
            )));
        }
        let mut y = vec![0f32; rows * self.inner.outputs()];
        py.allow_threads(|| self.inner.apply(x, rows, &mut y, threads)).map_err(to_py)?;
        Ok(PyArray1::from_vec(py, y))
    }
}

/// Which kernel computes the linear maps here: "avx512-vnni", "avx512", "avx2" or "portable"
/// (the same sums either way).
#[pyfunction]
fn map_kernel() -> &'static str {
    speckv::linear_map::kernel_name()
}

/// Which kernel decodes the fast lane here: "avx512" or "portable" (same output).
#[pyfunction]
fn fast_lane_kernel() -> &'static str {
    speckv::fast_lane::kernel()
}

/// The CUDA module's sources (`cuda/`), compiled into the extension so that a wheel carries
/// exactly the source its tests checked: `speckv.cuda` compiles them just in time on a GPU
/// machine. `(file name, text)` pairs.
#[pyfunction]
fn cuda_sources() -> Vec<(&'static str, &'static str)> {
    vec![
        ("speckv_params.cuh", include_str!("../../../cuda/speckv_params.cuh")),
        ("speckv_params.cu", include_str!("../../../cuda/speckv_params.cu")),
        ("speckv_xxh3.cuh", include_str!("../../../cuda/speckv_xxh3.cuh")),
        ("speckv_coder.cuh", include_str!("../../../cuda/speckv_coder.cuh")),
        ("speckv_coder.cu", include_str!("../../../cuda/speckv_coder.cu")),
        ("speckv_joint.cuh", include_str!("../../../cuda/speckv_joint.cuh")),
        ("speckv_stats.cuh", include_str!("../../../cuda/speckv_stats.cuh")),
        ("speckv_stats.cu", include_str!("../../../cuda/speckv_stats.cu")),
    ]
}

#[pymodule]
fn _speckv(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_function(wrap_pyfunction!(encode, m)?)?;
    m.add_function(wrap_pyfunction!(decode, m)?)?;
    m.add_function(wrap_pyfunction!(decode_into, m)?)?;
    m.add_function(wrap_pyfunction!(ideal_bits, m)?)?;
    m.add_function(wrap_pyfunction!(info, m)?)?;
    m.add_function(wrap_pyfunction!(sigma_codes, m)?)?;
    m.add_function(wrap_pyfunction!(relative_sigma_codes, m)?)?;
    m.add_function(wrap_pyfunction!(kernels, m)?)?;
    m.add_function(wrap_pyfunction!(kernel_report, m)?)?;
    m.add_function(wrap_pyfunction!(container_write, m)?)?;
    m.add_function(wrap_pyfunction!(stream_join, m)?)?;
    m.add_function(wrap_pyfunction!(entry_checksum, m)?)?;
    m.add_function(wrap_pyfunction!(stream_cut, m)?)?;
    m.add_function(wrap_pyfunction!(residuals, m)?)?;
    m.add_function(wrap_pyfunction!(container_info, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_sources, m)?)?;
    m.add_function(wrap_pyfunction!(exact_tables, m)?)?;
    m.add_function(wrap_pyfunction!(assemble_predicted, m)?)?;
    m.add_function(wrap_pyfunction!(channel_sums, m)?)?;
    m.add_function(wrap_pyfunction!(map_kernel, m)?)?;
    m.add_function(wrap_pyfunction!(fast_lane_kernel, m)?)?;
    m.add("FAST_LANE_CHUNK_SCALARS", speckv::fast_lane::CHUNK_SCALARS)?;
    m.add_class::<PyLinearMap>()?;
    m.add("SpeckvError", py.get_type::<SpeckvError>())?;
    m.add("CorruptStreamError", py.get_type::<CorruptStreamError>())?;
    m.add("ChecksumError", py.get_type::<ChecksumError>())?;
    m.add("UnsupportedStreamError", py.get_type::<UnsupportedStreamError>())?;
    m.add("PredictionMismatchError", py.get_type::<PredictionMismatchError>())?;
    m.add("FORMAT_VERSION", speckv::format::FORMAT_VERSION)?;
    m.add("FAST_LANE_VERSION", speckv::format::header::FAST_LANE_VERSION)?;
    m.add("BINS_VERSION", speckv::format::header::BINS_VERSION)?;
    m.add("CONTAINER_VERSION", speckv::format::CONTAINER_VERSION)?;
    m.add("DEFAULT_CHUNK_SCALARS", speckv::codec::DEFAULT_CHUNK_SCALARS)?;
    m.add("LINEAR_MAP_MAX_SHIFT", speckv::linear_map::MAX_SHIFT)?;
    let p = ModelParams::default();
    m.add("DEFAULT_WEIGHTS", (p.weight_narrow, p.weight_wide, p.weight_escape))?;
    Ok(())
}
