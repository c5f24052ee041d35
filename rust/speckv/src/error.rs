//! Every way an input can be wrong, named for what the caller did.

use std::fmt;

/// Errors returned by the codec. Each variant says what was wrong with the *input*; none of
/// them is a bug in the codec, and no input makes the codec panic instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// An argument was inconsistent before any stream was involved: a buffer length that does
    /// not match the shape, a sigma array that does not broadcast, a zero thread count, a
    /// non-finite or non-positive sigma. The string names the argument.
    InvalidArgument(String),
    /// The bytes are not a speckv stream at all (wrong magic) or use a version or feature this
    /// build does not know.
    Unsupported(String),
    /// The stream is structurally broken: truncated, a length or count out of range, fields that
    /// contradict each other, a claimed size beyond the stated limits.
    Corrupt(String),
    /// A checksum over the header or over a chunk's bytes did not match: the bytes were changed
    /// after they were written.
    Checksum(String),
    /// The stream was made with predictions (`mu`, `sigma`) other than the ones given to the
    /// decoder, or with a prediction while none was given (or the reverse). Detected from the
    /// fingerprint of the integer coding parameters before anything is decoded.
    PredictionMismatch(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidArgument(m) => write!(f, "invalid argument: {m}"),
            Error::Unsupported(m) => write!(f, "unsupported stream: {m}"),
            Error::Corrupt(m) => write!(f, "corrupt stream: {m}"),
            Error::Checksum(m) => write!(f, "checksum mismatch: {m}"),
            Error::PredictionMismatch(m) => write!(f, "prediction mismatch: {m}"),
        }
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

pub(crate) fn corrupt<T>(msg: impl Into<String>) -> Result<T> {
    Err(Error::Corrupt(msg.into()))
}

pub(crate) fn invalid<T>(msg: impl Into<String>) -> Result<T> {
    Err(Error::InvalidArgument(msg.into()))
}
