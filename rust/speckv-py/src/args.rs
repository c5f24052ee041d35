//! Arguments as the binding extracts them: word arrays, sigma values or codes, the
//! prediction and the joint model, the encoder's options.

use numpy::{PyArray1, PyArrayMethods, PyReadonlyArray1};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

use speckv::codec::EncodeOptions;
use speckv::model::ladder;
use speckv::model::ModelParams;
use speckv::{Bits, DType, Error, ModelKind, Prediction, SigmaCodes, TokenScale};

use crate::errors::*;

/// A flat read-only integer array of one of the three word widths.
pub(crate) enum Words<'py> {
    U8(PyReadonlyArray1<'py, u8>),
    U16(PyReadonlyArray1<'py, u16>),
    U32(PyReadonlyArray1<'py, u32>),
}

impl<'py> Words<'py> {
    pub(crate) fn extract(obj: &Bound<'py, PyAny>, what: &str) -> PyResult<Self> {
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

    pub(crate) fn bits(&self, what: &str) -> PyResult<Bits<'_>> {
        let not_contiguous = |_| PyValueError::new_err(format!("{what}: array must be C-contiguous"));
        Ok(match self {
            Words::U8(a) => Bits::U8(a.as_slice().map_err(not_contiguous)?),
            Words::U16(a) => Bits::U16(a.as_slice().map_err(not_contiguous)?),
            Words::U32(a) => Bits::U32(a.as_slice().map_err(not_contiguous)?),
        })
    }
}

pub(crate) fn dtype(name: &str) -> PyResult<DType> {
    DType::from_name(name).map_err(|e| PyTypeError::new_err(format!("dtype: {e}")))
}

/// A sigma argument: positive float32 values, or sigma codes already computed (the integer
/// coding parameters; see `speckv::model::ladder::sigma_code`).
pub(crate) enum SigmaValues<'py> {
    Floats(PyReadonlyArray1<'py, f32>),
    Codes(PyReadonlyArray1<'py, i16>),
}

impl<'py> SigmaValues<'py> {
    pub(crate) fn extract(obj: &Bound<'py, PyAny>) -> PyResult<Self> {
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
pub(crate) struct PredictionArgs<'py> {
    mu: PyReadonlyArray1<'py, f32>,
    mu_shape: Vec<usize>,
    sigma: SigmaValues<'py>,
    sigma_shape: Vec<usize>,
}

/// Sigma codes owned by the call (computed from float sigma) or borrowed from the caller.
pub(crate) enum Codes<'a> {
    Owned(Vec<i16>),
    Borrowed(&'a [i16]),
}

impl Codes<'_> {
    pub(crate) fn as_slice(&self) -> &[i16] {
        match self {
            Codes::Owned(v) => v,
            Codes::Borrowed(s) => s,
        }
    }
}

impl<'py> PredictionArgs<'py> {
    pub(crate) fn extract(
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
    pub(crate) fn codes(&self, py: Python<'_>) -> PyResult<Codes<'_>> {
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
    pub(crate) fn prediction<'a>(
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

/// `(residual scales, integer coefficients, units)`: the joint model's integer form
/// (`speckv::joint_integer::IntegerJoint`), flat.
pub(crate) type IntegerArgs<'py> = (PyReadonlyArray1<'py, f32>, PyReadonlyArray1<'py, i16>, PyReadonlyArray1<'py, f32>);

/// `(channels, tokens, outside_channels, outside, coef, offset, integer)`: the joint residual
/// model's arguments (`speckv::joint::Joint`), float32 arrays flat, and its integer form or
/// `None`.
pub(crate) type JointArgs<'py> = (
    usize,
    usize,
    usize,
    PyReadonlyArray1<'py, f32>,
    PyReadonlyArray1<'py, f32>,
    PyReadonlyArray1<'py, f32>,
    Option<IntegerArgs<'py>>,
);

/// The core's joint model over `joint`'s arrays (borrowed); `contiguous` names the arrays
/// in the error when one is not contiguous.
pub(crate) fn joint_of<'a>(joint: &'a JointArgs<'_>, contiguous: &str) -> PyResult<speckv::joint::Joint<'a>> {
    let (channels, tokens, outside_channels, outside, coef, offset, integer) = joint;
    let error = |_| PyValueError::new_err(format!("{contiguous} must be C-contiguous"));
    let integer = match integer {
        Some((scale, coef, unit)) => Some(speckv::joint_integer::IntegerJoint {
            scale: scale.as_slice().map_err(error)?,
            coef: coef.as_slice().map_err(error)?,
            unit: unit.as_slice().map_err(error)?,
        }),
        None => None,
    };
    Ok(speckv::joint::Joint {
        channels: *channels,
        tokens: *tokens,
        outside_channels: *outside_channels,
        outside: outside.as_slice().map_err(error)?,
        coef: coef.as_slice().map_err(error)?,
        offset: offset.as_slice().map_err(error)?,
        integer,
    })
}

/// `prediction` with the joint model of `joint` (borrowing its arrays), if any.
pub(crate) fn with_joint<'a>(
    prediction: Option<Prediction<'a>>,
    joint: &'a Option<JointArgs<'_>>,
) -> PyResult<Option<Prediction<'a>>> {
    let (Some(mut p), Some(joint)) = (prediction.clone(), joint) else {
        if joint.is_some() {
            return Err(SpeckvError::new_err("joint: the joint model needs mu and sigma"));
        }
        return Ok(prediction);
    };
    p.joint = Some(joint_of(joint, "joint: arrays")?);
    Ok(Some(p))
}

/// Runs `f` with the core's prediction for a tensor of `shape`, built from `prediction` (its
/// sigma codes computed here, with the GIL released; the joint model borrowed), or `None`
/// without one. A `mu` of another shape is `mismatch`'s error.
pub(crate) fn with_prediction<R>(
    py: Python<'_>,
    prediction: Option<PredictionIn<'_>>,
    shape: &[u64],
    mismatch: fn(String) -> PyErr,
    f: impl FnOnce(Option<&Prediction<'_>>) -> PyResult<R>,
) -> PyResult<R> {
    let (args, joint) = PredictionIn::parts(prediction)?;
    let codes = args.as_ref().map(|a| a.codes(py)).transpose()?;
    let prediction = match (&args, &codes) {
        (Some(a), Some(c)) => Some(a.prediction(c, shape, mismatch)?),
        _ => None,
    };
    let prediction = with_joint(prediction, &joint)?;
    f(prediction.as_ref())
}

/// A prediction as Python passes it (`speckv._api._prediction`), one tuple: `(mu, mu_shape,
/// sigma, sigma_shape, joint)`, mu flat float32 with its shape, sigma (values or codes) flat
/// with the shape it broadcasts from, and the joint model's arguments or `None`.
#[derive(FromPyObject)]
pub(crate) struct PredictionIn<'py>(
    Option<PyReadonlyArray1<'py, f32>>,
    Option<Vec<usize>>,
    Option<Bound<'py, PyAny>>,
    Option<Vec<usize>>,
    Option<JointArgs<'py>>,
);

impl<'py> PredictionIn<'py> {
    /// The prediction's arguments (checked to go together) and the joint model's, if any.
    pub(crate) fn parts(prediction: Option<Self>) -> PyResult<(Option<PredictionArgs<'py>>, Option<JointArgs<'py>>)> {
        match prediction {
            None => Ok((None, None)),
            Some(PredictionIn(mu, mu_shape, sigma, sigma_shape, joint)) => {
                Ok((PredictionArgs::extract(mu, mu_shape, sigma.as_ref(), sigma_shape)?, joint))
            }
        }
    }
}

/// The coder's options as Python passes them (`speckv._api._options`): a dict with every key.
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub(crate) struct OptionsIn {
    threads: usize,
    chunk_scalars: u32,
    model: String,
    weights: Option<(u16, u16, u16)>,
    token_scale: Option<(u8, u8)>,
    torch_hint: bool,
    fast_lane: bool,
    context_period: Option<u32>,
}

impl OptionsIn {
    /// The core's options, checked.
    pub(crate) fn encode_options(&self) -> PyResult<EncodeOptions> {
        Ok(EncodeOptions {
            torch_hint: self.torch_hint,
            fast_lane: self.fast_lane,
            context_period: self.context_period,
            ..options(self.threads, self.chunk_scalars, &self.model, self.weights, self.token_scale)?
        })
    }
}

pub(crate) fn options(
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
