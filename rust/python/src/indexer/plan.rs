//! `Plan` and its layout views, and the interned `plan` / uncached `build_plan`.

use std::sync::{Arc, LazyLock};

use b12x_core::indexer::{
    Caps, DeviceFacts, InternCache, MmaFlavor, Mode, Plan, PlanOptions, Region, Stages,
};
use b12x_core::{DType, Device, Error as CoreError};
use b12x_cuda::indexer::LaunchRecipe;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};
use pyo3::IntoPyObjectExt;

use super::caps::PyCaps;
use super::{torch_dtype, SCRATCH_NAME};
use crate::error::PyB12xResult;

static PLANS: LazyLock<InternCache<Caps, Py<PyPlan>>> = LazyLock::new(InternCache::new);

/// One scratch buffer a plan needs: ``name``, ``shape`` = (nbytes,),
/// ``dtype`` = torch.uint8, ``device``.
#[pyclass(name = "ScratchSpec", module = "b12x.attention.dsa_indexer", frozen)]
pub struct PyScratchSpec {
    #[pyo3(get)]
    name: &'static str,
    #[pyo3(get)]
    nbytes: u64,
    dtype: Py<PyAny>,
    device: Py<PyAny>,
}

#[pymethods]
impl PyScratchSpec {
    #[getter]
    fn shape(&self) -> (u64,) {
        (self.nbytes,)
    }
    #[getter]
    fn dtype(&self, py: Python<'_>) -> Py<PyAny> {
        self.dtype.clone_ref(py)
    }
    #[getter]
    fn device(&self, py: Python<'_>) -> Py<PyAny> {
        self.device.clone_ref(py)
    }
    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "ScratchSpec(name={:?}, shape=({},), dtype=torch.uint8, device={})",
            self.name,
            self.nbytes,
            self.device.bind(py)
        )
    }
}

/// A typed view of the scratch: ``offset`` bytes from its base, ``dtype``,
/// ``shape``; every offset is a multiple of 1024.
#[pyclass(name = "ScratchRegion", module = "b12x.attention.dsa_indexer", frozen)]
pub struct PyRegion {
    #[pyo3(get)]
    name: &'static str,
    #[pyo3(get)]
    offset: u64,
    #[pyo3(get)]
    nbytes: u64,
    #[pyo3(get)]
    numel: u64,
    dtype: Py<PyAny>,
    shape: Vec<u64>,
}

#[pymethods]
impl PyRegion {
    #[getter]
    fn dtype(&self, py: Python<'_>) -> Py<PyAny> {
        self.dtype.clone_ref(py)
    }
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.shape)
    }
    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "ScratchRegion(name={:?}, offset={}, dtype={}, shape={:?}, nbytes={})",
            self.name,
            self.offset,
            self.dtype.bind(py),
            self.shape,
            self.nbytes
        )
    }
}

fn region_obj(py: Python<'_>, r: &Region) -> PyResult<Py<PyRegion>> {
    Py::new(
        py,
        PyRegion {
            name: r.name,
            offset: r.offset,
            nbytes: r.nbytes,
            numel: r.numel(),
            dtype: torch_dtype(py, r.dtype)?,
            shape: r.shape.to_vec(),
        },
    )
}

/// The plan's scratch layout: a read-only mapping from region name to
/// :class:`ScratchRegion`, plus ``nbytes`` and the plan facts the vLLM
/// adapter looks up on a layout (``route``, ``supertile_tokens``, ``max_chunks``).
#[pyclass(name = "ScratchLayout", module = "b12x.attention.dsa_indexer", frozen, mapping)]
pub struct PyLayout {
    plan: Arc<Plan>,
    regions: Py<PyTuple>,
}

impl PyLayout {
    fn find<'py>(&self, py: Python<'py>, name: &str) -> Option<Bound<'py, PyAny>> {
        let i = self.plan.layout().regions().iter().position(|r| r.name == name)?;
        self.regions.bind(py).get_item(i).ok()
    }

    fn names<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.plan.layout().regions().iter().map(|r| r.name))
    }
}

