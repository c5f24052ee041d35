//! speckv: lossless speculative coding of LLM KV caches.
//!
//! A predictor guesses every scalar (`mu`) with a typical error (`sigma`); the range coder
//! spends about `-log2 q(x)` bits on the true value under a Gaussian mixture around the guess.
//! This crate is the pure-Rust core: coder, tables, adaptive models, container, threading. It
//! has no Python and no GPU code; `speckv-py` is a thin binding over [`codec`].
//!
//! Where to find things: the coder and its invariants in [`coder`], the tables and adaptive
//! models in [`model`], the byte layout in [`format::header`], per-chunk coding in [`chunk`],
//! static-table coding in [`fast_lane`] (predictor-free) and [`bins`] (predicted),
//! the joint residual model in [`joint`] (its integer form in [`joint_integer`]) and its
//! per-token sigma in [`token_scale`],
//! threading in [`parallel`].

// Streams and fingerprints are defined little-endian, and the fingerprint hashes numbers in
// memory order; a big-endian port must byte-swap there first.
#[cfg(not(target_endian = "little"))]
compile_error!("speckv supports little-endian targets only");

pub mod bins;
pub mod chunk;
pub mod codec;
pub mod coder;
pub mod dtype;
pub mod error;
mod exact;
pub mod fast_lane;
pub mod format;
pub mod hash;
pub mod joint;
pub mod joint_integer;
pub mod linear_map;
pub mod model;
pub mod parallel;
pub mod prediction;
pub mod stats;
#[cfg(test)]
mod test_env;
pub mod token_scale;
pub mod words;

pub use chunk::ModelKind;
pub use codec::{
    assemble_predicted, decode_chunks_into, decode_into, decode_parsed, decoded_len, encode, ideal_bits, info,
    EncodeOptions,
};
pub use dtype::DType;
pub use error::{Error, Result};
pub use exact::kernels;
pub use exact::tables::{exact_tables, ExactTables};
pub use prediction::{Prediction, SigmaCodes};
pub use token_scale::TokenScale;
pub use words::{Bits, BitsMut, Word};

/// The kernel each part of the core runs in this process, by part: the exact model's coder,
/// the bins model's decoder, the fast lane's decoder, the joint sums (float32 and integer
/// forms) and the maps' integer sums. Every kernel of a part computes the same bits;
/// benchmarks print these beside their figures, since speeds differ by kernel and CPU.
pub fn kernel_report() -> [(&'static str, &'static str); 6] {
    [
        ("exact", exact::kernels()),
        ("bins", bins::kernel()),
        ("fast_lane", fast_lane::kernel()),
        ("joint", joint::kernel()),
        ("joint_integer", joint_integer::kernel()),
        ("maps", linear_map::kernel_name()),
    ]
}
