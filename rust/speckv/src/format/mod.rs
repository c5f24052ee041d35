//! Byte layouts: the stream (header, chunk index, checksums) in `header.rs`, the cache
//! container (streams by token block, layer and K/V) in `container.rs`; streams cut and joined
//! along their first dimension in `splice.rs`.

pub mod container;
pub mod header;
pub mod splice;

pub use container::{Container, CONTAINER_MAGIC, CONTAINER_VERSION};
pub use header::{ChunkEntry, Header, FORMAT_VERSION, MAGIC};
