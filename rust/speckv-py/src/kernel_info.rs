//! What runs where: the kernels each part of the core runs here, and the CUDA module's
//! sources compiled into the extension.

use pyo3::prelude::*;

/// Which kernels code the exact model here: "avx2" or "portable" (same bytes either way).
#[pyfunction]
pub(crate) fn kernels() -> &'static str {
    speckv::kernels()
}

/// The kernel each part of the core runs here (`speckv::kernel_report`), as (part, kernel).
#[pyfunction]
pub(crate) fn kernel_report() -> Vec<(&'static str, &'static str)> {
    speckv::kernel_report().to_vec()
}

/// Which kernel decodes the fast lane here: "avx512" or "portable" (same output).
#[pyfunction]
pub(crate) fn fast_lane_kernel() -> &'static str {
    speckv::fast_lane::kernel()
}

/// The CUDA module's sources (`cuda/`), compiled into the extension so that a wheel carries
/// exactly the source its tests checked: `speckv.cuda` compiles them just in time on a GPU
/// machine. `(file name, text)` pairs.
#[pyfunction]
pub(crate) fn cuda_sources() -> Vec<(&'static str, &'static str)> {
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
