//! Embedded PTX modules and the kernels they export.
//!
//! `kernels/build_ptx.py` writes `ptx/<module>.ptx` from `kernels/<module>.cu`;
//! add a module here with the `modules!` table and its kernels become
//! `Kernel` variants, loaded together per device.

/// What the embedded PTX was built for (kept in step with kernels/build_ptx.py).
pub const PTX_TARGET: &str = "compute_89";
pub const PTX_ISA: &str = "8.7";

pub struct PtxModule {
    pub name: &'static str,
    pub ptx: &'static str,
    pub kernels: &'static [Kernel],
}

macro_rules! modules {
    ($($module:ident => [$($kernel:ident = $symbol:literal),* $(,)?]),* $(,)?) => {
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
            ptx: include_str!(concat!("../ptx/", stringify!($module), ".ptx")),
            kernels: &[$(Kernel::$kernel,)*],
        },)*];
    };
}

modules! {
    topk_pad => [FillTopkPadding = "b12x_fill_topk_padding"],
    allreduce => [
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
    indexer_decode => [
        IndexerDecodeE4m3H16 = "b12x_indexer_decode_e4m3_h16",
        IndexerDecodeE4m3H32 = "b12x_indexer_decode_e4m3_h32",
        IndexerDecodeE4m3H48 = "b12x_indexer_decode_e4m3_h48",
        IndexerDecodeE4m3H64 = "b12x_indexer_decode_e4m3_h64",
        IndexerDecodeF16H16 = "b12x_indexer_decode_f16_h16",
        IndexerDecodeF16H32 = "b12x_indexer_decode_f16_h32",
        IndexerDecodeF16H48 = "b12x_indexer_decode_f16_h48",
        IndexerDecodeF16H64 = "b12x_indexer_decode_f16_h64",
    ],
    indexer_prefill => [
        IndexerPrefillE4m3H16 = "b12x_indexer_prefill_e4m3_h16",
        IndexerPrefillE4m3H32 = "b12x_indexer_prefill_e4m3_h32",
        IndexerPrefillE4m3H48 = "b12x_indexer_prefill_e4m3_h48",
        IndexerPrefillE4m3H64 = "b12x_indexer_prefill_e4m3_h64",
        IndexerPrefillF16H16 = "b12x_indexer_prefill_f16_h16",
        IndexerPrefillF16H32 = "b12x_indexer_prefill_f16_h32",
        IndexerPrefillF16H48 = "b12x_indexer_prefill_f16_h48",
        IndexerPrefillF16H64 = "b12x_indexer_prefill_f16_h64",
    ],
    indexer_topk => [
        IndexerTopkFold = "b12x_indexer_topk_fold",
        IndexerTopkSlice = "b12x_indexer_topk_slice",
        IndexerTopkMerge = "b12x_indexer_topk_merge",
    ],
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every embedded module is PTX ISA 8.7 for sm_89 (the driver >= 570 promise)
    /// and exports every kernel the table says it does.
    #[test]
    fn embedded_ptx_headers_match_the_pinned_target() {
        for module in MODULES {
            assert!(
                module.ptx.contains(&format!("\n.version {PTX_ISA}\n")),
                "{}: wrong .version",
                module.name
            );
            assert!(module.ptx.contains("\n.target sm_89"), "{}: wrong .target", module.name);
            for kernel in module.kernels {
                let entry = format!(".entry {}(", kernel.symbol());
                assert!(module.ptx.contains(&entry), "{}: no {}", module.name, entry);
            }
        }
    }

    #[test]
    fn every_kernel_belongs_to_exactly_one_module() {
        for kernel in Kernel::ALL {
            let owners = MODULES.iter().filter(|m| m.kernels.contains(kernel)).count();
            assert_eq!(owners, 1, "{kernel:?}");
        }
    }
}
