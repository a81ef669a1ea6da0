//! Tensor maps for the TMA-fed scorers (kernels/indexer_hopper.cu).
//!
//! A tensor map is a 128-byte descriptor the driver encodes on the host
//! (`cuTensorMapEncodeTiled`: pure host work, no device call, no sync) and a
//! kernel receives by value in its `__grid_constant__` parameters; the copy
//! engine then reads boxes of the described tensor into shared memory. The
//! indexer's maps depend on the bound tensors' addresses, so they are
//! encoded once per binding (`indexer::BoundMaps`), not per run.

use cudarc::driver::sys;

use crate::error::{DriverContext, Result};

pub type TensorMap = sys::CUtensorMap;

/// Element types the scorers' maps use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Element {
    U8,
    F32,
}

/// One tiled map: `dims` innermost first (elements), `strides` the byte
/// strides of dims 1.. (multiples of 16), `boxes` the copied box (elements);
/// `swizzle128` lays each box out in the 128-byte-swizzled form wgmma reads.
/// Out-of-bounds box elements read as zeros.
#[derive(Debug, Clone, Copy)]
pub struct Tiled<'a> {
    pub element: Element,
    pub address: u64,
    pub dims: &'a [u64],
    pub strides: &'a [u64],
    pub boxes: &'a [u32],
    pub swizzle128: bool,
}

impl Tiled<'_> {
    /// Encodes the map; `what` names it in a driver error.
    pub fn encode(&self, what: &'static str) -> Result<TensorMap> {
        let rank = self.dims.len();
        debug_assert!(self.strides.len() + 1 == rank && self.boxes.len() == rank);
        debug_assert!(self.address % 16 == 0 && self.strides.iter().all(|s| s % 16 == 0));
        let element_strides = [1u32; 5];
        let dtype = match self.element {
            Element::U8 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT8,
            Element::F32 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
        };
        let swizzle = if self.swizzle128 {
            sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B
        } else {
            sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_NONE
        };
        let mut map = TensorMap { opaque: [0; 16] };
        // SAFETY: every array holds `rank` (strides: rank - 1) entries; the
        // call only writes `map`.
        unsafe {
            sys::cuTensorMapEncodeTiled(
                &mut map,
                dtype,
                rank as u32,
                self.address as *mut std::ffi::c_void,
                self.dims.as_ptr(),
                self.strides.as_ptr(),
                self.boxes.as_ptr(),
                element_strides.as_ptr(),
                sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                swizzle,
                sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            )
        }
        .result()
        .ctx("cuTensorMapEncodeTiled", || what.to_string())?;
        Ok(map)
    }
}