#[pymethods]
impl PyLayout {
    #[getter]
    fn nbytes(&self) -> u64 {
        self.plan.nbytes()
    }
    #[getter]
    fn route(&self) -> &'static str {
        self.plan.route().name()
    }
    #[getter]
    fn supertile_tokens(&self) -> u32 {
        self.plan.supertile()
    }
    #[getter]
    fn max_chunks(&self) -> u32 {
        self.plan.max_chunks()
    }
    /// The regions in layout order.
    #[getter]
    fn regions(&self, py: Python<'_>) -> Py<PyTuple> {
        self.regions.clone_ref(py)
    }
    fn __getitem__<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
        self.find(py, name).ok_or_else(|| {
            pyo3::exceptions::PyKeyError::new_err(format!(
                "no scratch region {name:?}; regions: {:?}",
                self.plan.layout().regions().iter().map(|r| r.name).collect::<Vec<_>>()
            ))
        })
    }
    #[pyo3(signature = (name, default=None))]
    fn get<'py>(
        &self,
        py: Python<'py>,
        name: &str,
        default: Option<Bound<'py, PyAny>>,
    ) -> Option<Bound<'py, PyAny>> {
        self.find(py, name).or(default)
    }
    fn __contains__(&self, name: &str) -> bool {
        self.plan.layout().by_name(name).is_some()
    }
    fn __len__(&self) -> usize {
        self.plan.layout().regions().len()
    }
    fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.names(py)?.into_any().try_iter().map(Bound::into_any)
    }
    fn keys<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        self.names(py)
    }
    fn values(&self, py: Python<'_>) -> Py<PyTuple> {
        self.regions.clone_ref(py)
    }
    fn items<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let regions = self.regions.bind(py);
        let names = self.names(py)?;
        PyList::new(py, names.iter().zip(regions.iter()))
    }
    fn __repr__(&self) -> String {
        let parts: Vec<String> = self
            .plan
            .layout()
            .regions()
            .iter()
            .map(|r| format!("{}@{}:{}{:?}", r.name, r.offset, r.dtype, r.shape.as_slice()))
            .collect();
        format!("ScratchLayout(nbytes={}, {})", self.plan.nbytes(), parts.join(", "))
    }
}

/// An immutable plan: route, MMA flavor, chunking and scratch layout,
/// resolved once for a :class:`Caps` rounded up to its buckets. Holds no tensors and no
/// addresses; one plan serves every call whose rows and page-table width fit
/// its capacities. Made by :func:`plan` (interned: equal caps, same object).
#[pyclass(name = "Plan", module = "b12x.attention.dsa_indexer", frozen)]
pub struct PyPlan {
    pub(super) plan: Arc<Plan>,
    /// What a run launches (None on the CPU), resolved here, not per call.
    pub(super) recipe: Option<LaunchRecipe>,
    caps: Py<PyCaps>,
    layout: Py<PyLayout>,
    specs: Py<PyTuple>,
    shapes: Py<PyTuple>,
}

