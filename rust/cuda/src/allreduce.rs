//! Launchers for the all-reduce kernels (kernels/allreduce.cu).

use b12x_core::allreduce::Geometry;
use b12x_core::DType;

use crate::error::Result;
use crate::kernel_args;
use crate::launch::{launch, LaunchConfig};
use crate::ptx::Kernel;

/// `ArCtx` of kernels/allreduce.cuh: identical for every launch of a rank.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelCtx {
    /// Device table of every rank's slab base (as mapped in this process).
    pub peers: u64,
    /// Own slab base.
    pub own: u64,
    /// Device address of the host-mapped error word.
    pub host_err: u64,
    pub slot_bytes: u64,
    pub timeout_ns: u64,
    pub rank: u32,
    pub world: u32,
}

pub fn oneshot_kernel(dtype: DType) -> Option<Kernel> {
    Some(match dtype {
        DType::F16 => Kernel::ArOneShotF16,
        DType::BF16 => Kernel::ArOneShotBF16,
        DType::F32 => Kernel::ArOneShotF32,
        _ => return None,
    })
}

pub fn fused_kernel(dtype: DType, packs_per_thread: u32) -> Option<Kernel> {
    Some(match (dtype, packs_per_thread) {
        (DType::F16, 1) => Kernel::ArFusedF16P1,
        (DType::F16, 2) => Kernel::ArFusedF16P2,
        (DType::F16, 4) => Kernel::ArFusedF16P4,
        (DType::BF16, 1) => Kernel::ArFusedBF16P1,
        (DType::BF16, 2) => Kernel::ArFusedBF16P2,
        (DType::BF16, 4) => Kernel::ArFusedBF16P4,
        (DType::F32, 1) => Kernel::ArFusedF32P1,
        (DType::F32, 2) => Kernel::ArFusedF32P2,
        (DType::F32, 4) => Kernel::ArFusedF32P4,
        _ => return None,
    })
}

/// `push`: peers store their shards into the owner's slot (NVLink) instead of
/// the owner pulling them from the peers' staged copies (PCIe-friendly).
pub fn twoshot_kernel(dtype: DType, push: bool) -> Option<Kernel> {
    (dtype == DType::BF16).then_some(if push {
        Kernel::ArTwoShotPushBF16
    } else {
        Kernel::ArTwoShotBF16
    })
}

fn config(g: Geometry) -> LaunchConfig {
    LaunchConfig::linear(g.grid, g.block)
}

/// Live operands of the one-shot and two-shot kernels.
#[derive(Debug, Clone, Copy)]
pub struct PlainArgs {
    pub inp: u64,
    pub out: u64,
    /// 16-byte packs of `inp` (and `out`).
    pub packs: u64,
}

/// One-shot or two-shot all-reduce of `packs` 16-byte packs from `inp` to `out`.
///
/// # Safety
/// `ctx` describes this rank's open runtime on `ordinal` (slab, peer table and
/// host word alive, slots hold `packs * 16` bytes); `inp` and `out` are device
/// pointers on `ordinal`, 16-byte aligned, valid for `packs * 16` bytes; every
/// rank launches the same kernel with the same geometry and `packs`, in the
/// same order on its runtime; `stream` belongs to `ordinal`.
pub unsafe fn plain(
    ordinal: u32,
    kernel: Kernel,
    ctx: &KernelCtx,
    geometry: Geometry,
    a: &PlainArgs,
    stream: u64,
) -> Result<()> {
    let c = *ctx;
    let a = *a;
    let mut args = kernel_args![c, a.inp, a.out, a.packs];
    // SAFETY: args match (ArCtx, const T*, T*, u64); validity is the caller's contract.
    unsafe { launch(ordinal, kernel, config(geometry), stream, &mut args) }
}

/// Live operands of the fused kernel: `rows x hidden` row-major tensors.
#[derive(Debug, Clone, Copy)]
pub struct FusedArgs {
    pub inp: u64,
    pub residual: u64,
    pub weight: u64,
    pub out: u64,
    pub residual_out: u64,
    pub rows: u32,
    pub row_packs: u32,
    pub hidden: u32,
    pub eps: f32,
}

/// Fused all-reduce + residual add + RMSNorm.
///
/// # Safety
/// As [`plain`], for every pointer of `a` (rows * row_packs packs each,
/// `weight` row_packs packs); `out` must not alias `residual_out`.
pub unsafe fn fused(
    ordinal: u32,
    kernel: Kernel,
    ctx: &KernelCtx,
    geometry: Geometry,
    a: &FusedArgs,
    stream: u64,
) -> Result<()> {
    let c = *ctx;
    let a = *a;
    let mut args = kernel_args![
        c,
        a.inp,
        a.residual,
        a.weight,
        a.out,
        a.residual_out,
        a.rows,
        a.row_packs,
        a.hidden,
        a.eps
    ];
    // SAFETY: args match the fused kernel's parameter list; validity is the caller's contract.
    unsafe { launch(ordinal, kernel, config(geometry), stream, &mut args) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ctx_layout_matches_the_kernel_struct() {
        // ArCtx: five u64 then two u32, 8-byte aligned, 48 bytes.
        assert_eq!(std::mem::size_of::<KernelCtx>(), 48);
        assert_eq!(std::mem::align_of::<KernelCtx>(), 8);
    }

    #[test]
    fn every_route_dtype_has_a_kernel() {
        for dtype in [DType::F16, DType::BF16, DType::F32] {
            assert!(oneshot_kernel(dtype).is_some());
            for ppt in [1, 2, 4] {
                assert!(fused_kernel(dtype, ppt).is_some());
            }
        }
        assert_eq!(twoshot_kernel(DType::BF16, false), Some(Kernel::ArTwoShotBF16));
        assert_eq!(twoshot_kernel(DType::BF16, true), Some(Kernel::ArTwoShotPushBF16));
        assert!(twoshot_kernel(DType::F16, false).is_none());
        assert!(fused_kernel(DType::BF16, 3).is_none());
    }
}
