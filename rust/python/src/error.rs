//! Maps b12x-core and b12x-cuda errors to the Python classes of `b12x.errors`.
//!
//! The classes are defined in Python (they inherit from both `B12xError`
//! and a builtin such as ValueError) and imported here. The single `match`
//! that picks a class lives in `From<PyB12xErr> for PyErr`.

use b12x_core::Error as CoreError;
use b12x_cuda::CudaError;
use pyo3::PyErr;

/// The exception classes of `b12x.errors`, imported on first use.
pub mod exc {
    use pyo3::import_exception;
    import_exception!(b12x.errors, AlignmentError);
    import_exception!(b12x.errors, CapacityError);
    import_exception!(b12x.errors, ConfigError);
    import_exception!(b12x.errors, CudaError);
    import_exception!(b12x.errors, CollectiveTimeoutError);
    import_exception!(b12x.errors, DTypeError);
    import_exception!(b12x.errors, DeviceError);
    import_exception!(b12x.errors, KernelLoadError);
    import_exception!(b12x.errors, LayoutError);
    import_exception!(b12x.errors, NotATensorError);
    import_exception!(b12x.errors, PageTableError);
    import_exception!(b12x.errors, ShapeError);
    import_exception!(b12x.errors, UndeclaredPlanError);
    import_exception!(b12x.errors, UnsupportedTensorError);
    import_exception!(b12x.errors, ArgumentTypeError);
}
use exc::*;

/// Newtype so `?` works on core and cuda errors inside `#[pyfunction]`s
/// (the orphan rule forbids `From<CoreError> for PyErr` here).
pub enum PyB12xErr {
    Core(CoreError),
    Cuda(CudaError),
    Py(PyErr),
}

pub type PyB12xResult<T> = Result<T, PyB12xErr>;

impl From<CoreError> for PyB12xErr {
    fn from(e: CoreError) -> Self {
        PyB12xErr::Core(e)
    }
}

impl From<CudaError> for PyB12xErr {
    fn from(e: CudaError) -> Self {
        match e {
            CudaError::Core(core) => PyB12xErr::Core(core),
            other => PyB12xErr::Cuda(other),
        }
    }
}

impl From<PyErr> for PyB12xErr {
    fn from(e: PyErr) -> Self {
        PyB12xErr::Py(e)
    }
}

pub fn core_to_py(e: CoreError) -> PyErr {
    let msg = e.to_string();
    match e {
        CoreError::DType { .. } => DTypeError::new_err(msg),
        CoreError::NotATensor { .. }
        | CoreError::BadTensor { .. }
        | CoreError::ForeignTensor { .. } => NotATensorError::new_err(msg),
        CoreError::Device { .. } | CoreError::DeviceArgument { .. } => DeviceError::new_err(msg),
        CoreError::Rank { .. } | CoreError::Shape { .. } => ShapeError::new_err(msg),
        CoreError::Layout { .. } => LayoutError::new_err(msg),
        CoreError::Alignment { .. } => AlignmentError::new_err(msg),
        CoreError::ExtentOverflow { .. }
        | CoreError::Capacity { .. }
        | CoreError::Insufficient { .. } => CapacityError::new_err(msg),
        CoreError::UndeclaredPlan(_) => UndeclaredPlanError::new_err(msg),
        CoreError::UnsupportedTensor { .. } => UnsupportedTensorError::new_err(msg),
        CoreError::PageTable(_) => PageTableError::new_err(msg),
        CoreError::ArgumentType { .. } => ArgumentTypeError::new_err(msg),
        _ => ConfigError::new_err(msg),
    }
}

impl From<PyB12xErr> for PyErr {
    fn from(e: PyB12xErr) -> PyErr {
        match e {
            PyB12xErr::Core(core) => core_to_py(core),
            PyB12xErr::Cuda(cuda @ CudaError::ModuleLoad(_)) => {
                KernelLoadError::new_err(cuda.to_string())
            }
            PyB12xErr::Cuda(cuda @ CudaError::CollectiveTimeout { .. }) => {
                CollectiveTimeoutError::new_err(cuda.to_string())
            }
            PyB12xErr::Cuda(cuda) => exc::CudaError::new_err(cuda.to_string()),
            PyB12xErr::Py(py) => py,
        }
    }
}