#[pymethods]
impl PyPlan {
    /// The plan's caps: ``max_q_rows`` and ``max_page_table_width`` are its
    /// (bucketed) capacities.
    #[getter]
    fn caps(&self, py: Python<'_>) -> Py<PyCaps> {
        self.caps.clone_ref(py)
    }
    #[getter]
    fn device(&self, py: Python<'_>) -> Py<PyAny> {
        self.caps.get().device.clone_ref(py)
    }
    #[getter]
    fn route(&self) -> &'static str {
        self.plan.route().name()
    }
    #[getter]
    fn mode(&self) -> &'static str {
        self.plan.caps().mode.name()
    }
    #[getter]
    fn shared_page_table(&self) -> bool {
        self.plan.caps().mode == Mode::Prefill
    }
    #[getter]
    fn output_index_space(&self) -> &'static str {
        self.plan.caps().index_space.name()
    }
    #[getter]
    fn num_q_heads(&self) -> u32 {
        self.plan.caps().num_q_heads
    }
    #[getter]
    fn heads_padded(&self) -> u32 {
        self.plan.heads_padded()
    }
    #[getter]
    fn topk(&self) -> u32 {
        self.plan.caps().topk
    }
    #[getter]
    fn max_q_rows(&self) -> u32 {
        self.plan.rows_capacity()
    }
    #[getter]
    fn max_page_table_width(&self) -> u32 {
        self.plan.width_capacity()
    }
    #[getter]
    fn supertile_tokens(&self) -> u32 {
        self.plan.supertile()
    }
    #[getter]
    fn max_chunks(&self) -> u32 {
        self.plan.max_chunks()
    }
    #[getter]
    fn multiprocessors(&self) -> u32 {
        self.plan.multiprocessors()
    }
    /// "exact" or "fast" (see :class:`Caps`).
    #[getter]
    fn precision(&self) -> &'static str {
        self.plan.caps().precision.name()
    }
    /// The scorers' MMA flavor, resolved from the device and the precision:
    /// "e4m3", "f16", "wgmma" / "tma_f16" (exact; sm_90) or "wgmma_fp8" /
    /// "tma_fp8" (fast, sm_90) on a GPU
    /// (see ``b12x_core::indexer::MmaFlavor``), "reference" on the CPU.
    #[getter]
    fn mma_flavor(&self) -> &'static str {
        self.plan.mma_flavor().map_or("reference", MmaFlavor::name)
    }
    /// Slices of the two-stage top-k (1: one CTA per row reads each chunk).
    #[getter]
    fn topk_slices(&self) -> u32 {
        self.plan.topk_slices()
    }
    /// True for a benchmark plan that runs the top-k stage only.
    #[getter]
    fn topk_only(&self) -> bool {
        self.plan.stages() == Stages::TopkOnly
    }
    /// True for a benchmark plan that runs the scorer only (logits into the
    /// scratch; the outputs are not written).
    #[getter]
    fn score_only(&self) -> bool {
        self.plan.stages() == Stages::ScoreOnly
    }
    #[getter]
    fn nbytes(&self) -> u64 {
        self.plan.nbytes()
    }
    #[getter]
    fn layout(&self, py: Python<'_>) -> Py<PyLayout> {
        self.layout.clone_ref(py)
    }
    /// ``(ScratchSpec("paged_indexer.scratch", (nbytes,), torch.uint8, device),)``
    fn scratch_specs(&self, py: Python<'_>) -> Py<PyTuple> {
        self.specs.clone_ref(py)
    }
    /// ``(((nbytes,), torch.uint8),)``, the form vLLM's workspace manager takes.
    fn shapes_and_dtypes(&self, py: Python<'_>) -> Py<PyTuple> {
        self.shapes.clone_ref(py)
    }
    fn __repr__(&self) -> String {
        format!("Plan({})", self.plan)
    }
}

