//! Reading a declared invocation into b12x-core's `Declaration`.
//!
//! Any object with the fields of `b12x.comm.pcie.Invocation` is read (name,
//! operation, shape, dtype, strides, input_alignment, norm_weight, epsilon),
//! so records of other front ends index too. The rules themselves live in
//! `b12x_core::collective::Declaration::validate`; this file only turns
//! Python values into plain ones, keeping a `repr` of anything of the wrong
//! type for the message.

use b12x_core::collective::{Declaration, Field, PlanKey};
use b12x_core::DType;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt, PyList, PyString, PyTuple};

use b12x_core::Error as CoreError;

use crate::error::PyB12xResult;
use crate::tensor::{extract, torch_cache};

/// A validated declaration: its key, its name and the weight the key's
/// identity refers to (held so the identity stays unique).
pub(crate) struct Declared {
    pub key: PlanKey,
    pub name: String,
    pub weight: Option<Py<PyAny>>,
}

pub(crate) fn repr(obj: &Bound<'_, PyAny>) -> String {
    obj.repr().map(|r| r.to_string()).unwrap_or_else(|_| "<unprintable object>".into())
}

pub(crate) fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .fully_qualified_name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "an unknown object".into())
}

/// A tensor for weight purposes: a torch tensor or any `__dlpack__` producer.
pub(crate) fn is_tensor(obj: &Bound<'_, PyAny>) -> bool {
    let py = obj.py();
    torch_cache(py).is_some_and(|torch| torch.is_tensor(obj))
        || obj.hasattr(intern!(py, "__dlpack__")).unwrap_or(false)
}

/// A tuple or list of objects of type exactly `int` (so not bool) that fit
/// in 64 bits; `Err(repr)` otherwise.
fn exact_ints(obj: &Bound<'_, PyAny>) -> Field<Vec<i64>> {
    let items: Vec<Bound<'_, PyAny>> = if let Ok(t) = obj.cast::<PyTuple>() {
        t.iter().collect()
    } else if let Ok(l) = obj.cast::<PyList>() {
        l.iter().collect()
    } else {
        return Err(repr(obj));
    };
    items
        .iter()
        .map(|x| x.is_exact_instance_of::<PyInt>().then(|| x.extract::<i64>().ok()).flatten())
        .collect::<Option<Vec<i64>>>()
        .ok_or_else(|| repr(obj))
}

fn string(obj: &Bound<'_, PyAny>) -> Field<String> {
    match obj.cast::<PyString>() {
        Ok(s) => s.to_str().map(str::to_owned).map_err(|_| repr(obj)),
        Err(_) => Err(repr(obj)),
    }
}

/// A real number other than a bool, as f64.
pub(crate) fn real(obj: &Bound<'_, PyAny>) -> Option<f64> {
    if obj.is_instance_of::<PyBool>() {
        return None;
    }
    obj.extract::<f64>().ok()
}

fn dtype(obj: &Bound<'_, PyAny>) -> Field<DType> {
    torch_cache(obj.py()).and_then(|torch| torch.dtype(obj)).ok_or_else(|| repr(obj))
}

fn optional<'py>(obj: Bound<'py, PyAny>) -> Option<Bound<'py, PyAny>> {
    (!obj.is_none()).then_some(obj)
}

fn attr<'py>(
    inv: &Bound<'py, PyAny>,
    name: &Bound<'py, PyString>,
) -> PyB12xResult<Bound<'py, PyAny>> {
    inv.getattr(name).map_err(|_| {
        CoreError::ArgumentType {
            op: "PCIe invocation".into(),
            operand: "invocation".into(),
            expected: "an Invocation (an object with name, operation, shape, dtype, strides, \
                       input_alignment, norm_weight and epsilon)"
                .into(),
            got: format!("{} without {}", type_name(inv), name),
        }
        .into()
    })
}

/// Reads and validates one invocation.
pub(crate) fn read(inv: &Bound<'_, PyAny>) -> PyB12xResult<Declared> {
    let py = inv.py();
    let name = string(&attr(inv, intern!(py, "name"))?);
    let operation = string(&attr(inv, intern!(py, "operation"))?);
    let shape = exact_ints(&attr(inv, intern!(py, "shape"))?);
    let dtype = dtype(&attr(inv, intern!(py, "dtype"))?);
    let strides = optional(attr(inv, intern!(py, "strides"))?).map(|s| exact_ints(&s));
    let alignment_obj = attr(inv, intern!(py, "input_alignment"))?;
    let alignment = if alignment_obj.is_exact_instance_of::<PyInt>() {
        alignment_obj.extract::<i64>().map_err(|_| repr(&alignment_obj))
    } else {
        Err(repr(&alignment_obj))
    };
    let weight = optional(attr(inv, intern!(py, "norm_weight"))?);
    let norm_weight =
        weight
            .as_ref()
            .map(|w| if is_tensor(w) { Ok(w.as_ptr() as u64) } else { Err(type_name(w)) });
    // its shape, so a weight of the wrong length is refused when declared
    let weight_meta = weight
        .as_ref()
        .filter(|w| is_tensor(w))
        .map(|w| extract(w, "PCIe invocation", "norm_weight"))
        .transpose()?;
    let epsilon =
        optional(attr(inv, intern!(py, "epsilon"))?).map(|e| real(&e).ok_or_else(|| repr(&e)));

    let declaration = Declaration {
        name: name.as_deref().map_err(Clone::clone),
        operation: operation.as_deref().map_err(Clone::clone),
        shape: shape.as_deref().map_err(Clone::clone),
        dtype,
        strides: strides.as_ref().map(|s| s.as_deref().map_err(Clone::clone)),
        alignment,
        norm_weight,
        norm_weight_shape: weight_meta.as_ref().map(|m| m.shape.as_slice()),
        epsilon,
    };
    let key = declaration.validate()?;
    Ok(Declared {
        key,
        name: name.unwrap_or_default(),
        weight: weight.filter(|_| key.norm().is_some()).map(Bound::unbind),
    })
}

/// `(operation, shape, dtype name, address strides, norm)` with norm `None`
/// or `(weight id, epsilon)`: the key as plain Python values.
pub(crate) fn key_tuple<'py>(py: Python<'py>, key: &PlanKey) -> PyResult<Bound<'py, PyTuple>> {
    let shape = PyTuple::new(py, key.shape())?;
    let strides = PyTuple::new(py, key.address_strides())?;
    let norm = key.norm().map(|n| (n.weight, n.epsilon()));
    (key.operation().name(), shape, key.dtype().name(), strides, norm).into_pyobject(py)
}
