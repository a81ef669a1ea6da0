//! Bindings of the IPC all-reduce, thin newtypes over the layers below:
//! [`knobs`] (`Limits` and the environment knobs, b12x-core's rules),
//! [`plan`] (routing and prepared plans, b12x-core), [`runtime`] (one
//! rank's IPC runtime, b12x-cuda) and [`call`] (admission: one call's
//! checked launch).

mod call;
mod knobs;
mod plan;
mod runtime;

use pyo3::prelude::*;

use crate::error::PyB12xResult;

/// PCI bus id of `ordinal` (names a GPU across processes).
#[pyfunction]
fn pci_bus_id(ordinal: u32) -> PyB12xResult<String> {
    Ok(b12x_cuda::pci_bus_id(ordinal)?)
}

/// Native P2P atomics both ways between `ordinal` and the GPU at `peer_bus_id`
/// (NVLink yes, PCIe no); None if that GPU is not visible here.
#[pyfunction]
fn p2p_native_atomics(ordinal: u32, peer_bus_id: &str) -> PyB12xResult<Option<bool>> {
    Ok(b12x_cuda::p2p_native_atomics(ordinal, peer_bus_id)?)
}

/// Raises ConfigError unless ``world`` ranks can run the all-reduce (2..=8).
#[pyfunction]
fn allreduce_check_world(world: u32) -> PyB12xResult<()> {
    Ok(b12x_core::allreduce::layout::check_world(0, world)?)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(allreduce_check_world, m)?)?;
    m.add_function(wrap_pyfunction!(pci_bus_id, m)?)?;
    m.add_function(wrap_pyfunction!(p2p_native_atomics, m)?)?;
    knobs::register(m)?;
    plan::register(m)?;
    runtime::register(m)?;
    Ok(())
}
