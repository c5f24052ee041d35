//! Stream header and chunk index, format version 2. All integers little-endian.
//!
//! ```text
//! offset  size        field
//! 0       4           magic "SPKV"
//! 4       2           format version (2; with FLAG_FAST_LANE 3, or 4 with FLAG_PREDICTED;
//!                     versions 1 and predicted 3 are read too)
//! 6       2           flags (FLAG_PREDICTED, FLAG_TORCH_HINT, FLAG_FAST_MODEL, FLAG_JOINT,
//!                     FLAG_TOKEN_SCALE, FLAG_FAST_LANE, FLAG_JOINT_INT; others 0)
//! 8       1           dtype code (DType discriminant)
//! 9       1           ndim (0..=8)
//! 10      1           coder lanes per chunk (8; with FLAG_FAST_LANE, rANS states: 32, or
//!                     16 in version 4)
//! 11      1           reserved, 0
//! 12      4           scalars per chunk (the last chunk may hold fewer)
//! 16      8           number of scalars (= product of the shape)
//! 24      8 * ndim    shape
//! +0      16          model parameters (MODEL_PARAMS_LEN, see write_params)
//! +16     2           predictor-free contexts
//! +18     1           token scale prior (FLAG_TOKEN_SCALE; else 0)
//! +19     1           token scale clamp (FLAG_TOKEN_SCALE; else 0)
//! +20     4           context period (scalars per channel cycle, the last dimension)
//! +24     8           table-bank digest (0 when not predicted)
//! +32     8           prediction fingerprint: XXH3 over the chunks' fingerprints (0 if none)
//! +40     4           number of chunks
//! +44     4           reserved, 0
//! +48     32 * chunks chunk index: offset u64 (from stream start), length u32, reserved u32,
//!                     checksum u64 (XXH3 of the chunk's bytes), prediction fingerprint u64
//! ..      8           header checksum: XXH3 of every byte above
//! ..                  chunk payloads, back to back, in index order, to the end of the stream
//! ```
//!
//! A chunk's payload holds its lanes' coded words (little-endian u32 each; a lane's last
//! word may be cut to its 1-3 high bytes, see `coder` invariant 5):
//!
//! ```text
//! [len_0 .. len_{N-2}: LEB128, in bytes][lane 0] ... [lane N-1: the rest]
//! ```
//!
//! Version 3 streams (`FLAG_FAST_LANE`, 8/16-bit only) hold chunks laid out as in `fast_lane`
//! (predictor-free; their model parameters are the defaults, their predictor-free contexts 1)
//! or, with `FLAG_PREDICTED`, as in `bins` (the bins model; `FLAG_JOINT` and
//! `FLAG_TOKEN_SCALE` as in version 2). Version 4 streams are the bins model's second revision
//! (`bins::V4`: its rounding shift, finer classes, 16 states); this build writes predicted
//! fast-lane streams as version 4 only, and reads both.
//! Every other stream is still written as version 2, byte for byte as before.
//!
//! Version 1 differs in bytes 10-11 (both 0), in coding each chunk with two lanes
//! (`chunk::LANES_V1`), and in the payload's lane length (`[lane 0 length in bytes: u32 LE]`);
//! its models are the same, so this build decodes it as it was written.

use crate::chunk::{ModelKind, LANES, LANES_V1};
use crate::dtype::DType;
use crate::error::{corrupt, Error, Result};
use crate::fast_lane;
use crate::hash::{checksum, matches};
use crate::model::ModelParams;
use crate::prediction::MAX_NDIM;
use crate::token_scale::TokenScale;

