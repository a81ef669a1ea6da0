//! Devices, the primary context and the per-device module store.
//!
//! Modules load once per device, in the device's primary context (the
//! context torch uses), when a plan or prepared object asks for them
//! ([`ensure_loaded`]). Launches only read the store ([`loaded`]): a missing
//! entry is an error, never a load, so the driver's JIT cannot land in a hot
//! call or a graph capture. Failed loads are not cached.

use std::ffi::{c_int, c_void, CString};
use std::sync::{Mutex, OnceLock};

use cudarc::driver::{result, sys};

use crate::error::{CudaError, DriverContext, ModuleLoadError, Result};
use crate::ptx::{Kernel, PtxModule, MODULES, PTX_ISA};

/// Device ordinals b12x can address (the store is a fixed array: lookups take no lock).
pub const MAX_DEVICES: usize = 64;

/// Loaded modules and kernel handles of one device.
pub struct DeviceModules {
    pub ordinal: u32,
    pub context: sys::CUcontext,
    pub compute_capability: (u32, u32),
    pub multiprocessors: u32,
    /// Dynamic shared memory one CTA may take (the opt-in limit every
    /// function was given at load).
    pub shared_opt_in: u32,
    /// Shared memory of one SM: what the CTAs resident on it share.
    pub shared_per_sm: u32,
    /// Device address of the status record kernels report refused input in
    /// ([`STATUS_BYTES`], zeroed here; the indexer's page-id faults). One per
    /// device, so it stays valid in captured graphs and is never shared with
    /// a caller's workspace.
    pub status: u64,
    functions: [sys::CUfunction; Kernel::COUNT],
}

/// Bytes of the per-device status record (b12x_core::indexer::STATUS_WORDS u32s).
pub const STATUS_BYTES: usize = b12x_core::indexer::STATUS_WORDS * 4;

// SAFETY: CUcontext and CUfunction are driver handles, valid from any thread;
// the driver API is thread-safe and the store never frees them.
unsafe impl Send for DeviceModules {}
unsafe impl Sync for DeviceModules {}

impl DeviceModules {
    /// The kernel's handle; null when its module targets another architecture.
    pub fn function(&self, kernel: Kernel) -> sys::CUfunction {
        self.functions[kernel as usize]
    }

    /// Whether `kernel` was loaded (its module's target runs on this device).
    pub fn has(&self, kernel: Kernel) -> bool {
        !self.functions[kernel as usize].is_null()
    }
}

static STORE: [OnceLock<DeviceModules>; MAX_DEVICES] = [const { OnceLock::new() }; MAX_DEVICES];
static LOAD_LOCK: Mutex<()> = Mutex::new(());

/// True when libcuda can be loaded; never panics.
pub fn driver_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to dlopen the library by its usual names.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

fn init() -> Result<()> {
    if !driver_present() {
        return Err(CudaError::NoDriver);
    }
    static INIT: OnceLock<std::result::Result<(), sys::CUresult>> = OnceLock::new();
    INIT.get_or_init(|| result::init().map_err(|e| e.0)).map_err(|code| CudaError::Driver {
        call: "cuInit",
        device: "the driver".into(),
        source: cudarc::driver::DriverError(code),
    })
}

/// The driver's CUDA version as (major, minor), e.g. (13, 0) for driver 580.
pub fn driver_version() -> Result<(u32, u32)> {
    init()?;
    let mut v: c_int = 0;
    // SAFETY: writes one int.
    unsafe { sys::cuDriverGetVersion(&mut v) }
        .result()
        .ctx("cuDriverGetVersion", || "the driver".into())?;
    Ok(((v / 1000) as u32, ((v % 1000) / 10) as u32))
}

pub fn device_count() -> Result<u32> {
    init()?;
    Ok(result::device::get_count().ctx("cuDeviceGetCount", || "the driver".into())? as u32)
}

/// The CUDA devices this process can see (`CUDA_VISIBLE_DEVICES` applied): 0
/// without a driver. Fixed once the driver initialised, so read once; what a
/// device argument's ordinal is checked against.
pub fn visible_devices() -> u32 {
    static COUNT: OnceLock<u32> = OnceLock::new();
    *COUNT.get_or_init(|| device_count().unwrap_or(0))
}

