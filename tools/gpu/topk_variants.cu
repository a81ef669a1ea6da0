// Experiment-only variants of the top-k kernels for tools/device/topk_bench.py
// (not part of the product PTX): the product kernels come along through the
// include, and each variant below changes one launch property.
#include "indexer_topk.cu"

// Raw stage, four float4 groups per thread in flight.
B12X_KERNEL void __launch_bounds__(TOPK_THREADS, 1) topkx_fold_raw_u4(const TopkParams p) {
    topk_fold<4, true>(p);
}

// Prefix stage, one CTA per SM, four groups in flight.
B12X_KERNEL void __launch_bounds__(TOPK_THREADS, 1) topkx_fold_prefix_u4_b1(const TopkParams p) {
    topk_fold<4, false>(p);
}

// Slice and merge with eight groups in flight.
B12X_KERNEL void __launch_bounds__(TOPK_THREADS, 1) topkx_slice_raw_u8(const TopkParams p) {
    topk_slice<8, true>(p);
}

B12X_KERNEL void __launch_bounds__(TOPK_THREADS, 1) topkx_merge_raw_u8(const TopkParams p) {
    topk_merge<8, true>(p);
}

// Slice with the prefix stage (two CTAs per SM).
B12X_KERNEL void __launch_bounds__(TOPK_THREADS, 2) topkx_slice_prefix_u2_b2(const TopkParams p) {
    topk_slice<2, false>(p);
}

// Launch-overhead floor: a 1024-thread kernel that does nothing.
B12X_KERNEL void __launch_bounds__(TOPK_THREADS, 1) topkx_empty(const TopkParams p) {
    if (p.rows == 0xffffffffu) p.out_indices[threadIdx.x] = 0;
}
