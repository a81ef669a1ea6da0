//! `Binding`: one call's live tensors checked against a plan by b12x-core,
//! and `run` / `check`.

use b12x_core::indexer::{self, Operands, PageFault};
use b12x_core::{Device, Error as CoreError};
use b12x_cuda::indexer::{launch_indexer, BoundMaps};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyList, PyTuple};

use super::plan::PyPlan;
use super::SCRATCH_NAME;
use crate::error::PyB12xResult;
use crate::tensor::{extract_torch_tensor, is_torch_tensor};

/// A plan plus one call's live tensors, checked. Holds the caller's tensor
/// objects (aliases, never copies) and the launch arguments.
#[pyclass(name = "Binding", module = "b12x.attention.dsa_indexer", frozen)]
pub struct PyBinding {
    core: indexer::Binding,
    /// The CUDA launches' tensor maps, encoded at bind (none on the CPU).
    maps: BoundMaps,
    plan: Py<PyPlan>,
    #[pyo3(get)]
    scratch: Py<PyAny>,
    #[pyo3(get)]
    q_fp8: Py<PyAny>,
    #[pyo3(get)]
    query_weights: Py<PyAny>,
    #[pyo3(get)]
    index_k_cache: Py<PyAny>,
    #[pyo3(get)]
    page_table: Py<PyAny>,
    #[pyo3(get)]
    cache_lengths: Py<PyAny>,
    #[pyo3(get)]
    active_width: Py<PyAny>,
    #[pyo3(get)]
    output_indices: Py<PyAny>,
    #[pyo3(get)]
    output_scores: Option<Py<PyAny>>,
}

#[pymethods]
impl PyBinding {
    #[getter]
    fn plan(&self, py: Python<'_>) -> Py<PyPlan> {
        self.plan.clone_ref(py)
    }
    #[getter]
    fn rows(&self) -> u32 {
        self.core.rows()
    }
    #[getter]
    fn width(&self) -> u32 {
        self.core.width()
    }
    #[getter]
    fn route(&self) -> &'static str {
        self.core.plan().route().name()
    }
    /// Raises a ConfigError naming the operand when a held tensor changed in
    /// place since bind (``resize_``, ``set_``, ``.data =``), and
    /// :class:`b12x.errors.PageTableError` for the first page id at or
    /// past ``index_k_cache.shape[0]`` that a run on this binding's device met
    /// since the last check (such ids are skipped as unmapped), then clears
    /// the record. Synchronizes the device: keep it off hot paths and out of
    /// graph captures.
    fn check(&self, py: Python<'_>) -> PyB12xResult<()> {
        self.verify(py)?;
        check_device(py, self.core.plan().caps().device)
    }
    /// Address of a scratch region (scratch base + the layout offset).
    fn region_address(&self, name: &str) -> PyResult<u64> {
        let layout = self.core.plan().layout();
        layout.by_name(name).map(|r| self.core.args().scratch + r.offset).ok_or_else(|| {
            pyo3::exceptions::PyKeyError::new_err(format!("no scratch region {name:?}"))
        })
    }
    fn __repr__(&self) -> String {
        format!(
            "Binding(rows={}, width={}, scores={}, plan=Plan({}))",
            self.core.rows(),
            self.core.width(),
            self.output_scores.is_some(),
            self.core.plan()
        )
    }
}

/// The scratch tensor out of a tensor, a mapping {name: tensor} or a
/// one-element sequence (what vLLM's workspace manager returns).
fn scratch_tensor<'py>(obj: &Bound<'py, PyAny>) -> PyB12xResult<Bound<'py, PyAny>> {
    let wrong = |got: String| -> CoreError {
        CoreError::InvalidValue {
            op: "bind",
            operand: "scratch".into(),
            expected: format!(
                "a uint8 tensor, a mapping {{{SCRATCH_NAME:?}: tensor}} or a one-element sequence"
            )
            .into(),
            got,
        }
    };
    if is_torch_tensor(obj) {
        return Ok(obj.clone());
    }
    if let Ok(list) = obj.cast::<PyList>() {
        return match list.len() {
            1 => Ok(list.get_item(0)?),
            n => Err(wrong(format!("a list of {n} items")).into()),
        };
    }
    if let Ok(tuple) = obj.cast::<PyTuple>() {
        return match tuple.len() {
            1 => Ok(tuple.get_item(0)?),
            n => Err(wrong(format!("a tuple of {n} items")).into()),
        };
    }
    if let Ok(dict) = obj.cast::<PyDict>() {
        return dict.get_item(SCRATCH_NAME)?.ok_or_else(|| {
            let keys = dict.keys().repr().map(|r| r.to_string()).unwrap_or_default();
            wrong(format!("a mapping with keys {keys}")).into()
        });
    }
    Ok(obj.clone()) // any other tensor producer; extract names it if it is none
}

