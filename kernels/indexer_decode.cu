// Paged decode scorer: one page-table row per query row.
//
// logits[r, t - chunk_start] = scale[t] * sum_h w[r,h] * relu(q[r,h,:] . k[t,:])
// for the chunk's live tokens t < min(len_r, active_width, width * 64).
// Tokens on a page whose id is outside [0, pages) are not candidates
// (IDX_NOT_CANDIDATE); ids past the cache are reported (idx_bounded_pid).
//
// Grid (rows, ceil(chunk_pages / pages_per_cta)), 4 warps; each warp owns
// whole pages (strided by 4 inside the CTA's page range), keeps the next
// tiles' loads in flight while it multiplies the current one, and holds the
// row's Q fragments and weights in registers. Work stops at the live length.
//
// Two flavors with the same results (FP8 products are exact in f32):
//   e4m3: K tokens as the A operand of mma m16n8k32.e4m3 (native on sm_89 and
//         sm_120), Q as B;
//   f16:  Q (converted to f16 once) as the A operand of mma m16n8k16.f16, K
//         tokens as B, converted per 8-token tile (sm_90 has no e4m3 mma.sync).
#include "indexer_common.cuh"

#define DECODE_WARPS 4
#define DECODE_MAX_PAGES_PER_CTA 256

template <int NT>
__device__ __forceinline__ void decode_score_e4m3(const ScoreParams& p) {
    const u32 r = blockIdx.x;
    const u32 live = idx_live_tokens(p.lengths, p.active_width, r, p.width);
    if (live <= p.chunk_start) return;
    const u32 n_chunk = min(live - p.chunk_start, p.chunk_len);
    const u32 chunk_pages = (n_chunk + IDX_PAGE_ROWS - 1) / IDX_PAGE_ROWS;
    const u32 page0 = blockIdx.y * p.pages_per_cta;
    if (page0 >= chunk_pages) return;
    const u32 page_end = min(page0 + p.pages_per_cta, chunk_pages);

    __shared__ i32 pids[DECODE_MAX_PAGES_PER_CTA];
    const i32* pt = p.page_table + (u64)r * p.pt_row_stride + p.chunk_start / IDX_PAGE_ROWS;
    const u32 col0 = p.chunk_start / IDX_PAGE_ROWS + page0;  // page-table column of pids[0]
    for (u32 i = threadIdx.x; i < page_end - page0; i += blockDim.x)
        pids[i] = idx_bounded_pid(p, pt[page0 + i], r, col0 + i);
    __syncthreads();

    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u32 gid = lane >> 2, tig = lane & 3;

    // Q fragments (B operand: column = head) and this lane's two weights per n-tile.
    Row32 qf[NT];
    float w0[NT], w1[NT];
    const u8* qrow = p.q + (u64)r * p.heads * IDX_HEAD_DIM;
    const float* wrow = p.weights + (u64)r * p.heads;
#pragma unroll
    for (int n = 0; n < NT; ++n) {
        const u32 head = n * 8 + gid;
        qf[n] = head < p.heads ? load_row32(qrow + (u64)head * IDX_HEAD_DIM, tig) : zero_row32();
        const u32 h0 = n * 8 + tig * 2;
        w0[n] = h0 < p.heads ? wrow[h0] : 0.0f;
        w1[n] = h0 + 1 < p.heads ? wrow[h0 + 1] : 0.0f;
    }

    float* out = p.logits + (u64)r * p.logits_row_stride;
    const float skip = idx_not_candidate();
    // This lane's output token inside an m-tile (lanes tig 0/1 store rows gid / gid + 8).
    const u32 my_tok = gid + 8 * (tig & 1);

    KTile kt[4];
    float sc[4];
#pragma unroll
    for (int m = 0; m < 4; ++m) {
        kt[m].r0 = zero_row32();
        kt[m].r1 = zero_row32();
        sc[m] = 0.0f;
    }
    auto load_page = [&](u32 pg, i32 pid) {
        const u8* base = p.kcache + (u64)pid * p.page_stride;
#pragma unroll
        for (int m = 0; m < 4; ++m) {
            const u32 t0 = pg * IDX_PAGE_ROWS + m * 16;
            if (pid >= 0 && t0 < n_chunk) {
                const u8* rows = base + (u64)(m * 16 + gid) * IDX_HEAD_DIM;
                kt[m].r0 = load_row32_stream(rows, tig);
                kt[m].r1 = load_row32_stream(rows + 8 * IDX_HEAD_DIM, tig);
                sc[m] = __ldg(reinterpret_cast<const float*>(base + IDX_SCALE_OFFSET) + m * 16 +
                              my_tok);
            }
        }
    };

    u32 pg = page0 + warp;
    if (pg >= page_end) return;
    i32 pid = pids[pg - page0];
    load_page(pg, pid);
    while (true) {
        const u32 next = pg + DECODE_WARPS;
        const bool has_next = next < page_end;
        const i32 next_pid = has_next ? pids[next - page0] : -1;
        // Branch-free body (the shuffles stay convergent); a tile past the live
        // length (only in the last page) or on an unmapped page is computed on
        // stale registers and not stored / stored as "not a candidate".
#pragma unroll
        for (int m = 0; m < 4; ++m) {
            const u32 t0 = pg * IDX_PAGE_ROWS + m * 16;
            float acc[NT][4];
            mma_tile<NT>(acc, kt[m], qf);
            const float scale = sc[m];
            // Refill this slot with the next page's tile while the MMAs run.
            if (has_next && next_pid >= 0 && next * IDX_PAGE_ROWS + m * 16 < n_chunk) {
                const u8* base = p.kcache + (u64)next_pid * p.page_stride;
                const u8* rows = base + (u64)(m * 16 + gid) * IDX_HEAD_DIM;
                kt[m].r0 = load_row32_stream(rows, tig);
                kt[m].r1 = load_row32_stream(rows + 8 * IDX_HEAD_DIM, tig);
                sc[m] = __ldg(reinterpret_cast<const float*>(base + IDX_SCALE_OFFSET) + m * 16 +
                              my_tok);
            }
            float lo = 0.0f, hi = 0.0f;
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                lo = fmaf(relu_nan(acc[n][0]), w0[n], lo);
                lo = fmaf(relu_nan(acc[n][1]), w1[n], lo);
                hi = fmaf(relu_nan(acc[n][2]), w0[n], hi);
                hi = fmaf(relu_nan(acc[n][3]), w1[n], hi);
            }
            lo = quad_sum(lo);
            hi = quad_sum(hi);
            const float v = pid >= 0 ? ((tig & 1) ? hi : lo) * scale : skip;
            const u32 t = t0 + my_tok;
            if (tig < 2 && t < n_chunk) out[t] = v;
        }
        if (!has_next) break;
        pg = next;
        pid = next_pid;
    }
}

