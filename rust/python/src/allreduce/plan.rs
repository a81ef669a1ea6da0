//! `AllReducePlan`: b12x-core's all-reduce `Plan` as a Python object, and
//! the calls that route and prepare declarations.

use std::sync::Arc;

use b12x_core::allreduce::{self as ar, Declared, Decline, Plan, Setup};
use b12x_core::collective::Operation;
use b12x_core::{DType, Error as CoreError};
use b12x_cuda::allreduce::ptx_kernel;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyString, PyTuple};

use super::knobs::PyLimits;
use crate::collective::declaration::repr;
use crate::error::PyB12xResult;
use crate::tensor::{parse_dtype, torch_cache};

const DECLARE: &str = "AllReduce.declare";

/// A prepared all-reduce for one declared (operation, shape, dtype): its
/// route, kernel and launch geometry. Equal declarations share one plan.
/// Made by the runtime's ``declare``, never by hand.
#[pyclass(name = "AllReducePlan", module = "b12x._core", frozen)]
#[derive(Debug)]
pub struct PyAllReducePlan(pub Arc<Plan>);

#[pymethods]
impl PyAllReducePlan {
    /// "oneshot", "oneshot_fused" or "twoshot".
    #[getter]
    fn route(&self) -> &'static str {
        self.0.route().name()
    }
    #[getter]
    fn operation(&self) -> &'static str {
        self.0.operation().name()
    }
    #[getter]
    fn dtype(&self) -> &'static str {
        self.0.dtype().name()
    }
    #[getter]
    fn shape(&self) -> Vec<i64> {
        self.0.shape().to_vec()
    }
    #[getter]
    fn nbytes(&self) -> u64 {
        self.0.nbytes()
    }
    #[getter]
    fn world(&self) -> u32 {
        self.0.world()
    }
    /// Bytes one launch stages in the runtime's slot.
    #[getter]
    fn staged_bytes(&self) -> u64 {
        self.0.staged_bytes()
    }
    /// (grid, block, packs per thread)
    #[getter]
    fn geometry(&self) -> (u32, u32, u32) {
        let g = self.0.geometry();
        (g.grid, g.block, g.packs_per_thread)
    }
    /// The PTX symbol of the kernel.
    #[getter]
    fn kernel(&self) -> &'static str {
        ptx_kernel(self.0.kernel()).symbol()
    }
    #[getter]
    fn twoshot_push(&self) -> bool {
        self.0.twoshot_push()
    }

    fn __repr__(&self) -> String {
        let p = &self.0;
        let g = p.geometry();
        format!(
            "AllReducePlan(route={}, shape={:?}, dtype={}, grid={}, block={}, kernel={})",
            p.route().name(),
            p.shape(),
            p.dtype().name(),
            g.grid,
            g.block,
            self.kernel()
        )
    }
}

/// A declaration's fields as plain values; `dtype` is Err(repr) for an
/// object that names no b12x dtype.
struct Read {
    operation: Operation,
    shape: Vec<i64>,
    dtype: Result<DType, String>,
    strides: Option<Vec<i64>>,
}

fn bad(operand: &'static str, expected: &'static str, obj: &Bound<'_, PyAny>) -> CoreError {
    CoreError::InvalidValue {
        op: DECLARE,
        operand: operand.into(),
        expected: expected.into(),
        got: repr(obj),
    }
}

fn operation(obj: &Bound<'_, PyAny>) -> PyB12xResult<Operation> {
    const EXPECTED: &str = "'all_reduce' or 'all_reduce_fused_add_rms_norm'";
    let name = obj.cast::<PyString>().map_err(|_| bad("operation", EXPECTED, obj))?;
    Ok(Operation::parse(name.to_str()?).ok_or_else(|| bad("operation", EXPECTED, obj))?)
}

fn dims(obj: &Bound<'_, PyAny>, operand: &'static str) -> PyB12xResult<Vec<i64>> {
    Ok(obj.extract::<Vec<i64>>().map_err(|_| bad(operand, "a sequence of ints", obj))?)
}

/// A torch dtype (by identity) or anything whose str() is a dtype name.
fn dtype(obj: &Bound<'_, PyAny>) -> Result<DType, String> {
    if let Some(d) = torch_cache(obj.py()).and_then(|t| t.dtype(obj)) {
        return Ok(d);
    }
    let text = obj.str().map(|s| s.to_string()).map_err(|_| repr(obj))?;
    parse_dtype(&text).map_err(|_| repr(obj))
}

