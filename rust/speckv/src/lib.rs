//! speckv: lossless speculative coding of LLM KV caches.
//!
//! A predictor guesses every scalar (`mu`) with a typical error (`sigma`); the range coder
//! spends about `-log2 q(x)` bits on the true value under a Gaussian mixture around the guess.
//! This crate is the pure-Rust core: coder, tables, adaptive models, container, threading.

pub mod coder;
pub mod dtype;
pub mod error;
pub mod format;
pub mod model;

pub use dtype::DType;
pub use error::{Error, Result};
