//! The launch floor: bare launches of an empty kernel (kernels/probe.cu).

use crate::error::Result;
use crate::launch::{launch, LaunchConfig};
use crate::ptx::Kernel;

/// Enqueues `count` launches of the empty kernel (one thread each) on
/// `stream` of `ordinal`, through the same [`launch`] every b12x kernel goes
/// through: what `count` launches cost the host at least.
///
/// # Safety
/// `stream` is a live CUstream of `ordinal` (0 = the legacy default stream).
pub unsafe fn launch_empty(ordinal: u32, stream: u64, count: u32) -> Result<()> {
    let config = LaunchConfig::linear(1, 1);
    for _ in 0..count {
        // SAFETY: the kernel takes no parameters; the stream is the caller's contract.
        unsafe { launch(ordinal, Kernel::ProbeEmpty, config, stream, &mut [])? };
    }
    Ok(())
}
