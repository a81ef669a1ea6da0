// Experiment-only variants of the top-k kernels for tools/device/topk_bench.py
// (not part of the product PTX): the product kernels come along through the
// include, and each variant below changes one launch property.
#include "indexer_topk.cu"

// Two CTAs per SM (32 registers), two float4 groups per thread in flight.
B12X_KERNEL void __launch_bounds__(TOPK_THREADS, 2) topkx_fold_u2_b2(const TopkParams p) {
    topk_fold<2>(p);
}

// One CTA per SM, four groups in flight.
B12X_KERNEL void __launch_bounds__(TOPK_THREADS, 1) topkx_fold_u4_b1(const TopkParams p) {
    topk_fold<4>(p);
}

// Slice and merge with eight groups in flight.
B12X_KERNEL void __launch_bounds__(TOPK_THREADS, 1) topkx_slice_u8(const TopkParams p) {
    topk_slice<8>(p);
}

B12X_KERNEL void __launch_bounds__(TOPK_THREADS, 1) topkx_merge_u8(const TopkParams p) {
    topk_merge<8>(p);
}
