//! b12x-core: the pure host-side logic of b12x.
//!
//! Nothing here touches CUDA or Python, so `cargo test -p b12x-core` runs on
//! any machine. The CUDA crate launches what this crate plans; the Python
//! crate converts Python objects into the plain values this crate checks.

pub mod allreduce;
pub mod collective;
pub mod error;
pub mod indexer;
pub mod tensor;
pub mod validate;

pub use error::{Error, Result};
pub use tensor::{
    cuda_ordinal, DType, Device, DeviceName, Dims, TensorMeta, MAX_CUDA_ORDINAL, MAX_RANK,
};
