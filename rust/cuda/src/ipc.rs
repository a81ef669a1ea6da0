//! CUDA IPC memory for the all-reduce runtime, in each device's primary
//! context (the one torch uses).
//!
//! * [`Slab`]: this rank's exported allocation (`cuMemAlloc`: memory from the
//!   stream-ordered pool cannot be exported), zeroed and synchronized before
//!   its 64-byte `CUipcMemHandle` is handed out.
//! * [`PeerMapping`]: a peer's slab opened with lazy peer access.
//! * [`DeviceTable`]: the u64 slab addresses of every rank, in device memory.
//! * [`HostWord`]: a host-mapped u32 that kernels write their error code to,
//!   so the host reads it without a device sync.
//!
//! Nothing here frees on drop: an all-reduce runtime that was never closed
//! may still be read by a peer's kernel, so its memory is quarantined (kept
//! until the process exits) rather than freed from a finalizer. `free` /
//! `close` consume the value and are called by the coordinated close.

use std::ffi::c_void;

use cudarc::driver::sys;

use crate::device::{ensure_loaded, with_context};
use crate::error::{DriverContext, Result};

/// Bytes of a `CUipcMemHandle`.
pub const IPC_HANDLE_BYTES: usize = 64;

fn dev(ordinal: u32) -> String {
    format!("cuda:{ordinal}")
}

/// Runs `f` in the primary context of `ordinal` (loading b12x's modules there
/// first, which also retains the context).
fn in_primary<T>(ordinal: u32, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let modules = ensure_loaded(ordinal)?;
    with_context(modules.context, f)
}

/// This rank's exported slab.
#[derive(Debug)]
pub struct Slab {
    pub ordinal: u32,
    pub ptr: u64,
    pub bytes: u64,
    pub handle: [u8; IPC_HANDLE_BYTES],
}

impl Slab {
    /// Allocates `bytes`, zeroes them, waits for the zeroing, then exports.
    pub fn allocate(ordinal: u32, bytes: u64) -> Result<Slab> {
        in_primary(ordinal, || {
            let mut ptr: sys::CUdeviceptr = 0;
            // SAFETY: writes one device pointer.
            unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes as usize) }
                .result()
                .ctx("cuMemAlloc", || dev(ordinal))?;
            let zeroed = (|| {
                // SAFETY: ptr is a fresh allocation of `bytes` bytes.
                unsafe { sys::cuMemsetD8_v2(ptr, 0, bytes as usize) }
                    .result()
                    .ctx("cuMemsetD8", || dev(ordinal))?;
                // A peer must never see the slab before it is zero.
                // SAFETY: plain synchronization of the current context.
                unsafe { sys::cuCtxSynchronize() }
                    .result()
                    .ctx("cuCtxSynchronize", || dev(ordinal))?;
                let mut handle = sys::CUipcMemHandle { reserved: [0; IPC_HANDLE_BYTES] };
                // SAFETY: ptr is the base of a cuMemAlloc allocation.
                unsafe { sys::cuIpcGetMemHandle(&mut handle, ptr) }
                    .result()
                    .ctx("cuIpcGetMemHandle", || dev(ordinal))?;
                Ok(handle.reserved.map(|b| b as u8))
            })();
            match zeroed {
                Ok(handle) => Ok(Slab { ordinal, ptr, bytes, handle }),
                Err(e) => {
                    // SAFETY: ptr was allocated above and never shared.
                    let _ = unsafe { sys::cuMemFree_v2(ptr) };
                    Err(e)
                }
            }
        })
    }

    /// Frees the slab. Every peer must have closed its mapping first.
    pub fn free(self) -> Result<()> {
        in_primary(self.ordinal, || {
            // SAFETY: ptr came from cuMemAlloc; the caller guarantees no user is left.
            unsafe { sys::cuMemFree_v2(self.ptr) }.result().ctx("cuMemFree", || dev(self.ordinal))
        })
    }
}

/// A peer's slab mapped into this process.
#[derive(Debug)]
pub struct PeerMapping {
    pub ordinal: u32,
    pub ptr: u64,
}

impl PeerMapping {
    pub fn open(ordinal: u32, handle: &[u8; IPC_HANDLE_BYTES]) -> Result<PeerMapping> {
        in_primary(ordinal, || {
            let handle = sys::CUipcMemHandle { reserved: handle.map(|b| b as _) };
            let mut ptr: sys::CUdeviceptr = 0;
            // SAFETY: writes one device pointer; the handle bytes came from a peer's
            // cuIpcGetMemHandle (a bad handle is reported by the driver).
            unsafe {
                sys::cuIpcOpenMemHandle_v2(
                    &mut ptr,
                    handle,
                    sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
                )
            }
            .result()
            .ctx("cuIpcOpenMemHandle", || dev(ordinal))?;
            Ok(PeerMapping { ordinal, ptr })
        })
    }

