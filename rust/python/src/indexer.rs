//! Python classes of `b12x.attention.dsa_indexer`: `Caps`, `Plan`,
//! `Binding`, the layout views, and the `plan` / `bind` / `run` functions.
//!
//! Plans are interned by bucketed caps in a lock-free cache, so equal caps
//! give the same Python object; a hit is one atomic load and a hash probe.
//! The classes carry `module = "b12x.attention.dsa_indexer"` (their public
//! home) and are registered in `_core` under `Indexer*` names.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, LazyLock, Mutex};

use b12x_core::indexer::{
    self, Caps, CapsRequest, DeviceFacts, IndexSpace, InternCache, MmaFlavor, Mode, Operands,
    PageFault, Plan, PlanOptions, Precision, Region, Stages, PAGE_SIZE,
};
use b12x_core::{DType, Device, Error as CoreError};
use b12x_cuda::indexer::{available_flavors, launch_indexer, LaunchRecipe};
use pyo3::exceptions::PyOverflowError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyDict, PyInt, PyList, PyString, PyTuple, PyType};
use pyo3::{intern, IntoPyObjectExt};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::error::{exc, PyB12xResult};
use crate::tensor::{extract_torch_tensor, is_torch_tensor, short_repr};

/// Name of the one scratch buffer a plan asks for.
const SCRATCH_NAME: &str = "paged_indexer.scratch";

static PLANS: LazyLock<InternCache<Caps, Py<PyPlan>>> = LazyLock::new(InternCache::new);

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

fn caps_invalid(field: &'static str, expected: &'static str, got: String) -> CoreError {
    CoreError::InvalidValue { op: "Caps", operand: field.into(), expected: expected.into(), got }
}

fn bad_device(obj: &Bound<'_, PyAny>, why: String) -> CoreError {
    let got = short_repr(obj);
    caps_invalid(
        "device",
        "a torch.device, 'cpu', 'cuda', 'cuda:N' or a CUDA ordinal",
        if why.is_empty() { got } else { format!("{got} ({why})") },
    )
}

/// torch.device, for identity checks.
fn torch_device_type(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    static TYPE: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    TYPE.import(py, "torch", "device")
}

/// CUDA devices torch sees, once it has seen one (the count of a process is
/// fixed when CUDA initialises); zero is asked again.
static CUDA_DEVICES: AtomicU32 = AtomicU32::new(0);

/// `ordinal` names a CUDA device this process can use.
fn check_cuda_exists(py: Python<'_>, ordinal: u32, got: &str) -> PyB12xResult<()> {
    if ordinal < CUDA_DEVICES.load(Ordering::Relaxed) {
        return Ok(());
    }
    let count = torch(py)?.getattr("cuda")?.call_method0("device_count");
    let count: u32 = count.and_then(|c| c.extract()).unwrap_or(0);
    CUDA_DEVICES.fetch_max(count, Ordering::Relaxed);
    if ordinal < count {
        return Ok(());
    }
    Err(CoreError::InvalidValue {
        op: "Caps",
        operand: "device".into(),
        expected: format!("a CUDA device torch can see (torch.cuda.device_count() is {count})")
            .into(),
        got: got.to_string(),
    }
    .into())
}

/// A checked CUDA ordinal as (Device, torch.device); `reuse` is the caller's
/// own torch.device for it, if it passed one.
fn cuda_device(
    py: Python<'_>,
    ordinal: i64,
    got: &str,
    reuse: Option<&Bound<'_, PyAny>>,
) -> PyB12xResult<(Device, Py<PyAny>)> {
    let i = indexer::cuda_ordinal(ordinal)?;
    check_cuda_exists(py, i, got)?;
    let obj = match reuse {
        Some(dev) => dev.clone().unbind(),
        None => torch_device(py, Device::Cuda(i))?,
    };
    Ok((Device::Cuda(i), obj))
}

