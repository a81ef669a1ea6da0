//! The hot path: the key of a live tensor, read in the cheapest correct way.
//!
//! For a torch tensor that is three attribute reads (`dtype`, compared by
//! identity against cached dtype objects; `shape`; `stride()`) and the items
//! of two small tuples, with no allocation on the Rust side. Nothing here
//! builds a Python exception: bad input comes back as a `Bad` value, which
//! `has_plan_for` turns into `False` and `lookup` into an exception.

use b12x_core::collective::{Norm, Operation, PlanKey, Unindexable};
use b12x_core::{DType, Error as CoreError, TensorMeta, MAX_RANK};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyString, PyTuple};

use super::declaration::{is_tensor, real, repr, type_name};
use crate::error::PyB12xErr;
use crate::tensor::{extract, torch_cache, TorchCache};

/// Why a probe has no key. Cheap to make; turned into a Python exception
/// only when the caller asks for one (`lookup`, `plan_for`).
pub(crate) enum Bad {
    /// Can never be declared (rank above the limit, no weight or epsilon for
    /// the fused operation): not an error, just a miss.
    Never,
    NotATensor,
    Unindexable(Unindexable),
    Operation,
    WeightNotATensor,
    Epsilon,
    /// Reading the object failed (a tensor-like that raised).
    Py(PyErr),
}

/// The arguments of a probe, as the caller passed them.
pub(crate) struct Args<'a, 'py> {
    pub tensor: &'a Bound<'py, PyAny>,
    pub operation: Option<&'a Bound<'py, PyAny>>,
    pub weight: Option<&'a Bound<'py, PyAny>>,
    pub epsilon: Option<&'a Bound<'py, PyAny>>,
}

#[inline]
fn operation(op: Option<&Bound<'_, PyAny>>) -> Result<Operation, Bad> {
    let Some(op) = op else {
        return Ok(Operation::AllReduce);
    };
    let py = op.py();
    // string literals in Python code are interned, so identity usually decides
    if op.is(intern!(py, "all_reduce")) {
        return Ok(Operation::AllReduce);
    }
    if op.is(intern!(py, "all_reduce_fused_add_rms_norm")) {
        return Ok(Operation::AllReduceFusedAddRmsNorm);
    }
    let name = op.cast::<PyString>().map_err(|_| Bad::Operation)?;
    Operation::parse(name.to_str().map_err(|_| Bad::Operation)?).ok_or(Bad::Operation)
}

/// Reads a tuple of ints into `out`; `Ok(None)` when it has more than MAX_RANK items.
#[inline]
fn dims(obj: &Bound<'_, PyAny>, out: &mut [i64; MAX_RANK]) -> Result<Option<usize>, Bad> {
    let tuple = obj.cast::<PyTuple>().map_err(|e| Bad::Py(e.into()))?;
    let n = tuple.len();
    if n > MAX_RANK {
        return Ok(None);
    }
    for (i, slot) in out.iter_mut().enumerate().take(n) {
        *slot = tuple.get_borrowed_item(i).and_then(|x| x.extract::<i64>()).map_err(Bad::Py)?;
    }
    Ok(Some(n))
}

#[inline]
fn norm(op: Operation, args: &Args<'_, '_>) -> Result<Option<Norm>, Bad> {
    if !op.is_fused() {
        // the plain key has no norm: weight and epsilon are ignored, as in the reference
        return Ok(None);
    }
    let weight = args.weight.ok_or(Bad::Never)?;
    if !is_tensor(weight) {
        return Err(Bad::WeightNotATensor);
    }
    let epsilon = args.epsilon.ok_or(Bad::Never)?;
    let epsilon = real(epsilon).ok_or(Bad::Epsilon)?;
    Ok(Some(Norm::new(weight.as_ptr() as u64, epsilon)))
}

/// Reads a torch tensor's dtype, shape and strides and hands its key to `f`.
#[inline]
fn with_torch_key<R>(
    torch: &TorchCache,
    op: Operation,
    args: &Args<'_, '_>,
    f: impl FnOnce(&PlanKey) -> R,
) -> Result<R, Bad> {
    let t = args.tensor;
    let py = t.py();
    let dtype_obj = t.getattr(intern!(py, "dtype")).map_err(Bad::Py)?;
    let mut shape = [0i64; MAX_RANK];
    let mut strides = [0i64; MAX_RANK];
    let rank = dims(&t.getattr(intern!(py, "shape")).map_err(Bad::Py)?, &mut shape)?;
    let stride_rank = dims(&t.call_method0(intern!(py, "stride")).map_err(Bad::Py)?, &mut strides)?;
    let (Some(rank), Some(stride_rank)) = (rank, stride_rank) else {
        return Err(Bad::Never);
    };
    // a dtype b12x cannot name gets a key no declaration has
    let dtype = torch.dtype(&dtype_obj).unwrap_or(DType::Other { code: 255, bits: 0 });
    with_key(op, dtype, &shape[..rank], &strides[..stride_rank], args, f)
}

/// Builds the key in place (it is 160 bytes: moving it through `Result`s
/// cost more than the probe) and hands it to `f`. The tensor's own problems
/// are reported before those of the weight and epsilon.
#[inline(always)]
fn with_key<R>(
    op: Operation,
    dtype: DType,
    shape: &[i64],
    strides: &[i64],
    args: &Args<'_, '_>,
    f: impl FnOnce(&PlanKey) -> R,
) -> Result<R, Bad> {
    let norm = norm(op, args);
    let key = PlanKey::new(op, dtype, shape, strides, norm.as_ref().ok().copied().flatten())
        .map_err(unindexable)?;
    norm?;
    Ok(f(&key))
}

