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
//!
//! Nothing a producer does can crash the interpreter: every pointer read
//! from a capsule is checked first (name, null shape, ndim bounds, negative
//! extents), and a producer that raises or returns garbage gives a
//! `NotATensorError` naming the operand and what went wrong.

use std::ffi::{c_void, CStr};

use b12x_core::{
    DType, Device, DeviceName, Dims, Error as CoreError, TensorMeta, MAX_CUDA_ORDINAL, MAX_RANK,
};
use pyo3::exceptions::PyException;
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyString, PyTuple, PyType};

use crate::error::{core_to_py, PyB12xErr, PyB12xResult};
use crate::torch_abi;

pub(crate) struct TorchCache {
    pub(crate) tensor_type: Py<PyType>,
    /// `torch.empty_like`: the all-reduce's fresh output.
    pub(crate) empty_like: Py<PyAny>,
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
                // no b12x op takes these; their DLPack codes make errors name them
                ("complex32", DType::Other { code: 5, bits: 32 }),
                ("complex64", DType::Other { code: 5, bits: 64 }),
                ("complex128", DType::Other { code: 5, bits: 128 }),
                ("uint16", DType::Other { code: 1, bits: 16 }),
                ("uint32", DType::Other { code: 1, bits: 32 }),
                ("uint64", DType::Other { code: 1, bits: 64 }),
                ("float8_e4m3fnuz", DType::Other { code: 11, bits: 8 }),
                ("float8_e5m2fnuz", DType::Other { code: 13, bits: 8 }),
                ("float8_e8m0fnu", DType::Other { code: 14, bits: 8 }),
            ];
            let mut dtypes = Vec::with_capacity(names.len());
            for (name, dtype) in names {
                if let Ok(obj) = torch.getattr(name) {
                    dtypes.push((obj.unbind(), dtype));
                }
            }
            Ok(TorchCache {
                tensor_type: torch.getattr("Tensor")?.cast_into::<PyType>()?.unbind(),
                empty_like: torch.getattr("empty_like")?.unbind(),
                dtypes,
            })
        })
        .ok()
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .fully_qualified_name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "an unknown object".into())
}

/// `repr(obj)` for messages, cut after 60 characters.
pub(crate) fn short_repr(obj: &Bound<'_, PyAny>) -> String {
    const MAX: usize = 60;
    let r = obj.repr().map(|r| r.to_string()).unwrap_or_else(|_| type_name(obj));
    match r.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}...", &r[..cut]),
        None => r,
    }
}

fn not_a_tensor(obj: &Bound<'_, PyAny>, op: &'static str, operand: &str) -> PyB12xErr {
    CoreError::NotATensor { op, operand: operand.to_string().into(), got: type_name(obj) }.into()
}

/// The object being read and the names its errors carry. A producer that
/// raises or hands back garbage becomes a `NotATensorError` naming the
/// operand (the producer's own exception is its `__cause__`); only
/// exceptions outside `Exception` (KeyboardInterrupt, SystemExit) pass through.
struct Reading<'a, 'py> {
    obj: &'a Bound<'py, PyAny>,
    op: &'static str,
    operand: &'a str,
}

