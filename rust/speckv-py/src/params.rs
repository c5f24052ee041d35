//! Coding parameters computed in the core: sigma codes (absolute and relative), the joint
//! model's residuals, the exact model's tables and the calibration's exact channel sums.

use numpy::{PyArray1, PyReadonlyArray1};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use speckv::model::ladder;
use speckv::model::ModelParams;
use speckv::{Bits, Error};

use crate::args::*;
use crate::errors::*;

/// `round(8 log2 sigma)` of each float32 sigma, as int16; raises naming `sigma`.
#[pyfunction]
pub(crate) fn sigma_codes<'py>(
    py: Python<'py>,
    sigma: PyReadonlyArray1<'py, f32>,
) -> PyResult<Bound<'py, PyArray1<i16>>> {
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
pub(crate) fn relative_sigma_codes<'py>(
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

/// The integer form's `(residual scales, integer coefficients, units)` as numpy arrays.
type IntegerArrays<'py> = (Bound<'py, PyArray1<f32>>, Bound<'py, PyArray1<i16>>, Bound<'py, PyArray1<f32>>);

/// The joint model's integer form (`speckv::joint_integer::build`): `coef` (`layers x
/// channels x (outside + channels)`) and each source channel's sigma (`layers x (outside +
/// channels)`) into `(residual scales, integer coefficients, units)`.
#[pyfunction]
pub(crate) fn joint_integer<'py>(
    py: Python<'py>,
    channels: usize,
    outside: usize,
    coef: PyReadonlyArray1<'py, f32>,
    sigma: PyReadonlyArray1<'py, f32>,
) -> PyResult<IntegerArrays<'py>> {
    let error = |_| PyValueError::new_err("coef and sigma must be C-contiguous");
    let (coef, sigma) = (coef.as_slice().map_err(error)?, sigma.as_slice().map_err(error)?);
    let (scale, a, unit) =
        py.allow_threads(|| speckv::joint_integer::build(channels, outside, coef, sigma)).map_err(to_py)?;
    Ok((PyArray1::from_vec(py, scale), PyArray1::from_vec(py, a), PyArray1::from_vec(py, unit)))
}

/// `value(x) - mu` per scalar in float32, 0 where not finite: the residuals the joint model
/// conditions on (`speckv::joint::residuals`), computed here so that encoder and decoder use
/// the same ones.
#[pyfunction]
pub(crate) fn residuals<'py>(
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
pub(crate) fn exact_tables<'py>(py: Python<'py>, dtype_name: &str) -> PyResult<Bound<'py, PyDict>> {
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

/// Exact per-channel calibration sums of a `[..., heads, tokens, dim]` cache (flat float32
/// arrays `t`, `p`, `p8`, `q`; `block`: `(heads, tokens, dim)`; `speckv::stats`):
/// `[3 statistics][heads * dim][3 limbs]` of 192-bit fixed-point integers, flat.
#[pyfunction]
pub(crate) fn channel_sums<'py>(
    py: Python<'py>,
    t: PyReadonlyArray1<'py, f32>,
    p: PyReadonlyArray1<'py, f32>,
    p8: PyReadonlyArray1<'py, f32>,
    q: PyReadonlyArray1<'py, f32>,
    scale: f64,
    block: (usize, usize, usize),
) -> PyResult<Bound<'py, PyArray1<u64>>> {
    let (heads, tokens, dim) = block;
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
