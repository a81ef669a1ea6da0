//! The one device grammar of b12x's Python entry points (`Caps(device=)`,
//! `AllReduce(device=)`, `dsa_indexer.is_supported` / `check`, `b12x.cuda`).
//!
//! Strings are b12x-core's `DeviceName` ("cpu", "cuda", "cuda:N"; no
//! whitespace); a torch.device is read by its type and index; an int is a
//! CUDA ordinal (a bool is not). `None` and a bare "cuda" mean the current
//! CUDA device: torch's current device where torch has CUDA, cuda:0 otherwise
//! (so that a set-up on a machine without a GPU declines in its own words).
//! Ordinals are checked against core's bound before torch sees them
//! (`torch.device("cuda:300")` is cuda:44) and, where the entry point needs
//! the device to exist, against the devices this process can see. Every
//! refusal is core's `DeviceArgument` (a `DeviceError`) naming the operation.

use b12x_core::{cuda_ordinal, Device, DeviceName, Error as CoreError};
use pyo3::exceptions::PyOverflowError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyInt, PyString, PyType};

use crate::error::PyB12xResult;
use crate::tensor::short_repr;

/// What a device argument must satisfy beyond the grammar.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Need {
    /// Anything the grammar names (the current device need not exist).
    Any,
    /// cpu, or a CUDA device this process can see.
    Visible,
    /// A CUDA device (it need not exist: the caller declines later).
    Cuda,
}

fn refuse(op: &str, expected: impl Into<String>, got: String) -> CoreError {
    CoreError::DeviceArgument {
        op: op.to_string().into(),
        operand: "device".into(),
        expected: expected.into().into(),
        got,
    }
}

fn torch_device_type(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    static TYPE: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    TYPE.import(py, "torch", "device")
}

/// The current CUDA device: torch's where torch has CUDA, else 0.
fn current(py: Python<'_>) -> u32 {
    let cuda = py.import(intern!(py, "torch")).and_then(|t| t.getattr(intern!(py, "cuda")));
    let Ok(cuda) = cuda else { return 0 };
    let available = cuda.call_method0(intern!(py, "is_available")).and_then(|a| a.is_truthy());
    if !available.unwrap_or(false) {
        return 0;
    }
    cuda.call_method0(intern!(py, "current_device")).and_then(|i| i.extract()).unwrap_or(0)
}

/// A CUDA ordinal from a caller's int (`text`: how the caller wrote it).
fn ordinal(op: &str, value: i64, text: Option<String>) -> PyB12xResult<u32> {
    cuda_ordinal(op, value).map_err(|e| match (e, text) {
        (CoreError::DeviceArgument { op, operand, expected, .. }, Some(text)) => {
            CoreError::DeviceArgument { op, operand, expected, got: text }.into()
        }
        (e, _) => e.into(),
    })
}

fn int_ordinal(op: &str, obj: &Bound<'_, PyAny>) -> PyB12xResult<u32> {
    match obj.extract::<i64>() {
        Ok(v) => ordinal(op, v, None),
        Err(e) if e.is_instance_of::<PyOverflowError>(obj.py()) => {
            ordinal(op, i64::MAX, Some(short_repr(obj)))
        }
        Err(_) => Err(refuse(op, DeviceName::EXPECTED, short_repr(obj)).into()),
    }
}

/// Whether `obj` is a torch.device.
pub(crate) fn is_torch_device(obj: &Bound<'_, PyAny>) -> bool {
    torch_device_type(obj.py()).is_ok_and(|t| obj.is_instance(t).unwrap_or(false))
}

/// A torch.device's index (None: the current device of its type).
pub(crate) fn index_of(obj: &Bound<'_, PyAny>) -> Option<i64> {
    obj.getattr(intern!(obj.py(), "index")).ok()?.extract::<Option<i64>>().ok()?
}