/// The tensors of one call, as the caller passed them.
struct Objects<'a, 'py> {
    scratch: &'a Bound<'py, PyAny>,
    q_fp8: &'a Bound<'py, PyAny>,
    query_weights: &'a Bound<'py, PyAny>,
    index_k_cache: &'a Bound<'py, PyAny>,
    page_table: &'a Bound<'py, PyAny>,
    cache_lengths: &'a Bound<'py, PyAny>,
    active_width: &'a Bound<'py, PyAny>,
    output_indices: &'a Bound<'py, PyAny>,
    output_scores: Option<&'a Bound<'py, PyAny>>,
}

/// Reads every tensor's metadata once and binds it with b12x-core.
fn bind_objects(plan: &PyPlan, o: &Objects<'_, '_>) -> PyB12xResult<indexer::Binding> {
    const OP: &str = "bind";
    // torch tensors only: the binding keeps them, CPU runs hand them to the
    // PyTorch reference and CUDA runs order on torch's stream
    let extract = extract_torch_tensor;
    let m_scratch = extract(o.scratch, OP, "scratch")?;
    let m_q = extract(o.q_fp8, OP, "q_fp8")?;
    let m_w = extract(o.query_weights, OP, "query_weights")?;
    let m_k = extract(o.index_k_cache, OP, "index_k_cache")?;
    let m_pt = extract(o.page_table, OP, "page_table")?;
    let m_lens = extract(o.cache_lengths, OP, "cache_lengths")?;
    let m_aw = extract(o.active_width, OP, "active_width")?;
    let m_oi = extract(o.output_indices, OP, "output_indices")?;
    let m_os = match o.output_scores {
        Some(t) => {
            let meta = extract(t, OP, "output_scores")?;
            // the one float output: written in place, so outside autograd
            let requires_grad = t.getattr(intern!(t.py(), "requires_grad"))?.is_truthy()?;
            indexer::check_output_grad("output_scores", requires_grad)?;
            Some(meta)
        }
        None => None,
    };
    Ok(indexer::bind(
        &plan.plan,
        &Operands {
            scratch: &m_scratch,
            q_fp8: &m_q,
            query_weights: &m_w,
            index_k_cache: &m_k,
            page_table: &m_pt,
            cache_lengths: &m_lens,
            active_width: &m_aw,
            output_indices: &m_oi,
            output_scores: m_os.as_ref(),
        },
    )?)
}

impl PyBinding {
    /// Binds the held tensors again and refuses, naming the operand, when
    /// they no longer describe what was bound (changed in place since: a
    /// `resize_`, `set_` or `.data =`), so no run reads stale addresses.
    fn verify(&self, py: Python<'_>) -> PyB12xResult<()> {
        let bind = |t: &Py<PyAny>| t.bind(py).clone();
        let (scratch, q, w, k, pt) = (
            bind(&self.scratch),
            bind(&self.q_fp8),
            bind(&self.query_weights),
            bind(&self.index_k_cache),
            bind(&self.page_table),
        );
        let (lens, aw, oi) =
            (bind(&self.cache_lengths), bind(&self.active_width), bind(&self.output_indices));
        let os = self.output_scores.as_ref().map(bind);
        let objects = Objects {
            scratch: &scratch,
            q_fp8: &q,
            query_weights: &w,
            index_k_cache: &k,
            page_table: &pt,
            cache_lengths: &lens,
            active_width: &aw,
            output_indices: &oi,
            output_scores: os.as_ref(),
        };
        let now = bind_objects(self.plan.get(), &objects)?;
        match indexer::changed_operand(self.core.args(), now.args()) {
            None => Ok(()),
            Some(operand) => Err(CoreError::InvalidValue {
                op: "run",
                operand: operand.into(),
                expected: "the tensor as bound (its storage, shape and strides unchanged; \
                           bind again after resize_, set_ or .data =)"
                    .into(),
                got: "a tensor changed in place since bind".into(),
            }
            .into()),
        }
    }
}

/// Checks the live tensors of one call against ``plan`` and returns a
/// :class:`Binding`. Never allocates, launches or syncs; reads metadata only
/// (the scratch and output bytes are left untouched) and changes nothing in
/// the plan. The binding holds the tensors: none may be resized or re-set
/// (``resize_``, ``set_``, ``.data =``) while it is run; ``Binding.check()``
/// and CPU runs verify that and name the operand that changed.
#[pyfunction]
#[pyo3(signature = (plan, *, scratch, q_fp8, query_weights, index_k_cache, page_table,
    cache_lengths, active_width, output_indices, output_scores=None))]
