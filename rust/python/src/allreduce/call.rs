//! Admission: one all-reduce call turned into an `AllReduceCall`, core's
//! checked `Launch` together with the tensors it refers to.
//!
//! Per call the input's metadata is read once (the key is built from the
//! same read), the declared plan is found once, core binds once, and
//! running the call launches exactly that launch (its one health read is
//! the runtime's own, just before the enqueue). A refused call builds no
//! exception unless the caller asked for one (`strict`).

use b12x_core::allreduce::{self as ar, FusedOperands, Launch};
use b12x_core::collective::Operation;
use b12x_core::{Device, Error as CoreError, TensorMeta};
use pyo3::intern;
use pyo3::prelude::*;

use super::plan::PyAllReducePlan;
use super::runtime::PyIpcAllReduce;
use crate::collective::{Args, Bad};
use crate::error::{PyB12xErr, PyB12xResult};
use crate::tensor::{extract, torch_cache};
use crate::torch_stream::current_stream;

const OP: &str = "AllReduce";

/// One admitted all-reduce: the launch b12x-core bound for it and the
/// tensors that launch reads and writes. Made by ``IpcAllReduce.admit``;
/// ``run()`` launches exactly it. A call is one eager call: run it right away
/// (its addresses are the tensors' addresses at admission).
#[pyclass(name = "AllReduceCall", module = "b12x._core", frozen)]
pub struct PyAllReduceCall {
    runtime: Py<PyIpcAllReduce>,
    launch: Launch,
    plan: Py<PyAny>,
    inp: Py<PyAny>,
    out: Py<PyAny>,
    /// The fused call's ``residual``, ``weight`` and ``residual_out``.
    fused: Option<[Py<PyAny>; 3]>,
}

#[pymethods]
impl PyAllReduceCall {
    /// Enqueues the admitted launch on torch's current stream (the host
    /// stand-in counts it) and returns ``out``. Raises
    /// CollectiveTimeoutError if a kernel of this runtime recorded a timeout,
    /// and refuses a runtime closed since the admission.
    fn run(slf: &Bound<'_, Self>) -> PyB12xResult<Py<PyAny>> {
        let (py, call) = (slf.py(), slf.get());
        let runtime = call.runtime.bind(py).try_borrow().map_err(PyErr::from)?;
        let stream = match call.launch.target.device {
            Device::Cuda(ordinal) => current_stream(py, ordinal)?,
            _ => 0, // the host stand-in
        };
        // SAFETY: the call holds every tensor the launch was bound from, and
        // torch keeps their storage alive until the stream's work on it is
        // done; `launch` refuses a runtime other than the one it was bound for.
        unsafe { runtime.runtime().launch(&call.launch, stream)? };
        if let Some(device_side) = runtime.on_launch() {
            device_side.bind(py).call1((slf,))?;
        }
        Ok(call.out.clone_ref(py))
    }

    /// The declared plan this call runs.
    #[getter]
    fn plan(&self, py: Python<'_>) -> Py<PyAny> {
        self.plan.clone_ref(py)
    }
    #[getter]
    fn inp(&self, py: Python<'_>) -> Py<PyAny> {
        self.inp.clone_ref(py)
    }
    /// Where the result goes (plain: a fresh tensor unless one was given;
    /// fused: ``inp`` unless ``out`` was given).
    #[getter]
    fn out(&self, py: Python<'_>) -> Py<PyAny> {
        self.out.clone_ref(py)
    }
    /// The fused call's RMSNorm epsilon as the kernel gets it (float32); None for a plain one.
    #[getter]
    fn epsilon(&self) -> Option<f32> {
        match self.launch.args {
            ar::Args::Fused(a) => Some(a.eps),
            ar::Args::Plain(_) => None,
        }
    }
    /// The fused call's ``(residual, weight, residual_out)``; None for a plain one.
    #[getter]
    fn fused_operands(&self, py: Python<'_>) -> Option<(Py<PyAny>, Py<PyAny>, Py<PyAny>)> {
        self.fused.as_ref().map(|[r, w, ro]| (r.clone_ref(py), w.clone_ref(py), ro.clone_ref(py)))
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let plan = self.plan.bind(py).repr().map(|r| r.to_string()).unwrap_or_default();
        format!("AllReduceCall({plan})")
    }
}

/// The operands of one call, as the caller passed them.
pub(crate) struct CallArgs<'a, 'py> {
    pub key: Args<'a, 'py>,
    pub residual: Option<&'a Bound<'py, PyAny>>,
    pub out: Option<&'a Bound<'py, PyAny>>,
    pub residual_out: Option<&'a Bound<'py, PyAny>>,
}

/// Why a call was not admitted; turned into an exception only on request.
enum Refused {
    Closed,
    NoKey(Bad),
    Undeclared,
    /// Boxed: errors are the cold path, and they are large.
    Error(Box<PyB12xErr>),
}

impl From<PyB12xErr> for Refused {
    fn from(e: PyB12xErr) -> Self {
        Refused::Error(Box::new(e))
    }
}

impl From<CoreError> for Refused {
    fn from(e: CoreError) -> Self {
        Refused::Error(Box::new(e.into()))
    }
}

impl From<PyErr> for Refused {
    fn from(e: PyErr) -> Self {
        Refused::Error(Box::new(e.into()))
    }
}

