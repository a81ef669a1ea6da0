//! Torch tensor metadata through PyTorch's stable C shim (`aoti_torch_get_*`).
//!
//! The attribute path of [`crate::tensor`] makes six torch calls per tensor
//! (`dtype`, `is_cuda`, `shape`, `stride()`, ...), each ~60-150 ns because
//! torch sets up error and warning handlers around every getter; a bind of
//! eight tensors then costs ~5 us. Here one attribute read (`_cdata`, the
//! tensor's `TensorImpl*`) plus seven C calls into the AOTInductor shim,
//! which PyTorch keeps ABI-stable, give the same facts in ~0.1 us.
//!
//! Used for exact `torch.Tensor` instances only: a subclass may override
//! metadata in Python, so it takes the attribute path.
//!
//! Assumptions, each checked or contained:
//! * the shim lives in `torch/lib/libtorch_cpu.so`, already loaded by
//!   `import torch` (opened with `RTLD_NOLOAD`, so never loaded twice);
//! * an `at::Tensor` is a single `TensorImpl*` (its only member is an
//!   intrusive pointer), so the address of a local holding `_cdata` is a
//!   valid `AtenTensorHandle` for as long as the Python tensor lives;
//! * shim calls catch C++ exceptions and return an error code; any error
//!   falls back to the attribute path.
//!
//! The first tensor read this way is also read through the attribute path;
//! if the two disagree the shim is never used again in this process.
//!
//! `B12X_TORCH_SHIM` switches it (and the current-stream shim of
//! [`crate::torch_stream`]): unset, empty, `1`/`on`/`true`/`yes` use it,
//! `0`/`off`/`false`/`no` turn it off (case-insensitive); any other value
//! makes every tensor read fail with a `ConfigError` naming the variable.
//! It is read once per process.

use std::ffi::c_void;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

use b12x_core::validate::parse_switch;
use b12x_core::{DType, Device, Dims, Error as CoreError, TensorMeta, MAX_RANK};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

type Handle = *mut c_void;
type GetPtr = unsafe extern "C" fn(Handle, *mut *mut c_void) -> i32;
type GetI64 = unsafe extern "C" fn(Handle, *mut i64) -> i32;
type GetDims = unsafe extern "C" fn(Handle, *mut *mut i64) -> i32;
type GetI32 = unsafe extern "C" fn(Handle, *mut i32) -> i32;
type Code = unsafe extern "C" fn() -> i32;

pub struct Shim {
    data_ptr: GetPtr,
    dim: GetI64,
    sizes: GetDims,
    strides: GetDims,
    dtype: GetI32,
    device_type: GetI32,
    device_index: GetI32,
    dtypes: Vec<(i32, DType)>,
    cpu: i32,
    cuda: i32,
}

// SAFETY: plain function pointers into a library that stays loaded.
unsafe impl Send for Shim {}
unsafe impl Sync for Shim {}

const UNCHECKED: u8 = 0;
const TRUSTED: u8 = 1;
const OFF: u8 = 2;
static STATE: AtomicU8 = AtomicU8::new(UNCHECKED);
static SHIM: PyOnceLock<Option<Shim>> = PyOnceLock::new();

const SWITCH_VAR: &str = "B12X_TORCH_SHIM";

/// `B12X_TORCH_SHIM`, read once: whether the shims may be used, or the error
/// for a value outside the documented set.
pub(crate) fn switch() -> &'static Result<bool, CoreError> {
    static SWITCH: OnceLock<Result<bool, CoreError>> = OnceLock::new();
    SWITCH.get_or_init(|| match std::env::var_os(SWITCH_VAR) {
        None => Ok(true),
        Some(v) => parse_switch(SWITCH_VAR, &v.to_string_lossy()).map(|on| on.unwrap_or(true)),
    })
}