#[allow(clippy::too_many_arguments)]
pub(super) fn indexer_bind(
    plan: &Bound<'_, PyPlan>,
    scratch: &Bound<'_, PyAny>,
    q_fp8: &Bound<'_, PyAny>,
    query_weights: &Bound<'_, PyAny>,
    index_k_cache: &Bound<'_, PyAny>,
    page_table: &Bound<'_, PyAny>,
    cache_lengths: &Bound<'_, PyAny>,
    active_width: &Bound<'_, PyAny>,
    output_indices: &Bound<'_, PyAny>,
    output_scores: Option<&Bound<'_, PyAny>>,
) -> PyB12xResult<PyBinding> {
    let scratch = scratch_tensor(scratch)?;
    let objects = Objects {
        scratch: &scratch,
        q_fp8,
        query_weights,
        index_k_cache,
        page_table,
        cache_lengths,
        active_width,
        output_indices,
        output_scores,
    };
    let core = bind_objects(plan.get(), &objects)?;
    let maps = match plan.get().recipe.as_ref() {
        Some(recipe) => BoundMaps::encode(&core, recipe)?,
        None => BoundMaps::NONE,
    };
    Ok(PyBinding {
        core,
        maps,
        plan: plan.clone().unbind(),
        scratch: scratch.unbind(),
        q_fp8: q_fp8.clone().unbind(),
        query_weights: query_weights.clone().unbind(),
        index_k_cache: index_k_cache.clone().unbind(),
        page_table: page_table.clone().unbind(),
        cache_lengths: cache_lengths.clone().unbind(),
        active_width: active_width.clone().unbind(),
        output_indices: output_indices.clone().unbind(),
        output_scores: output_scores.map(|t| t.clone().unbind()),
    })
}

/// Runs a bound call and returns ``binding.output_indices``. CUDA bindings
/// enqueue the kernels on torch's current stream (no allocation, no sync);
/// CPU bindings run the PyTorch reference. Every output slot is written.
#[pyfunction]
pub(super) fn indexer_run(
    py: Python<'_>,
    binding: &Bound<'_, PyBinding>,
) -> PyB12xResult<Py<PyAny>> {
    let b = binding.get();
    match b.core.plan().caps().device {
        Device::Cuda(_) => run_cuda(py, b)?,
        _ => {
            b.verify(py)?; // the reference is slow anyway: refuse stale tensors by name
            run_cpu(binding)?
        }
    }
    Ok(b.output_indices.clone_ref(py))
}

fn run_cpu(binding: &Bound<'_, PyBinding>) -> PyResult<()> {
    static REFERENCE_RUN: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let py = binding.py();
    let f = REFERENCE_RUN.get_or_try_init(py, || {
        Ok::<_, PyErr>(
            py.import("b12x.attention.dsa_indexer.reference")?.getattr("run_binding")?.unbind(),
        )
    })?;
    let fault: Option<(u32, u32, i64)> = f.bind(py).call1((binding,))?.extract()?;
    if let Some((row, column, page_id)) = fault {
        let pages = binding.get().core.args().pages;
        indexer::record_host_fault(PageFault { row, column, page_id, pages });
    }
    Ok(())
}

/// Reads and clears `device`'s page-fault record; raises PageTableError when set.
fn check_device(py: Python<'_>, device: Device) -> PyB12xResult<()> {
    let fault = match device {
        Device::Cuda(ordinal) => py.detach(|| b12x_cuda::indexer::take_page_fault(ordinal))?,
        _ => indexer::take_host_fault(),
    };
    match fault {
        Some(f) => Err(CoreError::PageTable(f).into()),
        None => Ok(()),
    }
}

/// ``dsa_indexer.check(device)``: :meth:`Binding.check` for every binding of a
/// device (``None`` = the CPU).
#[pyfunction]
#[pyo3(signature = (ordinal, /))]
pub(super) fn indexer_check(py: Python<'_>, ordinal: Option<u32>) -> PyB12xResult<()> {
    check_device(py, ordinal.map_or(Device::Cpu, Device::Cuda))
}

/// Enqueues paged FP8 scoring + exact top-k for `b.core` on torch's current
/// stream of the binding's device: no allocation, no sync, grids from static
/// shapes only.
fn run_cuda(py: Python<'_>, b: &PyBinding) -> PyB12xResult<()> {
    let args = b.core.args();
    let Some(recipe) = b.plan.get().recipe.as_ref() else {
        return Err(CoreError::Device {
            op: "run",
            operand: "binding".into(),
            expected: Device::Cuda(args.device),
            got: Device::Cpu,
        }
        .into());
    };
    let stream = crate::torch_stream::current_stream(py, args.device)?;
    // SAFETY: bind checked every operand against the plan (dtype, shape,
    // strides, device, extent, disjointness) and carved the scratch regions
    // from a buffer of at least plan.nbytes(); the binding holds the tensors,
    // and the stream is torch's current stream of that device.
    // An empty call enqueues nothing (launch_indexer).
    unsafe { launch_indexer(&b.core, recipe, &b.maps, stream)? };
    Ok(())
}