    pub fn close(self) -> Result<()> {
        in_primary(self.ordinal, || {
            // SAFETY: ptr came from cuIpcOpenMemHandle; no kernel of ours is in flight
            // (the caller synchronized the device).
            unsafe { sys::cuIpcCloseMemHandle(self.ptr) }
                .result()
                .ctx("cuIpcCloseMemHandle", || dev(self.ordinal))
        })
    }
}

/// u64 addresses in device memory (the peer slab table kernels read).
#[derive(Debug)]
pub struct DeviceTable {
    pub ordinal: u32,
    pub ptr: u64,
}

impl DeviceTable {
    pub fn upload(ordinal: u32, values: &[u64]) -> Result<DeviceTable> {
        in_primary(ordinal, || {
            let bytes = std::mem::size_of_val(values).max(8);
            let mut ptr: sys::CUdeviceptr = 0;
            // SAFETY: writes one device pointer.
            unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes) }
                .result()
                .ctx("cuMemAlloc", || dev(ordinal))?;
            // SAFETY: synchronous copy of `values` into the fresh allocation.
            let copied = unsafe {
                sys::cuMemcpyHtoD_v2(ptr, values.as_ptr().cast(), std::mem::size_of_val(values))
            }
            .result()
            .ctx("cuMemcpyHtoD", || dev(ordinal));
            if let Err(e) = copied {
                // SAFETY: ptr was allocated above and never shared.
                let _ = unsafe { sys::cuMemFree_v2(ptr) };
                return Err(e);
            }
            Ok(DeviceTable { ordinal, ptr })
        })
    }

    pub fn free(self) -> Result<()> {
        in_primary(self.ordinal, || {
            // SAFETY: ptr came from cuMemAlloc; no kernel of ours is in flight.
            unsafe { sys::cuMemFree_v2(self.ptr) }.result().ctx("cuMemFree", || dev(self.ordinal))
        })
    }
}

/// A zeroed u32 in pinned host memory, mapped into the device's address space.
#[derive(Debug)]
pub struct HostWord {
    pub ordinal: u32,
    host: *mut u32,
    pub device_ptr: u64,
}

// SAFETY: the pointer is pinned host memory owned by this value; reads are
// volatile and the only writers are kernels.
unsafe impl Send for HostWord {}
unsafe impl Sync for HostWord {}

impl HostWord {
    pub fn allocate(ordinal: u32) -> Result<HostWord> {
        in_primary(ordinal, || {
            let mut host: *mut c_void = std::ptr::null_mut();
            let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
            // SAFETY: writes one host pointer to a fresh 64-byte pinned allocation.
            unsafe { sys::cuMemHostAlloc(&mut host, 64, flags) }
                .result()
                .ctx("cuMemHostAlloc", || dev(ordinal))?;
            // SAFETY: host points to 64 writable bytes.
            unsafe { std::ptr::write_bytes(host.cast::<u8>(), 0, 64) };
            let mut device_ptr: sys::CUdeviceptr = 0;
            // SAFETY: host is a DEVICEMAP allocation of this context.
            let mapped = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device_ptr, host, 0) }
                .result()
                .ctx("cuMemHostGetDevicePointer", || dev(ordinal));
            if let Err(e) = mapped {
                // SAFETY: allocated above, never shared.
                let _ = unsafe { sys::cuMemFreeHost(host) };
                return Err(e);
            }
            Ok(HostWord { ordinal, host: host.cast(), device_ptr })
        })
    }

    /// The word as kernels last wrote it (no sync: may lag a running kernel).
    #[inline]
    pub fn read(&self) -> u32 {
        // SAFETY: host is valid for the lifetime of self (freed only by `free`).
        unsafe { std::ptr::read_volatile(self.host) }
    }

    pub fn free(self) -> Result<()> {
        in_primary(self.ordinal, || {
            // SAFETY: host came from cuMemHostAlloc; no kernel of ours is in flight.
            unsafe { sys::cuMemFreeHost(self.host.cast()) }
                .result()
                .ctx("cuMemFreeHost", || dev(self.ordinal))
        })
    }
}
