//! Pure logic of the single-node IPC all-reduce: the byte-size grammar of the
//! limit knobs, declaration routing, the slab layout the kernels share and
//! launch geometry. No CUDA here; `b12x-cuda` launches what this plans.

pub mod bytesize;
pub mod geometry;
pub mod layout;
pub mod route;

pub use bytesize::{parse_byte_size, parse_optional_byte_size};
pub use geometry::{fused_geometry, oneshot_geometry, twoshot_geometry, Geometry};
pub use layout::SlabLayout;
pub use route::{route, Decline, Limits, Op, Route};