fn cu_device(ordinal: u32) -> Result<sys::CUdevice> {
    let count = device_count()?;
    if ordinal >= count || ordinal as usize >= MAX_DEVICES {
        return Err(CudaError::NoSuchDevice { ordinal, count });
    }
    result::device::get(ordinal as c_int).ctx("cuDeviceGet", || format!("cuda:{ordinal}"))
}

fn attribute(dev: sys::CUdevice, ordinal: u32, attr: sys::CUdevice_attribute) -> Result<u32> {
    // SAFETY: plain attribute query on a valid device handle.
    let v = unsafe { result::device::get_attribute(dev, attr) }
        .ctx("cuDeviceGetAttribute", || format!("cuda:{ordinal}"))?;
    Ok(v as u32)
}

/// Static properties `doctor` reports and plans depend on.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    pub ordinal: u32,
    pub name: String,
    pub compute_capability: (u32, u32),
    pub multiprocessors: u32,
    pub total_memory: u64,
    pub l2_bytes: u32,
}

pub fn device_info(ordinal: u32) -> Result<DeviceInfo> {
    use sys::CUdevice_attribute::*;
    let dev = cu_device(ordinal)?;
    let at = |a| attribute(dev, ordinal, a);
    Ok(DeviceInfo {
        ordinal,
        name: result::device::get_name(dev).ctx("cuDeviceGetName", || format!("cuda:{ordinal}"))?,
        compute_capability: (
            at(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            at(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        ),
        multiprocessors: at(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
        // SAFETY: plain query on a valid device handle.
        total_memory: unsafe { result::device::total_mem(dev) }
            .ctx("cuDeviceTotalMem", || format!("cuda:{ordinal}"))? as u64,
        l2_bytes: at(CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)?,
    })
}

/// Whether `from` can map memory of `to` (P2P over NVLink or PCIe).
pub fn can_access_peer(from: u32, to: u32) -> Result<bool> {
    let a = cu_device(from)?;
    let b = cu_device(to)?;
    let mut v: c_int = 0;
    // SAFETY: writes one int.
    unsafe { sys::cuDeviceCanAccessPeer(&mut v, a, b) }
        .result()
        .ctx("cuDeviceCanAccessPeer", || format!("cuda:{from}->cuda:{to}"))?;
    Ok(v != 0)
}

/// The PCI bus id of `ordinal` ("0000:19:00.0"): names a GPU across processes
/// whose CUDA_VISIBLE_DEVICES differ.
pub fn pci_bus_id(ordinal: u32) -> Result<String> {
    let dev = cu_device(ordinal)?;
    let mut buf = [0 as std::ffi::c_char; 32];
    // SAFETY: writes at most buf.len() bytes, NUL-terminated.
    unsafe { sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as c_int, dev) }
        .result()
        .ctx("cuDeviceGetPCIBusId", || format!("cuda:{ordinal}"))?;
    // SAFETY: the driver NUL-terminated the buffer.
    let id = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    Ok(id.to_string_lossy().into_owned())
}

/// Whether `ordinal` and the GPU at `peer_bus_id` support native atomics over
/// P2P in both directions (true over NVLink, false over PCIe); None when the
/// peer is not visible to this process.
pub fn p2p_native_atomics(ordinal: u32, peer_bus_id: &str) -> Result<Option<bool>> {
    let dev = cu_device(ordinal)?;
    let Ok(id) = CString::new(peer_bus_id) else {
        return Ok(None);
    };
    let mut peer: sys::CUdevice = 0;
    // SAFETY: id is NUL-terminated; writes one device handle.
    if unsafe { sys::cuDeviceGetByPCIBusId(&mut peer, id.as_ptr()) }.result().is_err() {
        return Ok(None);
    }
    if peer == dev {
        return Ok(Some(true));
    }
    let attr = sys::CUdevice_P2PAttribute::CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED;
    let mut both = true;
    for (a, b) in [(dev, peer), (peer, dev)] {
        let mut v: c_int = 0;
        // SAFETY: writes one int for two valid device handles.
        unsafe { sys::cuDeviceGetP2PAttribute(&mut v, attr, a, b) }
            .result()
            .ctx("cuDeviceGetP2PAttribute", || format!("cuda:{ordinal}<->{peer_bus_id}"))?;
        both &= v != 0;
    }
    Ok(Some(both))
}

/// Runs `f` with `ctx` current on this thread and restores what was current,
/// so torch's notion of the current device is left as it was.
pub(crate) fn with_context<T>(ctx: sys::CUcontext, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let mut prev: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: reads the calling thread's current context.
    unsafe { sys::cuCtxGetCurrent(&mut prev) }
        .result()
        .ctx("cuCtxGetCurrent", || "this thread".into())?;
    if prev == ctx {
        return f();
    }
    // SAFETY: ctx is a retained primary context, valid for the process lifetime.
    unsafe { sys::cuCtxSetCurrent(ctx) }
        .result()
        .ctx("cuCtxSetCurrent", || "this thread".into())?;
    let out = f();
    // SAFETY: restores the previous (possibly null) context.
    unsafe { sys::cuCtxSetCurrent(prev) }
        .result()
        .ctx("cuCtxSetCurrent", || "this thread".into())?;
    out
}

/// The loaded modules of `ordinal`, if a plan already loaded them.
#[inline]
pub fn loaded(ordinal: u32) -> Result<&'static DeviceModules> {
    STORE.get(ordinal as usize).and_then(OnceLock::get).ok_or(CudaError::NotLoaded(ordinal))
}

/// Loads every embedded module on `ordinal` once (in its primary context).
/// Slow the first time (the driver JIT-compiles PTX for the device); cheap after.
pub fn ensure_loaded(ordinal: u32) -> Result<&'static DeviceModules> {
    if let Ok(m) = loaded(ordinal) {
        return Ok(m);
    }
    let _guard = LOAD_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    if let Ok(m) = loaded(ordinal) {
        return Ok(m);
    }
    let modules = load_all(ordinal)?;
    Ok(STORE[ordinal as usize].get_or_init(|| modules))
}

