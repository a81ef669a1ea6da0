//! `Limits` and the environment knobs of the all-reduce (b12x-core's rules).

use b12x_core::allreduce::knobs::{self, EnvValues, Knob};
use b12x_core::allreduce::{parse_byte_size, LimitField, Limits};
use std::sync::Mutex;

use b12x_core::Error as CoreError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyInt, PyString, PyTuple};

use crate::collective::declaration::{real, repr};
use crate::error::PyB12xResult;

/// Reads `knobs` from `env` (a mapping; None: `os.environ`), each from its
/// name or else its deprecated one (core's rule). A value that is not a
/// string is an error naming its variable; a deprecated name in use is
/// logged once per process with the new one.
fn env_values(
    env: Option<&Bound<'_, PyAny>>,
    py: Python<'_>,
    only: &[Knob],
) -> PyB12xResult<EnvValues> {
    let os_environ;
    let env = match env {
        Some(env) if !env.is_none() => env,
        _ => {
            os_environ = py.import(intern!(py, "os"))?.getattr(intern!(py, "environ"))?;
            &os_environ
        }
    };
    let values = EnvValues::read(only, |name| -> PyB12xResult<Option<String>> {
        let value = env.call_method1(intern!(py, "get"), (name,))?;
        if value.is_none() {
            return Ok(None);
        }
        let Ok(text) = value.cast::<PyString>() else {
            return Err(CoreError::InvalidValue {
                op: knobs::OP,
                operand: name.into(),
                expected: "a string (an environment value)".into(),
                got: repr(&value),
            }
            .into());
        };
        Ok(Some(text.to_str()?.to_owned()))
    })?;
    for (old, new) in values.deprecated_in_use() {
        warn_deprecated_once(py, old, new)?;
    }
    Ok(values)
}

/// One warning per deprecated name and process, on b12x's logger (which runs
/// through vLLM's handlers inside vLLM). The lock is not held while logging:
/// a handler may release the GIL or read the knobs again.
fn warn_deprecated_once(py: Python<'_>, old: &'static str, new: &'static str) -> PyResult<()> {
    static WARNED: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());
    {
        let mut warned = WARNED.lock().unwrap_or_else(|p| p.into_inner());
        if warned.contains(&old) {
            return Ok(());
        }
        warned.push(old);
    }
    let logger =
        py.import(intern!(py, "logging"))?.call_method1("getLogger", ("b12x.comm.pcie",))?;
    logger.call_method1(
        "warning",
        (format!("b12x: {old} is deprecated and will be ignored in a later release; set {new}"),),
    )?;
    Ok(())
}

const LIMIT_KNOBS: [Knob; 4] =
    [Knob::OneshotMax, Knob::FusedMax, Knob::TwoshotMax, Knob::TwoshotRowElems];

/// A limit field as a Python int: exactly an int (not a bool), in range.
fn field(field: LimitField, obj: &Bound<'_, PyAny>) -> PyB12xResult<u64> {
    if !obj.is_instance_of::<PyInt>() || obj.is_instance_of::<PyBool>() {
        return Err(field.refuse(repr(obj)).into());
    }
    let value = obj.extract::<u64>().map_err(|_| field.refuse(repr(obj)))?;
    Ok(field.check(value)?)
}

/// Inclusive byte ceilings of each all-reduce route (0 turns a route off).
///
/// ``oneshot_max`` and ``fused_max`` bound the one-shot and fused kernels,
/// ``twoshot_max`` the bf16 two-shot, which also needs ``numel % (world *
/// twoshot_row_elems) == 0``. Every field is checked here: byte ceilings are
/// ints in 0..=2**40, ``twoshot_row_elems`` in 1..=2**31; anything else is a
/// ConfigError naming the field.
#[pyclass(name = "Limits", module = "b12x.comm.pcie", frozen, eq, hash)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PyLimits(pub Limits);

#[pymethods]
impl PyLimits {
    #[new]
    #[pyo3(signature = (oneshot_max=None, fused_max=None, twoshot_max=None, twoshot_row_elems=None))]
    fn new(
        oneshot_max: Option<&Bound<'_, PyAny>>,
        fused_max: Option<&Bound<'_, PyAny>>,
        twoshot_max: Option<&Bound<'_, PyAny>>,
        twoshot_row_elems: Option<&Bound<'_, PyAny>>,
    ) -> PyB12xResult<Self> {
        let d = Limits::DEFAULT;
        let get = |f: LimitField, obj: Option<&Bound<'_, PyAny>>, default: u64| match obj {
            Some(obj) => field(f, obj),
            None => Ok(default),
        };
        Ok(PyLimits(Limits::new(
            get(LimitField::OneshotMax, oneshot_max, d.oneshot_max())?,
            get(LimitField::FusedMax, fused_max, d.fused_max())?,
            get(LimitField::TwoshotMax, twoshot_max, d.twoshot_max())?,
            get(LimitField::TwoshotRowElems, twoshot_row_elems, d.twoshot_row_elems())?,
        )?))
    }

    /// Limits from the environment knobs (``env``: a mapping, default
    /// ``os.environ``), defaults where a variable is unset. A garbage value
    /// is a ConfigError naming the variable and the accepted form.
    #[staticmethod]
    #[pyo3(signature = (env=None))]
    fn from_env(py: Python<'_>, env: Option<&Bound<'_, PyAny>>) -> PyB12xResult<Self> {
        let values = env_values(env, py, &LIMIT_KNOBS)?;
        Ok(PyLimits(knobs::limits_from_env(&values)?))
    }

    #[getter]
    fn oneshot_max(&self) -> u64 {
        self.0.oneshot_max()
    }
    #[getter]
    fn fused_max(&self) -> u64 {
        self.0.fused_max()
    }
    #[getter]
    fn twoshot_max(&self) -> u64 {
        self.0.twoshot_max()
    }
    #[getter]
    fn twoshot_row_elems(&self) -> u64 {
        self.0.twoshot_row_elems()
    }

    /// Bytes one staging slot must hold: the largest ceiling, the push
    /// two-shot counting twice (it stages received shards and gathered
    /// results side by side).
    #[pyo3(signature = (twoshot_push=false))]
    fn slot_bytes(&self, twoshot_push: bool) -> u64 {
        self.0.slot_bytes(twoshot_push)
    }

    fn __repr__(&self) -> String {
        self.0.to_string()
    }

    /// ``(oneshot_max, fused_max, twoshot_max, twoshot_row_elems)``: every
    /// field in the constructor's order (what ranks compare at set-up).
    fn as_tuple(&self) -> (u64, u64, u64, u64) {
        let l = self.0;
        (l.oneshot_max(), l.fused_max(), l.twoshot_max(), l.twoshot_row_elems())
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        (slf.get_type(), slf.get().as_tuple()).into_pyobject(slf.py())
    }
}

