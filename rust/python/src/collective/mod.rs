//! `DeclaredPlanIndex` and `invocation_key` for `b12x.comm.pcie`.
//!
//! The index is b12x-core's `DeclaredPlanIndex` with Python payloads: each
//! entry holds the invocation, its plan and (for the fused operation) a
//! strong reference to the norm weight, so the weight's `id()`, which is
//! part of the key, cannot be reused by another object while it is indexed.

pub(crate) mod declaration;
mod probe;

use b12x_core::collective::{DeclaredPlanIndex, Entry};
use b12x_core::Error as CoreError;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};
use pyo3::{PyTraverseError, PyVisit};

use crate::error::PyB12xResult;
pub(crate) use probe::{Args, Bad};

/// What one declaration maps to.
struct Payload {
    invocation: Py<PyAny>,
    plan: Py<PyAny>,
    /// Keeps the weight whose identity is in the key alive.
    weight: Option<Py<PyAny>>,
}

/// Declared collective plans, found by exact key in constant time.
///
/// Built from ``(invocation, plan)`` pairs in declaration order; for equal
/// keys the first declaration wins. The key is ``(operation, shape, dtype,
/// address strides, norm)``: address strides set the stride of every size-1
/// dimension to 0, and norm is ``(id(norm_weight), epsilon)`` for the fused
/// operation. Lookups never insert; ``rebuild`` swaps in a whole new snapshot
/// at once, so a concurrent reader sees the old declarations or the new ones.
#[pyclass(frozen, module = "b12x._core", name = "DeclaredPlanIndex")]
pub struct PyDeclaredPlanIndex {
    index: DeclaredPlanIndex<Payload>,
}

const LOOKUP: &str = "DeclaredPlanIndex.lookup";
const PLAN_FOR: &str = "DeclaredPlanIndex.plan_for";

fn entries(op: &'static str, pairs: &Bound<'_, PyAny>) -> PyB12xResult<Vec<Entry<Payload>>> {
    let refuse = |operand: String, expected: &'static str, got: String| CoreError::ArgumentType {
        op: op.into(),
        operand: operand.into(),
        expected: expected.into(),
        got,
    };
    let items = pairs.try_iter().map_err(|_| {
        refuse("pairs".into(), "an iterable of (invocation, plan) tuples", declaration::repr(pairs))
    })?;
    let mut out = Vec::new();
    for (i, item) in items.enumerate() {
        let item = item?;
        let Ok((invocation, plan)) = item.extract::<(Bound<'_, PyAny>, Bound<'_, PyAny>)>() else {
            return Err(refuse(
                format!("pairs[{i}]"),
                "an (invocation, plan) tuple",
                declaration::type_name(&item),
            )
            .into());
        };
        let declared = declaration::read(&invocation)?;
        out.push(Entry {
            name: declared.name,
            key: declared.key,
            payload: Payload {
                invocation: invocation.unbind(),
                plan: plan.unbind(),
                weight: declared.weight,
            },
        });
    }
    Ok(out)
}

impl PyDeclaredPlanIndex {
    /// The plan for a call whose tensor was read already; `Ok(None)` on a
    /// miss, `Err(Bad)` for input that has no key (no exception is built).
    #[inline]
    pub(crate) fn probe_meta(
        &self,
        py: Python<'_>,
        args: &Args<'_, '_>,
        meta: &b12x_core::TensorMeta,
    ) -> Result<Option<Py<PyAny>>, probe::Bad> {
        probe::with_meta(meta, args, |key| {
            self.index.lookup(key).map(|hit| hit.payload.plan.clone_ref(py))
        })
    }

    /// The UndeclaredPlanError of a call `args` that found nothing: its
    /// operation, shape, dtype and strides, and at most 16 declarations.
    pub(crate) fn undeclared(&self, op: &'static str, args: &Args<'_, '_>) -> CoreError {
        let (shape, strides, dtype) = probe::describe(args.tensor);
        let msg = self.index.load().undeclared_message(
            op,
            probe::operation_of(args),
            &dtype,
            &shape,
            &strides,
            probe::norm_of(args),
        );
        CoreError::UndeclaredPlan(msg)
    }

    /// The plan for `args`, `Ok(None)` on a miss, `Err` for bad input.
    #[inline]
    fn find(
        &self,
        py: Python<'_>,
        op: &'static str,
        args: &Args<'_, '_>,
    ) -> PyB12xResult<Option<Py<PyAny>>> {
        match probe::with(args, |key| {
            self.index.lookup(key).map(|hit| hit.payload.plan.clone_ref(py))
        }) {
            Ok(plan) => Ok(plan),
            Err(bad) => match bad.into_err(op, args) {
                Some(err) => Err(err),
                None => Ok(None),
            },
        }
    }
}

#[pymethods]
impl PyDeclaredPlanIndex {
    #[new]
    #[pyo3(signature = (pairs=None))]
    fn new(pairs: Option<&Bound<'_, PyAny>>) -> PyB12xResult<Self> {
        let index = match pairs {
            Some(pairs) => DeclaredPlanIndex::new(entries("DeclaredPlanIndex", pairs)?),
            None => DeclaredPlanIndex::default(),
        };
        Ok(PyDeclaredPlanIndex { index })
    }

