//! The cache container ("SPKC" version 2): one model's KV cache as speckv streams, addressable
//! by token block, by layer and by K/V, checksummed, readable without the model or torch.
//! All integers little-endian.
//!
//! ```text
//! offset  size         field
//! 0       4            magic "SPKC"
//! 4       2            container version (2)
//! 6       2            flags (FLAG_PER_LAYER; others 0)
//! 8       4            layers L (1..=MAX_LAYERS)
//! 12      4            tokens per block B (>= 1)
//! 16      8            tokens T (1..=MAX_TOKENS)
//! 24      4            metadata length M (<= MAX_METADATA)
//! 28      4            reserved, 0
//! 32      8 * L        layer tokens (only with FLAG_LAYER_TOKENS): per layer, u64 n_l <= T,
//!                      the layer holds the LAST n_l of the T tokens (a sliding-window layer
//!                      keeps its window; 0: a layer with no cache of its own)
//! ..      16 * N * S   stream index: for each block in token order, for each of its S
//!                      streams: offset u64 (from the container's first byte), length u64
//! ..      M            metadata, opaque here (`speckv.hf` writes UTF-8 JSON: storage mode,
//!                      model, calibration and predictor identities, prompt digest)
//! ..      8            header checksum: XXH3-64 of every byte above
//! ..                   the streams (see `format::header`), back to back in index order, to
//!                      the end
//! ```
//!
//! N = ceil(T / B) blocks; block `i` holds tokens `i*B .. min((i+1)*B, T)`. A block's S streams:
//! - stacked layout (no flag, S = 2): the block's keys, then its values, each one stream of
//!   shape `[L, batch, heads, tokens of the block, head dim]` whose chunks never straddle a
//!   layer boundary unless they hold whole layers, so any layer is a run of whole chunks
//!   ([`StreamLayers::chunks_of`]);
//! - per-layer layout (`FLAG_PER_LAYER`, S = 2L), for layers of different shapes: layer 0 K,
//!   layer 0 V, layer 1 K, ..., each of shape `[batch, heads, tokens of the block, head dim]`.
//!   With `FLAG_LAYER_TOKENS` (per-layer layout only) layer `l`'s streams in block `i` hold
//!   the tokens of `i*B .. min((i+1)*B, T)` that the layer holds (`T - n_l .. T`,
//!   [`Container::layer_block_range`]); where none are, the index entry is empty (length 0,
//!   no stream).
//!
//! A stream coded with the joint residual model (`FLAG_JOINT` in its own header, see
//! `crate::joint`) stores its layers channel-major: tokens are its last axis
//! (`[L, batch, heads, head dim, tokens of the block]`), and its chunks hold whole layers.
//!
//! So a block, a layer of a block, or K or V alone can be read and decoded without touching
//! the rest; each stream carries its own chunk checksums and prediction fingerprints.
//!
//! Version 1 (one block, a BLAKE2b-checksummed JSON header written by the Python codec of
//! 2026-11) is still read by `speckv.hf`; this parser answers it with `Error::Unsupported`.

use std::ops::Range;

use crate::error::{corrupt, invalid, Error, Result};
use crate::format::header::{Header, Reader, FLAG_JOINT};
use crate::hash::checksum;

pub const CONTAINER_MAGIC: [u8; 4] = *b"SPKC";
pub const CONTAINER_VERSION: u16 = 2;
/// One stream per layer and K/V in each block (layers of different shapes); otherwise stacked.
pub const FLAG_PER_LAYER: u16 = 1 << 0;
/// A table of per-layer token counts follows the fixed fields: layers hold the last `n_l`
/// tokens (sliding windows), and a block's stream of a layer holds only those of its tokens.
pub const FLAG_LAYER_TOKENS: u16 = 1 << 1;
const KNOWN_FLAGS: u16 = FLAG_PER_LAYER | FLAG_LAYER_TOKENS;

/// Most layers a container may claim (refused before anything is sized by it).
pub const MAX_LAYERS: u32 = 1 << 12;
/// Most tokens a container may claim.
pub const MAX_TOKENS: u64 = 1 << 32;
/// Largest metadata block (1 MiB: a JSON description, not data).
pub const MAX_METADATA: u32 = 1 << 20;

const FIXED_LEN: usize = 32;
const INDEX_ENTRY_LEN: usize = 16;
const CHECKSUM_LEN: usize = 8;