fn meta(obj: &Bound<'_, PyAny>, operand: &'static str) -> Result<TensorMeta, Refused> {
    Ok(extract(obj, OP, operand)?)
}

fn required<'a, 'py>(
    obj: Option<&'a Bound<'py, PyAny>>,
    operand: &'static str,
) -> Result<&'a Bound<'py, PyAny>, Refused> {
    obj.ok_or_else(|| {
        CoreError::InvalidValue {
            op: OP,
            operand: operand.into(),
            expected: "a tensor for the fused operation".into(),
            got: "None".into(),
        }
        .into()
    })
}

/// A fresh output like `inp` and its metadata. `torch.empty_like` keeps a
/// dense tensor's shape, strides, dtype and device (preserve_format; every
/// plan's operands are dense), so only its address is read.
fn empty_like<'py>(
    inp: &Bound<'py, PyAny>,
    meta: &TensorMeta,
) -> Result<(Bound<'py, PyAny>, TensorMeta), Refused> {
    let py = inp.py();
    let torch = torch_cache(py).ok_or(Refused::Undeclared)?;
    let out = torch.empty_like.bind(py).call1((inp,))?;
    let data_ptr = out.call_method0(intern!(py, "data_ptr"))?.extract::<u64>()?;
    Ok((out, TensorMeta { data_ptr, byte_offset: 0, ..meta.clone() }))
}

fn admit_with(
    runtime: &Bound<'_, PyIpcAllReduce>,
    a: &CallArgs<'_, '_>,
) -> Result<PyAllReduceCall, Refused> {
    let py = runtime.py();
    let me = runtime.try_borrow().map_err(PyErr::from)?;
    let (Some(index), Some(target)) = (me.index(), me.runtime().target()) else {
        return Err(Refused::Closed);
    };
    let index = index.get();
    let inp = meta(a.key.tensor, "inp")?;
    let found = index.probe_meta(py, &a.key, &inp).map_err(Refused::NoKey)?;
    let plan_obj = found.ok_or(Refused::Undeclared)?;
    let plan_ref = plan_obj.bind(py).cast::<PyAllReducePlan>().map_err(PyErr::from)?;
    let plan = &plan_ref.get().0;
    let (launch, out, fused) = match plan.operation() {
        Operation::AllReduce => {
            let (out, out_meta) = match a.out {
                Some(out) => (out.clone(), meta(out, "out")?),
                None => empty_like(a.key.tensor, &inp)?,
            };
            let launch = ar::bind_plain(plan, &target, &inp, &out_meta)?;
            (launch, out, None)
        }
        Operation::AllReduceFusedAddRmsNorm => {
            let residual = required(a.residual, "residual")?;
            let weight = required(a.key.weight, "weight")?;
            let out = a.out.unwrap_or(a.key.tensor);
            let residual_out = a.residual_out.unwrap_or(residual);
            let eps = a.key.epsilon.and_then(|e| e.extract::<f64>().ok()).unwrap_or(f64::NAN);
            let metas = (
                meta(residual, "residual")?,
                meta(weight, "weight")?,
                meta(out, "out")?,
                meta(residual_out, "residual_out")?,
            );
            let ops = FusedOperands {
                inp: &inp,
                residual: &metas.0,
                weight: &metas.1,
                out: &metas.2,
                residual_out: &metas.3,
            };
            let launch = ar::bind_fused(plan, &target, &ops, eps)?;
            let held =
                [residual.clone().unbind(), weight.clone().unbind(), residual_out.clone().unbind()];
            (launch, out.clone(), Some(held))
        }
    };
    Ok(PyAllReduceCall {
        runtime: runtime.clone().unbind(),
        launch,
        plan: plan_obj,
        inp: a.key.tensor.clone().unbind(),
        out: out.unbind(),
        fused,
    })
}

/// The admitted call, or None when it does not run here (never raises).
pub(crate) fn admit(
    runtime: &Bound<'_, PyIpcAllReduce>,
    a: &CallArgs<'_, '_>,
) -> Option<PyAllReduceCall> {
    admit_with(runtime, a).ok()
}

/// The admitted call, or the precise error saying why it does not run here.
pub(crate) fn admit_or_raise(
    runtime: &Bound<'_, PyIpcAllReduce>,
    a: &CallArgs<'_, '_>,
) -> PyB12xResult<PyAllReduceCall> {
    let closed = || -> PyB12xErr {
        CoreError::UndeclaredPlan(format!(
            "{OP}: runtime expected open, with declared plans attached, got a closed or \
             unopened one (nothing runs on it)"
        ))
        .into()
    };
    let refused = match admit_with(runtime, a) {
        Ok(call) => return Ok(call),
        Err(why) => why,
    };
    let me = runtime.try_borrow().map_err(PyErr::from)?;
    let Some(index) = me.index() else {
        return Err(closed());
    };
    let index = index.get();
    Err(match refused {
        Refused::Closed => closed(),
        Refused::NoKey(bad) => match bad.into_err(OP, &a.key) {
            Some(err) => err,
            None => index.undeclared(OP, &a.key).into(),
        },
        Refused::Undeclared => index.undeclared(OP, &a.key).into(),
        Refused::Error(e) => *e,
    })
}