    /// Replaces every declaration at once with ``pairs`` (first equal key
    /// wins). On a bad pair the index is left as it was.
    fn rebuild(&self, pairs: &Bound<'_, PyAny>) -> PyB12xResult<()> {
        let entries = entries("DeclaredPlanIndex.rebuild", pairs)?;
        self.index.rebuild(entries);
        Ok(())
    }

    /// Empties the index and releases its plans and weights.
    fn clear(&self) {
        self.index.clear();
    }

    /// Number of distinct declared keys (what a lookup can find).
    fn __len__(&self) -> usize {
        self.index.len()
    }

    /// The plan declared for this tensor, or None.
    ///
    /// ``operation`` None means ``"all_reduce"``; ``weight`` and ``epsilon``
    /// count only for the fused operation (a fused call without them finds
    /// nothing). Raises a TypeError for a non-tensor (NotATensorError), a
    /// zero-size tensor or negative strides (UnsupportedTensorError), a
    /// weight that is not a tensor, an epsilon that is not a real number or an
    /// operation that is not a string; a ValueError (ConfigError) for an
    /// unknown operation name. Tensors of more than 8 dimensions or of a dtype
    /// b12x cannot name are plain misses.
    #[pyo3(signature = (tensor, operation=None, weight=None, epsilon=None))]
    fn lookup(
        &self,
        tensor: &Bound<'_, PyAny>,
        operation: Option<&Bound<'_, PyAny>>,
        weight: Option<&Bound<'_, PyAny>>,
        epsilon: Option<&Bound<'_, PyAny>>,
    ) -> PyB12xResult<Option<Py<PyAny>>> {
        let args = Args { tensor, operation, weight, epsilon };
        self.find(tensor.py(), LOOKUP, &args)
    }

    /// Whether a plan is declared for this tensor: ``lookup(...) is not
    /// None``, except that it never raises (bad input is False) and builds no
    /// exception on a miss. Never inserts.
    #[pyo3(signature = (tensor, operation=None, weight=None, epsilon=None))]
    fn has_plan_for(
        &self,
        tensor: &Bound<'_, PyAny>,
        operation: Option<&Bound<'_, PyAny>>,
        weight: Option<&Bound<'_, PyAny>>,
        epsilon: Option<&Bound<'_, PyAny>>,
    ) -> bool {
        let args = Args { tensor, operation, weight, epsilon };
        probe::with(&args, |key| self.index.contains(key)).unwrap_or(false)
    }

    /// The plan declared for this tensor; raises UndeclaredPlanError (a
    /// RuntimeError) naming the operation, shape, dtype and strides of the
    /// call, at most 16 declarations and their count when there is none. Bad
    /// input raises as in ``lookup``.
    #[pyo3(signature = (tensor, operation=None, weight=None, epsilon=None))]
    fn plan_for(
        &self,
        tensor: &Bound<'_, PyAny>,
        operation: Option<&Bound<'_, PyAny>>,
        weight: Option<&Bound<'_, PyAny>>,
        epsilon: Option<&Bound<'_, PyAny>>,
    ) -> PyB12xResult<Py<PyAny>> {
        let py = tensor.py();
        let args = Args { tensor, operation, weight, epsilon };
        if let Some(plan) = self.find(py, PLAN_FOR, &args)? {
            return Ok(plan);
        }
        Err(self.undeclared(PLAN_FOR, &args).into()) // the miss path only: O(16) formatting
    }

    /// Every ``(invocation, plan)`` pair in declaration order, shadowed
    /// duplicates included.
    fn declared<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let snapshot = self.index.load();
        let pairs = snapshot
            .entries()
            .iter()
            .map(|e| {
                PyTuple::new(py, [e.payload.invocation.clone_ref(py), e.payload.plan.clone_ref(py)])
            })
            .collect::<PyResult<Vec<_>>>()?;
        PyList::new(py, pairs)
    }

    fn __repr__(&self) -> String {
        let snapshot = self.index.load();
        format!(
            "DeclaredPlanIndex({} keys from {} declarations)",
            snapshot.len(),
            snapshot.entries().len()
        )
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        let snapshot = self.index.load();
        for e in snapshot.entries() {
            visit.call(&e.payload.invocation)?;
            visit.call(&e.payload.plan)?;
            if let Some(w) = &e.payload.weight {
                visit.call(w)?;
            }
        }
        Ok(())
    }

    fn __clear__(&self) {
        self.index.clear();
    }
}

/// Validates an invocation (spec §2 rules) and returns its key:
/// ``(operation, shape, dtype name, address strides, norm)`` with norm None
/// or ``(id(norm_weight), epsilon)``.
#[pyfunction]
fn invocation_key<'py>(invocation: &Bound<'py, PyAny>) -> PyB12xResult<Bound<'py, PyTuple>> {
    let declared = declaration::read(invocation)?;
    Ok(declaration::key_tuple(invocation.py(), &declared.key)?)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyDeclaredPlanIndex>()?;
    m.add_function(wrap_pyfunction!(invocation_key, m)?)?;
    Ok(())
}