/// How a stacked stream's chunks line up with its layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamLayers {
    /// Every chunk holds this many whole layers (the last chunk may hold fewer).
    LayersPerChunk(u64),
    /// Every layer is this many whole chunks.
    ChunksPerLayer(u64),
}

impl StreamLayers {
    /// Chunks that hold layer `layer`, and where the layer starts in the first of them (in
    /// layers).
    pub fn chunks_of(&self, layer: u64) -> (Range<u64>, u64) {
        match *self {
            StreamLayers::LayersPerChunk(n) => (layer / n..layer / n + 1, layer % n),
            StreamLayers::ChunksPerLayer(n) => (layer * n..(layer + 1) * n, 0),
        }
    }
}

/// One stream of the container: where it lies and its parsed (validated) header.
#[derive(Debug, Clone)]
pub struct StreamEntry {
    pub range: Range<usize>,
    pub header: Header,
    /// Stacked layout only.
    pub layers: Option<StreamLayers>,
}

/// A parsed, validated container (the streams' payloads are checked when decoded).
#[derive(Debug, Clone)]
pub struct Container {
    pub version: u16,
    pub flags: u16,
    pub layers: u32,
    pub block_tokens: u32,
    pub tokens: u64,
    pub metadata: Range<usize>,
    /// Tokens each layer holds (the last ones of `tokens`): `tokens` for every layer unless
    /// `FLAG_LAYER_TOKENS` says otherwise.
    pub layer_tokens: Vec<u64>,
    /// `blocks() * streams_per_block()` entries, block-major; `None` where a layer holds no
    /// token of the block (`FLAG_LAYER_TOKENS` only).
    pub streams: Vec<Option<StreamEntry>>,
}

fn block_count(tokens: u64, block_tokens: u32) -> u64 {
    tokens.div_ceil(block_tokens as u64)
}

impl Container {
    pub fn per_layer(&self) -> bool {
        self.flags & FLAG_PER_LAYER != 0
    }

    pub fn blocks(&self) -> usize {
        block_count(self.tokens, self.block_tokens) as usize
    }

    pub fn streams_per_block(&self) -> usize {
        streams_per_block(self.flags, self.layers)
    }

    /// Tokens of block `b`.
    pub fn block_range(&self, b: usize) -> Range<u64> {
        let start = b as u64 * self.block_tokens as u64;
        start..(start + self.block_tokens as u64).min(self.tokens)
    }

    /// Positions (of the `tokens`) of block `b` that `layer` holds: the block's tokens from
    /// `tokens - layer_tokens[layer]` on; empty where the layer holds none of them.
    pub fn layer_block_range(&self, b: usize, layer: usize) -> Range<u64> {
        let block = self.block_range(b);
        let first = self.tokens - self.layer_tokens[layer];
        block.start.max(first).min(block.end)..block.end
    }

    /// Stream `s` of block `b` (`s`: 0 K / 1 V stacked; `2 * layer + kv` per layer); `None`
    /// where the layer holds no token of the block.
    pub fn stream(&self, b: usize, s: usize) -> Option<&StreamEntry> {
        self.streams[b * self.streams_per_block() + s].as_ref()
    }

