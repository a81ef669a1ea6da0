//! Reading tensor metadata off Python objects.
//!
//! Two paths, one result (`TensorMeta`):
//! * torch tensors: PyTorch's stable C shim when it is usable (see
//!   [`crate::torch_abi`], ~0.1 us), otherwise a handful of attribute reads
//!   (dtype by identity against cached dtype objects, `shape`, `stride()`,
//!   `data_ptr()`, `is_cuda`/`is_cpu`, `get_device()`); no capsule, no
//!   allocation on the torch side.
//!   `torch.Tensor.__dlpack__` costs several microseconds because it builds a
//!   managed tensor and a capsule (see `b12x bench extract`).
//! * any other `__dlpack__` producer (numpy, cupy, ...): the legacy
//!   "dltensor" capsule, read and released without consuming it.

use std::ffi::{c_void, CStr};

use b12x_core::{DType, Device, Dims, Error as CoreError, TensorMeta, MAX_RANK};
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};

use crate::error::{PyB12xErr, PyB12xResult};
use crate::torch_abi;

pub(crate) struct TorchCache {
    pub(crate) tensor_type: Py<PyType>,
    dtypes: Vec<(Py<PyAny>, DType)>,
}

impl TorchCache {
    /// The b12x dtype of a torch dtype object, by identity (no attribute
    /// reads, no string compare); `None` for anything else.
    pub(crate) fn dtype(&self, obj: &Bound<'_, PyAny>) -> Option<DType> {
        let py = obj.py();
        self.dtypes.iter().find(|(d, _)| d.bind(py).is(obj)).map(|(_, d)| *d)
    }

    /// True when `obj` is a torch.Tensor (or subclass).
    pub(crate) fn is_tensor(&self, obj: &Bound<'_, PyAny>) -> bool {
        let ty = self.tensor_type.bind(obj.py());
        obj.get_type().is(ty) || obj.is_instance(ty).unwrap_or(false)
    }
}

static TORCH: PyOnceLock<TorchCache> = PyOnceLock::new();

/// The torch objects extraction compares against, once torch is imported.
/// Nothing is cached before that (a tensor can only be a torch tensor after
/// torch has been imported), so importing torch later still works.
pub(crate) fn torch_cache(py: Python<'_>) -> Option<&TorchCache> {
    TORCH
        .get_or_try_init(py, || -> PyResult<TorchCache> {
            let modules = py.import(intern!(py, "sys"))?.getattr(intern!(py, "modules"))?;
            let torch = modules.cast::<PyDict>()?.get_item("torch")?;
            let Some(torch) = torch else {
                return Err(pyo3::exceptions::PyImportError::new_err("torch not imported"));
            };
            let names = [
                ("float8_e4m3fn", DType::F8E4M3),
                ("float8_e5m2", DType::F8E5M2),
                ("bfloat16", DType::BF16),
                ("float16", DType::F16),
                ("float32", DType::F32),
                ("float64", DType::F64),
                ("int8", DType::I8),
                ("int16", DType::I16),
                ("int32", DType::I32),
                ("int64", DType::I64),
                ("uint8", DType::U8),
                ("bool", DType::Bool),
            ];
            let mut dtypes = Vec::with_capacity(names.len());
            for (name, dtype) in names {
                if let Ok(obj) = torch.getattr(name) {
                    dtypes.push((obj.unbind(), dtype));
                }
            }
            Ok(TorchCache {
                tensor_type: torch.getattr("Tensor")?.cast_into::<PyType>()?.unbind(),
                dtypes,
            })
        })
        .ok()
}

fn not_a_tensor(obj: &Bound<'_, PyAny>, op: &'static str, operand: &str) -> PyB12xErr {
    let got = obj
        .get_type()
        .fully_qualified_name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "an unknown object".into());
    CoreError::NotATensor { op, operand: operand.to_string().into(), got }.into()
}

/// True when `obj` is a torch.Tensor (or subclass); cheap once torch is imported.
pub fn is_torch_tensor(obj: &Bound<'_, PyAny>) -> bool {
    torch_kind(obj).is_some()
}