pub const MAGIC: [u8; 4] = *b"SPKV";
/// The version of every stream this build writes without `FLAG_FAST_LANE`.
pub const FORMAT_VERSION: u16 = 2;
/// The version of predictor-free fast-lane streams (`FLAG_FAST_LANE`).
pub const FAST_LANE_VERSION: u16 = 3;
/// The version of bins-model streams (`FLAG_FAST_LANE | FLAG_PREDICTED`, `bins::CURRENT`),
/// and the newest this build reads.
pub const BINS_VERSION: u16 = 4;
const _: () = assert!(BINS_VERSION == crate::bins::CURRENT.version);
/// The oldest version this build reads.
pub const OLDEST_READABLE_VERSION: u16 = 1;
/// The stream was coded against a prediction (`mu`, `sigma`); otherwise predictor-free.
pub const FLAG_PREDICTED: u16 = 1 << 0;
/// The encoder's caller held a torch tensor: bindings hand back one. Decoding ignores it.
pub const FLAG_TORCH_HINT: u16 = 1 << 1;
/// Predicted scalars use the ordinal-residual tables (`ModelKind::Fast`); float32 streams
/// always do. Without it, 8/16-bit formats use the value-space mixture (`ModelKind::Exact`).
pub const FLAG_FAST_MODEL: u16 = 1 << 2;
/// Predicted scalars were coded with the joint residual model (`crate::joint`): whole layers,
/// channel-major, each channel against a mu corrected by the residuals coded before it.
pub const FLAG_JOINT: u16 = 1 << 3;
/// Jointly coded layers scale each token's sigmas by its residuals so far
/// (`crate::token_scale`); the knobs are at +18. Only with `FLAG_JOINT`.
pub const FLAG_TOKEN_SCALE: u16 = 1 << 4;
/// Coded with static tables and rANS: predictor-free (`crate::fast_lane`, version 3), or with
/// `FLAG_PREDICTED` the bins model (`crate::bins`: version 4, version 3 still read).
pub const FLAG_FAST_LANE: u16 = 1 << 5;
/// The joint model's sums in its integer form (`crate::joint_integer`, invariant J4) instead
/// of float32 (J1). Only with `FLAG_JOINT`; builds before it refuse the stream (unknown flag).
pub const FLAG_JOINT_INT: u16 = 1 << 6;
const KNOWN_FLAGS: u16 = FLAG_PREDICTED
    | FLAG_TORCH_HINT
    | FLAG_FAST_MODEL
    | FLAG_JOINT
    | FLAG_TOKEN_SCALE
    | FLAG_FAST_LANE
    | FLAG_JOINT_INT;

const FIXED_LEN: usize = 24;
const MODEL_PARAMS_LEN: usize = 16;
const TAIL_LEN: usize = MODEL_PARAMS_LEN + 32;
const CHUNK_ENTRY_LEN: usize = 32;
const CHECKSUM_LEN: usize = 8;

/// Largest tensor a stream may describe (2^40 scalars). A decoder refuses larger claims
/// before allocating anything.
pub const MAX_SCALARS: u64 = 1 << 40;
/// Largest chunk (2^24 scalars).
pub const MAX_CHUNK_SCALARS: u32 = 1 << 24;
/// Largest number of predictor-free contexts.
pub const MAX_RAW_CONTEXTS: u16 = 256;
/// Every coded scalar costs at least `-log2(1 - 2^-12)` bits (escape weight and adaptive
/// floors, see `ModelParams::validate` and `model::adaptive`; in the fast lane at least
/// `-log2(1 - 2^-10)`, `fast_lane` invariant F3), fewer than 2^15 per byte; a chunk
/// claiming more scalars than `(length + 8 * lanes) << 15` is corrupt (slack for the coders' final words). This bounds the output a small
/// stream can make a decoder allocate.
pub const MAX_SCALARS_PER_BYTE_LOG2: u32 = 15;

/// One chunk's entry in the index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkEntry {
    pub offset: u64,
    pub length: u32,
    pub checksum: u64,
    pub fingerprint: u64,
}

/// Everything in front of the payloads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// The stream's format version (`FORMAT_VERSION` when written by this build).
    pub version: u16,
    pub flags: u16,
    pub dtype: DType,
    pub shape: Vec<u64>,
    pub chunk_scalars: u32,
    pub n_scalars: u64,
    /// Range coders per chunk (`chunk::LANES`; 2 in version 1).
    pub lanes: u8,
    pub params: ModelParams,
    pub raw_contexts: u16,
    /// The token scale's knobs (`FLAG_TOKEN_SCALE`).
    pub token_scale: Option<TokenScale>,
    pub context_period: u32,
    pub table_digest: u64,
    pub fingerprint: u64,
    pub chunks: Vec<ChunkEntry>,
}

/// Number of chunks `n` scalars split into.
pub fn chunk_count(n_scalars: u64, chunk_scalars: u32) -> u64 {
    n_scalars.div_ceil(chunk_scalars as u64)
}

pub fn header_len(ndim: usize, n_chunks: usize) -> usize {
    FIXED_LEN + 8 * ndim + TAIL_LEN + CHUNK_ENTRY_LEN * n_chunks + CHECKSUM_LEN
}

