//! Python classes of `b12x.attention.dsa_indexer`, by concern: [`caps`]
//! (`Caps`), [`plan`] (`Plan`, its layout views, the interned `plan`) and
//! [`binding`] (`Binding`, `bind`, `run`, `check`). Conversions only: the
//! rules live in b12x-core (`indexer`) and b12x-cuda.
//!
//! Plans are interned by bucketed caps in a lock-free cache, so equal caps
//! give the same Python object; a hit is one atomic load and a hash probe.
//! The classes carry `module = "b12x.attention.dsa_indexer"` (their public
//! home) and are registered in `_core` under `Indexer*` names.

mod binding;
mod caps;
mod plan;

use b12x_core::indexer::{self, MmaFlavor};
use b12x_core::{DType, Device};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

/// Name of the one scratch buffer a plan asks for.
const SCRATCH_NAME: &str = "paged_indexer.scratch";

fn torch<'py>(py: Python<'py>) -> PyResult<Bound<'py, PyModule>> {
    py.import(intern!(py, "torch"))
}

fn torch_device(py: Python<'_>, device: Device) -> PyResult<Py<PyAny>> {
    let torch = torch(py)?;
    let dev = match device {
        Device::Cuda(i) => torch.getattr("device")?.call1(("cuda", i))?,
        _ => torch.getattr("device")?.call1(("cpu",))?,
    };
    Ok(dev.unbind())
}

fn torch_dtype(py: Python<'_>, dtype: DType) -> PyResult<Py<PyAny>> {
    Ok(torch(py)?.getattr(dtype.name())?.unbind())
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("IndexerCaps", py.get_type::<caps::PyCaps>())?;
    m.add("IndexerPlan", py.get_type::<plan::PyPlan>())?;
    m.add("IndexerBinding", py.get_type::<binding::PyBinding>())?;
    m.add("IndexerScratchSpec", py.get_type::<plan::PyScratchSpec>())?;
    m.add("IndexerScratchLayout", py.get_type::<plan::PyLayout>())?;
    m.add("IndexerScratchRegion", py.get_type::<plan::PyRegion>())?;
    m.add("INDEXER_SCRATCH_NAME", SCRATCH_NAME)?;
    // The page and top-k facts, from their one home (b12x_core::indexer).
    m.add("INDEXER_PAGE_SIZE", indexer::PAGE_SIZE)?;
    m.add("INDEXER_HEAD_DIM", indexer::HEAD_DIM)?;
    m.add("INDEXER_PAGE_BYTES", indexer::PAGE_BYTES)?;
    m.add("INDEXER_ROW_BYTES", indexer::PAGE_BYTES / u64::from(indexer::PAGE_SIZE))?;
    m.add("INDEXER_PREFILL_ROUTE", indexer::Route::SharedPrefill.name())?;
    m.add("INDEXER_SCALE_OFFSET", indexer::SCALE_OFFSET)?;
    m.add("INDEXER_MAX_HEADS", indexer::MAX_HEADS)?;
    m.add("INDEXER_SUPPORTED_TOPK", PyTuple::new(py, indexer::SUPPORTED_TOPK)?)?;
    m.add("INDEXER_MMA_FLAVORS", PyTuple::new(py, MmaFlavor::ALL.map(MmaFlavor::name))?)?;
    m.add_function(wrap_pyfunction!(plan::indexer_plan, m)?)?;
    m.add_function(wrap_pyfunction!(plan::indexer_build_plan, m)?)?;
    m.add_function(wrap_pyfunction!(plan::indexer_plan_count, m)?)?;
    m.add_function(wrap_pyfunction!(plan::indexer_clear_plans, m)?)?;
    m.add_function(wrap_pyfunction!(binding::indexer_bind, m)?)?;
    m.add_function(wrap_pyfunction!(binding::indexer_run, m)?)?;
    m.add_function(wrap_pyfunction!(binding::indexer_check, m)?)?;
    Ok(())
}