/// A handle to one of torch's own shared libraries (`torch/lib/<file>`),
/// only if `import torch` already loaded it; None when the shim is switched
/// off (`B12X_TORCH_SHIM`, see the module docs) or the library is not there.
#[cfg(target_os = "linux")]
pub(crate) fn loaded_torch_library(
    py: Python<'_>,
    file: &str,
) -> Option<libloading::os::unix::Library> {
    use libloading::os::unix::{Library, RTLD_NOW};
    const RTLD_NOLOAD: i32 = 4; // glibc and musl
    if !matches!(switch(), Ok(true)) {
        return None;
    }
    let torch_file: String = py.import("torch").ok()?.getattr("__file__").ok()?.extract().ok()?;
    let path = std::path::Path::new(&torch_file).parent()?.join("lib").join(file);
    // SAFETY: RTLD_NOLOAD only returns a handle to a library torch already
    // loaded, so no initialisers run.
    unsafe { Library::open(Some(path), RTLD_NOW | RTLD_NOLOAD) }.ok()
}

#[cfg(target_os = "linux")]
fn load(py: Python<'_>) -> Option<Shim> {
    let lib = loaded_torch_library(py, "libtorch_cpu.so")?;
    // SAFETY: the signatures are those of torch/csrc/inductor/aoti_torch/c/shim.h.
    unsafe {
        let code = |name: &[u8]| lib.get::<Code>(name).ok().map(|f| f());
        let mut dtypes = Vec::new();
        for (name, dtype) in [
            (&b"aoti_torch_dtype_float8_e4m3fn\0"[..], DType::F8E4M3),
            (b"aoti_torch_dtype_float8_e5m2\0", DType::F8E5M2),
            (b"aoti_torch_dtype_bfloat16\0", DType::BF16),
            (b"aoti_torch_dtype_float16\0", DType::F16),
            (b"aoti_torch_dtype_float32\0", DType::F32),
            (b"aoti_torch_dtype_float64\0", DType::F64),
            (b"aoti_torch_dtype_int8\0", DType::I8),
            (b"aoti_torch_dtype_int16\0", DType::I16),
            (b"aoti_torch_dtype_int32\0", DType::I32),
            (b"aoti_torch_dtype_int64\0", DType::I64),
            (b"aoti_torch_dtype_uint8\0", DType::U8),
            (b"aoti_torch_dtype_bool\0", DType::Bool),
        ] {
            if let Some(c) = code(name) {
                dtypes.push((c, dtype));
            }
        }
        let shim = Shim {
            data_ptr: *lib.get::<GetPtr>(b"aoti_torch_get_data_ptr\0").ok()?,
            dim: *lib.get::<GetI64>(b"aoti_torch_get_dim\0").ok()?,
            sizes: *lib.get::<GetDims>(b"aoti_torch_get_sizes\0").ok()?,
            strides: *lib.get::<GetDims>(b"aoti_torch_get_strides\0").ok()?,
            dtype: *lib.get::<GetI32>(b"aoti_torch_get_dtype\0").ok()?,
            device_type: *lib.get::<GetI32>(b"aoti_torch_get_device_type\0").ok()?,
            device_index: *lib.get::<GetI32>(b"aoti_torch_get_device_index\0").ok()?,
            dtypes,
            cpu: code(b"aoti_torch_device_type_cpu\0")?,
            cuda: code(b"aoti_torch_device_type_cuda\0")?,
        };
        std::mem::forget(lib); // torch keeps it loaded; keep our reference too
        Some(shim)
    }
}

#[cfg(not(target_os = "linux"))]
fn load(_py: Python<'_>) -> Option<Shim> {
    None
}

fn shim(py: Python<'_>) -> Option<&'static Shim> {
    if STATE.load(Ordering::Relaxed) == OFF {
        return None;
    }
    let s = SHIM.get_or_init(py, || load(py)).as_ref();
    if s.is_none() {
        STATE.store(OFF, Ordering::Relaxed);
    }
    s
}

/// True until one tensor has been read both ways and they agreed.
pub fn unchecked() -> bool {
    STATE.load(Ordering::Relaxed) == UNCHECKED
}

/// "unchecked", "trusted", "off", or "invalid" (a bad `B12X_TORCH_SHIM`),
/// for tests and `b12x doctor`.
pub fn state() -> &'static str {
    if switch().is_err() {
        return "invalid";
    }
    match STATE.load(Ordering::Relaxed) {
        UNCHECKED => "unchecked",
        TRUSTED => "trusted",
        _ => "off",
    }
}

