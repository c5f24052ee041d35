//! Store entries' checksums, streams joined and cut, and cache containers written and read.

use numpy::PyReadonlyArray1;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::{PyBytes, PyDict};

use speckv::format::container::{self, Container, StreamLayers};

use crate::codec::header_dict;
use crate::errors::*;

/// The checksum of a store entry's payload under `key` (`speckv::hash::keyed_checksum`),
/// computed without the GIL.
#[pyfunction]
pub(crate) fn entry_checksum(py: Python<'_>, key: &[u8], payload: PyBackedBytes) -> u64 {
    py.allow_threads(|| speckv::hash::keyed_checksum(key, &payload))
}

/// Streams of consecutive slabs of one tensor joined into the stream of the whole
/// (`speckv::format::splice::join`).
#[pyfunction]
pub(crate) fn stream_join<'py>(py: Python<'py>, streams: Vec<PyBackedBytes>) -> PyResult<Bound<'py, PyBytes>> {
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
pub(crate) fn stream_cut<'py>(
    py: Python<'py>,
    data: PyReadonlyArray1<'py, u8>,
    start: usize,
    stop: usize,
) -> PyResult<Bound<'py, PyBytes>> {
    let stream = data.as_slice().map_err(|_| PyValueError::new_err("data must be contiguous"))?;
    let out = py.allow_threads(|| speckv::format::splice::cut(stream, start..stop)).map_err(to_py)?;
    Ok(PyBytes::new(py, &out))
}

/// Wraps block-major `streams` in a cache container (`speckv::format::container`), laid out
/// as `layout` says: `(per_layer, layers, block_tokens, tokens, layer_tokens)`.
#[pyfunction]
pub(crate) fn container_write<'py>(
    py: Python<'py>,
    layout: (bool, u32, u32, u64, Option<Vec<u64>>),
    metadata: &[u8],
    streams: Vec<PyBackedBytes>,
) -> PyResult<Bound<'py, PyBytes>> {
    let (per_layer, layers, block_tokens, tokens, layer_tokens) = layout;
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
pub(crate) fn container_info<'py>(py: Python<'py>, data: PyReadonlyArray1<'py, u8>) -> PyResult<Bound<'py, PyDict>> {
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