/// A torch.device, a device string or a CUDA ordinal -> (Device, torch.device).
/// A bare "cuda" means torch's current device. Ordinals are checked before
/// torch sees them (`torch.device("cuda:300")` is cuda:44) and against the
/// devices torch can see; bools are not ordinals.
fn parse_device(obj: &Bound<'_, PyAny>) -> PyB12xResult<(Device, Py<PyAny>)> {
    let py = obj.py();
    if obj.is_instance_of::<PyBool>() {
        return Err(bad_device(obj, "a bool is not a device".into()).into());
    }
    if let Ok(text) = obj.cast::<PyString>() {
        let text = text.to_cow()?;
        if let Some(digits) = text.strip_prefix("cuda:") {
            if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
                let ordinal = digits.parse::<i64>().unwrap_or(i64::MAX);
                return cuda_device(py, ordinal, &format!("{text:?}"), None);
            }
        }
    } else if obj.is_instance_of::<PyInt>() {
        let ordinal =
            obj.extract::<i64>().map_err(|_| bad_device(obj, "not a CUDA ordinal".into()))?;
        return cuda_device(py, ordinal, &ordinal.to_string(), None);
    }
    let given = obj.is_instance(torch_device_type(py)?)?;
    let dev = if given {
        obj.clone()
    } else {
        torch(py)?
            .getattr("device")?
            .call1((obj,))
            .map_err(|e| bad_device(obj, e.value(py).to_string()))?
    };
    let kind: String = dev.getattr(intern!(py, "type"))?.extract()?;
    match kind.as_str() {
        "cpu" => Ok((Device::Cpu, torch_device(py, Device::Cpu)?)),
        "cuda" => {
            // a torch.device reads as torch prints it ("cuda:3"), anything else by repr
            let got = if given { dev.str()?.to_string() } else { short_repr(obj) };
            match dev.getattr(intern!(py, "index"))?.extract::<Option<i64>>()? {
                Some(i) => cuda_device(py, i, &got, given.then_some(&dev)),
                None => {
                    // torch's current device; asking it needs a device to exist
                    check_cuda_exists(py, 0, &got)?;
                    let current = torch(py)?.getattr("cuda")?.call_method0("current_device");
                    let i = current
                        .and_then(|c| c.extract::<i64>())
                        .map_err(|e| bad_device(obj, e.value(py).to_string()))?;
                    cuda_device(py, i, &got, None)
                }
            }
        }
        other => Err(bad_device(obj, format!("b12x runs on cpu and cuda, not {other}")).into()),
    }
}

/// A `Caps` integer field: an int (or integer-like, e.g. numpy.int64), never
/// a bool or a float. A value past int64 keeps its text (`huge`) so that the
/// field's range error can quote it.
struct IntArg {
    field: &'static str,
    value: i64,
    huge: Option<String>,
}

fn int_arg(field: &'static str, obj: &Bound<'_, PyAny>) -> PyB12xResult<IntArg> {
    let not_int = || caps_invalid(field, "an integer", short_repr(obj));
    if obj.is_instance_of::<PyBool>() {
        return Err(not_int().into());
    }
    match obj.extract::<i64>() {
        Ok(value) => Ok(IntArg { field, value, huge: None }),
        Err(e) if e.is_instance_of::<PyOverflowError>(obj.py()) => {
            let negative = obj.lt(0).unwrap_or(false);
            let value = if negative { i64::MIN } else { i64::MAX };
            Ok(IntArg { field, value, huge: Some(short_repr(obj)) })
        }
        Err(_) => Err(not_int().into()),
    }
}

fn str_arg(field: &'static str, obj: &Bound<'_, PyAny>) -> PyB12xResult<String> {
    match obj.cast::<PyString>() {
        Ok(s) => Ok(s.to_cow()?.into_owned()),
        Err(_) => Err(caps_invalid(field, "a string", short_repr(obj)).into()),
    }
}

/// A field's range error quotes the caller's own text for values past int64.
fn quote_huge(e: CoreError, args: &[IntArg]) -> CoreError {
    match e {
        CoreError::InvalidValue { op, operand, expected, got } => {
            let huge = args.iter().find(|a| a.field == operand).and_then(|a| a.huge.clone());
            CoreError::InvalidValue { op, operand, expected, got: huge.unwrap_or(got) }
        }
        other => other,
    }
}

/// What a plan is made for: device, query geometry, page-table capacity,
/// top-k, serving mode and output index space. Frozen, hashable,
/// keyword-only. Validated here, with one precise error per field.
///
/// Capacities are in query rows and in pages of 64 compressed K rows (C4:
/// one K row per four model tokens). ``topk`` must be 512, 1024 or 2048;
/// ``num_q_heads`` 1..64; ``mode`` "decode" (one page-table row per query
/// row) or "prefill" (one request's row shared by every query row);
/// ``output_index_space`` "logical" (request-relative position) or
/// "physical" (page_id*64 + slot); ``supertile_tokens`` 0 picks
/// min(32768, width*64 rounded up to 512) K rows per chunk.
///
/// Integer fields take ints (numpy integers too), never bools or floats; an
/// omitted or ``None`` optional field takes its default. ``device`` is a
/// torch.device, "cpu", "cuda" (torch's current device), "cuda:N" or an
/// ordinal N, and a CUDA device must be one torch can see (N <= 127). Every
/// refusal is a ``ConfigError`` naming the field.
///
/// ``precision`` "exact" (the default): fp32 accumulation of exact FP8
/// products, the same logits on every architecture. "fast": a device may use
/// a faster MMA with reduced-precision accumulation (Hopper: FP8 wgmma,
/// ``Plan.mma_flavor == "tma_fp8"``); every logit stays within 1e-3 of the
/// exact one relative to its magnitude, ``scale * sum_h |w_h| * |q_h . k|``
/// (1e-3 relative to the logit itself when no term is negative), and the
/// selected set equals the exact one's except for indices whose logit lies
/// within that tolerance of the k-th value. Where the hardware has no faster
/// path, "fast" runs the exact flavor.
#[pyclass(name = "Caps", module = "b12x.attention.dsa_indexer", frozen)]
pub struct PyCaps {
    caps: Caps,
    /// The plan key (rows and width rounded up to their buckets).
    key: Caps,
    device: Py<PyAny>,
}

