//! The calibrated integer linear maps (`speckv::linear_map`) and the kernel computing them.

use numpy::{PyArray1, PyReadonlyArray1};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::errors::*;

/// A calibrated integer linear map (`speckv::linear_map`): the layer-wise predictor's maps,
/// the same bits on every machine, SIMD width and thread count.
#[pyclass(name = "LinearMap", module = "speckv._speckv", frozen)]
pub(crate) struct PyLinearMap {
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

    /// `y` (`batch * rows x outputs`, flat float32) for the features gathered from `sources`
    /// (the core's `linear_map::sources`, invariant R1): each `(data, heads, tokens, dim, cos,
    /// sin)`, `data` `batch x heads x tokens x dim` and the rotation to undo `tokens x dim`
    /// (or None), all flat float32.
    #[pyo3(signature = (sources, batch, rows, threads=1))]
    fn apply_sources<'py>(
        &self,
        py: Python<'py>,
        sources: Vec<SourceArgs<'py>>,
        batch: usize,
        rows: usize,
        threads: usize,
    ) -> PyResult<Bound<'py, PyArray1<f32>>> {
        let contiguous = || PyValueError::new_err("linear map: source arrays must be contiguous");
        let mut parts = Vec::with_capacity(sources.len());
        for (data, heads, tokens, dim, cos, sin) in &sources {
            let rope = match (cos, sin) {
                (Some(c), Some(s)) => {
                    Some((c.as_slice().map_err(|_| contiguous())?, s.as_slice().map_err(|_| contiguous())?))
                }
                (None, None) => None,
                _ => return Err(PyValueError::new_err("linear map: a source's cos and sin come together")),
            };
            let data = data.as_slice().map_err(|_| contiguous())?;
            parts.push(speckv::linear_map::Source { data, heads: *heads, tokens: *tokens, dim: *dim, rope });
        }
        let Some(total) = batch.checked_mul(rows).and_then(|r| r.checked_mul(self.inner.outputs())) else {
            return Err(SpeckvError::new_err(format!("linear map: {batch} x {rows} rows are too many")));
        };
        let mut y = Vec::new();
        py.allow_threads(|| {
            // the output is allocated only once every source has shown its `batch` entries
            speckv::linear_map::check_sources(&parts, batch, self.inner.features())?;
            y = vec![0f32; total];
            self.inner.apply_sources(&parts, batch, rows, &mut y, threads)
        })
        .map_err(to_py)?;
        Ok(PyArray1::from_vec(py, y))
    }
}

/// One `apply_sources` source as Python gives it.
type SourceArgs<'py> = (
    PyReadonlyArray1<'py, f32>,
    usize,
    usize,
    usize,
    Option<PyReadonlyArray1<'py, f32>>,
    Option<PyReadonlyArray1<'py, f32>>,
);

/// Columns `col..col + heads * dim` of a map's outputs `y` (`batch x rows` rows of `stride`,
/// flat float32) as a cache layer of `shape` (`batch, heads, rows, dim`), flat float32, with
/// the rotation `rope` (`cos, sin`, each `rows x dim`) applied (the core's
/// `linear_map::heads`, invariant R2).
#[pyfunction]
#[pyo3(signature = (y, stride, col, shape, rope=None))]
pub(crate) fn map_heads<'py>(
    py: Python<'py>,
    y: PyReadonlyArray1<'py, f32>,
    stride: usize,
    col: usize,
    shape: (usize, usize, usize, usize),
    rope: Option<(PyReadonlyArray1<'py, f32>, PyReadonlyArray1<'py, f32>)>,
) -> PyResult<Bound<'py, PyArray1<f32>>> {
    let contiguous = || PyValueError::new_err("map heads: arrays must be contiguous");
    let tables = match &rope {
        Some((c, s)) => Some((c.as_slice().map_err(|_| contiguous())?, s.as_slice().map_err(|_| contiguous())?)),
        None => None,
    };
    let y = y.as_slice().map_err(|_| contiguous())?;
    let (batch, heads, rows, dim) = shape;
    let layer = speckv::linear_map::Heads { stride, col, batch, rows, heads, dim, rope: tables };
    // sized once the layout has been checked against `y` (the layer fits in it), and made
    // without the GIL like the rest: the other walk's thread may want it meanwhile
    layer.check(y).map_err(to_py)?;
    let out = py.allow_threads(|| {
        let mut out = vec![0f32; layer.floats()];
        layer.write(y, &mut out);
        out
    });
    Ok(PyArray1::from_vec(py, out))
}

/// Which kernel computes the linear maps here: "amx-int8", "avx512-vnni", "avx512", "avx2" or "portable"
/// (the same sums either way).
#[pyfunction]
pub(crate) fn map_kernel() -> &'static str {
    speckv::linear_map::kernel_name()
}
