// Prefill scorer: every query row reads the same (shared) page-table row.
//
// Same math as the decode scorer, laid out as a GEMM: a CTA owns 512 tokens
// (8 warps x 64 tokens each, held in registers as MMA A fragments)
// and a block of PREFILL_ROWS query rows, whose Q (8 KiB per row at 64 heads)
// and weights stream through a double-buffered shared-memory stage with
// cp.async. Each (row, 64 tokens) costs a warp 4 * NT * 4 MMAs; a row's work
// stops at its live length, a CTA's at the longest live row of its block.
// A page id outside [0, pages) is unmapped (ids past the cache reported).
//
// Grid (chunk_len / 512, ceil(rows / PREFILL_ROWS)), 256 threads.
//
// Flavors as in the decode scorer: e4m3 (mma m16n8k32.e4m3 on the raw bytes;
// sm_89, sm_120) and f16 (sm_90: the warp's 64 tokens converted to f16 A
// fragments once, 128 registers, and each staged Q fragment converted once
// per (row, 8 heads) for 32 m16n8k16 MMAs). On an H200 ncu reads the tensor
// pipe 60% busy either way with 8 warps x 64 tokens (5.40 ms for
// prefill_r4096_L32768) or 16 warps x 32 tokens (5.49 ms).
#include "indexer_common.cuh"

#define PREFILL_WARPS 8
#define PREFILL_WARP_TOKENS 64
#define PREFILL_MT (PREFILL_WARP_TOKENS / 16)  // m-tiles per warp
#define PREFILL_TOKENS (PREFILL_WARPS * PREFILL_WARP_TOKENS)
#define PREFILL_ROWS 64
#define PREFILL_STAGE_ROWS 2

__device__ __forceinline__ void cp_async4(void* dst, const void* src, u32 src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)),
                 "l"(src), "r"(src_bytes));
}


__device__ __forceinline__ uint4 lds128(const u8* p) {
    return *reinterpret_cast<const uint4*>(p);
}

// Q stage layout: [head][128 bytes], the 16-byte chunk c of head h stored at
// chunk c ^ ((h & 1) << 2), so the 8 lanes of a quarter warp (2 heads x 4
// chunks) hit 32 distinct banks.
__device__ __forceinline__ u32 q_swizzle(u32 head, u32 chunk) {
    return head * IDX_HEAD_DIM + ((chunk ^ ((head & 1) << 2)) << 4);
}

template <int NT>
struct PrefillSmem {
    u8 q[2][PREFILL_STAGE_ROWS][NT * 8 * IDX_HEAD_DIM];
    float w[2][PREFILL_STAGE_ROWS][NT * 8];
    u32 live[PREFILL_ROWS];
};

template <int NT>
__device__ __forceinline__ void stage_rows(const ScoreParams& p, PrefillSmem<NT>& sm, int buf,
                                           u32 row_first, u32 row_end) {
    constexpr u32 CHUNKS = NT * 8 * (IDX_HEAD_DIM / 16);  // per row
    for (u32 i = threadIdx.x; i < PREFILL_STAGE_ROWS * CHUNKS; i += blockDim.x) {
        const u32 rr = i / CHUNKS, c = i % CHUNKS;
        const u32 head = c / (IDX_HEAD_DIM / 16), chunk = c % (IDX_HEAD_DIM / 16);
        const u32 row = row_first + rr;
        const bool ok = row < row_end && head < p.heads;
        const u8* src = p.q + ((u64)(ok ? row : 0) * p.heads + (ok ? head : 0)) * IDX_HEAD_DIM +
                        chunk * 16;
        cp_async16(smem_addr(&sm.q[buf][rr][q_swizzle(head, chunk)]), src, ok ? 16u : 0u);
    }
    for (u32 i = threadIdx.x; i < PREFILL_STAGE_ROWS * NT * 8; i += blockDim.x) {
        const u32 rr = i / (NT * 8), head = i % (NT * 8);
        const u32 row = row_first + rr;
        const bool ok = row < row_end && head < p.heads;
        const float* src = p.weights + (u64)(ok ? row : 0) * p.heads + (ok ? head : 0);
        cp_async4(&sm.w[buf][rr][head], src, ok ? 4u : 0u);
    }
}

