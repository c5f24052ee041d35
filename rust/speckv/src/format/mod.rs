//! Byte layouts: the stream (header, chunk index, checksums) in `header.rs`, the cache
//! container (streams by token block, layer and K/V) in `container.rs`.

pub mod container;
pub mod header;

pub use container::{Container, CONTAINER_MAGIC, CONTAINER_VERSION};
pub use header::{ChunkEntry, Header, FORMAT_VERSION, MAGIC};
