//! A stream back into its tensor: each chunk checked (checksum, then the prediction's
//! fingerprint) before it is decoded, on every thread.

use super::joint_runs::{joint_fingerprint, joint_runs};
use super::lanes::split_lanes;
use super::{check_joint, check_prediction, fingerprint_of, with_codes};
use crate::bins;
use crate::chunk::{unclean_end, ModelKind, PredictedModel, StreamModel, LANES, LANES_V1};
use crate::error::{invalid, Error, Result};
use crate::fast_lane;
use crate::format::header::{Header, FLAG_JOINT, FLAG_JOINT_INT};
use crate::hash::matches;
use crate::joint::Joint;
use crate::parallel::for_each_piece_mut;
use crate::prediction::{codes_and_fingerprint, Prediction};
use crate::words::{BitsMut, Word};

/// Parses and validates a stream's header.
pub fn info(stream: &[u8]) -> Result<Header> {
    Header::parse(stream)
}

fn decode_words<W: Word, const N: usize>(
    stream: &[u8],
    header: &Header,
    model: &StreamModel,
    out: &mut [W],
    prediction: Option<&Prediction>,
    threads: usize,
    first_chunk: usize,
) -> Result<()> {
    let chunk = header.chunk_scalars as usize;
    let payload = |i: usize| {
        let c = &header.chunks[i];
        &stream[c.offset as usize..c.offset as usize + c.length as usize]
    };
    // Each chunk is checked before it is decoded: its checksum, then the fingerprint of the
    // decoder's own integer predictions against the encoder's. A failure anywhere fails the
    // whole call, so no partly decoded output is ever handed back.
    for_each_piece_mut(threads, out, chunk, |piece_index, piece| {
        let i = first_chunk + piece_index;
        let bytes = payload(i);
        if !matches(bytes, header.chunks[i].checksum) {
            return Err(Error::Checksum(format!("chunk {i} of {}", header.chunks.len())));
        }
        let start = i * chunk;
        let mut dec = split_lanes::<N>(bytes, header.version)
            .ok_or_else(|| Error::Corrupt(format!("chunk {i}: bad lane length")))?;
        match prediction {
            Some(p) => {
                let mu = &p.mu[start..start + piece.len()];
                with_codes(|codes| {
                    let mut fp = codes_and_fingerprint(mu, &p.sigma, start, codes);
                    if let Some(joint) = &p.joint {
                        fp = joint_fingerprint(fp, joint, &(start..start + piece.len()));
                    }
                    if fp != header.chunks[i].fingerprint {
                        return Err(Error::PredictionMismatch(format!(
                            "the mu/sigma given differ from the encoder's (chunk {i}, scalars {start}..{})",
                            start + piece.len()
                        )));
                    }
                    match &p.joint {
                        Some(joint) => {
                            let mut escapes = model.escapes();
                            joint_runs(model, joint, piece, p.mu, codes, start, |run_x, corrected, run_codes| {
                                model.decode_predicted_with(&mut dec, &mut escapes, run_x, corrected, run_codes);
                            })
                        }
                        None => model.decode_predicted(&mut dec, piece, mu, codes),
                    }
                    Ok(())
                })?
            }
            None => model.decode_raw(&mut dec, piece, start),
        }
        if dec.iter().all(|d| d.finished_cleanly()) {
            Ok(())
        } else {
            Err(unclean_end(i))
        }
    })
}

/// Decodes the bins-model chunks of `stream` from `first_chunk` on into `out`, each checked
/// against its checksum and its prediction fingerprint first (as `decode_words`).
fn decode_bins<W: Word>(
    stream: &[u8],
    header: &Header,
    model: &StreamModel,
    out: &mut [W],
    p: &Prediction,
    threads: usize,
    first_chunk: usize,
) -> Result<()> {
    let PredictedModel::Bins { tables } = &model.predicted else {
        return invalid("bins: the stream model is not the bins model");
    };
    let chunk = header.chunk_scalars as usize;
    for_each_piece_mut(threads, out, chunk, |piece_index, piece| {
        let i = first_chunk + piece_index;
        let c = &header.chunks[i];
        let bytes = &stream[c.offset as usize..c.offset as usize + c.length as usize];
        if !matches(bytes, c.checksum) {
            return Err(Error::Checksum(format!("chunk {i} of {}", header.chunks.len())));
        }
        let start = i * chunk;
        let mu = &p.mu[start..start + piece.len()];
        let in_chunk = |e: Error| match e {
            Error::Corrupt(m) => Error::Corrupt(format!("chunk {i}: {m}")),
            other => other,
        };
        with_codes(|codes| {
            let mut fp = codes_and_fingerprint(mu, &p.sigma, start, codes);
            if let Some(joint) = &p.joint {
                fp = joint_fingerprint(fp, joint, &(start..start + piece.len()));
            }
            if fp != c.fingerprint {
                return Err(Error::PredictionMismatch(format!(
                    "the mu/sigma given differ from the encoder's (chunk {i}, scalars {start}..{})",
                    start + piece.len()
                )));
            }
            let mut dec = bins::Decoder::new(header.dtype, tables, bytes).map_err(in_chunk)?;
            match &p.joint {
                Some(joint) => joint_runs(model, joint, piece, p.mu, codes, start, |run_x, corrected, run_codes| {
                    dec.run(run_x, corrected, run_codes)
                }),
                None => dec.run(piece, mu, codes),
            }
            dec.finish().map_err(in_chunk)
        })
    })
}

