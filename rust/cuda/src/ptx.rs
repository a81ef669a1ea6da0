//! Embedded PTX modules and the kernels they export.
//!
//! `kernels/build_ptx.py` writes `ptx/<module>.ptx` from `kernels/<module>.cu`;
//! add a module here with the `modules!` table and its kernels become
//! `Kernel` variants, loaded together per device.

/// What the baseline PTX was built for (kept in step with kernels/build_ptx.py).
pub const PTX_TARGET: &str = "compute_89";
pub const PTX_ISA: &str = "8.7";
/// The oldest driver that loads PTX ISA 8.7 (the R570 branch, CUDA 12.8):
/// the one statement of it (messages, `b12x doctor`, `_core.build_info()`).
pub const MIN_DRIVER: u32 = 570;

/// Which devices a module's PTX can be JIT-compiled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// compute_89: every device from sm_89 on (sm_90, sm_100, sm_120, ...).
    Baseline,
    /// compute_90a: Hopper only (wgmma); arch-specific PTX does not carry forward.
    Sm90a,
}

impl Target {
    /// The NVRTC architecture the module was compiled for.
    pub const fn compute(self) -> &'static str {
        match self {
            Target::Baseline => PTX_TARGET,
            Target::Sm90a => "compute_90a",
        }
    }

    /// The `.target` line of the module's PTX.
    pub const fn ptx_target(self) -> &'static str {
        match self {
            Target::Baseline => "sm_89",
            Target::Sm90a => "sm_90a",
        }
    }

    pub fn runs_on(self, cc: (u32, u32)) -> bool {
        match self {
            Target::Baseline => cc >= BASELINE_MIN_COMPUTE_CAPABILITY,
            Target::Sm90a => cc == (9, 0),
        }
    }
}

/// The oldest GPU the baseline (`compute_89`) modules run on: FP8 `mma.sync`
/// needs sm_89. The one statement of it; Python reads it from `_core`.
pub const BASELINE_MIN_COMPUTE_CAPABILITY: (u32, u32) = (8, 9);

pub struct PtxModule {
    pub name: &'static str,
    pub target: Target,
    pub ptx: &'static str,
    pub kernels: &'static [Kernel],
}

impl Kernel {
    /// The module that exports this kernel.
    pub fn module(self) -> &'static PtxModule {
        MODULES.iter().find(|m| m.kernels.contains(&self)).expect("every kernel has a module")
    }

    /// Kernels that run several CTAs an SM only where the SM gives shared
    /// memory its largest share (the fast TMA decode scorers: two CTAs of
    /// about 100 KiB each).
    pub fn prefers_max_shared(self) -> bool {
        use Kernel::*;
        matches!(
            self,
            IndexerTmaFp8DecodeH16
                | IndexerTmaFp8DecodeH32
                | IndexerTmaFp8DecodeH48
                | IndexerTmaFp8DecodeH64
        )
    }
}

macro_rules! modules {
    ($($module:ident: $target:ident => [$($kernel:ident = $symbol:literal),* $(,)?]),* $(,)?) => {
        /// Every kernel b12x launches, by the symbol its module exports.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(usize)]
        pub enum Kernel { $($($kernel,)*)* }

        impl Kernel {
            pub const ALL: &'static [Kernel] = &[$($(Kernel::$kernel,)*)*];
            pub const COUNT: usize = Kernel::ALL.len();

            pub const fn symbol(self) -> &'static str {
                match self { $($(Kernel::$kernel => $symbol,)*)* }
            }
        }

        pub const MODULES: &[PtxModule] = &[$(PtxModule {
            name: stringify!($module),
            target: Target::$target,
            ptx: include_str!(concat!("../ptx/", stringify!($module), ".ptx")),
            kernels: &[$(Kernel::$kernel,)*],
        },)*];
    };
}