    /// Parses and validates the container header, its index and every stream's header
    /// against the layout; sizes nothing from a count before checking that the bytes to back
    /// it are there.
    pub fn parse(bytes: &[u8]) -> Result<Container> {
        if bytes.len() < 4 || bytes[..4] != CONTAINER_MAGIC {
            return Err(Error::Unsupported("not a speckv cache container (bad magic)".into()));
        }
        let mut r = Reader { bytes, pos: 4 };
        let version = r.u16()?;
        if version != CONTAINER_VERSION {
            return Err(Error::Unsupported(format!(
                "cache container version {version}: the core reads version {CONTAINER_VERSION} \
                 (speckv.hf still reads version 1)"
            )));
        }
        let flags = r.u16()?;
        if flags & !KNOWN_FLAGS != 0 {
            return Err(Error::Unsupported(format!("unknown container flags {flags:#06x}")));
        }
        if flags & FLAG_LAYER_TOKENS != 0 && flags & FLAG_PER_LAYER == 0 {
            return corrupt("per-layer token counts in a stacked container");
        }
        let layers = r.u32()?;
        let block_tokens = r.u32()?;
        let tokens = r.u64()?;
        let metadata_len = r.u32()?;
        let reserved = r.u32()?;
        if layers == 0 || layers > MAX_LAYERS {
            return corrupt(format!("{layers} layers (1..={MAX_LAYERS})"));
        }
        if block_tokens == 0 || tokens == 0 || tokens > MAX_TOKENS {
            return corrupt(format!("{tokens} tokens in blocks of {block_tokens}"));
        }
        if metadata_len > MAX_METADATA {
            return corrupt(format!("{metadata_len} bytes of metadata (at most {MAX_METADATA})"));
        }
        let layer_tokens = if flags & FLAG_LAYER_TOKENS != 0 {
            // the table must be in the bytes before room is made for it
            if 8 * layers as usize > bytes.len() - r.pos {
                return corrupt("truncated: the container's layer tokens run past the end");
            }
            let mut counts = Vec::with_capacity(layers as usize);
            for _ in 0..layers {
                let n = r.u64()?;
                if n > tokens {
                    return corrupt(format!("a layer of {n} tokens in a container of {tokens}"));
                }
                counts.push(n);
            }
            counts
        } else {
            vec![tokens; layers as usize]
        };
        let n_streams = block_count(tokens, block_tokens) * streams_per_block(flags, layers) as u64;
        // The index must fit in the bytes present before room is made for it.
        if n_streams.saturating_mul(INDEX_ENTRY_LEN as u64) > (bytes.len() - r.pos) as u64 {
            return corrupt("truncated: the container's stream index runs past the end");
        }
        let mut spans = Vec::with_capacity(n_streams as usize);
        for _ in 0..n_streams {
            spans.push((r.u64()?, r.u64()?));
        }
        let metadata_start = r.pos;
        r.take(metadata_len as usize)?;
        let metadata = metadata_start..r.pos;
        r.checksum("cache container header")?;
        // checked after the checksum: a flipped bit there is damage, said as such
        if reserved != 0 {
            return corrupt("reserved container bytes are not zero");
        }
        let mut expected = r.pos as u64;
        let mut container = Container {
            version,
            flags,
            layers,
            block_tokens,
            tokens,
            metadata,
            layer_tokens,
            streams: Vec::with_capacity(spans.len()),
        };
        let per_block = container.streams_per_block();
        for (i, &(offset, length)) in spans.iter().enumerate() {
            let (b, s) = (i / per_block, i % per_block);
            let block =
                if container.per_layer() { container.layer_block_range(b, s / 2) } else { container.block_range(b) };
            if block.is_empty() {
                // the layer holds none of the block's tokens: an empty entry, where it should be
                if offset != expected || length != 0 {
                    return corrupt(format!(
                        "stream {i}: the layer holds no token of its block, but has {length} bytes"
                    ));
                }
                container.streams.push(None);
                continue;
            }
            let end = offset.checked_add(length).filter(|&e| e <= bytes.len() as u64);
            let end = match end {
                Some(end) if offset == expected => end,
                _ => {
                    return corrupt(format!("stream {i} is not where the index says (offset {offset}, {length} bytes)"))
                }
            };
            expected = end;
            let range = offset as usize..end as usize;
            let header = Header::parse(&bytes[range.clone()]).map_err(|e| in_stream(i, e))?;
            let layers = check_stream(&header, block.end - block.start, &container)
                .map_err(|m| Error::Corrupt(format!("stream {i}: {m}")))?;
            container.streams.push(Some(StreamEntry { range, header, layers }));
        }
        if expected != bytes.len() as u64 {
            return corrupt(format!("streams end at byte {expected} but the container has {} bytes", bytes.len()));
        }
        Ok(container)
    }
}

fn streams_per_block(flags: u16, layers: u32) -> usize {
    if flags & FLAG_PER_LAYER != 0 {
        2 * layers as usize
    } else {
        2
    }
}

/// A stream's own error, said to be in the container's stream `i` (same kind).
fn in_stream(i: usize, e: Error) -> Error {
    match e {
        Error::Unsupported(m) => Error::Unsupported(format!("stream {i}: {m}")),
        Error::Checksum(m) => Error::Checksum(format!("stream {i}: {m}")),
        other => Error::Corrupt(format!("stream {i}: {other}")),
    }
}