/// The grammar alone: the device `obj` names.
fn parse(op: &str, obj: Option<&Bound<'_, PyAny>>, py: Python<'_>) -> PyB12xResult<Device> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(Device::Cuda(current(py)));
    };
    if obj.is_instance_of::<PyBool>() {
        return Err(
            refuse(op, DeviceName::EXPECTED, format!("{} (a bool)", short_repr(obj))).into()
        );
    }
    if let Ok(text) = obj.cast::<PyString>() {
        let text = text.to_cow()?;
        return match DeviceName::parse(&text) {
            Some(DeviceName::Cpu) => Ok(Device::Cpu),
            Some(DeviceName::Cuda(None)) => Ok(Device::Cuda(current(py))),
            Some(DeviceName::Cuda(Some(i))) => Ok(Device::Cuda(i)),
            None => match text
                .strip_prefix("cuda:")
                .filter(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
            {
                // digits past the bound: the ordinal's own message
                Some(digits) => {
                    Err(ordinal(op, digits.parse().unwrap_or(i64::MAX), Some(digits.into()))
                        .unwrap_err())
                }
                None => Err(refuse(op, DeviceName::EXPECTED, short_repr(obj)).into()),
            },
        };
    }
    if obj.is_instance_of::<PyInt>() {
        return Ok(Device::Cuda(int_ordinal(op, obj)?));
    }
    let dev = if obj.is_instance(torch_device_type(py)?)? {
        obj.clone()
    } else {
        // anything torch reads as a device (numpy ints, ...)
        let made = py.import(intern!(py, "torch"))?.getattr(intern!(py, "device"))?.call1((obj,));
        made.map_err(|_| refuse(op, DeviceName::EXPECTED, short_repr(obj)))?
    };
    let kind: String = dev.getattr(intern!(py, "type"))?.extract()?;
    match kind.as_str() {
        "cpu" => Ok(Device::Cpu),
        "cuda" => match dev.getattr(intern!(py, "index"))?.extract::<Option<i64>>()? {
            Some(i) => Ok(Device::Cuda(ordinal(op, i, None)?)),
            None => Ok(Device::Cuda(current(py))),
        },
        other => Err(refuse(
            op,
            DeviceName::EXPECTED,
            format!("{} (b12x runs on cpu and cuda, not {other})", short_repr(obj)),
        )
        .into()),
    }
}

/// The device `obj` names for `op`, checked as `need` says.
pub(crate) fn resolve(
    op: &str,
    obj: Option<&Bound<'_, PyAny>>,
    py: Python<'_>,
    need: Need,
) -> PyB12xResult<Device> {
    let device = parse(op, obj, py)?;
    match (need, device) {
        (Need::Cuda, Device::Cpu) => {
            Err(refuse(op, format!("a CUDA device ({})", DeviceName::EXPECTED), "cpu".into())
                .into())
        }
        (Need::Visible, Device::Cuda(i)) if i >= b12x_cuda::visible_devices() => {
            let count = b12x_cuda::visible_devices();
            let got = obj.filter(|o| !o.is_none()).map_or_else(|| format!("cuda:{i}"), short_repr);
            Err(refuse(
                op,
                format!("a CUDA device this process can see ({count} visible)"),
                if got == format!("cuda:{i}") { got } else { format!("{got} (cuda:{i})") },
            )
            .into())
        }
        _ => Ok(device),
    }
}

/// ``resolve_device(device, op, need="any")``: the device an argument names
/// under b12x's one grammar, as ``("cpu", None)`` or ``("cuda", N)``. ``need``
/// "visible": cpu or a CUDA device this process can see; "cuda": a CUDA
/// device. Raises DeviceError naming ``op``.
#[pyfunction]
#[pyo3(signature = (device, op, need="any"))]
fn resolve_device(
    py: Python<'_>,
    device: Option<&Bound<'_, PyAny>>,
    op: &str,
    need: &str,
) -> PyB12xResult<(&'static str, Option<u32>)> {
    let need = match need {
        "visible" => Need::Visible,
        "cuda" => Need::Cuda,
        _ => Need::Any,
    };
    Ok(match resolve(op, device, py, need)? {
        Device::Cuda(i) => ("cuda", Some(i)),
        _ => ("cpu", None),
    })
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(resolve_device, m)?)?;
    Ok(())
}