fn build_plan(py: Python<'_>, caps: &PyCaps, options: &PlanOptions) -> PyB12xResult<Py<PyPlan>> {
    // Modules load here, never in run: the driver's JIT stays out of hot calls.
    let facts = match caps.caps.device {
        Device::Cuda(ordinal) => {
            let m = py.detach(|| b12x_cuda::ensure_loaded(ordinal))?;
            DeviceFacts {
                multiprocessors: m.multiprocessors,
                compute_capability: m.compute_capability,
            }
        }
        _ => DeviceFacts::CPU,
    };
    let plan = Arc::new(Plan::with_options(&caps.caps, &facts, options)?);
    if let (Some(forced), Device::Cuda(ordinal)) = (options.mma_flavor, caps.caps.device) {
        b12x_cuda::flavor::require_flavor(ordinal, forced)?;
    }
    let device = caps.device.clone_ref(py);
    let uint8 = torch_dtype(py, DType::U8)?;
    let bucketed = PyCaps { caps: *plan.caps(), key: *plan.caps(), device: device.clone_ref(py) };
    let regions =
        plan.layout().regions().iter().map(|r| region_obj(py, r)).collect::<PyResult<Vec<_>>>()?;
    let spec = PyScratchSpec {
        name: SCRATCH_NAME,
        nbytes: plan.nbytes(),
        dtype: uint8.clone_ref(py),
        device: device.clone_ref(py),
    };
    let shapes = ((plan.nbytes(),), uint8);
    let out = PyPlan {
        caps: Py::new(py, bucketed)?,
        layout: Py::new(
            py,
            PyLayout { plan: plan.clone(), regions: PyTuple::new(py, regions)?.unbind() },
        )?,
        specs: PyTuple::new(py, [Py::new(py, spec)?])?.unbind(),
        shapes: PyTuple::new(py, [shapes.into_py_any(py)?])?.unbind(),
        recipe: if plan.caps().device.is_cuda() { Some(LaunchRecipe::new(&plan)?) } else { None },
        plan,
    };
    Ok(Py::new(py, out)?)
}

/// The interned plan for ``caps``: equal caps return the same object, from a
/// lock-free cache (a hit is one atomic load and a hash probe).
///
/// Rows and page-table width are rounded up to buckets first (exact up to 8,
/// then the next m*2^k with m in {4, 5, 6, 7}: at most 25% more, powers of
/// two exact), so a plan for capacity C serves every call <= C and varying
/// live sizes make O(log) plans. On a CUDA device the first plan loads
/// b12x's kernels there (the GIL is released meanwhile); nothing is cached
/// when that fails.
#[pyfunction]
pub(super) fn indexer_plan(py: Python<'_>, caps: &Bound<'_, PyCaps>) -> PyB12xResult<Py<PyPlan>> {
    let caps = caps.get();
    if let Some(hit) = PLANS.with(&caps.key, |p| p.clone_ref(py)) {
        return Ok(hit);
    }
    let built = build_plan(py, caps, &PlanOptions::default())?;
    Ok(PLANS.insert_if_absent(caps.key, built).clone_ref(py))
}

/// A new, uncached plan every call (for benchmarks and tests), optionally
/// with the scorers' MMA flavor forced to ``mma_flavor`` (one the device
/// runs, e.g. "e4m3" on an sm_90 to cover the kernels other devices use),
/// or running one stage alone: the top-k (``topk_only``: on the logits a
/// full run left in the scratch) or the scorer (``score_only``: logits into
/// the scratch, outputs unwritten), the benchmark's stage arms.
#[pyfunction]
#[pyo3(signature = (caps, /, *, mma_flavor=None, topk_only=false, score_only=false))]
pub(super) fn indexer_build_plan(
    py: Python<'_>,
    caps: &Bound<'_, PyCaps>,
    mma_flavor: Option<&str>,
    topk_only: bool,
    score_only: bool,
) -> PyB12xResult<Py<PyPlan>> {
    let mma_flavor = mma_flavor.map(MmaFlavor::parse).transpose()?;
    let stages = match (topk_only, score_only) {
        (false, false) => Stages::All,
        (true, false) => Stages::TopkOnly,
        (false, true) => Stages::ScoreOnly,
        (true, true) => {
            return Err(CoreError::InvalidValue {
                op: "plan",
                operand: "topk_only, score_only".into(),
                expected: "at most one of them".into(),
                got: "both".into(),
            }
            .into())
        }
    };
    build_plan(py, caps.get(), &PlanOptions { mma_flavor, stages })
}

#[pyfunction]
pub(super) fn indexer_plan_count() -> usize {
    PLANS.len()
}

#[pyfunction]
pub(super) fn indexer_clear_plans() {
    PLANS.clear();
}