// f16 flavor. A page is 8 tiles of 8 tokens. Each warp streams its tiles
// through its own shared-memory ring of F16_STAGES tiles with cp.async (deep
// memory pipelining without spending registers, which hold Q), and works on
// two tiles per step so two sets of MMA chains overlap. MT = heads / 16.
#define F16_STAGES 8
#define F16_TILE_BYTES (8 * IDX_HEAD_DIM)
#define F16_STAGE_BYTES (F16_TILE_BYTES + 32)  // 8 tokens + their 8 scales

// Token row g's 16-byte chunk c sits at chunk c ^ ((g & 1) << 2) of its
// 128-byte row: a quarter warp (rows 2i, 2i+1 x chunks tig) hits 32 banks.
__device__ __forceinline__ u32 tile_swizzle(u32 row, u32 chunk) {
    return row * IDX_HEAD_DIM + ((chunk ^ ((row & 1) << 2)) << 4);
}

template <int MT>
__device__ __forceinline__ void decode_tile_f16(const AFragF16 (&qa)[MT][8], const Row32& kb,
                                                float (&acc)[MT][4]) {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        u32 b0, b1;
        cvt_e4m3x4(row32_w(kb, k), b0, b1);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            const AFragF16& a = qa[mt][k];
            if (k == 0)
                mma_f16_zero(acc[mt], a.a[0], a.a[1], a.a[2], a.a[3], b0, b1);
            else
                mma_f16(acc[mt], a.a[0], a.a[1], a.a[2], a.a[3], b0, b1);
        }
    }
}

