//! The exact model's tables as plain arrays, for coders outside this crate: the CUDA module
//! (`cuda/speckv_coder.cuh`) codes chunks on the GPU from exactly these numbers, so nothing is
//! rebuilt there with another libm, and its bytes equal `codec::encode`'s.

use crate::dtype::DType;
use crate::error::{invalid, Result};
use crate::model::grid::ValueGrid;
use crate::model::ladder::{SigmaTable, SIGMA_CODE_MAX, SIGMA_CODE_MIN};
use crate::model::mixture::MixtureCdf;
use crate::model::ModelParams;

/// Everything the exact model reads while coding, for one 8- or 16-bit format and one set of
/// model parameters (field by field what `cuda/speckv_coder.cuh`'s `ExactTables` holds).
#[derive(Debug, Clone)]
pub struct ExactTables {
    /// `MixtureCdf` grid nodes, with the repeated last one.
    pub nodes: Vec<u32>,
    /// `ValueGrid` lower edges from the smallest finite ordinal up, then the top edge.
    pub edges: Vec<f32>,
    /// `(sigma, 1 / sigma)` of every sigma code `SIGMA_CODE_MIN..=SIGMA_CODE_MAX`, flattened.
    pub sigmas: Vec<f64>,
    /// Every pattern's value as float32, NaN where not finite (the joint model's values).
    pub values: Vec<f32>,
    pub half_width: f64,
    pub g_max: u32,
    pub precision: u32,
    pub min_ordinal: i64,
    pub max_ordinal: i64,
    pub exponent_bias: i64,
    pub width: u32,
    pub mantissa_bits: u32,
    pub max_magnitude: u32,
    /// The stream's table digest (what a header written with these tables records).
    pub digest: u64,
}

/// The exact model's tables for `dtype` (8 or 16 bits) and `params`.
pub fn exact_tables(dtype: DType, params: &ModelParams) -> Result<ExactTables> {
    if dtype.bits() > 16 {
        return invalid(format!("{dtype:?}: the exact model codes 8- and 16-bit formats"));
    }
    params.validate().map_err(|m| crate::error::Error::InvalidArgument(format!("model parameters: {m}")))?;
    let cdf = MixtureCdf::shared(params);
    let grid = ValueGrid::shared(dtype);
    let table = SigmaTable::shared();
    let sigmas = (SIGMA_CODE_MIN..=SIGMA_CODE_MAX)
        .flat_map(|c| {
            let (s, inv) = table.get(c as i16);
            [s, inv]
        })
        .collect();
    let (mantissa_bits, exponent_bias, max_magnitude) = grid.layout();
    Ok(ExactTables {
        nodes: cdf.nodes().to_vec(),
        edges: grid.edges().to_vec(),
        sigmas,
        values: crate::joint::values(dtype).map(<[f32]>::to_vec).unwrap_or_default(),
        half_width: cdf.half_width,
        g_max: cdf.g_max,
        precision: cdf.precision,
        min_ordinal: grid.min_ordinal,
        max_ordinal: grid.max_ordinal,
        exponent_bias,
        width: dtype.bits(),
        mantissa_bits,
        max_magnitude,
        digest: cdf.digest(),
    })
}
