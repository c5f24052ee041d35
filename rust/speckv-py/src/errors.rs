//! The exceptions speckv raises (`SpeckvError` and its subclasses) and the core's errors
//! mapped to them.

use pyo3::create_exception;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use speckv::Error;

create_exception!(_speckv, SpeckvError, PyValueError, "Base class of every error speckv raises.");
create_exception!(_speckv, CorruptStreamError, SpeckvError, "The bytes are not a valid speckv stream.");
create_exception!(_speckv, ChecksumError, CorruptStreamError, "A checksum did not match: the stream was altered.");
create_exception!(
    _speckv,
    UnsupportedStreamError,
    CorruptStreamError,
    "Not a speckv stream, or a format version or feature this build cannot read."
);
create_exception!(
    _speckv,
    PredictionMismatchError,
    SpeckvError,
    "The mu/sigma given to decode are not the ones the stream was encoded with."
);

pub(crate) fn to_py(err: Error) -> PyErr {
    match err {
        Error::InvalidArgument(m) => SpeckvError::new_err(m),
        Error::Unsupported(m) => UnsupportedStreamError::new_err(m),
        Error::Corrupt(m) => CorruptStreamError::new_err(m),
        Error::Checksum(m) => ChecksumError::new_err(m),
        Error::PredictionMismatch(m) => PredictionMismatchError::new_err(m),
    }
}

pub(crate) fn value_error(m: String) -> PyErr {
    SpeckvError::new_err(m)
}

pub(crate) fn mismatch_error(m: String) -> PyErr {
    PredictionMismatchError::new_err(m)
}
