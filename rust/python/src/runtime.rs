//! Driver facts and module loading, for Python.

use b12x_cuda::{device, ptx};
use pyo3::prelude::*;
use pyo3::types::{IntoPyDict, PyDict};

use crate::error::PyB12xResult;

/// Embedded PTX and build facts, for bug reports and `b12x doctor`.
#[pyfunction]
fn build_info(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("version", env!("CARGO_PKG_VERSION"))?;
    d.set_item("ptx_target", ptx::PTX_TARGET)?;
    d.set_item("ptx_isa", ptx::PTX_ISA)?;
    d.set_item("min_driver", ptx::MIN_DRIVER.to_string())?;
    d.set_item("cudarc_bindings", "CUDA 12.8 driver API (dynamic loading)")?;
    let modules: Vec<(&str, Vec<&str>)> = ptx::MODULES
        .iter()
        .map(|m| (m.name, m.kernels.iter().map(|k| k.symbol()).collect()))
        .collect();
    d.set_item("modules", modules)?;
    // Arch-specific modules (e.g. indexer_wgmma: compute_90a, loaded on sm_90 only).
    let targets: Vec<(&str, &str)> =
        ptx::MODULES.iter().map(|m| (m.name, m.target.compute())).collect();
    d.set_item("module_targets", targets.into_py_dict(py)?)?;
    d.set_item("debug_build", cfg!(debug_assertions))?;
    Ok(d)
}

#[pyfunction]
fn driver_present() -> bool {
    device::driver_present()
}

/// The driver's CUDA version, e.g. (13, 0).
#[pyfunction]
fn driver_version() -> PyB12xResult<(u32, u32)> {
    Ok(device::driver_version()?)
}

#[pyfunction]
fn device_count() -> PyB12xResult<u32> {
    Ok(device::device_count()?)
}

#[pyfunction]
fn device_info(py: Python<'_>, ordinal: u32) -> PyB12xResult<Bound<'_, PyDict>> {
    let info = device::device_info(ordinal)?;
    let d = PyDict::new(py);
    d.set_item("ordinal", info.ordinal)?;
    d.set_item("name", info.name)?;
    d.set_item("compute_capability", info.compute_capability)?;
    d.set_item("multiprocessors", info.multiprocessors)?;
    d.set_item("total_memory", info.total_memory)?;
    d.set_item("l2_bytes", info.l2_bytes)?;
    Ok(d)
}

#[pyfunction]
fn can_access_peer(from: u32, to: u32) -> PyB12xResult<bool> {
    Ok(device::can_access_peer(from, to)?)
}

/// Loads every embedded module on `ordinal` (JIT on first use; the GIL is released).
#[pyfunction]
fn load_kernels(py: Python<'_>, ordinal: u32) -> PyB12xResult<()> {
    py.detach(|| device::ensure_loaded(ordinal).map(|_| ()))?;
    Ok(())
}

#[pyfunction]
fn kernels_loaded(ordinal: u32) -> bool {
    device::loaded(ordinal).is_ok()
}

/// Kernels b12x has enqueued in this process (``b12x bench host`` reads how
/// many one call makes).
#[pyfunction]
fn _launch_count() -> u64 {
    b12x_cuda::launch::launches()
}

/// Enqueues ``count`` launches of an empty kernel on torch's current stream
/// of ``ordinal`` (kernels loaded there): the host floor of ``count`` launches.
#[pyfunction]
fn _bare_launches(py: Python<'_>, ordinal: u32, count: u32) -> PyB12xResult<()> {
    let stream = crate::torch_stream::current_stream(py, ordinal)?;
    // SAFETY: torch's current stream of `ordinal` is live.
    unsafe { b12x_cuda::probe::launch_empty(ordinal, stream, count)? };
    Ok(())
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(build_info, m)?)?;
    m.add_function(wrap_pyfunction!(driver_present, m)?)?;
    m.add_function(wrap_pyfunction!(driver_version, m)?)?;
    m.add_function(wrap_pyfunction!(device_count, m)?)?;
    m.add_function(wrap_pyfunction!(device_info, m)?)?;
    m.add_function(wrap_pyfunction!(can_access_peer, m)?)?;
    m.add_function(wrap_pyfunction!(load_kernels, m)?)?;
    m.add_function(wrap_pyfunction!(kernels_loaded, m)?)?;
    m.add_function(wrap_pyfunction!(_launch_count, m)?)?;
    m.add_function(wrap_pyfunction!(_bare_launches, m)?)?;
    m.add("MIN_COMPUTE_CAPABILITY", b12x_cuda::ptx::BASELINE_MIN_COMPUTE_CAPABILITY)?;
    Ok(())
}
