//! `IpcAllReduce`: b12x-cuda's all-reduce `Runtime` as a Python object. Each
//! method unwraps its arguments, calls down once and maps the error once.

use b12x_core::{Device, Error as CoreError};
use b12x_cuda::allreduce::Runtime;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::call::{self, CallArgs, PyAllReduceCall};
use super::knobs::PyLimits;
use crate::collective::{Args, PyDeclaredPlanIndex};
use crate::error::PyB12xResult;

/// One rank's IPC all-reduce state: own slab, host error word, peers' mapped
/// slabs and the device table of slab addresses. Built in steps so Python can
/// exchange handles and failure flags between them; nothing is freed on drop.
#[pyclass(name = "IpcAllReduce", module = "b12x._core")]
pub struct PyIpcAllReduce {
    rt: Runtime,
    /// The declared plans admission looks calls up in (``attach``).
    index: Option<Py<PyDeclaredPlanIndex>>,
    /// The host stand-in's device side in Python, called with each call it runs.
    on_launch: Option<Py<PyAny>>,
}

impl PyIpcAllReduce {
    pub(crate) fn runtime(&self) -> &Runtime {
        &self.rt
    }

    pub(crate) fn on_launch(&self) -> Option<&Py<PyAny>> {
        self.on_launch.as_ref()
    }

    pub(crate) fn index(&self) -> Option<&Py<PyDeclaredPlanIndex>> {
        self.index.as_ref()
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
        Ok(PyIpcAllReduce { rt, index: None, on_launch: None })
    }

    /// A runtime of rank ``rank`` in ``world`` whose device side is host
    /// memory: open at once, operands on ``device`` (``"cpu"`` or
    /// ``"cuda:N"``), launches counted (``stand_in_launches``), not enqueued.
    /// Admission, bind and the health read are the real ones (``b12x bench
    /// host``, tests without GPUs). ``on_launch(call)``, if given, runs after
    /// each counted launch: what the device would do, in Python (tests).
    #[staticmethod]
    #[pyo3(signature = (
        device, rank, world, limits, twoshot_push=false, multiprocessors=132, on_launch=None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn host_stand_in(
        device: &str,
        rank: u32,
        world: u32,
        limits: &Bound<'_, PyLimits>,
        twoshot_push: bool,
        multiprocessors: u32,
        on_launch: Option<Py<PyAny>>,
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
        Ok(PyIpcAllReduce { rt, index: None, on_launch })
    }

    /// Launches a host stand-in took; None for a real runtime.
    #[getter]
    fn stand_in_launches(&self) -> Option<u64> {
        self.rt.stand_in_launches()
    }

    /// Reads of a host stand-in's error word (one per launch); None for a real runtime.
    #[getter]
    fn stand_in_health_reads(&self) -> Option<u64> {
        self.rt.stand_in_health_reads()
    }

    /// Records ``code`` in a host stand-in's error word as a kernel that
    /// timed out would (tests of the health read); False for a real runtime.
    fn _stand_in_record_error(&self, code: u32) -> bool {
        self.rt.stand_in_record_error(code)
    }

