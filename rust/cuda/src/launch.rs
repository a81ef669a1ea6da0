//! Launching onto a caller's stream: the one audited unsafe boundary.
//!
//! # Safety contract
//! Callers of [`launch`] guarantee that `params` matches the kernel's PTX
//! parameter list in count, order and size, that every device pointer in it
//! is valid for the accesses the kernel makes, and that `stream` is a live
//! CUstream of the kernel's device (0 = the legacy default stream).

use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};

use cudarc::driver::sys;

use crate::device::{loaded, with_context};
use crate::error::{CudaError, DriverContext, Result};
use crate::ptx::Kernel;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchConfig {
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    pub shared_bytes: u32,
    /// CTAs per thread block cluster along x (sm_90+; 1: no cluster). The
    /// grid's x extent is a multiple of it.
    pub cluster: u32,
    /// Programmatic dependent launch (sm_90+): the kernel may start while
    /// the previous kernel of the stream is still running, once that one
    /// signals `griddepcontrol.launch_dependents` (or ends); it must wait in
    /// `griddepcontrol.wait` before reading what that kernel writes.
    pub dependent: bool,
}

impl LaunchConfig {
    pub const fn linear(grid: u32, block: u32) -> Self {
        LaunchConfig {
            grid: (grid, 1, 1),
            block: (block, 1, 1),
            shared_bytes: 0,
            cluster: 1,
            dependent: false,
        }
    }
}

/// Kernels enqueued by [`launch`] in this process (relaxed; for `b12x bench
/// host`, which sets a run's floor to as many bare launches as it makes).
static LAUNCHES: AtomicU64 = AtomicU64::new(0);

/// How many kernels [`launch`] has enqueued in this process.
pub fn launches() -> u64 {
    LAUNCHES.load(Ordering::Relaxed)
}

/// Kernel argument list: addresses of the argument values, in order.
#[macro_export]
macro_rules! kernel_args {
    ($($arg:expr),* $(,)?) => {
        [$(std::ptr::addr_of!($arg) as *mut std::ffi::c_void),*]
    };
}

/// Enqueues `kernel` on `stream` of device `ordinal`. Never loads, allocates or syncs.
///
/// # Safety
/// See the module's safety contract.
pub unsafe fn launch(
    ordinal: u32,
    kernel: Kernel,
    config: LaunchConfig,
    stream: u64,
    params: &mut [*mut c_void],
) -> Result<()> {
    let modules = loaded(ordinal)?;
    if !modules.has(kernel) {
        let (major, minor) = modules.compute_capability;
        return Err(CudaError::KernelUnavailable {
            kernel: kernel.symbol(),
            target: kernel.module().target.ptx_target(),
            ordinal,
            arch: format!("sm_{major}{minor}"),
        });
    }
    let f = modules.function(kernel);
    with_context(modules.context, || {
        let (api, status) = if config.cluster > 1 || config.dependent {
            // SAFETY: forwarded from this function's contract.
            ("cuLaunchKernelEx", unsafe { launch_ex(f, config, stream, params) })
        } else {
            // SAFETY: forwarded from this function's contract.
            let status = unsafe {
                sys::cuLaunchKernel(
                    f,
                    config.grid.0,
                    config.grid.1,
                    config.grid.2,
                    config.block.0,
                    config.block.1,
                    config.block.2,
                    config.shared_bytes,
                    stream as sys::CUstream,
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            };
            ("cuLaunchKernel", status)
        };
        status.result().ctx(api, || format!("cuda:{ordinal} ({})", kernel.symbol()))?;
        LAUNCHES.fetch_add(1, Ordering::Relaxed);
        Ok(())
    })
}

/// Enqueues clearing `words` 32-bit words at device address `dst` on `stream`.
///
/// # Safety
/// `dst` must be valid for `words` words of writes on device `ordinal`, and
/// `stream` a live CUstream of it.
pub unsafe fn memset_u32(ordinal: u32, dst: u64, words: u32, stream: u64) -> Result<()> {
    let modules = loaded(ordinal)?;
    with_context(modules.context, || {
        // SAFETY: forwarded from this function's contract.
        unsafe { sys::cuMemsetD32Async(dst, 0, words as usize, stream as sys::CUstream) }
            .result()
            .ctx("cuMemsetD32Async", || format!("cuda:{ordinal}"))
    })
}

/// `cuLaunchKernelEx` with the attributes `config` asks for: a cluster
/// dimension, programmatic stream serialization.
///
/// # Safety
/// As [`launch`]; the current context is the kernel's.
unsafe fn launch_ex(
    f: sys::CUfunction,
    config: LaunchConfig,
    stream: u64,
    params: &mut [*mut c_void],
) -> sys::CUresult {
    debug_assert!(config.grid.0 % config.cluster == 0);
    // SAFETY: each value union is read by the driver as the member its
    // attribute id names (clusterDim, programmaticStreamSerializationAllowed).
    let mut attrs: [sys::CUlaunchAttribute; 2] = unsafe { std::mem::zeroed() };
    let mut count = 0;
    if config.cluster > 1 {
        attrs[count].id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
        attrs[count].value.clusterDim =
            sys::CUlaunchAttributeValue_union__bindgen_ty_1 { x: config.cluster, y: 1, z: 1 };
        count += 1;
    }
    if config.dependent {
        attrs[count].id =
            sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attrs[count].value.programmaticStreamSerializationAllowed = 1;
        count += 1;
    }
    let cfg = sys::CUlaunchConfig {
        gridDimX: config.grid.0,
        gridDimY: config.grid.1,
        gridDimZ: config.grid.2,
        blockDimX: config.block.0,
        blockDimY: config.block.1,
        blockDimZ: config.block.2,
        sharedMemBytes: config.shared_bytes,
        hStream: stream as sys::CUstream,
        attrs: attrs.as_mut_ptr(),
        numAttrs: count as u32,
    };
    // SAFETY: forwarded from the caller's contract.
    unsafe { sys::cuLaunchKernelEx(&cfg, f, params.as_mut_ptr(), std::ptr::null_mut()) }
}
