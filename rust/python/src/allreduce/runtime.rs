//! `IpcAllReduce`: b12x-cuda's all-reduce `Runtime` as a Python object. Each
//! method unwraps its arguments, calls down once and maps the error once.

use b12x_core::allreduce::{self as ar, FusedOperands, Target};
use b12x_core::collective::Operation;
use b12x_core::{Device, Error as CoreError, TensorMeta};
use b12x_cuda::allreduce::Runtime;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::knobs::PyLimits;
use super::plan::PyAllReducePlan;
use crate::collective::declaration::type_name;
use crate::collective::{Args, PyDeclaredPlanIndex};
use crate::error::PyB12xResult;
use crate::tensor::extract;
use crate::torch_stream::current_stream;

const RUN: &str = "AllReduce";

fn plan_of<'a>(plan: &'a Bound<'_, PyAny>) -> PyB12xResult<&'a Bound<'a, PyAllReducePlan>> {
    plan.cast::<PyAllReducePlan>().map_err(|_| {
        CoreError::InvalidValue {
            op: RUN,
            operand: "plan".into(),
            expected: "an AllReducePlan (from declare or admit)".into(),
            got: type_name(plan),
        }
        .into()
    })
}

/// One rank's IPC all-reduce state: own slab, host error word, peers' mapped
/// slabs and the device table of slab addresses. Built in steps so Python can
/// exchange handles and failure flags between them; nothing is freed on drop.
#[pyclass(name = "IpcAllReduce", module = "b12x._core")]
pub struct PyIpcAllReduce(Runtime);

impl PyIpcAllReduce {
    fn target(&self) -> PyB12xResult<Target> {
        self.0.check()?;
        Ok(self.0.target().ok_or_else(|| CoreError::InvalidValue {
            op: RUN,
            operand: "runtime".into(),
            expected: "an open runtime".into(),
            got: "a closed or unopened one".into(),
        })?)
    }

    fn meta(obj: &Bound<'_, PyAny>, operand: &'static str) -> PyB12xResult<TensorMeta> {
        extract(obj, RUN, operand)
    }
}

/// The stream a launch for `target` goes on: torch's current one on a CUDA
/// device, none for the host stand-in.
fn stream_for(py: Python<'_>, target: &Target) -> PyResult<u64> {
    match target.device {
        Device::Cuda(ordinal) => current_stream(py, ordinal),
        _ => Ok(0),
    }
}

#[pymethods]
impl PyIpcAllReduce {
    /// Loads the kernels, allocates and zeroes the slab (slots sized by
    /// ``limits`` for this two-shot transport) and the host error word on
    /// ``ordinal``; nothing stays allocated on failure.
    #[new]
    fn new(
        py: Python<'_>,
        ordinal: u32,
        rank: u32,
        world: u32,
        limits: &Bound<'_, PyLimits>,
        twoshot_push: bool,
        timeout_ns: u64,
    ) -> PyB12xResult<Self> {
        let limits = limits.get().0;
        let rt = py.detach(|| {
            Runtime::allocate(ordinal, rank, world, &limits, twoshot_push, timeout_ns)
        })?;
        Ok(PyIpcAllReduce(rt))
    }

    /// A runtime of rank ``rank`` in ``world`` whose device side is host
    /// memory: open at once, operands on ``device`` (``"cpu"`` or
    /// ``"cuda:N"``), launches counted (``stand_in_launches``), not enqueued.
    /// Admission, bind and the health read are the real ones (``b12x bench
    /// host``, tests without GPUs).
    #[staticmethod]
    #[pyo3(signature = (device, rank, world, limits, twoshot_push=false, multiprocessors=132))]
    fn host_stand_in(
        device: &str,
        rank: u32,
        world: u32,
        limits: &Bound<'_, PyLimits>,
        twoshot_push: bool,
        multiprocessors: u32,
    ) -> PyB12xResult<Self> {
        let device = match b12x_core::DeviceName::parse(device) {
            Some(b12x_core::DeviceName::Cpu) => Device::Cpu,
            Some(b12x_core::DeviceName::Cuda(Some(i))) => Device::Cuda(i),
            _ => {
                return Err(CoreError::InvalidValue {
                    op: "IpcAllReduce.host_stand_in",
                    operand: "device".into(),
                    expected: "'cpu' or 'cuda:N'".into(),
                    got: format!("{device:?}"),
                }
                .into())
            }
        };
        let limits = limits.get().0;
        let rt =
            Runtime::host_stand_in(device, rank, world, &limits, twoshot_push, multiprocessors)?;
        Ok(PyIpcAllReduce(rt))
    }

    /// Launches a host stand-in took; None for a real runtime.
    #[getter]
    fn stand_in_launches(&self) -> Option<u64> {
        self.0.stand_in_launches()
    }

    /// Records ``code`` in a host stand-in's error word as a kernel that
    /// timed out would (tests of the health read); False for a real runtime.
    fn _stand_in_record_error(&self, code: u32) -> bool {
        self.0.stand_in_record_error(code)
    }