    /// This rank's 64-byte CUipcMemHandle.
    fn handle<'py>(&self, py: Python<'py>) -> PyB12xResult<Bound<'py, PyBytes>> {
        Ok(PyBytes::new(py, &self.rt.handle()?))
    }

    /// Opens every peer's slab from the gathered handles (in rank order) and
    /// uploads the slab table; on failure everything opened here is closed.
    fn open_peers(&mut self, handles: Vec<Vec<u8>>) -> PyB12xResult<()> {
        Ok(self.rt.open_peers(&handles)?)
    }

    /// Closes the peers' mappings and frees the table (after a device sync
    /// and a group barrier). Idempotent.
    fn close_peers(&mut self) -> PyB12xResult<()> {
        Ok(self.rt.close_peers()?)
    }

    /// Frees the own slab and host word (after every peer closed its mapping). Idempotent.
    fn free(&mut self) -> PyB12xResult<()> {
        Ok(self.rt.free()?)
    }

    /// The error code kernels recorded (0 = none); read without a device sync.
    fn error_code(&self) -> u32 {
        self.rt.error_code()
    }

    /// Raises CollectiveTimeoutError if a kernel recorded a timeout.
    fn check(&self) -> PyB12xResult<()> {
        Ok(self.rt.check()?)
    }

    #[getter]
    fn multiprocessors(&self) -> u32 {
        self.rt.multiprocessors()
    }
    #[getter]
    fn slab_bytes(&self) -> u64 {
        self.rt.layout().total_bytes()
    }
    #[getter]
    fn slot_bytes(&self) -> u64 {
        self.rt.layout().slot_bytes
    }
    #[getter]
    fn is_open(&self) -> bool {
        self.rt.is_open()
    }

    /// The call admitted to run here (an ``AllReduceCall``), else None; never
    /// raises and builds no exception.
    ///
    /// One read of ``tensor``'s metadata, one exact-key lookup in ``index``
    /// (operation, shape, dtype, address strides; for the fused operation the
    /// weight's identity and epsilon), one bind by b12x-core against the plan
    /// and this runtime: device, 16-byte alignment, layout, world and slot
    /// size; for the fused operation ``residual`` (``residual_out`` None:
    /// ``residual``), ``weight`` and ``out`` (None: in place, ``out = inp``).
    /// A plain call without ``out`` gets a fresh one like ``tensor``.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (
        tensor, operation=None, weight=None, epsilon=None, residual=None, out=None,
        residual_out=None
    ))]
    fn admit(
        slf: &Bound<'_, Self>,
        tensor: &Bound<'_, PyAny>,
        operation: Option<&Bound<'_, PyAny>>,
        weight: Option<&Bound<'_, PyAny>>,
        epsilon: Option<&Bound<'_, PyAny>>,
        residual: Option<&Bound<'_, PyAny>>,
        out: Option<&Bound<'_, PyAny>>,
        residual_out: Option<&Bound<'_, PyAny>>,
    ) -> Option<PyAllReduceCall> {
        let key = Args { tensor, operation, weight, epsilon };
        call::admit(slf, &CallArgs { key, residual, out, residual_out })
    }

    /// ``admit``, except that a call that does not run here raises the
    /// precise error: UndeclaredPlanError (nothing declared for its key, or
    /// the runtime is closed) or the error of the operand the launch refuses.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (
        tensor, operation=None, weight=None, epsilon=None, residual=None, out=None,
        residual_out=None
    ))]
    fn admit_or_raise(
        slf: &Bound<'_, Self>,
        tensor: &Bound<'_, PyAny>,
        operation: Option<&Bound<'_, PyAny>>,
        weight: Option<&Bound<'_, PyAny>>,
        epsilon: Option<&Bound<'_, PyAny>>,
        residual: Option<&Bound<'_, PyAny>>,
        out: Option<&Bound<'_, PyAny>>,
        residual_out: Option<&Bound<'_, PyAny>>,
    ) -> PyB12xResult<PyAllReduceCall> {
        let key = Args { tensor, operation, weight, epsilon };
        call::admit_or_raise(slf, &CallArgs { key, residual, out, residual_out })
    }

    /// Makes ``index`` the declared plans admission looks calls up in.
    fn attach(&mut self, index: Py<PyDeclaredPlanIndex>) {
        self.index = Some(index);
    }

    fn __traverse__(&self, visit: pyo3::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        if let Some(f) = &self.on_launch {
            visit.call(f)?;
        }
        if let Some(index) = &self.index {
            visit.call(index)?;
        }
        Ok(())
    }

    fn __clear__(&mut self) {
        self.on_launch = None;
        self.index = None;
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyIpcAllReduce>()?;
    m.add_class::<PyAllReduceCall>()?;
    Ok(())
}
