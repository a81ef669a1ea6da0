//! b12x-cuda: the device layer.
//!
//! * [`ptx`]: the PTX that `kernels/build_ptx.py` generated, embedded at
//!   compile time, and the table of kernels each module exports.
//! * [`device`]: per-device module loading in the primary context (the one
//!   torch uses). Modules load when a plan is made, never in a hot call.
//! * [`launch`]: the one audited place that launches onto a caller's stream.
//! * [`tma`]: tensor maps (host-encoded descriptors) for TMA-fed kernels.
//! * [`indexer`]: the C4 indexer's launchers, straight from a core binding;
//!   [`flavor`]: the rule for a plan whose MMA flavor is forced.
//! * [`ipc`] + [`allreduce`]: IPC slabs and the all-reduce launchers.
//! * [`probe`]: bare launches of an empty kernel, the floor of a launch.
//!
//! cudarc is used with dynamic loading: nothing here needs libcuda until a
//! function is called, and [`driver_present`] answers without panicking.

pub mod allreduce;
pub mod device;
pub mod error;
pub mod flavor;
pub mod indexer;
pub mod ipc;
pub mod launch;
pub mod probe;
pub mod ptx;
pub mod tma;

pub use device::{
    can_access_peer, device_count, device_info, driver_present, driver_version, ensure_loaded,
    loaded, p2p_native_atomics, pci_bus_id, visible_devices, DeviceInfo, DeviceModules,
};
pub use error::{CudaError, Result};
pub use ptx::{Kernel, PtxModule, MODULES, PTX_ISA, PTX_TARGET};