    /// This rank's 64-byte CUipcMemHandle.
    fn handle<'py>(&self, py: Python<'py>) -> PyB12xResult<Bound<'py, PyBytes>> {
        Ok(PyBytes::new(py, &self.0.handle()?))
    }

    /// Opens every peer's slab from the gathered handles (in rank order) and
    /// uploads the slab table; on failure everything opened here is closed.
    fn open_peers(&mut self, handles: Vec<Vec<u8>>) -> PyB12xResult<()> {
        Ok(self.0.open_peers(&handles)?)
    }

    /// Closes the peers' mappings and frees the table (after a device sync
    /// and a group barrier). Idempotent.
    fn close_peers(&mut self) -> PyB12xResult<()> {
        Ok(self.0.close_peers()?)
    }

    /// Frees the own slab and host word (after every peer closed its mapping). Idempotent.
    fn free(&mut self) -> PyB12xResult<()> {
        Ok(self.0.free()?)
    }

    /// The error code kernels recorded (0 = none); read without a device sync.
    fn error_code(&self) -> u32 {
        self.0.error_code()
    }

    /// Raises CollectiveTimeoutError if a kernel recorded a timeout.
    fn check(&self) -> PyB12xResult<()> {
        Ok(self.0.check()?)
    }

    #[getter]
    fn multiprocessors(&self) -> u32 {
        self.0.multiprocessors()
    }
    #[getter]
    fn slab_bytes(&self) -> u64 {
        self.0.layout().total_bytes()
    }
    #[getter]
    fn slot_bytes(&self) -> u64 {
        self.0.layout().slot_bytes
    }
    #[getter]
    fn is_open(&self) -> bool {
        self.0.is_open()
    }

    /// The declared plan if this call can run here, else None; never raises.
    ///
    /// One lookup in ``index`` (the key: operation, shape, dtype, address
    /// strides, norm weight identity and epsilon), then the checks a launch
    /// makes that the key cannot: device, 16-byte alignment, the runtime's
    /// world and slot size; for the fused operation also ``residual``
    /// (residual_out = residual), ``weight`` and ``out`` (None: in place,
    /// out = inp).
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (
        index, tensor, operation=None, weight=None, epsilon=None, residual=None, out=None
    ))]
    fn admit(
        &self,
        index: &Bound<'_, PyDeclaredPlanIndex>,
        tensor: &Bound<'_, PyAny>,
        operation: Option<&Bound<'_, PyAny>>,
        weight: Option<&Bound<'_, PyAny>>,
        epsilon: Option<&Bound<'_, PyAny>>,
        residual: Option<&Bound<'_, PyAny>>,
        out: Option<&Bound<'_, PyAny>>,
    ) -> Option<Py<PyAny>> {
        let py = tensor.py();
        let target = self.target().ok()?;
        let args = Args { tensor, operation, weight, epsilon };
        let found = index.get().probe(py, &args)?;
        let plan = found.bind(py).cast::<PyAllReducePlan>().ok()?.get().0.clone();
        let inp = Self::meta(tensor, "inp").ok()?;
        let admitted = match plan.operation() {
            Operation::AllReduce => ar::admit_plain(&plan, &target, &inp),
            Operation::AllReduceFusedAddRmsNorm => {
                let residual = Self::meta(residual?, "residual").ok()?;
                let weight = Self::meta(weight?, "weight").ok()?;
                let out = out.map(|o| Self::meta(o, "out")).transpose().ok()?;
                let eps = epsilon?.extract::<f64>().ok()?;
                ar::admit_fused(&plan, &target, &inp, &residual, &weight, out.as_ref(), eps)
            }
        };
        admitted.is_ok().then_some(found)
    }

    /// One-shot or two-shot all-reduce of ``inp`` into ``out`` on torch's
    /// current stream.
    fn run(
        &self,
        plan: &Bound<'_, PyAny>,
        inp: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
    ) -> PyB12xResult<()> {
        let target = self.target()?;
        let plan = plan_of(plan)?;
        let (i, o) = (Self::meta(inp, "inp")?, Self::meta(out, "out")?);
        let launch = ar::bind_plain(&plan.get().0, &target, &i, &o)?;
        let stream = stream_for(inp.py(), &target)?;
        // SAFETY: `inp` and `out` are borrowed for this call, and torch keeps
        // their storage alive until the stream's work on it is done.
        unsafe { self.0.launch(&launch, stream)? };
        Ok(())
    }

    /// Fused all-reduce + residual add + RMSNorm on torch's current stream.
    /// ``out`` may be ``inp`` and ``residual_out`` may be ``residual``;
    /// ``out`` may not alias ``residual_out``.
    #[allow(clippy::too_many_arguments)]
    fn run_fused(
        &self,
        plan: &Bound<'_, PyAny>,
        inp: &Bound<'_, PyAny>,
        residual: &Bound<'_, PyAny>,
        weight: &Bound<'_, PyAny>,
        eps: f64,
        out: &Bound<'_, PyAny>,
        residual_out: &Bound<'_, PyAny>,
    ) -> PyB12xResult<()> {
        let target = self.target()?;
        let plan = plan_of(plan)?;
        let metas = (
            Self::meta(inp, "inp")?,
            Self::meta(residual, "residual")?,
            Self::meta(weight, "weight")?,
            Self::meta(out, "out")?,
            Self::meta(residual_out, "residual_out")?,
        );
        let ops = FusedOperands {
            inp: &metas.0,
            residual: &metas.1,
            weight: &metas.2,
            out: &metas.3,
            residual_out: &metas.4,
        };
        let launch = ar::bind_fused(&plan.get().0, &target, &ops, eps)?;
        let stream = stream_for(inp.py(), &target)?;
        // SAFETY: as in `run`, for the five operands.
        unsafe { self.0.launch(&launch, stream)? };
        Ok(())
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyIpcAllReduce>()?;
    Ok(())
}