/// Decodes the fast-lane chunks of `stream` from `first_chunk` on into `out`, each checked
/// against its checksum first.
fn decode_fast_lane<W: Word>(
    stream: &[u8],
    header: &Header,
    out: &mut [W],
    threads: usize,
    first_chunk: usize,
) -> Result<()> {
    let period = header.context_period as usize;
    for_each_piece_mut(threads, out, header.chunk_scalars as usize, |piece_index, piece| {
        let i = first_chunk + piece_index;
        let c = &header.chunks[i];
        let bytes = &stream[c.offset as usize..c.offset as usize + c.length as usize];
        if !matches(bytes, c.checksum) {
            return Err(Error::Checksum(format!("chunk {i} of {}", header.chunks.len())));
        }
        fast_lane::decode_chunk(bytes, period, piece).map_err(|e| match e {
            Error::Corrupt(m) => Error::Corrupt(format!("chunk {i}: {m}")),
            other => other,
        })
    })
}

/// Decodes `stream` into `out` (as many words as the stream has scalars, of its dtype's
/// width). `prediction` must be the one the stream was made with. Returns the header.
pub fn decode_into(stream: &[u8], out: BitsMut, prediction: Option<&Prediction>, threads: usize) -> Result<Header> {
    decode_chunks_into(stream, out, prediction, threads, None)
}

/// Like `decode_into`, for the chunks in `chunks` only (all when `None`): `out` holds just
/// their scalars, in order, while `prediction` still covers the whole tensor. Chunks outside
/// the range are neither read nor checked, so a reader can take one layer of a cache whose
/// chunks are its layers.
pub fn decode_chunks_into(
    stream: &[u8],
    out: BitsMut,
    prediction: Option<&Prediction>,
    threads: usize,
    chunks: Option<std::ops::Range<usize>>,
) -> Result<Header> {
    let header = Header::parse(stream)?;
    decode_parsed(stream, &header, out, prediction, threads, chunks)?;
    Ok(header)
}

/// Scalars that decoding `chunks` (all when `None`) of a stream with `header` produces, after
/// checking that the range is within the stream.
pub fn decoded_len(header: &Header, chunks: Option<std::ops::Range<usize>>) -> Result<usize> {
    let chunks = chunks.unwrap_or(0..header.chunks.len());
    if chunks.start > chunks.end || chunks.end > header.chunks.len() {
        return invalid(format!("chunks: {chunks:?} is not within the stream's {} chunks", header.chunks.len()));
    }
    Ok(if chunks.is_empty() {
        0
    } else {
        header.chunk_scalar_range(chunks.end - 1).end - header.chunk_scalar_range(chunks.start).start
    })
}