fn write_params(out: &mut Vec<u8>, p: &ModelParams) {
    out.push(p.table_precision);
    out.push(p.min_scale_log2 as u8);
    out.push(p.max_scale_log2 as u8);
    out.push(p.window_scales);
    out.extend_from_slice(&p.weight_narrow.to_le_bytes());
    out.extend_from_slice(&p.weight_wide.to_le_bytes());
    out.extend_from_slice(&p.weight_escape.to_le_bytes());
    out.push(p.wide_factor);
    out.push(p.adapt_shift);
    out.extend_from_slice(&p.adapt_increment.to_le_bytes());
    out.extend_from_slice(&p.adapt_period.to_le_bytes());
}

/// Bounds-checked little-endian reader (also the cache container's).
pub(crate) struct Reader<'a> {
    pub(crate) bytes: &'a [u8],
    pub(crate) pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.bytes.len());
        match end {
            Some(end) => {
                let s = &self.bytes[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            None => corrupt(format!("truncated: header needs more than the {} bytes given", self.bytes.len())),
        }
    }
    pub(crate) fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    pub(crate) fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().unwrap()))
    }
    pub(crate) fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    pub(crate) fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    /// Reads a stored XXH3-64 and checks it against every byte before it; `what` names the
    /// header in the error.
    pub(crate) fn checksum(&mut self, what: &str) -> Result<()> {
        let covered = self.pos;
        let stored = self.u64()?;
        if !matches(&self.bytes[..covered], stored) {
            return Err(Error::Checksum(format!("{what} checksum does not match")));
        }
        Ok(())
    }
}

fn read_params(r: &mut Reader) -> Result<ModelParams> {
    Ok(ModelParams {
        table_precision: r.u8()?,
        min_scale_log2: r.u8()? as i8,
        max_scale_log2: r.u8()? as i8,
        window_scales: r.u8()?,
        weight_narrow: r.u16()?,
        weight_wide: r.u16()?,
        weight_escape: r.u16()?,
        wide_factor: r.u8()?,
        adapt_shift: r.u8()?,
        adapt_increment: r.u16()?,
        adapt_period: r.u16()?,
    })
}

impl Header {
    /// Coded with the fast lane (`FLAG_FAST_LANE`).
    pub fn fast_lane(&self) -> bool {
        self.flags & FLAG_FAST_LANE != 0
    }

    pub fn predicted(&self) -> bool {
        self.flags & FLAG_PREDICTED != 0
    }

    /// The model predicted scalars are coded with (`None`: predictor-free).
    pub fn model(&self) -> Option<ModelKind> {
        match (self.predicted(), self.flags & FLAG_FAST_MODEL != 0, self.fast_lane()) {
            (false, _, _) => None,
            (true, _, true) => Some(ModelKind::Bins),
            (true, true, false) => Some(ModelKind::Fast),
            (true, false, false) => Some(ModelKind::Exact),
        }
    }

