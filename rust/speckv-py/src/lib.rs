//! Thin PyO3 binding of the speckv core. Every function is: extract the arguments, release the
//! GIL, call the core, map the error. Array conversion (dtypes, broadcasting, torch) lives in
//! the Python package; here arrays arrive as flat, C-contiguous integer arrays.

use pyo3::prelude::*;

mod args;
mod codec;
mod container;
mod errors;
mod kernel_info;
mod maps;
mod params;

use codec::{assemble_predicted, decode, decode_into, decode_many, encode, ideal_bits, info};
use container::{container_info, container_write, entry_checksum, stream_cut, stream_join};
use errors::{ChecksumError, CorruptStreamError, PredictionMismatchError, SpeckvError, UnsupportedStreamError};
use kernel_info::{cuda_sources, fast_lane_kernel, kernel_report, kernels};
use maps::{map_heads, map_kernel, PyLinearMap};
use params::{channel_sums, exact_tables, joint_integer, relative_sigma_codes, residuals, sigma_codes};

#[pymodule]
fn _speckv(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_function(wrap_pyfunction!(encode, m)?)?;
    m.add_function(wrap_pyfunction!(decode, m)?)?;
    m.add_function(wrap_pyfunction!(decode_into, m)?)?;
    m.add_function(wrap_pyfunction!(decode_many, m)?)?;
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
    m.add_function(wrap_pyfunction!(joint_integer, m)?)?;
    m.add_function(wrap_pyfunction!(container_info, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_sources, m)?)?;
    m.add_function(wrap_pyfunction!(exact_tables, m)?)?;
    m.add_function(wrap_pyfunction!(assemble_predicted, m)?)?;
    m.add_function(wrap_pyfunction!(channel_sums, m)?)?;
    m.add_function(wrap_pyfunction!(map_heads, m)?)?;
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
    let p = speckv::model::ModelParams::default();
    m.add("DEFAULT_WEIGHTS", (p.weight_narrow, p.weight_wide, p.weight_escape))?;
    Ok(())
}