#[pymethods]
impl PyCaps {
    #[new]
    #[pyo3(signature = (*, device, num_q_heads, max_q_rows, max_page_table_width, topk,
        mode=None, output_index_space=None, page_size=None, supertile_tokens=None,
        precision=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        device: &Bound<'_, PyAny>,
        num_q_heads: &Bound<'_, PyAny>,
        max_q_rows: &Bound<'_, PyAny>,
        max_page_table_width: &Bound<'_, PyAny>,
        topk: &Bound<'_, PyAny>,
        mode: Option<&Bound<'_, PyAny>>,
        output_index_space: Option<&Bound<'_, PyAny>>,
        page_size: Option<&Bound<'_, PyAny>>,
        supertile_tokens: Option<&Bound<'_, PyAny>>,
        precision: Option<&Bound<'_, PyAny>>,
    ) -> PyB12xResult<Self> {
        let or = |arg: Option<&Bound<'_, PyAny>>, field, default| match arg {
            Some(obj) => int_arg(field, obj),
            None => Ok(IntArg { field, value: default, huge: None }),
        };
        let ints = [
            int_arg("num_q_heads", num_q_heads)?,
            int_arg("max_q_rows", max_q_rows)?,
            int_arg("max_page_table_width", max_page_table_width)?,
            int_arg("topk", topk)?,
            or(page_size, "page_size", PAGE_SIZE as i64)?,
            or(supertile_tokens, "supertile_tokens", 0)?,
        ];
        let mode = match mode {
            Some(m) => Mode::parse(&str_arg("mode", m)?)?,
            None => Mode::Decode,
        };
        let index_space = match output_index_space {
            Some(s) => IndexSpace::parse(&str_arg("output_index_space", s)?)?,
            None => IndexSpace::Logical,
        };
        let precision = match precision {
            Some(p) => Precision::parse(&str_arg("precision", p)?)?,
            None => Precision::Exact,
        };
        let (dev, device_obj) = parse_device(device)?;
        let [heads, rows, width, topk, page_size, supertile] = &ints;
        let caps = Caps::new(&CapsRequest {
            device: dev,
            num_q_heads: heads.value,
            max_q_rows: rows.value,
            max_page_table_width: width.value,
            topk: topk.value,
            mode,
            index_space,
            page_size: page_size.value,
            supertile_tokens: supertile.value,
            precision,
        })
        .map_err(|e| quote_huge(e, &ints))?;
        Ok(PyCaps { caps, key: caps.bucketed(), device: device_obj })
    }

    #[getter]
    fn device(&self, py: Python<'_>) -> Py<PyAny> {
        self.device.clone_ref(py)
    }
    #[getter]
    fn num_q_heads(&self) -> u32 {
        self.caps.num_q_heads
    }
    #[getter]
    fn max_q_rows(&self) -> u32 {
        self.caps.max_q_rows
    }
    #[getter]
    fn max_page_table_width(&self) -> u32 {
        self.caps.max_page_table_width
    }
    #[getter]
    fn topk(&self) -> u32 {
        self.caps.topk
    }
    #[getter]
    fn mode(&self) -> &'static str {
        self.caps.mode.name()
    }
    #[getter]
    fn output_index_space(&self) -> &'static str {
        self.caps.index_space.name()
    }
    #[getter]
    fn page_size(&self) -> u32 {
        self.caps.page_size
    }
    #[getter]
    fn supertile_tokens(&self) -> u32 {
        self.caps.supertile_tokens
    }
    #[getter]
    fn precision(&self) -> &'static str {
        self.caps.precision.name()
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other.cast::<PyCaps>().is_ok_and(|o| o.get().caps == self.caps)
    }

    fn __hash__(&self) -> u64 {
        let mut h = DefaultHasher::new();
        self.caps.hash(&mut h);
        h.finish()
    }

    fn __repr__(&self) -> String {
        format!("Caps({})", self.caps)
    }
}

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
    plan: Arc<Plan>,
    /// What a run launches (None on the CPU), resolved here, not per call.
    recipe: Option<LaunchRecipe>,
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
    /// "e4m3", "f16", "wgmma" (exact) or "wgmma_fp8" / "tma_fp8" (fast, sm_90) on a GPU
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
        let runs = available_flavors(ordinal)?;
        if !runs.contains(&forced) {
            let names: Vec<&str> = runs.iter().map(|f| f.name()).collect();
            let (major, minor) = facts.compute_capability;
            return Err(CoreError::InvalidValue {
                op: "plan",
                operand: "mma_flavor".into(),
                expected: format!(
                    "one of the flavors cuda:{ordinal} (sm_{major}{minor}) runs: {}",
                    names.join(", ")
                )
                .into(),
                got: format!("{:?}", forced.name()),
            }
            .into());
        }
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
fn indexer_plan(py: Python<'_>, caps: &Bound<'_, PyCaps>) -> PyB12xResult<Py<PyPlan>> {
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
fn indexer_build_plan(
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
fn indexer_plan_count() -> usize {
    PLANS.len()
}

#[pyfunction]
fn indexer_clear_plans() {
    PLANS.clear();
}

/// A plan plus one call's live tensors, checked. Holds the caller's tensor
/// objects (aliases, never copies) and the launch arguments.
#[pyclass(name = "Binding", module = "b12x.attention.dsa_indexer", frozen)]
pub struct PyBinding {
    core: indexer::Binding,
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
    /// The plain values a launcher receives (addresses as ints).
    fn launch_args<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let a = self.core.args();
        let d = PyDict::new(py);
        for (k, v) in [
            ("device", a.device as u64),
            ("rows", a.rows as u64),
            ("heads", a.heads as u64),
            ("width", a.width as u64),
            ("topk", a.topk as u64),
            ("q", a.q),
            ("weights", a.weights),
            ("kcache", a.kcache),
            ("page_stride", a.page_stride),
            ("page_table", a.page_table),
            ("page_table_row_stride", a.page_table_row_stride),
            ("lengths", a.lengths),
            ("active_width", a.active_width),
            ("out_indices", a.out_indices),
            ("out_scores", a.out_scores),
            ("scratch", a.scratch),
            ("pages", a.pages),
        ] {
            d.set_item(k, v)?;
        }
        Ok(d)
    }
    /// Raises :class:`b12x.errors.PageTableError` for the first page id at or
    /// past ``index_k_cache.shape[0]`` that a run on this binding's device met
    /// since the last check (such ids are skipped as unmapped), then clears
    /// the record. Synchronizes the device: keep it off hot paths and out of
    /// graph captures.
    fn check(&self, py: Python<'_>) -> PyB12xResult<()> {
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

/// Checks the live tensors of one call against ``plan`` and returns a
/// :class:`Binding`. Never allocates, launches or syncs; reads metadata only
/// (the scratch and output bytes are left untouched) and changes nothing in
/// the plan.
#[pyfunction]
#[pyo3(signature = (plan, *, scratch, q_fp8, query_weights, index_k_cache, page_table,
    cache_lengths, active_width, output_indices, output_scores=None))]