// MT head tiles split over GROUP warps (MT / GROUP each) that share one ring
// (GROUP = 2 halves the Q registers per warp, so twice the warps fit an SM).
template <int MT, int GROUP>
__device__ __forceinline__ void decode_score_f16(const ScoreParams& p) {
    constexpr int MTW = MT / GROUP;
    __shared__ __align__(16) u8 ring[DECODE_WARPS][F16_STAGES][F16_STAGE_BYTES];
    __shared__ float2 xchg[DECODE_WARPS][2][4];
    __shared__ i32 pids[DECODE_MAX_PAGES_PER_CTA];
    const u32 r = blockIdx.x;
    const u32 live = idx_live_tokens(p.lengths, p.active_width, r, p.width);
    if (live <= p.chunk_start) return;
    const u32 n_chunk = min(live - p.chunk_start, p.chunk_len);
    const u32 chunk_pages = (n_chunk + IDX_PAGE_ROWS - 1) / IDX_PAGE_ROWS;
    const u32 page0 = blockIdx.y * p.pages_per_cta;
    if (page0 >= chunk_pages) return;
    const u32 page_end = min(page0 + p.pages_per_cta, chunk_pages);

    const i32* pt = p.page_table + (u64)r * p.pt_row_stride + p.chunk_start / IDX_PAGE_ROWS;
    const u32 col0 = p.chunk_start / IDX_PAGE_ROWS + page0;  // page-table column of pids[0]
    for (u32 i = threadIdx.x; i < page_end - page0; i += blockDim.x)
        pids[i] = idx_bounded_pid(p, pt[page0 + i], r, col0 + i);
    __syncthreads();

    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u32 group = warp / GROUP, hw = warp % GROUP;  // hw: which share of the heads
    const u32 gid = lane >> 2, tig = lane & 3;
    if (page0 + group >= page_end) return;  // group-uniform
    const u32 my_pages = (page_end - page0 - group + DECODE_WARPS - 1) / DECODE_WARPS;
    const u32 tiles = my_pages * 8;
    u8* my_ring = ring[group][0];
    const u32 ring_addr = (u32)__cvta_generic_to_shared(my_ring);
    auto sync_group = [&]() {
        if (GROUP == 1)
            __syncwarp();
        else
            group_barrier(1 + group, 32 * GROUP);
    };

    // Tile u of this group: page page0 + group + (u / 8) * 4, tokens (u % 8) * 8 ...
    auto tile_page = [&](u32 u) { return page0 + group + (u >> 3) * DECODE_WARPS; };
    auto issue = [&](u32 u) {
        if (u < tiles) {
            const u32 pg = tile_page(u);
            const u32 sub = u & 7;
            const i32 pid = pids[pg - page0];
            if (pid >= 0 && pg * IDX_PAGE_ROWS + sub * 8 < n_chunk) {
                const u8* base = p.kcache + (u64)pid * p.page_stride;
                const u8* src = base + (u64)sub * F16_TILE_BYTES;
                const u32 stage = ring_addr + (u % F16_STAGES) * F16_STAGE_BYTES;
#pragma unroll
                for (int h = 0; h < 2 / GROUP; ++h) {
                    // 64 chunks (row c / 8, chunk c % 8) shared by the group's lanes
                    const u32 c = lane + 32 * (hw + GROUP * h);
                    cp_async16(stage + tile_swizzle(c >> 3, c & 7), src + c * 16);
                }
                if (hw == 0 && lane < 2)
                    cp_async16(stage + F16_TILE_BYTES + lane * 16,
                                   base + IDX_SCALE_OFFSET + sub * 32 + lane * 16);
            }
        }
        cp_async_commit();
    };

    // Start the copies before the Q conversion, which they then overlap.
#pragma unroll
    for (int j = 0; j < F16_STAGES - 2; ++j) issue(j);

    // Q of heads h0 = 16 (hw * MTW + mt) + gid and h0 + 8 as f16 A fragments.
    AFragF16 qa[MTW][8];
    float wa[MTW], wb[MTW];
    const u8* qrow = p.q + (u64)r * p.heads * IDX_HEAD_DIM;
    const float* wrow = p.weights + (u64)r * p.heads;
#pragma unroll
    for (int mt = 0; mt < MTW; ++mt) {
        const u32 h0 = (hw * MTW + mt) * 16 + gid, h1 = h0 + 8;
        const Row32 q0 = h0 < p.heads ? load_row32(qrow + (u64)h0 * IDX_HEAD_DIM, tig) : zero_row32();
        const Row32 q1 = h1 < p.heads ? load_row32(qrow + (u64)h1 * IDX_HEAD_DIM, tig) : zero_row32();
#pragma unroll
        for (int j = 0; j < 8; ++j) qa[mt][j] = a_frag_f16(q0, q1, j);
        wa[mt] = h0 < p.heads ? wrow[h0] : 0.0f;
        wb[mt] = h1 < p.heads ? wrow[h1] : 0.0f;
    }

    float* out = p.logits + (u64)r * p.logits_row_stride;
    const float skip = idx_not_candidate();
    // Two tiles per step: groups committed before the wait = u + STAGES, so
    // leaving STAGES - 2 pending means tiles u and u + 1 have landed. The
    // stages refilled at a step's start were read before the previous step's
    // last group barrier.
    for (u32 u = 0; u < tiles; u += 2) {
        issue(u + F16_STAGES - 2);
        issue(u + F16_STAGES - 1);
        cp_async_wait<F16_STAGES - 2>();
        sync_group();
        float acc[2][MTW][4];
        float2 scale[2];
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const u8* stage = my_ring + ((u + j) % F16_STAGES) * F16_STAGE_BYTES;
            Row32 kb;
            kb.lo = *reinterpret_cast<const uint4*>(stage + tile_swizzle(gid, tig));
            kb.hi = *reinterpret_cast<const uint4*>(stage + tile_swizzle(gid, 4 + tig));
            scale[j] = *reinterpret_cast<const float2*>(stage + F16_TILE_BYTES + tig * 8);
            decode_tile_f16<MTW>(qa, kb, acc[j]);
        }
        // C: rows = heads (gid, gid + 8), columns = tokens tig*2, tig*2 + 1.
        float s0[2], s1[2];
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            s0[j] = 0.0f;
            s1[j] = 0.0f;
#pragma unroll
            for (int mt = 0; mt < MTW; ++mt) {
                s0[j] = fmaf(relu_nan(acc[j][mt][0]), wa[mt], s0[j]);
                s1[j] = fmaf(relu_nan(acc[j][mt][1]), wa[mt], s1[j]);
                s0[j] = fmaf(relu_nan(acc[j][mt][2]), wb[mt], s0[j]);
                s1[j] = fmaf(relu_nan(acc[j][mt][3]), wb[mt], s1[j]);
            }
#pragma unroll
            for (int d = 4; d < 32; d <<= 1) {
                s0[j] += __shfl_xor_sync(0xffffffffu, s0[j], d);
                s1[j] += __shfl_xor_sync(0xffffffffu, s1[j], d);
            }
        }
        if (GROUP == 2) {
            // the second warp's head share joins the first's
            if (hw == 1 && gid == 0) {
                xchg[group][0][tig] = make_float2(s0[0], s1[0]);
                xchg[group][1][tig] = make_float2(s0[1], s1[1]);
            }
            sync_group();
            if (hw == 1) continue;
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const float2 o = xchg[group][j][tig];
                s0[j] += o.x;
                s1[j] += o.y;
            }
        } else {
            __syncwarp();
        }
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const u32 uu = u + j;
            const u32 pg = tile_page(uu);
            const u32 t0 = pg * IDX_PAGE_ROWS + (uu & 7) * 8;
            const i32 pid = pids[pg - page0];
            const float v0 = pid >= 0 ? s0[j] * scale[j].x : skip;
            const float v1 = pid >= 0 ? s1[j] * scale[j].y : skip;
            const u32 t = t0 + tig * 2;
            if (gid == 0 && t0 < n_chunk) {
                if (t + 1 < n_chunk)
                    *reinterpret_cast<float2*>(out + t) = make_float2(v0, v1);
                else if (t < n_chunk)
                    out[t] = v0;
            }
        }
    }
    cp_async_wait<0>();
}

#define DECODE_KERNELS(HEADS, NT, MT, GROUP, MINB)                                    \
    B12X_KERNEL void __launch_bounds__(DECODE_WARPS * 32, 2)                          \
        b12x_indexer_decode_e4m3_h##HEADS(const ScoreParams p) {                      \
        idx_zero_select_state(p);                                                     \
        decode_score_e4m3<NT>(p);                                                     \
    }                                                                                 \
    B12X_KERNEL void __launch_bounds__(DECODE_WARPS * 32 * GROUP, MINB)               \
        b12x_indexer_decode_f16_h##HEADS(const ScoreParams p) {                       \
        idx_zero_select_state(p);                                                     \
        decode_score_f16<MT, GROUP>(p);                                               \
    }

// f16: one warp per ring; MINB CTAs per SM keep each variant free of spills.
// (64 heads as warp pairs, GROUP = 2, fit 16 warps per SM but measured
// slower on an H200: 165 us against 141 us for decode_r64_L32768.)
DECODE_KERNELS(16, 2, 1, 1, 4)
DECODE_KERNELS(32, 4, 2, 1, 4)
DECODE_KERNELS(48, 6, 3, 1, 2)
DECODE_KERNELS(64, 8, 4, 1, 2)
