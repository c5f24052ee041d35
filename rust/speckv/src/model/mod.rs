//! The probability model: how a prediction becomes integer coding parameters, the bank of
//! fixed-point tables those parameters select, and the adaptive models for everything the
//! tables do not cover (escapes and the predictor-free mode).

pub mod adaptive;
pub mod grid;
pub mod ladder;
pub mod mixture;
pub mod params;
pub mod raw;
pub mod tables;

pub use adaptive::AdaptiveModel;
pub use params::ModelParams;
pub use raw::RawPatternModel;
pub use tables::{Table, TableBank};