/// None: not a torch tensor; Some(true): exactly torch.Tensor; Some(false): a subclass.
fn torch_kind(obj: &Bound<'_, PyAny>) -> Option<bool> {
    let torch = torch_cache(obj.py())?;
    let ty = torch.tensor_type.bind(obj.py());
    if obj.get_type().is(ty) {
        Some(true)
    } else if obj.is_instance(ty).unwrap_or(false) {
        Some(false)
    } else {
        None
    }
}

/// Metadata of a torch tensor or DLPack producer; `op`/`operand` name it in errors.
pub fn extract(
    obj: &Bound<'_, PyAny>,
    op: &'static str,
    operand: &str,
) -> PyB12xResult<TensorMeta> {
    if let Some(exact) = torch_kind(obj) {
        // subclasses may override metadata in Python: they take the attribute path
        if let Some(meta) = exact.then(|| torch_abi::extract(obj)).flatten() {
            if torch_abi::unchecked() {
                // first use: trust the shim only if it agrees with torch's own getters
                let attrs = extract_torch(obj, op, operand)?;
                torch_abi::set_checked(attrs == meta);
                return Ok(attrs);
            }
            return Ok(meta);
        }
        return extract_torch(obj, op, operand);
    }
    if obj.hasattr(intern!(obj.py(), "__dlpack__"))? {
        return extract_dlpack(obj, op, operand);
    }
    Err(not_a_tensor(obj, op, operand))
}

fn dims(tuple: &Bound<'_, PyAny>, op: &'static str, operand: &str) -> PyB12xResult<Dims> {
    let tuple = tuple.cast::<PyTuple>().map_err(PyErr::from)?;
    if tuple.len() > MAX_RANK {
        return Err(CoreError::Rank {
            op,
            operand: operand.to_string().into(),
            expected: format!("<= {MAX_RANK}"),
            got: tuple.len(),
            shape: Vec::new(),
        }
        .into());
    }
    let mut out = Dims::new();
    for item in tuple.iter() {
        out.push(item.extract::<i64>()?);
    }
    Ok(out)
}

fn extract_torch(
    obj: &Bound<'_, PyAny>,
    op: &'static str,
    operand: &str,
) -> PyB12xResult<TensorMeta> {
    let py = obj.py();
    let torch = torch_cache(py).expect("checked by is_torch_tensor");
    let dtype_obj = obj.getattr(intern!(py, "dtype"))?;
    let dtype = torch.dtype(&dtype_obj).unwrap_or(DType::Other { code: 255, bits: 0 });
    // Two C-level property reads; `tensor.device` would build a torch.device.
    let device = if obj.getattr(intern!(py, "is_cuda"))?.is_truthy()? {
        Device::Cuda(obj.call_method0(intern!(py, "get_device"))?.extract::<u32>()?)
    } else if obj.getattr(intern!(py, "is_cpu"))?.is_truthy()? {
        // `is_cpu` is a plain getter; `device.type` builds a torch.device (~0.4 us)
        Device::Cpu
    } else {
        Device::Other(-1)
    };
    let shape = dims(&obj.getattr(intern!(py, "shape"))?, op, operand)?;
    // With every extent <= 1 no stride is ever applied (torch ignores them for
    // contiguity too), so skip the `stride()` call (~0.15 us) for scalars.
    let strides = if shape.iter().all(|&d| d <= 1) {
        TensorMeta::contiguous_strides(&shape)
    } else {
        dims(&obj.call_method0(intern!(py, "stride"))?, op, operand)?
    };
    Ok(TensorMeta {
        dtype,
        device,
        shape,
        strides,
        data_ptr: obj.call_method0(intern!(py, "data_ptr"))?.extract::<u64>()?,
        byte_offset: 0,
    })
}

// dlpack.h (v0.x/1.x legacy, unversioned) structures, read-only.
#[repr(C)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}
#[repr(C)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}
#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *const i64,
    strides: *const i64,
    byte_offset: u64,
}