impl<'py> Reading<'_, 'py> {
    fn bad(&self, problem: String) -> PyB12xErr {
        CoreError::BadTensor {
            op: self.op,
            operand: self.operand.to_string().into(),
            got: type_name(self.obj),
            problem,
        }
        .into()
    }

    /// `what` (e.g. "data_ptr()") raised `err`.
    fn raised(&self, what: &str, err: PyErr) -> PyB12xErr {
        let py = self.obj.py();
        if !err.is_instance_of::<PyException>(py) {
            return err.into();
        }
        let kind = err.get_type(py).name().map(|n| n.to_string()).unwrap_or_default();
        let PyB12xErr::Core(core) = self.bad(format!("{what} raised {kind}: {}", err.value(py)))
        else {
            unreachable!("bad() builds a core error")
        };
        let wrapped = core_to_py(core);
        wrapped.set_cause(py, Some(err));
        wrapped.into()
    }

    fn attr(&self, name: &Bound<'py, PyString>) -> PyB12xResult<Bound<'py, PyAny>> {
        self.obj.getattr(name).map_err(|e| self.raised(&format!("tensor.{name}"), e))
    }

    fn call(&self, name: &Bound<'py, PyString>) -> PyB12xResult<Bound<'py, PyAny>> {
        self.obj.call_method0(name).map_err(|e| self.raised(&format!("tensor.{name}()"), e))
    }

    fn flag(&self, name: &Bound<'py, PyString>) -> PyB12xResult<bool> {
        let v = self.attr(name)?;
        v.is_truthy().map_err(|e| self.raised(&format!("bool(tensor.{name})"), e))
    }

    fn rank_error(&self, got: usize) -> PyB12xErr {
        CoreError::Rank {
            op: self.op,
            operand: self.operand.to_string().into(),
            expected: format!("<= {MAX_RANK}"),
            got,
            shape: Vec::new(),
        }
        .into()
    }
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
    let reading = Reading { obj, op, operand };
    if let Some(exact) = torch_kind(obj) {
        return read_torch(&reading, exact);
    }
    let has_dlpack = obj
        .hasattr(intern!(obj.py(), "__dlpack__"))
        .map_err(|e| reading.raised("looking up __dlpack__", e))?;
    if has_dlpack {
        return read_dlpack(&reading);
    }
    Err(not_a_tensor(obj, op, operand))
}

/// Like [`extract`], for ops that keep the object and hand it to torch (the
/// indexer's bind): anything but a torch tensor is refused, by name.
pub fn extract_torch_tensor(
    obj: &Bound<'_, PyAny>,
    op: &'static str,
    operand: &str,
) -> PyB12xResult<TensorMeta> {
    if let Some(exact) = torch_kind(obj) {
        return read_torch(&Reading { obj, op, operand }, exact);
    }
    if obj.hasattr(intern!(obj.py(), "__dlpack__")).unwrap_or(false) {
        let got = type_name(obj);
        return Err(
            CoreError::ForeignTensor { op, operand: operand.to_string().into(), got }.into()
        );
    }
    Err(not_a_tensor(obj, op, operand))
}

/// A torch tensor; `exact`: torch.Tensor itself, not a subclass.
fn read_torch(r: &Reading<'_, '_>, exact: bool) -> PyB12xResult<TensorMeta> {
    // subclasses may override metadata in Python: they take the attribute path
    if let Some(meta) = if exact { torch_abi::extract(r.obj)? } else { None } {
        if torch_abi::unchecked() {
            // first use: trust the shim only if it agrees with torch's own getters
            let attrs = extract_torch(r)?;
            torch_abi::set_checked(attrs == meta);
            return Ok(attrs);
        }
        return Ok(meta);
    }
    extract_torch(r)
}

/// A torch.Size / tuple of ints (`what` names it in errors).
fn dims(r: &Reading<'_, '_>, value: &Bound<'_, PyAny>, what: &str) -> PyB12xResult<Dims> {
    let tuple = value
        .cast::<PyTuple>()
        .map_err(|_| r.bad(format!("{what} is {}, not a tuple", short_repr(value))))?;
    if tuple.len() > MAX_RANK {
        return Err(r.rank_error(tuple.len()));
    }
    let mut out = Dims::new();
    for (i, item) in tuple.iter().enumerate() {
        let v = item.extract::<i64>().map_err(|_| {
            r.bad(format!("{what}[{i}] is {}, not a 64-bit integer", short_repr(&item)))
        })?;
        out.push(v);
    }
    Ok(out)
}

fn extract_torch(r: &Reading<'_, '_>) -> PyB12xResult<TensorMeta> {
    let obj = r.obj;
    let py = obj.py();
    let torch = torch_cache(py).expect("checked by is_torch_tensor");
    let dtype = torch.dtype(&r.attr(intern!(py, "dtype"))?).unwrap_or(DType::UNKNOWN);
    // Two C-level property reads; `tensor.device` would build a torch.device.
    let device = if r.flag(intern!(py, "is_cuda"))? {
        let index = r.call(intern!(py, "get_device"))?;
        let ordinal = index.extract::<u32>().map_err(|_| {
            r.bad(format!("get_device() returned {} for a CUDA tensor", short_repr(&index)))
        })?;
        Device::Cuda(ordinal)
    } else if r.flag(intern!(py, "is_cpu"))? {
        // `is_cpu` is a plain getter; `device.type` builds a torch.device (~0.4 us)
        Device::Cpu
    } else if r.flag(intern!(py, "is_meta"))? {
        Device::Meta
    } else {
        Device::Other(-1)
    };
    let shape = dims(r, &r.attr(intern!(py, "shape"))?, "shape")?;
    if let Some((i, d)) = shape.iter().enumerate().find(|(_, &d)| d < 0) {
        return Err(r.bad(format!("shape[{i}] is {d}")));
    }
    // With every extent <= 1 no stride is ever applied (torch ignores them for
    // contiguity too), so skip the `stride()` call (~0.15 us) for scalars.
    let strides = if shape.iter().all(|&d| d <= 1) {
        TensorMeta::contiguous_strides(&shape)
    } else {
        dims(r, &r.call(intern!(py, "stride"))?, "stride()")?
    };
    if strides.len() != shape.len() {
        return Err(r.bad(format!(
            "stride() has {} entries for the {} dimensions of its shape",
            strides.len(),
            shape.len()
        )));
    }
    let ptr = r.call(intern!(py, "data_ptr"))?;
    let data_ptr = ptr
        .extract::<u64>()
        .map_err(|_| r.bad(format!("data_ptr() returned {}, not an address", short_repr(&ptr))))?;
    Ok(TensorMeta { dtype, device, shape, strides, data_ptr, byte_offset: 0 })
}

// dlpack.h (v0.x/1.x legacy, unversioned) structures, read-only.
#[repr(C)]
#[derive(Clone, Copy)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}
#[repr(C)]
#[derive(Clone, Copy)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}
#[repr(C)]
#[derive(Clone, Copy)]
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
/// The capsule name of an unconsumed legacy DLPack tensor.
const CAPSULE_NAME: &CStr = c"dltensor";

/// Reads a `__dlpack__` producer through its legacy capsule (exposed for tests and benches).
pub fn extract_dlpack(
    obj: &Bound<'_, PyAny>,
    op: &'static str,
    operand: &str,
) -> PyB12xResult<TensorMeta> {
    read_dlpack(&Reading { obj, op, operand })
}

fn read_dlpack(r: &Reading<'_, '_>) -> PyB12xResult<TensorMeta> {
    let obj = r.obj;
    let py = obj.py();
    let dev = obj
        .call_method0(intern!(py, "__dlpack_device__"))
        .map_err(|e| r.raised("__dlpack_device__()", e))?;
    let (dev_type, dev_id): (i32, i32) = dev.extract().map_err(|_| {
        r.bad(format!(
            "__dlpack_device__() returned {}, not a (device_type, device_id) pair",
            short_repr(&dev)
        ))
    })?;
    // stream=-1: metadata only, the producer must not synchronize or wait.
    let capsule = if dev_type == DL_CUDA {
        let kwargs = PyDict::new(py);
        kwargs.set_item("stream", -1)?;
        obj.call_method(intern!(py, "__dlpack__"), (), Some(&kwargs))
    } else {
        obj.call_method0(intern!(py, "__dlpack__"))
    }
    .map_err(|e| r.raised("__dlpack__()", e))?;
    let t = dltensor(r, &capsule)?;
    if (t.device.device_type, t.device.device_id) != (dev_type, dev_id) {
        return Err(r.bad(format!(
            "__dlpack_device__() says ({dev_type}, {dev_id}) but its capsule holds a tensor on \
             ({}, {})",
            t.device.device_type, t.device.device_id
        )));
    }
    let ndim = usize::try_from(t.ndim)
        .map_err(|_| r.bad(format!("its DLPack tensor has ndim = {}", t.ndim)))?;
    if ndim > MAX_RANK {
        return Err(r.rank_error(ndim));
    }
    if ndim > 0 && t.shape.is_null() {
        return Err(r.bad(format!("its DLPack tensor has a NULL shape for ndim = {ndim}")));
    }
    // SAFETY: a non-null shape has ndim entries, and so do non-null strides
    // (null strides mean compact row-major), per dlpack.h; the capsule, and
    // with it the managed tensor, lives until this function returns.
    let read = |p: *const i64| -> Dims { (0..ndim).map(|i| unsafe { *p.add(i) }).collect() };
    let shape = if ndim == 0 { Dims::new() } else { read(t.shape) };
    if let Some((i, d)) = shape.iter().enumerate().find(|(_, &d)| d < 0) {
        return Err(r.bad(format!("its DLPack tensor has shape[{i}] = {d}")));
    }
    let strides = if ndim == 0 || t.strides.is_null() {
        TensorMeta::contiguous_strides(&shape)
    } else {
        read(t.strides)
    };
    let device = match t.device.device_type {
        DL_CPU => Device::Cpu,
        DL_CUDA => Device::Cuda(u32::try_from(t.device.device_id).map_err(|_| {
            r.bad(format!("its DLPack tensor is on CUDA device {}", t.device.device_id))
        })?),
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

/// The DLTensor inside an unconsumed "dltensor" capsule, by value. The
/// capsule is left as it is: not renamed, so its destructor still frees it.
fn dltensor(r: &Reading<'_, '_>, capsule: &Bound<'_, PyAny>) -> PyB12xResult<DLTensor> {
    // SAFETY: type checks and name reads on a live object; GetName returns
    // null for an unnamed capsule (and cannot fail on an exact capsule).
    let name = unsafe {
        if ffi::PyCapsule_CheckExact(capsule.as_ptr()) == 0 {
            let got = type_name(capsule);
            return Err(r.bad(format!("__dlpack__() returned {got}, not a DLPack capsule")));
        }
        let name = ffi::PyCapsule_GetName(capsule.as_ptr());
        (!name.is_null()).then(|| CStr::from_ptr(name))
    };
    if name != Some(CAPSULE_NAME) {
        let problem = match name.map(CStr::to_bytes) {
            Some(b"used_dltensor" | b"used_dltensor_versioned") => {
                "__dlpack__() returned a capsule another consumer already took".to_string()
            }
            Some(b"dltensor_versioned") => "__dlpack__() returned a versioned capsule \
                ('dltensor_versioned') though b12x asked for the unversioned 'dltensor'"
                .to_string(),
            Some(other) => format!(
                "__dlpack__() returned a capsule named {:?}, not 'dltensor'",
                String::from_utf8_lossy(other)
            ),
            None => "__dlpack__() returned an unnamed capsule, not 'dltensor'".to_string(),
        };
        return Err(r.bad(problem));
    }
    // SAFETY: the name matched, so GetPointer returns the capsule's pointer:
    // a DLManagedTensor, which starts with its DLTensor (null only if the
    // producer built an invalid capsule, reported as an exception).
    let ptr = unsafe { ffi::PyCapsule_GetPointer(capsule.as_ptr(), CAPSULE_NAME.as_ptr()) };
    if ptr.is_null() {
        let why = PyErr::take(capsule.py()).map(|e| e.to_string()).unwrap_or_default();
        return Err(r.bad(format!("its DLPack capsule holds no tensor ({why})")));
    }
    // SAFETY: see above; copied out while the capsule is alive.
    Ok(unsafe { *(ptr as *const DLTensor) })
}

/// What b12x read off a tensor: the Python view of `TensorMeta`.
#[pyclass(name = "TensorMeta", module = "b12x._core", frozen)]
pub struct PyTensorMeta(TensorMeta);

#[pymethods]
impl PyTensorMeta {
    #[getter]
    fn dtype(&self) -> String {
        self.0.dtype.to_string()
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

/// Same as `tensor_meta`, always through `__dlpack__`; private, for tests
/// and `b12x bench extract`.
#[pyfunction(name = "_tensor_meta_dlpack")]
fn tensor_meta_dlpack(obj: &Bound<'_, PyAny>) -> PyB12xResult<PyTensorMeta> {
    if !obj.hasattr(intern!(obj.py(), "__dlpack__")).unwrap_or(false) {
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
        let names: Vec<&str> = ALL.iter().map(|d| d.name()).collect();
        CoreError::InvalidValue {
            op: "validate_operand",
            operand: "dtypes".into(),
            expected: format!("dtype names from {{{}}}", names.join(", ")).into(),
            got: format!("{name:?}"),
        }
        .into()
    })
}

fn parse_device(name: &str) -> PyB12xResult<Device> {
    match DeviceName::parse(name) {
        Some(DeviceName::Cpu) => Ok(Device::Cpu),
        Some(DeviceName::Cuda(Some(ordinal))) => Ok(Device::Cuda(ordinal)),
        // a bare "cuda" (torch's current device) is no fixed device to check against
        _ => Err(CoreError::InvalidValue {
            op: "validate_operand",
            operand: "device".into(),
            expected: format!("'cpu' or 'cuda:N' (N <= {MAX_CUDA_ORDINAL})").into(),
            got: format!("{name:?}"),
        }
        .into()),
    }
}

/// The device string grammar of b12x-core (`DeviceName`), for the Python
/// entry points that take device strings: `("cpu", None)`, `("cuda", None)`
/// for torch's current device, `("cuda", N)`, or None when `text` is none.
#[pyfunction]
fn parse_device_name(text: &str) -> Option<(&'static str, Option<u32>)> {
    match DeviceName::parse(text)? {
        DeviceName::Cpu => Some(("cpu", None)),
        DeviceName::Cuda(ordinal) => Some(("cuda", ordinal)),
    }
}

/// Runs the shared operand checks on `obj`; returns its byte extent.
/// The building block every bind uses; private, for tests and `b12x bench extract`.
#[pyfunction(name = "_validate_operand")]
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
/// "trusted" (in use), "off" (attribute reads) or "invalid" (a
/// `B12X_TORCH_SHIM` value outside the accepted set: tensor reads raise).
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
    m.add_function(wrap_pyfunction!(parse_device_name, m)?)?;
    m.add("MAX_CUDA_ORDINAL", MAX_CUDA_ORDINAL)?;
    Ok(())
}