fn load_all(ordinal: u32) -> Result<DeviceModules> {
    let info = device_info(ordinal)?;
    let dev = cu_device(ordinal)?;
    // SAFETY: retains the primary context (the one torch uses); never released,
    // because the store lives as long as the process.
    let context = unsafe { result::primary_ctx::retain(dev) }
        .ctx("cuDevicePrimaryCtxRetain", || format!("cuda:{ordinal}"))?;
    let mut functions = [std::ptr::null_mut(); Kernel::COUNT];
    let opt_in_shared = attribute(
        dev,
        ordinal,
        sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
    )?;
    let shared_per_sm = attribute(
        dev,
        ordinal,
        sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
    )?;
    with_context(context, || {
        // Arch-specific modules load only where their target runs; their
        // kernels stay null elsewhere and launches of them are refused.
        for module in MODULES.iter().filter(|m| m.target.runs_on(info.compute_capability)) {
            let handle = load_module(module, &info)?;
            for &kernel in module.kernels {
                let name = CString::new(kernel.symbol()).expect("kernel symbols have no NUL");
                let at = || format!("cuda:{ordinal} ({})", kernel.symbol());
                // SAFETY: handle is a freshly loaded module; name is NUL-terminated.
                let f = unsafe { result::module::get_function(handle, name) }
                    .ctx("cuModuleGetFunction", at)?;
                allow_opt_in_shared(f, opt_in_shared).ctx("cuFuncSetAttribute", at)?;
                if kernel.prefers_max_shared() {
                    prefer_max_shared(f).ctx("cuFuncSetAttribute", at)?;
                }
                functions[kernel as usize] = f;
            }
        }
        Ok(())
    })?;
    let status = with_context(context, || alloc_status(ordinal))?;
    Ok(DeviceModules {
        ordinal,
        context,
        compute_capability: info.compute_capability,
        multiprocessors: info.multiprocessors,
        shared_opt_in: opt_in_shared,
        shared_per_sm,
        status,
        functions,
    })
}