template <int NT, bool F16>
__device__ __forceinline__ void prefill_score(const ScoreParams& p) {
    __shared__ __align__(16) PrefillSmem<NT> sm;
    const u32 row0 = blockIdx.y * PREFILL_ROWS;
    const u32 row_end = min(row0 + PREFILL_ROWS, p.rows);
    const u32 tile0 = blockIdx.x * PREFILL_TOKENS;  // chunk-local

    u32 my_max = 0;
    for (u32 i = threadIdx.x; i < PREFILL_ROWS; i += blockDim.x) {
        const u32 row = row0 + i;
        const u32 live =
            row < row_end ? idx_live_tokens(p.lengths, p.active_width, row, p.width) : 0u;
        sm.live[i] = live;
        my_max = max(my_max, live);
    }
    // Skip the whole tile when no row of the block reaches it.
    const bool any = __syncthreads_or(my_max > p.chunk_start + tile0);
    if (!any) return;

    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u32 gid = lane >> 2, tig = lane & 3;
    const u32 my_tok = gid + 8 * (tig & 1);
    const u32 wt0 = tile0 + warp * PREFILL_WARP_TOKENS;  // chunk-local first token of this warp
    const u32 page_col = (p.chunk_start + wt0) / IDX_PAGE_ROWS;
    const u32 slot0 = (p.chunk_start + wt0) % IDX_PAGE_ROWS;
    const bool in_table = page_col < p.width && wt0 < p.chunk_len;
    i32 pid = in_table ? p.page_table[page_col] : -1;
    if (pid >= 0 && !idx_page_in_range(pid, p.pages)) {
        // Unmapped; reported only when a row of the block reaches the page
        // (the table past every live length may hold anything).
        if (lane == 0) {
            for (u32 i = 0; i < row_end - row0; ++i) {
                if (sm.live[i] > p.chunk_start + wt0) {
                    idx_report_bad_page(p.status, row0 + i, page_col, pid, p.pages);
                    break;
                }
            }
        }
        pid = -1;
    }

    KTile kt[PREFILL_MT];
    float sc[PREFILL_MT];
#pragma unroll
    for (int m = 0; m < PREFILL_MT; ++m) {
        kt[m].r0 = zero_row32();
        kt[m].r1 = zero_row32();
        sc[m] = 0.0f;
    }
    if (pid >= 0) {
        const u8* base = p.kcache + (u64)pid * p.page_stride;
#pragma unroll
        for (int m = 0; m < PREFILL_MT; ++m) {
            const u8* rows = base + (u64)(slot0 + m * 16 + gid) * IDX_HEAD_DIM;
            kt[m].r0 = load_row32(rows, tig);
            kt[m].r1 = load_row32(rows + 8 * IDX_HEAD_DIM, tig);
            sc[m] = __ldg(reinterpret_cast<const float*>(base + IDX_SCALE_OFFSET) + slot0 +
                          m * 16 + my_tok);
        }
    }
    AFragF16 ka[F16 ? PREFILL_MT : 1][8];
    if (F16) {
#pragma unroll
        for (int m = 0; m < (F16 ? PREFILL_MT : 1); ++m)
#pragma unroll
            for (int k = 0; k < 8; ++k) ka[m][k] = a_frag_f16(kt[m].r0, kt[m].r1, k);
    }

    const float skip = idx_not_candidate();
    const u32 n_rows = row_end - row0;
    stage_rows<NT>(p, sm, 0, row0, row_end);
    cp_async_commit();
    for (u32 i = 0; i < n_rows; i += PREFILL_STAGE_ROWS) {
        const int buf = (i / PREFILL_STAGE_ROWS) & 1;
        if (i + PREFILL_STAGE_ROWS < n_rows) {
            stage_rows<NT>(p, sm, buf ^ 1, row0 + i + PREFILL_STAGE_ROWS, row_end);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
#pragma unroll
        for (int rr = 0; rr < PREFILL_STAGE_ROWS; ++rr) {
            if (i + rr >= n_rows) break;
            const u32 live = sm.live[i + rr];
            // Warp-uniform: this warp's page holds no live token of the row.
            if (live <= p.chunk_start + wt0) continue;
            const u32 row_live = min(live - p.chunk_start, p.chunk_len);  // chunk-local bound
            float* out = p.logits + (u64)(row0 + i + rr) * p.logits_row_stride;
            if (pid < 0) {
#pragma unroll
                for (int m = 0; m < PREFILL_MT; ++m) {
                    const u32 t = wt0 + m * 16 + my_tok;
                    if (tig < 2 && t < row_live) out[t] = skip;
                }
                continue;
            }
            const u8* qs = sm.q[buf][rr];
            const float* ws = sm.w[buf][rr];
            float lo[PREFILL_MT], hi[PREFILL_MT];
#pragma unroll
            for (int m = 0; m < PREFILL_MT; ++m) lo[m] = hi[m] = 0.0f;
            // Two head tiles per trip: enough overlap, and the f16 flavor's 128
            // registers of K fragments stay clear of spills.
#pragma unroll 2
            for (int n = 0; n < NT; ++n) {
                const u32 head = n * 8 + gid;
                Row32 b;
                b.lo = lds128(qs + q_swizzle(head, tig));
                b.hi = lds128(qs + q_swizzle(head, 4 + tig));
                const float2 w = *reinterpret_cast<const float2*>(ws + n * 8 + tig * 2);
                float acc[PREFILL_MT][4];
                if (F16) {
#pragma unroll
                    for (int k = 0; k < 8; ++k) {
                        u32 b0, b1;
                        cvt_e4m3x4(row32_w(b, k), b0, b1);
#pragma unroll
                        for (int m = 0; m < (F16 ? PREFILL_MT : 1); ++m) {
                            const AFragF16& a = ka[m][k];
                            if (k == 0)
                                mma_f16_zero(acc[m], a.a[0], a.a[1], a.a[2], a.a[3], b0, b1);
                            else
                                mma_f16(acc[m], a.a[0], a.a[1], a.a[2], a.a[3], b0, b1);
                        }
                    }
                } else {
#pragma unroll
                    for (int s = 0; s < 4; ++s) {
                        const u32 b0 = row32_word(b, s, 0), b1 = row32_word(b, s, 1);
#pragma unroll
                        for (int m = 0; m < PREFILL_MT; ++m) {
                            const u32 a0 = row32_word(kt[m].r0, s, 0);
                            const u32 a1 = row32_word(kt[m].r1, s, 0);
                            const u32 a2 = row32_word(kt[m].r0, s, 1);
                            const u32 a3 = row32_word(kt[m].r1, s, 1);
                            if (s == 0)
                                mma_e4m3_zero(acc[m], a0, a1, a2, a3, b0, b1);
                            else
                                mma_e4m3(acc[m], a0, a1, a2, a3, b0, b1);
                        }
                    }
                }
#pragma unroll
                for (int m = 0; m < PREFILL_MT; ++m) {
                    lo[m] = fmaf(relu_nan(acc[m][0]), w.x, lo[m]);
                    lo[m] = fmaf(relu_nan(acc[m][1]), w.y, lo[m]);
                    hi[m] = fmaf(relu_nan(acc[m][2]), w.x, hi[m]);
                    hi[m] = fmaf(relu_nan(acc[m][3]), w.y, hi[m]);
                }
            }
#pragma unroll
            for (int m = 0; m < PREFILL_MT; ++m) {
                lo[m] = quad_sum(lo[m]);
                hi[m] = quad_sum(hi[m]);
                const u32 t = wt0 + m * 16 + my_tok;
                if (tig < 2 && t < row_live) out[t] = ((tig & 1) ? hi[m] : lo[m]) * sc[m];
            }
        }
        __syncthreads();  // the buffer is restaged two rows from now
    }
}

#define PREFILL_KERNELS(HEADS, NT)                                             \
    B12X_KERNEL void __launch_bounds__(PREFILL_WARPS * 32, 1)                  \
        b12x_indexer_prefill_e4m3_h##HEADS(const ScoreParams p) {              \
        prefill_score<NT, false>(p);                                           \
    }                                                                          \
    B12X_KERNEL void __launch_bounds__(PREFILL_WARPS * 32, 1)                  \
        b12x_indexer_prefill_f16_h##HEADS(const ScoreParams p) {               \
        prefill_score<NT, true>(p);                                            \
    }

PREFILL_KERNELS(16, 2)
PREFILL_KERNELS(32, 4)
PREFILL_KERNELS(48, 6)
PREFILL_KERNELS(64, 8)