    /// `model()` by name, as the Python API and `speckv info` print it.
    pub fn model_name(&self) -> &'static str {
        self.model().map_or("predictor-free", ModelKind::name)
    }

    /// Serialises the header (with its checksum) in front of the payloads.
    pub fn write(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(header_len(self.shape.len(), self.chunks.len()));
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&self.flags.to_le_bytes());
        out.push(self.dtype as u8);
        out.push(self.shape.len() as u8);
        if self.version == 1 {
            out.extend_from_slice(&0u16.to_le_bytes());
        } else {
            out.push(self.lanes);
            out.push(0);
        }
        out.extend_from_slice(&self.chunk_scalars.to_le_bytes());
        out.extend_from_slice(&self.n_scalars.to_le_bytes());
        for d in &self.shape {
            out.extend_from_slice(&d.to_le_bytes());
        }
        write_params(&mut out, &self.params);
        out.extend_from_slice(&self.raw_contexts.to_le_bytes());
        let scale = self.token_scale.map_or([0, 0], |s| [s.prior, s.clamp]);
        out.extend_from_slice(&scale);
        out.extend_from_slice(&self.context_period.to_le_bytes());
        out.extend_from_slice(&self.table_digest.to_le_bytes());
        out.extend_from_slice(&self.fingerprint.to_le_bytes());
        out.extend_from_slice(&(self.chunks.len() as u32).to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        for c in &self.chunks {
            out.extend_from_slice(&c.offset.to_le_bytes());
            out.extend_from_slice(&c.length.to_le_bytes());
            out.extend_from_slice(&0u32.to_le_bytes());
            out.extend_from_slice(&c.checksum.to_le_bytes());
            out.extend_from_slice(&c.fingerprint.to_le_bytes());
        }
        let sum = checksum(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        out
    }

    /// Parses and validates a header against the whole stream `bytes`. Every count is checked
    /// against the bytes actually present before it sizes anything; chunk payloads are not
    /// read here (their checksums are checked when they are decoded).
    pub fn parse(bytes: &[u8]) -> Result<Header> {
        let mut r = Reader { bytes, pos: 0 };
        if bytes.len() < 4 || bytes[..4] != MAGIC {
            return Err(Error::Unsupported("not a speckv stream (bad magic)".into()));
        }
        r.take(4)?;
        let version = r.u16()?;
        if !(OLDEST_READABLE_VERSION..=BINS_VERSION).contains(&version) {
            return Err(Error::Unsupported(format!(
                "format version {version}; this build reads versions {OLDEST_READABLE_VERSION} to {BINS_VERSION}"
            )));
        }
        let flags = r.u16()?;
        if flags & !KNOWN_FLAGS != 0 {
            return Err(Error::Unsupported(format!("unknown flags {flags:#06x}")));
        }
        let fast = flags & FLAG_FAST_LANE != 0;
        if fast != (version >= FAST_LANE_VERSION) {
            return corrupt(format!(
                "version {version} with the fast-lane flag {}",
                if fast { "set" } else { "clear" }
            ));
        }
        // version 3 holds predictor-free fast-lane streams and predicted ones of the bins model
        if fast
            && (flags & FLAG_FAST_MODEL != 0
                || (flags & FLAG_PREDICTED == 0 && flags & (FLAG_JOINT | FLAG_TOKEN_SCALE) != 0))
        {
            return corrupt("a version-3 stream is predictor-free or coded with the bins model");
        }
        if version == BINS_VERSION && flags & FLAG_PREDICTED == 0 {
            return corrupt("a version-4 stream is coded with the bins model");
        }
        // a fast-lane stream's rANS states: the bins revision's, or the fast lane's
        let states = match crate::bins::Revision::of_version(version) {
            Some(revision) if fast && flags & FLAG_PREDICTED != 0 => revision.states,
            _ => fast_lane::STATES,
        };
        let dtype_code = r.u8()?;
        let ndim = r.u8()? as usize;
        if ndim > MAX_NDIM {
            return corrupt(format!("{ndim} dimensions (at most {MAX_NDIM})"));
        }
        let lanes = match (version, r.u8()?, r.u8()?) {
            (1, 0, 0) => LANES_V1 as u8,
            (_, lanes, 0) if fast && lanes as usize == states => lanes,
            (_, lanes, 0) if version > 1 && !fast && lanes as usize == LANES => lanes,
            (1, _, _) | (_, _, 1..) => return corrupt("reserved header bytes are not zero"),
            (_, lanes, _) => {
                let expected = if fast { states } else { LANES };
                return Err(Error::Unsupported(format!(
                    "{lanes} coder lanes per chunk; this build reads {expected} in a version-{version} stream"
                )));
            }
        };
        let chunk_scalars = r.u32()?;
        let n_scalars = r.u64()?;
        let mut shape = Vec::with_capacity(ndim);
        let mut product = 1u64;
        for _ in 0..ndim {
            let d = r.u64()?;
            product = product
                .checked_mul(d)
                .filter(|&p| p <= MAX_SCALARS)
                .ok_or_else(|| Error::Corrupt(format!("shape has more than {MAX_SCALARS} scalars")))?;
            shape.push(d);
        }
        if product != n_scalars {
            return corrupt(format!("shape holds {product} scalars but the header says {n_scalars}"));
        }
        if chunk_scalars == 0 || chunk_scalars > MAX_CHUNK_SCALARS {
            return corrupt(format!("{chunk_scalars} scalars per chunk (1..={MAX_CHUNK_SCALARS})"));
        }
        let params = read_params(&mut r)?;
        let raw_contexts = r.u16()?;
        let (prior, clamp) = (r.u8()?, r.u8()?);
        let token_scale = if flags & FLAG_TOKEN_SCALE != 0 {
            let scale = TokenScale { prior, clamp };
            scale.validate().map_err(Error::Corrupt)?;
            Some(scale)
        } else if prior != 0 || clamp != 0 {
            return corrupt("reserved header bytes are not zero");
        } else {
            None
        };
        let context_period = r.u32()?;
        let table_digest = r.u64()?;
        let fingerprint = r.u64()?;
        let n_chunks = r.u32()? as u64;
        if r.u32()? != 0 {
            return corrupt("reserved header bytes are not zero");
        }
        if n_chunks != chunk_count(n_scalars, chunk_scalars) {
            return corrupt(format!("{n_chunks} chunks for {n_scalars} scalars in chunks of {chunk_scalars}"));
        }
        // The index must fit in the bytes we have before we allocate room for it.
        let index_len = n_chunks.saturating_mul(CHUNK_ENTRY_LEN as u64);
        if index_len > (bytes.len() - r.pos) as u64 {
            return corrupt("truncated: the chunk index runs past the end");
        }
        let dtype = DType::from_code(dtype_code)?;
        if flags & FLAG_JOINT != 0 && (flags & FLAG_PREDICTED == 0 || dtype.bits() > 16) {
            return corrupt("the joint model codes predicted 8/16-bit streams only");
        }
        if flags & FLAG_TOKEN_SCALE != 0 && flags & FLAG_JOINT == 0 {
            return corrupt("the token scale is set on a stream without the joint model");
        }
        if flags & FLAG_JOINT_INT != 0 && flags & FLAG_JOINT == 0 {
            return corrupt("the joint model's integer form is set on a stream without the joint model");
        }
        if fast && fast_lane::Split::of(dtype).is_none() {
            return corrupt(format!("the fast lane does not code {}", dtype.name()));
        }
        if flags & FLAG_PREDICTED != 0 && dtype.bits() > 16 && flags & FLAG_FAST_MODEL == 0 {
            return corrupt("float32 streams are coded with the fast model, but the flag is missing");
        }
        let mut chunks = Vec::with_capacity(n_chunks as usize);
        for _ in 0..n_chunks {
            let offset = r.u64()?;
            let length = r.u32()?;
            if r.u32()? != 0 {
                return corrupt("reserved chunk-index bytes are not zero");
            }
            let checksum = r.u64()?;
            let fingerprint = r.u64()?;
            chunks.push(ChunkEntry { offset, length, checksum, fingerprint });
        }
        r.checksum("header")?;
        // From here the header is what the encoder wrote; the checks below catch an encoder
        // (or a forger who recomputed the checksum) writing nonsense.
        params.validate().map_err(|m| Error::Corrupt(format!("model parameters: {m}")))?;
        if raw_contexts == 0 || raw_contexts > MAX_RAW_CONTEXTS {
            return corrupt(format!("{raw_contexts} predictor-free contexts (1..={MAX_RAW_CONTEXTS})"));
        }
        if context_period == 0 {
            return corrupt("context period is zero");
        }
        let mut expected_offset = r.pos as u64;
        for (i, c) in chunks.iter().enumerate() {
            if c.offset != expected_offset {
                return corrupt(format!("chunk {i} starts at {} instead of {expected_offset}", c.offset));
            }
            // The lane lengths (a u32 in version 1, a varint of at least a byte in version 2)
            // plus every coder's final word at least (whole in version 1, one byte or more
            // in version 2; see `codec::join_lanes`).
            let lanes = lanes as u32;
            let shortest = match version {
                1 => 4 * (2 * lanes - 1),
                FAST_LANE_VERSION.. if flags & FLAG_PREDICTED != 0 => {
                    crate::bins::Revision::of_version(version).map_or(0, |r| r.min_chunk_len()) as u32
                }
                FAST_LANE_VERSION.. => fast_lane::MIN_CHUNK_LEN as u32,
                _ => (lanes - 1) + lanes,
            };
            if c.length < shortest || (version == 1 && c.length % 4 != 0) {
                return corrupt(format!("chunk {i} has length {}", c.length));
            }
            let scalars = if i as u64 + 1 == n_chunks {
                n_scalars - chunk_scalars as u64 * i as u64
            } else {
                chunk_scalars as u64
            };
            if scalars > (c.length as u64 + 8 * lanes as u64) << MAX_SCALARS_PER_BYTE_LOG2 {
                return corrupt(format!("chunk {i} claims {scalars} scalars in {} bytes", c.length));
            }
            expected_offset += c.length as u64;
        }
        if expected_offset != bytes.len() as u64 {
            return corrupt(format!("payloads end at byte {expected_offset} but the stream has {} bytes", bytes.len()));
        }
        Ok(Header {
            version,
            flags,
            dtype,
            shape,
            chunk_scalars,
            n_scalars,
            lanes,
            params,
            raw_contexts,
            token_scale,
            context_period,
            table_digest,
            fingerprint,
            chunks,
        })
    }

    /// Range of scalars chunk `i` holds.
    pub fn chunk_scalar_range(&self, i: usize) -> std::ops::Range<usize> {
        let start = i * self.chunk_scalars as usize;
        let end = (start + self.chunk_scalars as usize).min(self.n_scalars as usize);
        start..end
    }
}