/// The zeroed status record of `ordinal` (in the current context). Never
/// freed: it lives as long as the module store, i.e. the process.
fn alloc_status(ordinal: u32) -> Result<u64> {
    let at = || format!("cuda:{ordinal}");
    let mut ptr: sys::CUdeviceptr = 0;
    // SAFETY: allocates STATUS_BYTES in the current (primary) context.
    unsafe { sys::cuMemAlloc_v2(&mut ptr, STATUS_BYTES) }.result().ctx("cuMemAlloc", at)?;
    // SAFETY: ptr holds STATUS_BYTES bytes.
    unsafe { sys::cuMemsetD8_v2(ptr, 0, STATUS_BYTES) }.result().ctx("cuMemsetD8", at)?;
    // The memset runs on the legacy stream; finish it before any stream's kernel (plan time).
    // SAFETY: waits for the current context's work.
    unsafe { sys::cuCtxSynchronize() }.result().ctx("cuCtxSynchronize", at)?;
    Ok(ptr)
}

/// Lets `f` take dynamic shared memory up to the device's opt-in limit (the
/// default stops at 48 KiB). This only raises the cap: each launch still asks
/// for what it uses, so occupancy is unchanged.
fn allow_opt_in_shared(
    f: sys::CUfunction,
    opt_in: u32,
) -> std::result::Result<(), cudarc::driver::DriverError> {
    use sys::CUfunction_attribute::*;
    let mut static_bytes: c_int = 0;
    // SAFETY: f is a valid function handle; writes one int.
    unsafe { sys::cuFuncGetAttribute(&mut static_bytes, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, f) }
        .result()?;
    let dynamic = (opt_in as c_int - static_bytes).max(0);
    // SAFETY: f is a valid function handle; the value is within the device limit.
    unsafe { sys::cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, dynamic) }
        .result()
}

/// Asks for the SM's largest shared-memory carveout for `f` (a hint the
/// driver follows where it can), so that its CTAs share an SM as planned.
fn prefer_max_shared(f: sys::CUfunction) -> std::result::Result<(), cudarc::driver::DriverError> {
    use sys::CUfunction_attribute::*;
    // CU_SHAREDMEM_CARVEOUT_MAX_SHARED, in percent of the SM's shared memory
    const MAX_SHARED: c_int = 100;
    // SAFETY: f is a valid function handle; the value is a valid percentage.
    let set = unsafe {
        sys::cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, MAX_SHARED)
    };
    set.result()
}

fn load_module(ptx_module: &PtxModule, info: &DeviceInfo) -> Result<sys::CUmodule> {
    let (name, ptx) = (ptx_module.name, ptx_module.ptx);
    let image = CString::new(ptx).expect("PTX text has no NUL");
    const LOG_BYTES: usize = 8192;
    let mut log = vec![0u8; LOG_BYTES];
    let mut options = [
        sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
        sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
    ];
    let mut values: [*mut c_void; 2] = [log.as_mut_ptr().cast(), LOG_BYTES as *mut c_void];
    let mut module: sys::CUmodule = std::ptr::null_mut();
    // SAFETY: image is NUL-terminated PTX; the option arrays have matching
    // length and the log buffer outlives the call.
    let rc = unsafe {
        sys::cuModuleLoadDataEx(
            &mut module,
            image.as_ptr().cast(),
            options.len() as u32,
            options.as_mut_ptr(),
            values.as_mut_ptr(),
        )
    };
    rc.result().map_err(|source| {
        let text = String::from_utf8_lossy(&log);
        let text = text.trim_end_matches('\0').trim();
        CudaError::ModuleLoad(Box::new(ModuleLoadError {
            module: name,
            ordinal: info.ordinal,
            arch: format!("sm_{}{}", info.compute_capability.0, info.compute_capability.1),
            isa: PTX_ISA,
            target: ptx_module.target.compute(),
            driver: driver_version()
                .map(|(a, b)| format!("{a}.{b}"))
                .unwrap_or_else(|_| "unknown".into()),
            log: if text.is_empty() { String::new() } else { format!(" JIT log: {text}") },
            source,
        }))
    })?;
    Ok(module)
}
