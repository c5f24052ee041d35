//! The container: header, chunk index, checksums. See `header.rs` for the byte layout.

pub mod header;

pub use header::{ChunkEntry, Header, FORMAT_VERSION, MAGIC};
