// Experiment-only variants of the top-k kernels for tools/gpu/topk_bench.py
// (not part of the product PTX): the product kernels come along through the
// include, and each variant below changes one launch property.
#include "indexer_topk.cu"

// Prefix stage, one CTA per SM, four groups in flight (v1's decode form).
B12X_KERNEL void __launch_bounds__(TOPK_THREADS, 1) topkx_fold_prefix_u4_b1(const TopkParams p) {
    topk_fold<4, false>(p);
}

// Launch-overhead floor: a 1024-thread kernel that does nothing.
B12X_KERNEL void __launch_bounds__(TOPK_THREADS, 1) topkx_empty(const TopkParams p) {
    if (p.rows == 0xffffffffu) p.out_indices[threadIdx.x] = 0;
}