const DL_CPU: i32 = 1;
const DL_CUDA: i32 = 2;

/// Reads a `__dlpack__` producer through its legacy capsule.
pub fn extract_dlpack(
    obj: &Bound<'_, PyAny>,
    op: &'static str,
    operand: &str,
) -> PyB12xResult<TensorMeta> {
    let py = obj.py();
    let (dev_type, _dev_id): (i32, i32) =
        obj.call_method0(intern!(py, "__dlpack_device__"))?.extract()?;
    // stream=-1: metadata only, the producer must not synchronize or wait.
    let capsule = if dev_type == DL_CUDA {
        let kwargs = PyDict::new(py);
        kwargs.set_item("stream", -1)?;
        obj.call_method(intern!(py, "__dlpack__"), (), Some(&kwargs))?
    } else {
        obj.call_method0(intern!(py, "__dlpack__"))?
    };
    const NAME: &CStr = c"dltensor";
    // SAFETY: PyCapsule_GetPointer checks the capsule's type and name and
    // returns null (with an exception set) otherwise. The producer keeps the
    // managed tensor alive until the capsule's destructor runs, after this
    // function has copied what it needs.
    let ptr = unsafe { ffi::PyCapsule_GetPointer(capsule.as_ptr(), NAME.as_ptr()) };
    if ptr.is_null() {
        return Err(PyErr::fetch(py).into());
    }
    // DLManagedTensor starts with its DLTensor.
    let t = unsafe { &*(ptr as *const DLTensor) };
    let ndim = usize::try_from(t.ndim).unwrap_or(usize::MAX);
    if ndim > MAX_RANK {
        return Err(CoreError::Rank {
            op,
            operand: operand.to_string().into(),
            expected: format!("<= {MAX_RANK}"),
            got: ndim,
            shape: Vec::new(),
        }
        .into());
    }
    // SAFETY: shape has ndim entries; strides has ndim entries or is null
    // (meaning compact row-major), per dlpack.h.
    let shape: Dims = (0..ndim).map(|i| unsafe { *t.shape.add(i) }).collect();
    let strides = if t.strides.is_null() {
        TensorMeta::contiguous_strides(&shape)
    } else {
        (0..ndim).map(|i| unsafe { *t.strides.add(i) }).collect()
    };
    let device = match t.device.device_type {
        DL_CPU => Device::Cpu,
        DL_CUDA => Device::Cuda(t.device.device_id as u32),
        other => Device::Other(other),
    };
    Ok(TensorMeta {
        dtype: DType::from_dlpack(t.dtype.code, t.dtype.bits, t.dtype.lanes),
        device,
        shape,
        strides,
        data_ptr: t.data as u64,
        byte_offset: t.byte_offset,
    })
}

/// What b12x read off a tensor: the Python view of `TensorMeta`.
#[pyclass(name = "TensorMeta", module = "b12x._core", frozen)]
pub struct PyTensorMeta(TensorMeta);

#[pymethods]
impl PyTensorMeta {
    #[getter]
    fn dtype(&self) -> &'static str {
        self.0.dtype.name()
    }
    #[getter]
    fn device(&self) -> String {
        self.0.device.to_string()
    }
    #[getter]
    fn shape(&self) -> Vec<i64> {
        self.0.shape.to_vec()
    }
    #[getter]
    fn strides(&self) -> Vec<i64> {
        self.0.strides.to_vec()
    }
    #[getter]
    fn data_ptr(&self) -> u64 {
        self.0.data_ptr
    }
    #[getter]
    fn byte_offset(&self) -> u64 {
        self.0.byte_offset
    }
    /// Address of element 0 (`data_ptr + byte_offset`).
    #[getter]
    fn address(&self) -> u64 {
        self.0.address()
    }
    fn __repr__(&self) -> String {
        let m = &self.0;
        format!(
            "TensorMeta(dtype={}, device={}, shape={:?}, strides={:?}, address={:#x})",
            m.dtype,
            m.device,
            m.shape.as_slice(),
            m.strides.as_slice(),
            m.address()
        )
    }
}