/// Whether a stream's shape fits the container's layout: `[L, batch, heads, block tokens,
/// dim]` stacked (chunks aligned with layers), `[batch, heads, block tokens, dim]` per layer.
fn check_stream(h: &Header, block_tokens: u64, c: &Container) -> std::result::Result<Option<StreamLayers>, String> {
    let (ndim, mut token_axis) = if c.per_layer() { (4, 2) } else { (5, 3) };
    if h.flags & FLAG_JOINT != 0 {
        token_axis = ndim - 1; // channel-major: [.., heads, dim, tokens]
    }
    if h.shape.len() != ndim || h.shape[token_axis] != block_tokens || h.n_scalars == 0 {
        return Err(format!("shape {:?} is not a {ndim}-d block of {block_tokens} tokens", h.shape));
    }
    if c.per_layer() {
        return Ok(None);
    }
    if h.shape[0] != c.layers as u64 {
        return Err(format!("shape {:?} does not hold the container's {} layers", h.shape, c.layers));
    }
    let layer = h.n_scalars / c.layers as u64;
    let chunk = h.chunk_scalars as u64;
    if chunk >= layer && chunk.is_multiple_of(layer) {
        Ok(Some(StreamLayers::LayersPerChunk(chunk / layer)))
    } else if chunk < layer && layer.is_multiple_of(chunk) {
        Ok(Some(StreamLayers::ChunksPerLayer(layer / chunk)))
    } else {
        Err(format!("chunks of {chunk} scalars straddle layers of {layer}"))
    }
}

/// Writes a container around `streams` (block-major, `streams_per_block` each, see the
/// layout above; an empty slice where a layer holds none of a block's tokens) and validates
/// the result as a reader would. `layer_tokens`: per layer, how many of the last tokens it
/// holds (per-layer layout only; `None`: every layer holds every token).
pub fn write(
    per_layer: bool,
    layers: u32,
    block_tokens: u32,
    tokens: u64,
    layer_tokens: Option<&[u64]>,
    metadata: &[u8],
    streams: &[&[u8]],
) -> Result<Vec<u8>> {
    let mut flags = if per_layer { FLAG_PER_LAYER } else { 0 };
    if layers == 0 || layers > MAX_LAYERS || block_tokens == 0 || tokens == 0 || tokens > MAX_TOKENS {
        return invalid(format!("container of {layers} layers, {tokens} tokens in blocks of {block_tokens}"));
    }
    if let Some(counts) = layer_tokens {
        if !per_layer {
            return invalid("layer_tokens: only the per-layer layout holds layers of different token counts");
        }
        if counts.len() != layers as usize || counts.iter().any(|&n| n > tokens) {
            return invalid(format!("layer_tokens: {counts:?} for {layers} layers of at most {tokens} tokens"));
        }
        flags |= FLAG_LAYER_TOKENS;
    }
    if metadata.len() > MAX_METADATA as usize {
        return invalid(format!("metadata: {} bytes (at most {MAX_METADATA})", metadata.len()));
    }
    let expected = block_count(tokens, block_tokens) as usize * streams_per_block(flags, layers);
    if streams.len() != expected {
        return invalid(format!("{} streams given, the layout has {expected}", streams.len()));
    }
    let table = layer_tokens.map_or(0, |c| 8 * c.len());
    let head = FIXED_LEN + table + INDEX_ENTRY_LEN * streams.len() + metadata.len() + CHECKSUM_LEN;
    let total = head + streams.iter().map(|s| s.len()).sum::<usize>();
    let mut out = Vec::with_capacity(total);
    out.extend_from_slice(&CONTAINER_MAGIC);
    out.extend_from_slice(&CONTAINER_VERSION.to_le_bytes());
    out.extend_from_slice(&flags.to_le_bytes());
    out.extend_from_slice(&layers.to_le_bytes());
    out.extend_from_slice(&block_tokens.to_le_bytes());
    out.extend_from_slice(&tokens.to_le_bytes());
    out.extend_from_slice(&(metadata.len() as u32).to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    for n in layer_tokens.unwrap_or(&[]) {
        out.extend_from_slice(&n.to_le_bytes());
    }
    let mut offset = head as u64;
    for s in streams {
        out.extend_from_slice(&offset.to_le_bytes());
        out.extend_from_slice(&(s.len() as u64).to_le_bytes());
        offset += s.len() as u64;
    }
    out.extend_from_slice(metadata);
    let sum = checksum(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    for s in streams {
        out.extend_from_slice(s);
    }
    Container::parse(&out).map_err(|e| match e {
        Error::Corrupt(m) | Error::Unsupported(m) => Error::InvalidArgument(format!("streams: {m}")),
        other => other,
    })?;
    Ok(out)
}
