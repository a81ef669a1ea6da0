//! Pure logic of the single-node IPC all-reduce, shaped like the indexer:
//! [`Limits`] (what the knobs allow) -> [`Plan`] (one declaration routed and
//! resolved to a kernel, a launch geometry and the bytes it stages) ->
//! [`Launch`] (one call's live tensors checked by [`bind_plain`] /
//! [`bind_fused`] against the plan and the runtime's [`Target`]). Also the
//! environment knobs, the byte-size grammar and the slab layout the kernels
//! share. No CUDA here: `b12x-cuda` owns the runtime and launches a `Launch`.

pub mod bind;
pub mod bytesize;
pub mod geometry;
pub mod knobs;
pub mod layout;
pub mod limits;
pub mod plan;
pub mod route;

pub use bind::{
    admit_fused, admit_plain, bind_fused, bind_plain, Args, FusedArgs, FusedOperands, Launch,
    PlainArgs, Target,
};
pub use bytesize::{parse_byte_size, parse_optional_byte_size};
pub use geometry::{fused_geometry, oneshot_geometry, twoshot_geometry, Geometry};
pub use knobs::{EnvValues, Knob};
pub use layout::SlabLayout;
pub use limits::{LimitField, Limits};
pub use plan::{prepare, Float, Kernel, PacksPerThread, Plan, Prepared, Setup};
pub use route::{route, Declared, Decline, Route};