/// Metadata of a torch tensor (fast attribute path) or any DLPack producer.
#[pyfunction]
fn tensor_meta(obj: &Bound<'_, PyAny>) -> PyB12xResult<PyTensorMeta> {
    Ok(PyTensorMeta(extract(obj, "tensor_meta", "tensor")?))
}

/// Same as `tensor_meta`, always through `__dlpack__` (for tests and benches).
#[pyfunction]
fn tensor_meta_dlpack(obj: &Bound<'_, PyAny>) -> PyB12xResult<PyTensorMeta> {
    if !obj.hasattr(intern!(obj.py(), "__dlpack__"))? {
        return Err(not_a_tensor(obj, "tensor_meta_dlpack", "tensor"));
    }
    Ok(PyTensorMeta(extract_dlpack(obj, "tensor_meta_dlpack", "tensor")?))
}

/// A dtype by its torch name (``"bfloat16"`` or ``"torch.bfloat16"``).
pub(crate) fn parse_dtype(name: &str) -> PyB12xResult<DType> {
    const ALL: [DType; 12] = [
        DType::F8E4M3,
        DType::F8E5M2,
        DType::BF16,
        DType::F16,
        DType::F32,
        DType::F64,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::Bool,
    ];
    let name = name.strip_prefix("torch.").unwrap_or(name);
    ALL.into_iter().find(|d| d.name() == name).ok_or_else(|| {
        pyo3::exceptions::PyValueError::new_err(format!("unknown dtype name {name:?}")).into()
    })
}

fn parse_device(name: &str) -> PyB12xResult<Device> {
    match name {
        "cpu" => Ok(Device::Cpu),
        _ => name.strip_prefix("cuda:").and_then(|i| i.parse().ok()).map(Device::Cuda).ok_or_else(
            || {
                pyo3::exceptions::PyValueError::new_err(format!(
                    "device must be 'cpu' or 'cuda:N', got {name:?}"
                ))
                .into()
            },
        ),
    }
}

/// Runs the shared operand checks on `obj`; returns its byte extent.
/// The building block every bind uses, exposed for tests and tools.
#[pyfunction]
#[pyo3(signature = (obj, operand, *, dtypes=None, device=None, rank=None, contiguous=false, weakly_contiguous=false, align=None))]
#[allow(clippy::too_many_arguments)]
fn validate_operand(
    obj: &Bound<'_, PyAny>,
    operand: &str,
    dtypes: Option<Vec<String>>,
    device: Option<&str>,
    rank: Option<usize>,
    contiguous: bool,
    weakly_contiguous: bool,
    align: Option<u64>,
) -> PyB12xResult<u64> {
    use b12x_core::validate::Operand;
    let meta = extract(obj, "validate_operand", operand)?;
    let check = Operand::new("validate_operand", operand.to_string(), &meta);
    if let Some(names) = dtypes {
        let allowed = names.iter().map(|n| parse_dtype(n)).collect::<PyB12xResult<Vec<_>>>()?;
        check.dtype(&allowed)?;
    }
    if let Some(device) = device {
        check.device(parse_device(device)?)?;
    }
    if let Some(rank) = rank {
        check.rank(rank)?;
    }
    if contiguous {
        check.contiguous()?;
    }
    if weakly_contiguous {
        check.weakly_contiguous()?;
    }
    if let Some(align) = align {
        check.aligned(align)?;
    }
    Ok(check.byte_extent()?)
}

/// Whether torch metadata comes through PyTorch's C shim: "unchecked",
/// "trusted" (in use) or "off" (attribute reads).
#[pyfunction]
fn torch_shim_state() -> &'static str {
    torch_abi::state()
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyTensorMeta>()?;
    m.add_function(wrap_pyfunction!(torch_shim_state, m)?)?;
    m.add_function(wrap_pyfunction!(tensor_meta, m)?)?;
    m.add_function(wrap_pyfunction!(tensor_meta_dlpack, m)?)?;
    m.add_function(wrap_pyfunction!(validate_operand, m)?)?;
    Ok(())
}
