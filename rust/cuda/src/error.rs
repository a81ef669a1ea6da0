//! Errors of the device layer, with the context a bug report needs.

use cudarc::driver::DriverError;

use crate::ptx::MIN_DRIVER;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CudaError {
    #[error(
        "no CUDA driver found (libcuda.so could not be loaded); b12x needs an NVIDIA driver >= \
         {MIN_DRIVER} for GPU work"
    )]
    NoDriver,

    #[error("{call} failed on {device}: {source}")]
    Driver {
        call: &'static str,
        device: String,
        #[source]
        source: DriverError,
    },

    #[error(transparent)]
    ModuleLoad(Box<ModuleLoadError>),

    #[error("b12x kernels are not loaded on cuda:{0}: make a plan (or prepare the op) for this device before running it")]
    NotLoaded(u32),

    #[error("kernel {kernel} is built for {target} and cannot run on cuda:{ordinal} ({arch})")]
    KernelUnavailable { kernel: &'static str, target: &'static str, ordinal: u32, arch: String },

    #[error("cuda:{ordinal} does not exist ({count} device(s) visible)")]
    NoSuchDevice { ordinal: u32, count: u32 },

    /// A cross-GPU wait of the all-reduce ran past its bound (read from the
    /// host-mapped error word the kernels write).
    #[error(
        "AllReduce: rank {rank} waited more than {:.3} s for rank {peer} at a barrier \
         (error code {code:#x}); the peer is dead or far behind. The runtime is unusable: \
         close it and fall back to NCCL",
        *timeout_ns as f64 * 1e-9
    )]
    CollectiveTimeout { rank: u32, peer: u32, code: u32, timeout_ns: u64 },

    #[error(transparent)]
    Core(#[from] b12x_core::Error),
}

/// A PTX module the driver refused, with what was embedded and what the driver supports.
#[derive(Debug, thiserror::Error)]
#[error(
    "loading PTX module '{module}' on cuda:{ordinal} ({arch}) failed: {source}. \
     Embedded: PTX ISA {isa} for {target}; the driver supports CUDA {driver}. \
     PTX ISA {isa} needs a driver >= {MIN_DRIVER}.{log}"
)]
pub struct ModuleLoadError {
    pub module: &'static str,
    pub ordinal: u32,
    pub arch: String,
    pub isa: &'static str,
    pub target: &'static str,
    pub driver: String,
    pub log: String,
    #[source]
    pub source: DriverError,
}

pub type Result<T, E = CudaError> = std::result::Result<T, E>;

/// Attaches the call name and device to a driver result.
pub(crate) trait DriverContext<T> {
    fn ctx(self, call: &'static str, device: impl FnOnce() -> String) -> Result<T>;
}

impl<T> DriverContext<T> for std::result::Result<T, DriverError> {
    fn ctx(self, call: &'static str, device: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| CudaError::Driver { call, device: device(), source })
    }
}