fn read_fields(
    operation_obj: &Bound<'_, PyAny>,
    shape: &Bound<'_, PyAny>,
    dtype_obj: &Bound<'_, PyAny>,
    strides: &Bound<'_, PyAny>,
) -> PyB12xResult<Read> {
    Ok(Read {
        operation: operation(operation_obj)?,
        shape: dims(shape, "shape")?,
        dtype: dtype(dtype_obj),
        strides: if strides.is_none() { None } else { Some(dims(strides, "strides")?) },
    })
}

fn read_invocation(inv: &Bound<'_, PyAny>) -> PyB12xResult<Read> {
    let py = inv.py();
    read_fields(
        &inv.getattr(intern!(py, "operation"))?,
        &inv.getattr(intern!(py, "shape"))?,
        &inv.getattr(intern!(py, "dtype"))?,
        &inv.getattr(intern!(py, "strides"))?,
    )
}

impl Read {
    fn declared(&self) -> Result<Declared<'_>, Decline> {
        let dtype = self
            .dtype
            .as_ref()
            .map_err(|obj| Decline(format!("dtype {obj} is not float16, bfloat16 or float32")))?;
        Ok(Declared {
            operation: self.operation,
            shape: &self.shape,
            dtype: *dtype,
            strides: self.strides.as_deref(),
        })
    }
}

/// Routes a declaration: ("oneshot" | "oneshot_fused" | "twoshot", "") or (None, why).
#[pyfunction]
#[pyo3(signature = (operation, shape, dtype, strides, world, limits))]
fn allreduce_route(
    operation: &Bound<'_, PyAny>,
    shape: &Bound<'_, PyAny>,
    dtype: &Bound<'_, PyAny>,
    strides: &Bound<'_, PyAny>,
    world: u32,
    limits: &Bound<'_, PyLimits>,
) -> PyB12xResult<(Option<&'static str>, String)> {
    let read = read_fields(operation, shape, dtype, strides)?;
    let routed = read.declared().and_then(|d| ar::route(&d, world, &limits.get().0));
    Ok(match routed {
        Ok(route) => (Some(route.name()), String::new()),
        Err(why) => (None, why.0),
    })
}

/// Routes and prepares ``invocations`` (objects with ``operation``,
/// ``shape``, ``dtype``, ``strides``) for a group of ``world`` ranks:
/// ``([(invocation, plan)], [(invocation, why)])`` in declaration order,
/// equal declarations sharing one plan.
#[pyfunction]
#[pyo3(signature = (invocations, world, limits, multiprocessors, twoshot_push=false))]
fn allreduce_prepare<'py>(
    py: Python<'py>,
    invocations: &Bound<'py, PyAny>,
    world: u32,
    limits: &Bound<'py, PyLimits>,
    multiprocessors: u32,
    twoshot_push: bool,
) -> PyB12xResult<(Bound<'py, PyList>, Bound<'py, PyList>)> {
    let invs = invocations.try_iter()?.collect::<PyResult<Vec<_>>>()?;
    let reads = invs.iter().map(read_invocation).collect::<PyB12xResult<Vec<_>>>()?;
    let declared: Vec<Result<Declared<'_>, Decline>> = reads.iter().map(Read::declared).collect();
    let setup = Setup { world, multiprocessors, twoshot_push };
    let prepared = ar::prepare(
        declared.iter().filter_map(|d| d.as_ref().ok().copied()),
        &setup,
        &limits.get().0,
    );
    let mut plans: Vec<Option<Py<PyAllReducePlan>>> =
        (0..prepared.plans.len()).map(|_| None).collect();
    let mut outcomes = prepared.outcomes.into_iter();
    let (routed, declined) = (PyList::empty(py), PyList::empty(py));
    for (inv, d) in invs.iter().zip(declared) {
        let outcome = match d {
            Ok(_) => outcomes.next().expect("one outcome per readable declaration"),
            Err(why) => Err(why),
        };
        match outcome {
            Ok(i) => {
                let plan = match &plans[i] {
                    Some(plan) => plan.clone_ref(py),
                    None => {
                        let plan = Py::new(py, PyAllReducePlan(prepared.plans[i].clone()))?;
                        plans[i] = Some(plan.clone_ref(py));
                        plan
                    }
                };
                routed.append(PyTuple::new(
                    py,
                    [inv.clone().into_any(), plan.into_bound(py).into_any()],
                )?)?;
            }
            Err(why) => declined.append((inv, why.0))?,
        }
    }
    Ok((routed, declined))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyAllReducePlan>()?;
    m.add_function(wrap_pyfunction!(allreduce_route, m)?)?;
    m.add_function(wrap_pyfunction!(allreduce_prepare, m)?)?;
    Ok(())
}
