//! torch's current CUDA stream, for enqueueing kernels where torch would.
//!
//! Fast path: `aoti_torch_get_current_cuda_stream` from PyTorch's stable C
//! shim in `libtorch_cuda.so` (already loaded by torch; opened with
//! `RTLD_NOLOAD`), a plain C call. Fallback:
//! `torch._C._cuda_getCurrentRawStream(device)` through Python.
//! `B12X_TORCH_SHIM=0` turns the fast path off, as for tensor metadata.

use std::ffi::c_void;

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

type GetStream = unsafe extern "C" fn(i32, *mut *mut c_void) -> i32;

static SHIM: PyOnceLock<Option<GetStream>> = PyOnceLock::new();
static PY_FALLBACK: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

#[cfg(target_os = "linux")]
fn load(py: Python<'_>) -> Option<GetStream> {
    let lib = crate::torch_abi::loaded_torch_library(py, "libtorch_cuda.so")?;
    // SAFETY: the signature of torch/csrc/inductor/aoti_torch/c/shim.h.
    let f = unsafe { *lib.get::<GetStream>(b"aoti_torch_get_current_cuda_stream\0").ok()? };
    std::mem::forget(lib); // torch keeps it loaded; keep our reference too
    Some(f)
}

#[cfg(not(target_os = "linux"))]
fn load(_py: Python<'_>) -> Option<GetStream> {
    None
}

/// torch's current CUstream on `ordinal`, as an integer (0 = legacy default).
pub fn current_stream(py: Python<'_>, ordinal: u32) -> PyResult<u64> {
    if let Some(f) = SHIM.get_or_init(py, || load(py)) {
        let mut stream: *mut c_void = std::ptr::null_mut();
        // SAFETY: writes one pointer; errors come back as a non-zero code.
        if unsafe { f(ordinal as i32, &mut stream) } == 0 {
            return Ok(stream as u64);
        }
    }
    let f = PY_FALLBACK.get_or_try_init(py, || {
        Ok::<_, PyErr>(
            py.import("torch")?.getattr("_C")?.getattr("_cuda_getCurrentRawStream")?.unbind(),
        )
    })?;
    f.bind(py).call1((ordinal,))?.extract()
}