#[allow(clippy::too_many_arguments)]
fn indexer_bind(
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
    const OP: &str = "bind";
    let scratch = scratch_tensor(scratch)?;
    // torch tensors only: the binding keeps them, CPU runs hand them to the
    // PyTorch reference and CUDA runs order on torch's stream
    let extract = extract_torch_tensor;
    let m_scratch = extract(&scratch, OP, "scratch")?;
    let m_q = extract(q_fp8, OP, "q_fp8")?;
    let m_w = extract(query_weights, OP, "query_weights")?;
    let m_k = extract(index_k_cache, OP, "index_k_cache")?;
    let m_pt = extract(page_table, OP, "page_table")?;
    let m_lens = extract(cache_lengths, OP, "cache_lengths")?;
    let m_aw = extract(active_width, OP, "active_width")?;
    let m_oi = extract(output_indices, OP, "output_indices")?;
    let m_os = match output_scores {
        Some(t) => Some(extract(t, OP, "output_scores")?),
        None => None,
    };
    let p = plan.get();
    let core = indexer::bind(
        &p.plan,
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
    )?;
    Ok(PyBinding {
        core,
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
fn indexer_run(py: Python<'_>, binding: &Bound<'_, PyBinding>) -> PyB12xResult<Py<PyAny>> {
    let b = binding.get();
    match b.core.plan().caps().device {
        Device::Cuda(_) => run_cuda(py, b)?,
        _ => run_cpu(binding)?,
    }
    Ok(b.output_indices.clone_ref(py))
}

/// The first page fault of CPU runs since the last check (the CPU's status record).
static CPU_FAULT: Mutex<Option<PageFault>> = Mutex::new(None);

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
        let mut first = CPU_FAULT.lock().unwrap_or_else(|p| p.into_inner());
        first.get_or_insert(PageFault { row, column, page_id, pages });
    }
    Ok(())
}

/// Reads and clears `device`'s page-fault record; raises PageTableError when set.
fn check_device(py: Python<'_>, device: Device) -> PyB12xResult<()> {
    let fault = match device {
        Device::Cuda(ordinal) => py.detach(|| b12x_cuda::indexer::take_page_fault(ordinal))?,
        _ => CPU_FAULT.lock().unwrap_or_else(|p| p.into_inner()).take(),
    };
    match fault {
        Some(f) => Err(exc::PageTableError::new_err(f.to_string()).into()),
        None => Ok(()),
    }
}

/// ``dsa_indexer.check(device)``: :meth:`Binding.check` for every binding of a
/// device (``None`` = the CPU).
#[pyfunction]
#[pyo3(signature = (ordinal, /))]
fn indexer_check(py: Python<'_>, ordinal: Option<u32>) -> PyB12xResult<()> {
    check_device(py, ordinal.map_or(Device::Cpu, Device::Cuda))
}

/// Enqueues paged FP8 scoring + exact top-k for `b.core` on torch's current
/// stream of the binding's device: no allocation, no sync, grids from static
/// shapes only.
fn run_cuda(py: Python<'_>, b: &PyBinding) -> PyB12xResult<()> {
    let args = b.core.args();
    if args.rows == 0 {
        return Ok(()); // nothing to write; kernels never see an empty grid
    }
    let stream = crate::torch_stream::current_stream(py, args.device)?;
    // SAFETY: bind checked every operand against the plan (dtype, shape,
    // strides, device, extent, disjointness) and carved the scratch regions
    // from a buffer of at least plan.nbytes(); the binding holds the tensors,
    // and the stream is torch's current stream of that device.
    let Some(recipe) = b.plan.get().recipe.as_ref() else {
        return Err(CoreError::Device {
            op: "run",
            operand: "binding".into(),
            expected: Device::Cuda(args.device),
            got: Device::Cpu,
        }
        .into());
    };
    unsafe { launch_indexer(&b.core, recipe, stream)? };
    Ok(())
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("IndexerCaps", py.get_type::<PyCaps>())?;
    m.add("IndexerPlan", py.get_type::<PyPlan>())?;
    m.add("IndexerBinding", py.get_type::<PyBinding>())?;
    m.add("IndexerScratchSpec", py.get_type::<PyScratchSpec>())?;
    m.add("IndexerScratchLayout", py.get_type::<PyLayout>())?;
    m.add("IndexerScratchRegion", py.get_type::<PyRegion>())?;
    m.add("INDEXER_SCRATCH_NAME", SCRATCH_NAME)?;
    // The page and top-k facts, from their one home (b12x_core::indexer).
    m.add("INDEXER_PAGE_SIZE", indexer::PAGE_SIZE)?;
    m.add("INDEXER_HEAD_DIM", indexer::HEAD_DIM)?;
    m.add("INDEXER_PAGE_BYTES", indexer::PAGE_BYTES)?;
    m.add("INDEXER_SCALE_OFFSET", indexer::SCALE_OFFSET)?;
    m.add("INDEXER_MAX_HEADS", indexer::MAX_HEADS)?;
    m.add("INDEXER_SUPPORTED_TOPK", PyTuple::new(py, indexer::SUPPORTED_TOPK)?)?;
    m.add("INDEXER_MMA_FLAVORS", PyTuple::new(py, MmaFlavor::ALL.map(MmaFlavor::name))?)?;
    m.add_function(wrap_pyfunction!(indexer_plan, m)?)?;
    m.add_function(wrap_pyfunction!(indexer_build_plan, m)?)?;
    m.add_function(wrap_pyfunction!(indexer_plan_count, m)?)?;
    m.add_function(wrap_pyfunction!(indexer_clear_plans, m)?)?;
    m.add_function(wrap_pyfunction!(indexer_bind, m)?)?;
    m.add_function(wrap_pyfunction!(indexer_run, m)?)?;
    m.add_function(wrap_pyfunction!(indexer_check, m)?)?;
    Ok(())
}
