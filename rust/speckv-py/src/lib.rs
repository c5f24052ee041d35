use pyo3::prelude::*;
#[pymodule]
fn _speckv(_m: &Bound<'_, PyModule>) -> PyResult<()> { Ok(()) }
