// Top-k output padding: every slot of a (rows, topk) output gets index -1 and
// score -inf. The exact top-k kernels pad the tail of short rows the same way;
// this standalone form proves the launch chain and serves callers that must
// clear an output before a partial write.
#include "common.cuh"

// indices: int32 [rows * topk] contiguous; scores: float32 same shape or null.
B12X_KERNEL void b12x_fill_topk_padding(i32* __restrict__ indices,
                                        float* __restrict__ scores,
                                        u64 count) {
    const float neg_inf = b12x_neg_inf();
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < count;
         i += (u64)gridDim.x * blockDim.x) {
        indices[i] = -1;
        if (scores != nullptr) scores[i] = neg_inf;
    }
}