/// Parses a byte size ("17", "84KB", "6 MiB", "2g"); signed.
#[pyfunction]
fn allreduce_parse_byte_size(text: &str) -> PyB12xResult<i64> {
    Ok(parse_byte_size(text)?)
}

/// Nanoseconds of the wait bound: ``timeout_s`` (a real number of seconds)
/// or, when None, ``B12X_ALLREDUCE_TIMEOUT_S`` from ``env`` (default 60 s).
#[pyfunction]
#[pyo3(signature = (timeout_s, env=None))]
fn allreduce_timeout_ns(
    py: Python<'_>,
    timeout_s: Option<&Bound<'_, PyAny>>,
    env: Option<&Bound<'_, PyAny>>,
) -> PyB12xResult<u64> {
    match timeout_s.filter(|t| !t.is_none()) {
        Some(obj) => {
            let seconds = real(obj).ok_or_else(|| CoreError::InvalidValue {
                op: knobs::OP,
                operand: "timeout_s".into(),
                expected: Knob::TimeoutS.accepted().into(),
                got: repr(obj),
            })?;
            Ok(knobs::timeout_ns(seconds, "timeout_s")?)
        }
        None => Ok(knobs::timeout_ns_from_env(&env_values(env, py, &[Knob::TimeoutS])?)?),
    }
}

/// The two-shot transport: ``choice`` (a bool) or, when None,
/// ``B12X_ALLREDUCE_TWOSHOT_PUSH`` from ``env``: True, False or None (auto).
#[pyfunction]
#[pyo3(signature = (choice, env=None))]
fn allreduce_twoshot_push(
    py: Python<'_>,
    choice: Option<&Bound<'_, PyAny>>,
    env: Option<&Bound<'_, PyAny>>,
) -> PyB12xResult<Option<bool>> {
    match choice.filter(|c| !c.is_none()) {
        Some(obj) => {
            let push = obj.cast::<PyBool>().map_err(|_| CoreError::InvalidValue {
                op: knobs::OP,
                operand: "twoshot_push".into(),
                expected: "True, False or None (auto)".into(),
                got: repr(obj),
            })?;
            Ok(Some(push.is_true()))
        }
        None => Ok(knobs::twoshot_push_from_env(&env_values(env, py, &[Knob::TwoshotPush])?)?),
    }
}

/// The rank the set-up test hook fails (``B12X_ALLREDUCE_TEST_FAIL_SETUP_RANK``), if set.
/// Private: a test hook, read through `b12x.comm.pcie.knobs.fail_setup_rank`.
#[pyfunction(name = "_allreduce_fail_setup_rank")]
#[pyo3(signature = (env=None))]
fn allreduce_fail_setup_rank(
    py: Python<'_>,
    env: Option<&Bound<'_, PyAny>>,
) -> PyB12xResult<Option<u32>> {
    Ok(knobs::fail_setup_rank_from_env(&env_values(env, py, &[Knob::FailSetupRank])?)?)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let names = PyDict::new(m.py());
    for knob in Knob::ALL {
        names.set_item(knob.key(), knob.var())?;
    }
    m.add("ALLREDUCE_ENV", names)?;
    let deprecated = PyDict::new(m.py());
    for knob in Knob::ALL {
        if let Some(old) = knob.deprecated_var() {
            deprecated.set_item(old, knob.var())?;
        }
    }
    m.add("ALLREDUCE_ENV_DEPRECATED", deprecated)?;
    m.add("ALLREDUCE_DEFAULT_TIMEOUT_S", knobs::DEFAULT_TIMEOUT_S)?;
    m.add_class::<PyLimits>()?;
    m.add_function(wrap_pyfunction!(allreduce_parse_byte_size, m)?)?;
    m.add_function(wrap_pyfunction!(allreduce_timeout_ns, m)?)?;
    m.add_function(wrap_pyfunction!(allreduce_twoshot_push, m)?)?;
    m.add_function(wrap_pyfunction!(allreduce_fail_setup_rank, m)?)?;
    Ok(())
}
