//! The container: header, chunk index, checksums. See `header.rs` for the byte layout.

pub mod checksum;