fn unindexable(why: Unindexable) -> Bad {
    match why {
        Unindexable::Rank => Bad::Never,
        other => Bad::Unindexable(other),
    }
}

/// The key of a call whose tensor was read already (`meta`, the admission's
/// one read of it), handed to `f`.
#[inline]
pub(crate) fn with_meta<R>(
    meta: &TensorMeta,
    args: &Args<'_, '_>,
    f: impl FnOnce(&PlanKey) -> R,
) -> Result<R, Bad> {
    let op = operation(args.operation)?;
    with_key(op, meta.dtype, &meta.shape, &meta.strides, args, f)
}

/// Any other tensor (a `__dlpack__` producer): the general extraction path.
fn with_dlpack_key<R>(
    op: Operation,
    args: &Args<'_, '_>,
    f: impl FnOnce(&PlanKey) -> R,
) -> Result<R, Bad> {
    let meta = match extract(args.tensor, "DeclaredPlanIndex.lookup", "tensor") {
        Ok(meta) => meta,
        Err(PyB12xErr::Core(CoreError::NotATensor { .. })) => return Err(Bad::NotATensor),
        Err(PyB12xErr::Core(CoreError::Rank { .. })) => return Err(Bad::Never),
        Err(other) => return Err(Bad::Py(other.into())),
    };
    with_key(op, meta.dtype, &meta.shape, &meta.strides, args, f)
}

/// Hands the key of a live call to `f`, or says why there is none.
#[inline]
pub(crate) fn with<R>(args: &Args<'_, '_>, f: impl FnOnce(&PlanKey) -> R) -> Result<R, Bad> {
    let op = operation(args.operation)?;
    match torch_cache(args.tensor.py()) {
        Some(torch) if torch.is_tensor(args.tensor) => with_torch_key(torch, op, args, f),
        _ => with_dlpack_key(op, args, f),
    }
}

/// The operation of a call that got past `with` (so it parsed).
pub(crate) fn operation_of(args: &Args<'_, '_>) -> Operation {
    operation(args.operation).unwrap_or(Operation::AllReduce)
}

/// The norm of a call, when it has one, for messages.
pub(crate) fn norm_of(args: &Args<'_, '_>) -> Option<Norm> {
    norm(operation_of(args), args).ok().flatten()
}

/// Shape, strides and dtype of the tensor as plain values, for messages
/// (the slow path: lists of any length, the dtype's own name).
pub(crate) fn describe(tensor: &Bound<'_, PyAny>) -> (Vec<i64>, Vec<i64>, String) {
    let py = tensor.py();
    let ints = |obj: PyResult<Bound<'_, PyAny>>| -> Vec<i64> {
        obj.and_then(|o| o.extract::<Vec<i64>>()).unwrap_or_default()
    };
    if torch_cache(py).is_some_and(|torch| torch.is_tensor(tensor)) {
        let shape = ints(tensor.getattr(intern!(py, "shape")));
        let strides = ints(tensor.call_method0(intern!(py, "stride")));
        let dtype = tensor.getattr(intern!(py, "dtype")).map(|d| repr(&d)).unwrap_or_default();
        let dtype = dtype.strip_prefix("torch.").unwrap_or(&dtype).to_string();
        return (shape, strides, dtype);
    }
    match extract(tensor, "DeclaredPlanIndex.lookup", "tensor") {
        Ok(meta) => (meta.shape.to_vec(), meta.strides.to_vec(), meta.dtype.to_string()),
        Err(_) => (Vec::new(), Vec::new(), "unknown".into()),
    }
}

impl Bad {
    /// The error `lookup` raises for this input; `None` for a plain miss.
    pub(crate) fn into_err(self, op: &'static str, args: &Args<'_, '_>) -> Option<PyB12xErr> {
        let argument =
            |operand: &'static str, expected: &'static str, got: String| CoreError::ArgumentType {
                op: op.into(),
                operand: operand.into(),
                expected: expected.into(),
                got,
            };
        let err = match self {
            Bad::Never => return None,
            Bad::NotATensor => {
                CoreError::NotATensor { op, operand: "tensor".into(), got: type_name(args.tensor) }
            }
            Bad::Unindexable(why) => {
                let (shape, strides, _) = describe(args.tensor);
                CoreError::UnsupportedTensor {
                    op: op.into(),
                    operand: "tensor".into(),
                    expected: why.expected().into(),
                    shape,
                    strides,
                }
            }
            Bad::Operation => {
                const EXPECTED: &str = "'all_reduce' or 'all_reduce_fused_add_rms_norm'";
                let got = args.operation.map(repr).unwrap_or_default();
                match args.operation.is_some_and(|o| o.is_instance_of::<PyString>()) {
                    true => CoreError::InvalidValue {
                        op,
                        operand: "operation".into(),
                        expected: EXPECTED.into(),
                        got,
                    },
                    false => argument("operation", EXPECTED, got),
                }
            }
            Bad::WeightNotATensor => CoreError::NotATensor {
                op,
                operand: "weight".into(),
                got: args.weight.map(type_name).unwrap_or_default(),
            },
            Bad::Epsilon => argument(
                "epsilon",
                "a real number (not a bool)",
                args.epsilon.map(repr).unwrap_or_default(),
            ),
            Bad::Py(err) => return Some(err.into()),
        };
        Some(err.into())
    }
}
