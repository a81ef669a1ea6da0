//! Launcher for `b12x_fill_topk_padding` (kernels/topk_pad.cu).

use crate::error::Result;
use crate::kernel_args;
use crate::launch::{launch, LaunchConfig};
use crate::ptx::Kernel;

const THREADS: u32 = 256;
/// Enough CTAs to saturate HBM on a 132-SM H200 with a grid-stride loop; the
/// grid depends only on the element count, never on device values.
const MAX_CTAS: u64 = 1024;

/// Fills `count` int32 indices with -1 and, when `scores` is non-zero, `count`
/// float32 scores with -inf, on `stream` of device `ordinal`.
///
/// # Safety
/// `indices` (and `scores` when non-zero) must be device pointers on
/// `ordinal` valid for `count` 4-byte elements; `stream` must belong to it.
pub unsafe fn fill_topk_padding(
    ordinal: u32,
    indices: u64,
    scores: u64,
    count: u64,
    stream: u64,
) -> Result<()> {
    if count == 0 {
        return Ok(());
    }
    let ctas = count.div_ceil(THREADS as u64).min(MAX_CTAS) as u32;
    let mut args = kernel_args![indices, scores, count];
    // SAFETY: args match (i32*, float*, u64); pointer validity is the caller's contract.
    unsafe {
        launch(
            ordinal,
            Kernel::FillTopkPadding,
            LaunchConfig::linear(ctas, THREADS),
            stream,
            &mut args,
        )
    }
}