/// Records the outcome of the one-time comparison with the attribute path.
pub fn set_checked(agreed: bool) {
    STATE.store(if agreed { TRUSTED } else { OFF }, Ordering::Relaxed);
}

/// Metadata of a torch tensor through the shim, or None (use the attribute
/// path); an error only for a `B12X_TORCH_SHIM` value outside the accepted set.
pub fn extract(obj: &Bound<'_, PyAny>) -> Result<Option<TensorMeta>, CoreError> {
    if let Err(e) = switch() {
        return Err(e.clone());
    }
    Ok(read(obj))
}

fn read(obj: &Bound<'_, PyAny>) -> Option<TensorMeta> {
    let py = obj.py();
    let shim = shim(py)?;
    let cdata_obj = obj.getattr(intern!(py, "_cdata")).ok()?;
    // PyLong_AsVoidPtr: a digit loop, unlike u64 extraction's byte-array path (~30 ns)
    // SAFETY: a plain conversion of a Python object; errors come back as null + exception.
    let cdata = unsafe { pyo3::ffi::PyLong_AsVoidPtr(cdata_obj.as_ptr()) } as usize;
    if cdata == 0 {
        let _ = PyErr::take(py); // not an int (a subclass override): use the attribute path
        return None;
    }
    // An at::Tensor is exactly one TensorImpl pointer: point the shim at ours.
    let mut tensor = cdata;
    let h: Handle = (&mut tensor as *mut usize).cast();
    let (mut data, mut dim, mut sizes, mut strides) =
        (std::ptr::null_mut(), 0i64, std::ptr::null_mut(), std::ptr::null_mut());
    let (mut dtype, mut dev_type, mut dev_index) = (0i32, 0i32, 0i32);
    // SAFETY: `obj` (borrowed for this whole call) owns the TensorImpl, so
    // the handle is valid; each call writes only its out-parameter and
    // reports failures as a non-zero code.
    unsafe {
        if (shim.dim)(h, &mut dim) != 0
            || (shim.sizes)(h, &mut sizes) != 0
            || (shim.strides)(h, &mut strides) != 0
            || (shim.dtype)(h, &mut dtype) != 0
            || (shim.device_type)(h, &mut dev_type) != 0
            || (shim.device_index)(h, &mut dev_index) != 0
            || (shim.data_ptr)(h, &mut data) != 0
        {
            return None;
        }
    }
    let rank = usize::try_from(dim).ok().filter(|&d| d <= MAX_RANK)?;
    if rank > 0 && (sizes.is_null() || strides.is_null()) {
        return None;
    }
    let view = |p: *mut i64| -> &[i64] {
        if rank == 0 {
            &[]
        } else {
            // SAFETY: the shim returned `rank` int64 values owned by the TensorImpl.
            unsafe { std::slice::from_raw_parts(p, rank) }
        }
    };
    let shape = Dims::try_from(view(sizes)).ok()?;
    let strides = if shape.iter().all(|&d| d <= 1) {
        TensorMeta::contiguous_strides(&shape) // same normalisation as the attribute path
    } else {
        Dims::try_from(view(strides)).ok()?
    };
    let device = if dev_type == shim.cuda {
        Device::Cuda(u32::try_from(dev_index).ok()?)
    } else if dev_type == shim.cpu {
        Device::Cpu
    } else {
        return None; // the attribute path names the other devices
    };
    // a dtype the shim table lacks: the attribute path can still name it
    let dtype = shim.dtypes.iter().find(|(c, _)| *c == dtype).map(|(_, d)| *d)?;
    Some(TensorMeta { dtype, device, shape, strides, data_ptr: data as u64, byte_offset: 0 })
}