modules! {
    allreduce: Baseline => [
        ArOneShotF16 = "b12x_allreduce_oneshot_f16",
        ArOneShotBF16 = "b12x_allreduce_oneshot_bf16",
        ArOneShotF32 = "b12x_allreduce_oneshot_f32",
        ArFusedF16P1 = "b12x_allreduce_fused_f16_p1",
        ArFusedF16P2 = "b12x_allreduce_fused_f16_p2",
        ArFusedF16P4 = "b12x_allreduce_fused_f16_p4",
        ArFusedBF16P1 = "b12x_allreduce_fused_bf16_p1",
        ArFusedBF16P2 = "b12x_allreduce_fused_bf16_p2",
        ArFusedBF16P4 = "b12x_allreduce_fused_bf16_p4",
        ArFusedF32P1 = "b12x_allreduce_fused_f32_p1",
        ArFusedF32P2 = "b12x_allreduce_fused_f32_p2",
        ArFusedF32P4 = "b12x_allreduce_fused_f32_p4",
        ArTwoShotBF16 = "b12x_allreduce_twoshot_bf16",
        ArTwoShotPushBF16 = "b12x_allreduce_twoshot_push_bf16",
    ],
    indexer_decode: Baseline => [
        IndexerDecodeE4m3H16 = "b12x_indexer_decode_e4m3_h16",
        IndexerDecodeE4m3H32 = "b12x_indexer_decode_e4m3_h32",
        IndexerDecodeE4m3H48 = "b12x_indexer_decode_e4m3_h48",
        IndexerDecodeE4m3H64 = "b12x_indexer_decode_e4m3_h64",
        IndexerDecodeF16H16 = "b12x_indexer_decode_f16_h16",
        IndexerDecodeF16H32 = "b12x_indexer_decode_f16_h32",
        IndexerDecodeF16H48 = "b12x_indexer_decode_f16_h48",
        IndexerDecodeF16H64 = "b12x_indexer_decode_f16_h64",
    ],
    indexer_prefill: Baseline => [
        IndexerPrefillE4m3H16 = "b12x_indexer_prefill_e4m3_h16",
        IndexerPrefillE4m3H32 = "b12x_indexer_prefill_e4m3_h32",
        IndexerPrefillE4m3H48 = "b12x_indexer_prefill_e4m3_h48",
        IndexerPrefillE4m3H64 = "b12x_indexer_prefill_e4m3_h64",
        IndexerPrefillF16H16 = "b12x_indexer_prefill_f16_h16",
        IndexerPrefillF16H32 = "b12x_indexer_prefill_f16_h32",
        IndexerPrefillF16H48 = "b12x_indexer_prefill_f16_h48",
        IndexerPrefillF16H64 = "b12x_indexer_prefill_f16_h64",
    ],
    indexer_topk: Baseline => [
        IndexerTopkFold = "b12x_indexer_topk_fold",
        IndexerTopkFoldPrefix = "b12x_indexer_topk_fold_prefix",
        IndexerTopkStream = "b12x_indexer_topk_stream",
        IndexerTopkSlice = "b12x_indexer_topk_slice",
        IndexerTopkMerge = "b12x_indexer_topk_merge",
    ],
    probe: Baseline => [
        ProbeEmpty = "b12x_probe_empty",
    ],
    indexer_wgmma: Sm90a => [
        IndexerWgmmaDecodeH16 = "b12x_indexer_wgmma_decode_h16",
        IndexerWgmmaDecodeH32 = "b12x_indexer_wgmma_decode_h32",
        IndexerWgmmaDecodeH48 = "b12x_indexer_wgmma_decode_h48",
        IndexerWgmmaDecodeH64 = "b12x_indexer_wgmma_decode_h64",
        IndexerWgmmaPrefillH16 = "b12x_indexer_wgmma_prefill_h16",
        IndexerWgmmaPrefillH32 = "b12x_indexer_wgmma_prefill_h32",
        IndexerWgmmaPrefillH48 = "b12x_indexer_wgmma_prefill_h48",
        IndexerWgmmaPrefillH64 = "b12x_indexer_wgmma_prefill_h64",
        IndexerWgmmaFp8DecodeH16 = "b12x_indexer_wgmma_fp8_decode_h16",
        IndexerWgmmaFp8DecodeH32 = "b12x_indexer_wgmma_fp8_decode_h32",
        IndexerWgmmaFp8DecodeH48 = "b12x_indexer_wgmma_fp8_decode_h48",
        IndexerWgmmaFp8DecodeH64 = "b12x_indexer_wgmma_fp8_decode_h64",
        IndexerWgmmaFp8PrefillH16 = "b12x_indexer_wgmma_fp8_prefill_h16",
        IndexerWgmmaFp8PrefillH32 = "b12x_indexer_wgmma_fp8_prefill_h32",
        IndexerWgmmaFp8PrefillH48 = "b12x_indexer_wgmma_fp8_prefill_h48",
        IndexerWgmmaFp8PrefillH64 = "b12x_indexer_wgmma_fp8_prefill_h64",
    ],
    indexer_hopper: Sm90a => [
        IndexerTmaFp8DecodeH16 = "b12x_indexer_tma_fp8_decode_h16",
        IndexerTmaFp8DecodeH32 = "b12x_indexer_tma_fp8_decode_h32",
        IndexerTmaFp8DecodeH48 = "b12x_indexer_tma_fp8_decode_h48",
        IndexerTmaFp8DecodeH64 = "b12x_indexer_tma_fp8_decode_h64",
        IndexerTmaFp8PrefillH16 = "b12x_indexer_tma_fp8_prefill_h16",
        IndexerTmaFp8PrefillH32 = "b12x_indexer_tma_fp8_prefill_h32",
        IndexerTmaFp8PrefillH48 = "b12x_indexer_tma_fp8_prefill_h48",
        IndexerTmaFp8PrefillH64 = "b12x_indexer_tma_fp8_prefill_h64",
        IndexerTmaF16DecodeH16 = "b12x_indexer_tma_f16_decode_h16",
        IndexerTmaF16DecodeH32 = "b12x_indexer_tma_f16_decode_h32",
        IndexerTmaF16DecodeH48 = "b12x_indexer_tma_f16_decode_h48",
        IndexerTmaF16DecodeH64 = "b12x_indexer_tma_f16_decode_h64",
        IndexerTmaF16PrefillH16 = "b12x_indexer_tma_f16_prefill_h16",
        IndexerTmaF16PrefillH32 = "b12x_indexer_tma_f16_prefill_h32",
        IndexerTmaF16PrefillH48 = "b12x_indexer_tma_f16_prefill_h48",
        IndexerTmaF16PrefillH64 = "b12x_indexer_tma_f16_prefill_h64",
        IndexerZeroState = "b12x_indexer_zero_state",
    ],
    indexer_select: Sm90a => [
        IndexerSelectP4 = "b12x_indexer_select_p4",
        IndexerSelectP8 = "b12x_indexer_select_p8",
        IndexerSelectP16 = "b12x_indexer_select_p16",
        IndexerGridSelectP2 = "b12x_indexer_gselect_p2",
        IndexerGridSelectP4 = "b12x_indexer_gselect_p4",
        IndexerGridSelectP8 = "b12x_indexer_gselect_p8",
        IndexerGridSelectP16 = "b12x_indexer_gselect_p16",
    ],
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every embedded module is PTX ISA 8.7 (the driver >= 570 promise) for
    /// its declared target, and exports every kernel the table says it does.
    #[test]
    fn embedded_ptx_headers_match_the_pinned_target() {
        for module in MODULES {
            assert!(
                module.ptx.contains(&format!("\n.version {PTX_ISA}\n")),
                "{}: wrong .version",
                module.name
            );
            let target = format!("\n.target {}\n", module.target.ptx_target());
            assert!(module.ptx.contains(&target), "{}: wrong .target", module.name);
            for kernel in module.kernels {
                let entry = format!(".entry {}(", kernel.symbol());
                assert!(module.ptx.contains(&entry), "{}: no {}", module.name, entry);
            }
        }
    }

    #[test]
    fn targets_by_arch() {
        assert!(Target::Baseline.runs_on((8, 9)) && Target::Baseline.runs_on((12, 0)));
        assert!(!Target::Baseline.runs_on((8, 6)));
        assert!(Target::Sm90a.runs_on((9, 0)));
        assert!(!Target::Sm90a.runs_on((10, 0)) && !Target::Sm90a.runs_on((12, 0)));
    }

    #[test]
    fn every_kernel_belongs_to_exactly_one_module() {
        for kernel in Kernel::ALL {
            let owners = MODULES.iter().filter(|m| m.kernels.contains(kernel)).count();
            assert_eq!(owners, 1, "{kernel:?}");
        }
    }
}