/// `decode_chunks_into` for a header the caller has already parsed from `stream` (bindings
/// parse once, size their output from it, then decode).
pub fn decode_parsed(
    stream: &[u8],
    header: &Header,
    out: BitsMut,
    prediction: Option<&Prediction>,
    threads: usize,
    chunks: Option<std::ops::Range<usize>>,
) -> Result<()> {
    let n = header.n_scalars as usize;
    let wanted = decoded_len(header, chunks.clone())?;
    let chunks = chunks.unwrap_or(0..header.chunks.len());
    if out.width_bits() != header.dtype.bits() || out.len() != wanted {
        return invalid(format!(
            "out: {} words of {} bits given; chunks {chunks:?} hold {wanted} {} scalars",
            out.len(),
            out.width_bits(),
            header.dtype.name()
        ));
    }
    // the joint model's form is the stream's (`FLAG_JOINT_INT`): a caller may give both
    let chosen;
    let prediction = match prediction {
        Some(p) if p.joint.is_some() && header.flags & FLAG_JOINT != 0 => {
            let joint = p.joint.expect("checked above");
            let integer = header.flags & FLAG_JOINT_INT != 0;
            if integer && joint.integer.is_none() {
                return Err(Error::PredictionMismatch(
                    "the stream was coded with the joint model's integer form; give its arrays to decode".into(),
                ));
            }
            chosen = Prediction {
                joint: Some(Joint { integer: if integer { joint.integer } else { None }, ..joint }),
                ..p.clone()
            };
            Some(&chosen)
        }
        other => other,
    };
    match (header.predicted(), prediction) {
        (true, None) => {
            return Err(Error::PredictionMismatch("the stream was coded with mu/sigma; give the same to decode".into()))
        }
        (false, Some(_)) => {
            return Err(Error::PredictionMismatch("the stream was coded without mu/sigma; give none to decode".into()))
        }
        (_, Some(p)) => {
            check_prediction(&header.shape, n, p)?;
            match (header.flags & FLAG_JOINT != 0, p.joint.is_some()) {
                (true, false) => {
                    return Err(Error::PredictionMismatch(
                        "the stream was coded with a joint residual model; give the same to decode".into(),
                    ))
                }
                (false, true) => {
                    return Err(Error::PredictionMismatch(
                        "the stream was coded without a joint residual model; give none to decode".into(),
                    ))
                }
                _ => check_joint(header.dtype, n, header.chunk_scalars as usize, prediction)?,
            }
        }
        _ => {}
    }
    if header.fast_lane() && header.predicted() {
        let Some(p) = prediction else {
            return Err(Error::PredictionMismatch(
                "the stream was coded with mu/sigma; give the same to decode".into(),
            ));
        };
        let mut model = StreamModel::new(header.dtype, header.params, ModelKind::Bins, 1, 1);
        model.token_scale = header.token_scale;
        // `Header::parse` admits a predicted fast-lane stream only at a bins revision's version
        let revision = bins::Revision::of_version(header.version)
            .ok_or_else(|| Error::Corrupt(format!("no bins revision has version {}", header.version)))?;
        model.predicted = PredictedModel::Bins { tables: bins::BinTables::shared(&header.params, revision) };
        if model.table_digest() != header.table_digest {
            return Err(Error::Unsupported(
                "the stream's probability tables differ from the ones this build computes".into(),
            ));
        }
        if fingerprint_of(&header.chunks) != header.fingerprint {
            return Err(Error::Corrupt("prediction fingerprint disagrees with the chunk index".into()));
        }
        return match out {
            BitsMut::U8(o) => decode_bins(stream, header, &model, o, p, threads, chunks.start),
            BitsMut::U16(o) => decode_bins(stream, header, &model, o, p, threads, chunks.start),
            BitsMut::U32(_) => Err(Error::Corrupt("the bins model does not code float32".into())),
        };
    }
    if header.fast_lane() {
        return match out {
            BitsMut::U8(o) => decode_fast_lane(stream, header, o, threads, chunks.start),
            BitsMut::U16(o) => decode_fast_lane(stream, header, o, threads, chunks.start),
            BitsMut::U32(_) => Err(Error::Corrupt("the fast lane does not code float32".into())),
        };
    }
    let mut model = StreamModel::new(
        header.dtype,
        header.params,
        header.model().unwrap_or_default(),
        header.raw_contexts as usize,
        header.context_period as usize,
    );
    model.token_scale = header.token_scale;
    if header.predicted() {
        if model.table_digest() != header.table_digest {
            return Err(Error::Unsupported(
                "the stream's probability tables differ from the ones this build computes".into(),
            ));
        }
        if fingerprint_of(&header.chunks) != header.fingerprint {
            return Err(Error::Corrupt("prediction fingerprint disagrees with the chunk index".into()));
        }
    }
    // `Header::parse` admits exactly these lane counts.
    macro_rules! decode_lanes {
        ($n:expr) => {
            match out {
                BitsMut::U8(o) => decode_words::<_, $n>(stream, header, &model, o, prediction, threads, chunks.start),
                BitsMut::U16(o) => decode_words::<_, $n>(stream, header, &model, o, prediction, threads, chunks.start),
                BitsMut::U32(o) => decode_words::<_, $n>(stream, header, &model, o, prediction, threads, chunks.start),
            }
        };
    }
    match header.lanes as usize {
        LANES_V1 => decode_lanes!(LANES_V1),
        _ => decode_lanes!(LANES),
    }
}
