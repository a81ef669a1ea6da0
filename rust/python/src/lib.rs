//! `b12x._core`: the pyo3 extension. Conversions and exception mapping only;
//! the logic lives in b12x-core and b12x-cuda.

mod allreduce;
mod collective;
mod device;
mod error;
mod indexer;
mod runtime;
mod tensor;
mod torch_abi;
mod torch_stream;

use pyo3::prelude::*;

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    runtime::register(m)?;
    device::register(m)?;
    allreduce::register(m)?;
    indexer::register(m)?;
    tensor::register(m)?;
    collective::register(m)?;
    Ok(())
}
