// Hopper (sm_90a) scorers: warpgroup MMAs (wgmma) for both routes.
//
// Same contract as indexer_decode.cu / indexer_prefill.cu (ScoreParams, the
// logits chunk, the live-length rule, "not a candidate" for unmapped pages,
// page ids bounded by the cache); only the arithmetic engine differs. This
// module is built for compute_90a and loads on sm_90 only; every other device
// keeps the compute_89 baseline.
//
// Two flavors. The exact one (precision="exact", the default) widens the FP8
// bytes to f16 on the way into an f16 wgmma: Q once per CTA, K per page in
// registers; every e4m3 value is an f16 value, so the products are exact and
// accumulate in fp32. The fast one (precision="fast", FP8 = true) feeds the
// raw bytes to the e4m3 wgmma (m64nNk32): half the MMAs and no conversions,
// but Hopper's FP8 wgmma does not keep a full fp32 accumulation (an H200
// measured logits ~2.5e-4 relative off the fp32 reference; the contract is
// 1e-3, documented with Caps).
//
// One CTA is one warpgroup (128 threads) owning ROWS query rows and a range
// of page-table columns. The work is a sequence of units, a page's tokens
// against all the CTA's columns (decode) or half of them (prefill, SPLIT = 2),
// software-pipelined: the MMAs of the next unit are issued before the
// epilogue of the current one, so the tensor cores run while the warps do
// relu * weight. Per page (64 tokens):
//   * the K page streams into a STAGES-deep shared-memory ring with cp.async;
//     each warp converts its 16 tokens to f16 A fragments in registers;
//   * the rows' Q (ROWS x NH heads) sits in shared memory as f16 in the
//     128-byte-swizzled K-major layout wgmma reads: the B operand, N = ROWS * NH;
//   * eight m64nNk16 wgmmas give the 64 tokens x N (row, head) dot products;
//     relu * weight, summed over heads (per thread, then across the 4 lanes
//     of a quad), times the token's scale, is the logit.
// Decode uses ROWS = 1 and the row's own page-table row; prefill uses ROWS = 4
// over the shared row. Two or more CTAs per SM keep the tensor cores busy
// while another CTA runs its epilogue.
//
// The 128 dims are taken in a permuted order (any one permutation applied to
// both operands leaves the dot product unchanged), chosen so that a lane's A
// fragments are its own 32 bytes of a token row (lane t = lane % 4 holds
// bytes 32t .. 32t + 31, words W0..W7):
//   f16: logical dims 16s + 2t + e and 16s + 8 + 2t + e (k16 step s, e = 0, 1)
//        are bytes 32t + 4s + e and 32t + 4s + 2 + e: the fragment of step s
//        is word W_s widened by one cvt per half;
//   FP8: logical dims 32s + 4t + i and 32s + 16 + 4t + i (k32 step s, i < 4)
//        are words W_2s and W_2s+1: the fragment of step s is two raw words.
#include "indexer_common.cuh"
#include "wgmma_f16.cuh"
#include "wgmma_f16_operands.cuh"
#include "wgmma_fp8.cuh"

#define WG_THREADS 128
// K ring depth: decode is bound by HBM latency (deeper), prefill by the MMA.
#define WG_DECODE_STAGES 4
#define WG_PREFILL_STAGES 4
#define WG_TILE_BYTES (IDX_PAGE_ROWS * IDX_HEAD_DIM)  // one K page, 8 KiB
#define WG_PREFILL_ROWS 4
// Resident prefill CTAs per SM (the launch bound; register-bound at 64 heads).
#define WG_PREFILL_MIN_CTAS 2
// Pages per software-pipelined window (the last unit of a window does not
// overlap an MMA; longer windows waste more at the end of a CTA's range).
// Decode takes one page per window, no overlap: its second set of registers
// would cost a CTA per SM, and decode needs CTAs in flight for HBM (an H200
// measured 130.8 us for decode_r64_L32768 with windows of 4, 124.7 without).
#define WG_DECODE_WINDOW 1
#define WG_PREFILL_WINDOW 2

// Shared-memory plan (dynamic, carved from a 1024-byte aligned base: the
// 128-byte swizzle repeats every 8 rows = 1024 bytes, and the matrix
// descriptors assume atoms start on that boundary). The host sizes the
// allocation with the same formula (rust/cuda/src/indexer.rs).
//   K: the FP8 page ring; Q: the B operand, [N rows][128 bytes] per part:
//   f16 in two parts of 64 dims, FP8 in one; then scales, weights and page ids.
template <int NH, int ROWS, bool FP8>
struct WgSmem {
    static constexpr u32 N = ROWS * NH;
    static constexpr u32 STAGES = ROWS == 1 ? WG_DECODE_STAGES : WG_PREFILL_STAGES;
    static constexpr u32 K = 0;
    static constexpr u32 Q = K + STAGES * WG_TILE_BYTES;
    static constexpr u32 Q_HALF = N * 128;
    static constexpr u32 Q_PARTS = FP8 ? 1 : 2;
    static constexpr u32 SCALE = Q + Q_PARTS * Q_HALF;
    static constexpr u32 W = SCALE + STAGES * IDX_PAGE_ROWS * 4;
    // Weights by lane: lane t's columns 8j + 2t + e at [t][j][e], rows padded
    // by 2 pairs so the 4 lanes of a quad read distinct banks.
    static constexpr u32 W_ROW = N / 8 + 2;  // (j, e) pairs per lane row
    static constexpr u32 PID = W + 4 * W_ROW * 2 * 4;
    static constexpr u32 BYTES = PID + STAGES * 4;
};

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// K-major operand, 128-byte swizzle, rows of 128 bytes, 8-row groups 1024
// bytes apart (stride byte offset); the leading byte offset is unused when a
// k step (16 f16 or 32 FP8 = 32 bytes) stays inside the swizzle width.
__device__ __forceinline__ u64 wg_desc(u32 smem_byte_addr) {
    return (u64)((smem_byte_addr & 0x3FFFF) >> 4) | ((u64)1 << 16) | ((u64)(1024 >> 4) << 32) |
           ((u64)1 << 62);
}

__device__ __forceinline__ u32 dynamic_smem_bytes() {
    u32 v;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(v));
    return v;
}

// Starts the copy of one K page (tokens and scales) into ring stage `stage`;
// an unmapped page copies nothing. Thread 0 records the page id for the
// consumers (read after the barrier that follows the copy). Decode
// (kStream) reads each page once, prefill again for every row block: decode
// copies its tokens under `stream_policy` (l2_evict_first_policy).
template <class L, bool kStream>
__device__ __forceinline__ void wg_issue_page(const ScoreParams& p, u8* smem, u32 stage, i32 pid,
                                              u64 stream_policy) {
    const u32 tid = threadIdx.x;
    if (pid >= 0) {
        const u8* src = p.kcache + (u64)pid * p.page_stride;
        const u32 dst = smem_addr(smem + L::K + stage * WG_TILE_BYTES);
#pragma unroll
        for (u32 c = tid; c < WG_TILE_BYTES / 16; c += WG_THREADS) {
            if (kStream)
                cp_async16_hint(dst + sw128(c >> 3, c & 7), src + c * 16, stream_policy);
            else
                cp_async16(dst + sw128(c >> 3, c & 7), src + c * 16);
        }
        if (tid < IDX_PAGE_ROWS * 4 / 16)
            cp_async16(smem_addr(smem + L::SCALE + stage * IDX_PAGE_ROWS * 4) + tid * 16,
                          src + IDX_SCALE_OFFSET + tid * 16);
    }
    if (tid == 0) reinterpret_cast<i32*>(smem + L::PID)[stage] = pid;
}

// Q of the CTA's rows as the B operand (see the permutation above).
//   f16: f16_stage_q (wgmma_f16_operands.cuh).
//   FP8: word w of FP8 chunk i of a row (bytes 16i..16i+15: lane t = i / 2,
//        its words 4(i % 2)..+3) is W_j, j = 4(i % 2) + w, which holds
//        logical dims 16j + 4t .. + 3: byte 4t of logical chunk j.
// Padded heads / rows are 0.
template <int NH, class L, bool FP8>
__device__ __forceinline__ void wg_stage_q(const ScoreParams& p, u8* smem, u32 row0) {
    if constexpr (!FP8) {
        f16_stage_q<NH, L::N>(p, smem + L::Q, L::Q_HALF, row0, threadIdx.x, WG_THREADS);
        return;
    }
#pragma unroll 4
    for (u32 c = threadIdx.x; c < L::N * 8; c += WG_THREADS) {
        const u32 n = c >> 3, i = c & 7;
        const uint4 v = q_chunk<NH>(p, row0, n, i);
        const u32 t = i >> 1;
        const u32 words[4] = {v.x, v.y, v.z, v.w};
        u8* q = smem + L::Q;
#pragma unroll
        for (u32 w = 0; w < 4; ++w)
            *reinterpret_cast<u32*>(q + sw128(n, 4 * (i & 1) + w) + 4 * t) = words[w];
    }
}

template <int V>
struct Int {
    static constexpr int value = V;
};

// f(Int<I>{}), ..., f(Int<N - 1>{}): unrolled with compile-time indices.
template <int I, int N, class F>
__device__ __forceinline__ void static_for(F&& f) {
    if constexpr (I < N) {
        f(Int<I>{});
        static_for<I + 1, N>(f);
    }
}

// Per page, kept in registers so its ring stage can be refilled early.
struct PageRegs {
    i32 pid;
    float scale;  // scale of the token this lane stores (lane_out.token)
};

template <bool B, class T, class F>
struct Pick {
    using type = T;
};
template <class T, class F>
struct Pick<false, T, F> {
    using type = F;
};

template <int NH, int ROWS, int SPLIT, int WINDOW, bool FP8>
__device__ __forceinline__ void wg_score(const ScoreParams& p) {
    static_assert(WINDOW == 1 || WINDOW % 2 == 0, "windows start on even pages (buffer = parity)");
    using L = WgSmem<NH, ROWS, FP8>;
    constexpr int N = L::N;
    constexpr int UN = N / SPLIT;          // columns per unit
    constexpr int UROWS = ROWS / SPLIT;    // query rows per unit
    constexpr int UF = WINDOW * SPLIT;     // units per window
    using Mma = typename Pick<FP8, WgmmaFp8<UN>, WgmmaF16<UN>>::type;
    constexpr int REGS = Mma::REGS;
    constexpr int KSTEPS = FP8 ? 4 : 8;    // MMAs per unit (k32 or k16 over 128 dims)

    extern __shared__ __align__(16) u8 smem_raw[];
    u8* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
    if (dynamic_smem_bytes() < L::BYTES + 1024) __trap();  // host/kernel layout drift

    const u32 tid = threadIdx.x;
    const u32 row0 = blockIdx.x * ROWS;

    // Live tokens of each row inside this chunk; the CTA stops at the longest.
    u32 n_chunk[ROWS];
    u32 max_chunk = 0;
#pragma unroll
    for (int rr = 0; rr < ROWS; ++rr) {
        const u32 row = row0 + rr;
        const u32 live =
            row < p.rows ? idx_live_tokens(p.lengths, p.active_width, row, p.width) : 0u;
        n_chunk[rr] = live > p.chunk_start ? min(live - p.chunk_start, p.chunk_len) : 0u;
        max_chunk = max(max_chunk, n_chunk[rr]);
    }
    const u32 chunk_pages = (max_chunk + IDX_PAGE_ROWS - 1) / IDX_PAGE_ROWS;
    const u32 page0 = blockIdx.y * p.pages_per_cta;
    if (page0 >= chunk_pages) return;  // CTA-uniform
    const u32 page_end = min(page0 + p.pages_per_cta, chunk_pages);
    const i32* pt = p.page_table + (u64)row0 * p.pt_row_stride + p.chunk_start / IDX_PAGE_ROWS;
    // Page id of chunk page i (every page a CTA issues is live for one of its
    // rows): an id past the cache is unmapped, reported for the first row
    // that reaches it.
    auto page_id = [&](u32 i) -> i32 {
        const i32 pid = pt[i];
        if (pid < 0 || idx_page_in_range(pid, p.pages)) return pid;
        if (tid == 0) {
            u32 first = 0;
            bool found = false;
#pragma unroll
            for (int rr = 0; rr < ROWS; ++rr) {
                if (!found && n_chunk[rr] > i * IDX_PAGE_ROWS) {
                    first = rr;
                    found = true;
                }
            }
            idx_report_bad_page(p.status, row0 + first, p.chunk_start / IDX_PAGE_ROWS + i, pid,
                                p.pages);
        }
        return -1;
    };

    const u64 stream_policy = l2_evict_first_policy();
    // The first pages' copies run while Q is staged.
#pragma unroll
    for (u32 s = 0; s < L::STAGES - 1; ++s) {
        if (page0 + s < page_end)
            wg_issue_page<L, ROWS == 1>(p, smem, s, page_id(page0 + s), stream_policy);
        cp_async_commit();
    }
    wg_stage_q<NH, L, FP8>(p, smem, row0);
    float* ws = reinterpret_cast<float*>(smem + L::W);
    // halved: the epilogue multiplies them by twice relu (relu_nan_x2)
    for (u32 c = tid; c < N; c += WG_THREADS) {
        const u32 rr = c / NH, h = c % NH, row = row0 + rr;
        const u32 lane_t = (c % 8) / 2, j = c / 8, e = c % 2;
        ws[(lane_t * L::W_ROW + j) * 2 + e] =
            row < p.rows && h < p.heads ? 0.5f * p.weights[(u64)row * p.heads + h] : 0.0f;
    }
    fence_proxy_async_shared();  // Q, read by wgmma after the first barrier below

    const u32 lane = tid & 31, warp = tid >> 5;
    const u32 gid = lane >> 2, tig = lane & 3;
    const u32 t_lo = 16 * warp + gid;  // this lane's tokens: t_lo and t_lo + 8
    const float skip = idx_not_candidate();
    // The logit this lane stores from each unit (row HALF * UROWS + lane_out.row);
    // per half, its row's chunk tokens and its logits (selects: no local memory).
    const QuadLogit<UROWS> lane_out(tig, t_lo);
    u32 my_n[SPLIT];
    float* my_out[SPLIT];
#pragma unroll
    for (int h = 0; h < SPLIT; ++h) {
        const u32 rr = h * UROWS + lane_out.row;
        u32 n = 0;
#pragma unroll
        for (int r = 0; r < ROWS; ++r) n = (u32)r == rr ? n_chunk[r] : n;
        my_n[h] = n;
        my_out[h] = p.logits + (u64)(row0 + rr) * p.logits_row_stride + lane_out.token;
    }
    const i32* pids = reinterpret_cast<const i32*>(smem + L::PID);
    const float* scales = reinterpret_cast<const float*>(smem + L::SCALE);
    const u32 q_base = smem_addr(smem + L::Q);

    float d[2][REGS];  // accumulators of two units in flight
    u32 a[2][KSTEPS][4];  // A fragments of two pages in flight
    PageRegs pr[2];

    // Waits for page i's copy, refills the stage the page before it used and
    // moves page i into registers (buffer B).
    auto begin_page = [&](u32 i, auto bc) {
        constexpr int B = decltype(bc)::value;
        // i may be past page_end (the last window's tail): nothing is copied
        // for it and nothing computed from its stale stage is stored.
        const u32 idx = i - page0, stage = idx % L::STAGES;
        cp_async_wait<L::STAGES - 2>();  // this page's copy (one group per page)
        __syncthreads();  // ... from every thread; every thread is done with stage idx - 1
        const u32 ahead = i + L::STAGES - 1;
        if (ahead < page_end)
            wg_issue_page<L, ROWS == 1>(p, smem, (idx + L::STAGES - 1) % L::STAGES, page_id(ahead),
                                        stream_policy);
        cp_async_commit();
        // A fragments: this lane's 32 bytes (chunks 2 tig, 2 tig + 1) of rows
        // t_lo, t_lo + 8 (f16: word s widens to the fragment of k step s;
        // FP8: words 2s, 2s + 1 are it). An unmapped page multiplies stale
        // bytes; its logits are not stored.
        const u8* ks = smem + L::K + stage * WG_TILE_BYTES;
        u32 w0[8], w1[8];
        f16_lane_words(ks, t_lo, tig, w0, w1);
        // The MMAs that read a[B] (two pages back) are complete; keep the
        // compiler from moving these writes above the wait that said so.
#pragma unroll
        for (int s = 0; s < KSTEPS; ++s)
            asm volatile("" : "+r"(a[B][s][0]), "+r"(a[B][s][1]), "+r"(a[B][s][2]), "+r"(a[B][s][3])
                         :: "memory");
#pragma unroll
        for (int s = 0; s < KSTEPS; ++s) {
            if constexpr (FP8) {
                a[B][s][0] = w0[2 * s];
                a[B][s][1] = w1[2 * s];
                a[B][s][2] = w0[2 * s + 1];
                a[B][s][3] = w1[2 * s + 1];
            } else {
                f16_a_fragment(w0, w1, s, a[B][s]);
            }
        }
        pr[B].pid = pids[stage];
        pr[B].scale = scales[stage * IDX_PAGE_ROWS + lane_out.token];
    };

    // Issues the KSTEPS MMAs of one unit (eight k16 or four k32): page buffer
    // P, accumulators D, columns [HALF * UN, +UN). Each step reads 32 bytes
    // of every Q row: f16 steps 4..7 from the second part.
    auto issue = [&](auto pc, auto dc, auto hc) {
        constexpr int P = decltype(pc)::value, D = decltype(dc)::value;
        constexpr int HALF = decltype(hc)::value;
        wgmma_fence();
        const u32 b = q_base + HALF * UN * 128;
        Mma::mma_first(d[D], a[P][0], wg_desc(b));
#pragma unroll
        for (int s = 1; s < KSTEPS; ++s)
            Mma::mma(d[D], a[P][s], wg_desc(b + (s >> 2) * L::Q_HALF + 32 * (s & 3)));
        wgmma_commit();
    };

    // relu * weight over the unit's heads, per query row, times the scale.
    auto epilogue = [&](u32 page, auto pc, auto dc, auto hc, bool exists) {
        constexpr int P = decltype(pc)::value, D = decltype(dc)::value;
        constexpr int HALF = decltype(hc)::value;
        Mma::fence_operands(d[D]);
        float x[2 * UROWS];  // [lo0, hi0, lo1, hi1]: this lane's share
#pragma unroll
        for (int v = 0; v < 2 * UROWS; ++v) x[v] = 0.0f;
        const float* wrow = ws + tig * L::W_ROW * 2 + HALF * (UN / 8) * 2;
#pragma unroll
        for (int j = 0; j < UN / 8; j += 2) {
            const float4 w = *reinterpret_cast<const float4*>(wrow + 2 * j);
            const int r0 = (8 * j) / NH, r1 = (8 * (j + 1)) / NH;
            x[2 * r0] = fmaf(relu_nan_x2(d[D][4 * j]), w.x, x[2 * r0]);
            x[2 * r0] = fmaf(relu_nan_x2(d[D][4 * j + 1]), w.y, x[2 * r0]);
            x[2 * r0 + 1] = fmaf(relu_nan_x2(d[D][4 * j + 2]), w.x, x[2 * r0 + 1]);
            x[2 * r0 + 1] = fmaf(relu_nan_x2(d[D][4 * j + 3]), w.y, x[2 * r0 + 1]);
            x[2 * r1] = fmaf(relu_nan_x2(d[D][4 * j + 4]), w.z, x[2 * r1]);
            x[2 * r1] = fmaf(relu_nan_x2(d[D][4 * j + 5]), w.w, x[2 * r1]);
            x[2 * r1 + 1] = fmaf(relu_nan_x2(d[D][4 * j + 6]), w.z, x[2 * r1 + 1]);
            x[2 * r1 + 1] = fmaf(relu_nan_x2(d[D][4 * j + 7]), w.w, x[2 * r1 + 1]);
        }
        const float val = quad_reduce_scatter<2 * UROWS>(x, tig) * pr[P].scale;
        const u32 t = page * IDX_PAGE_ROWS + lane_out.token;  // chunk-local
        if (lane_out.stores && exists && t < my_n[HALF])
            my_out[HALF][page * IDX_PAGE_ROWS] = pr[P].pid >= 0 ? val : skip;
    };

    // Windows of WINDOW pages. Inside a window the next unit's MMAs are
    // issued before the current unit's epilogue; a window ends with no MMA in
    // flight, the state ptxas needs to keep the wgmma pipeline across the loop
    // (a group pending over the back edge makes it serialize every wgmma).
    // Inside a window the code is straight-line around the MMAs, so the last
    // window may run past the CTA's pages: stale operands, no stores.
    const u32 units = (page_end - page0) * SPLIT;
    for (u32 base = 0; base < units; base += UF) {
        begin_page(page0 + base / SPLIT, Int<0>{});
        issue(Int<0>{}, Int<0>{}, Int<0>{});
        // Unit base + k: accumulators k % 2, page buffer (k / SPLIT) % 2, half k % SPLIT.
        static_for<0, UF>([&](auto kc) {
            constexpr int K = decltype(kc)::value, KN = K + 1;
            const u32 u = base + K;
            if constexpr (KN < UF) {
                if constexpr (KN % SPLIT == 0)
                    begin_page(page0 + (u + 1) / SPLIT, Int<(KN / SPLIT) % 2>{});
                issue(Int<(KN / SPLIT) % 2>{}, Int<KN % 2>{}, Int<KN % SPLIT>{});
                wgmma_wait<1>();  // unit u's group (groups complete in order)
            } else {
                wgmma_wait<0>();
            }
            epilogue(page0 + u / SPLIT, Int<(K / SPLIT) % 2>{}, Int<K % 2>{}, Int<K % SPLIT>{},
                     u < units);
        });
    }
    cp_async_wait<0>();  // nothing in flight at exit
}

// Per head count: exact (f16) and fast (FP8) scorers for both routes.
#define WGMMA_KERNELS(HEADS)                                                        \
    B12X_KERNEL void __launch_bounds__(WG_THREADS, 4)                               \
        b12x_indexer_wgmma_decode_h##HEADS(const ScoreParams p) {                   \
        idx_zero_select_state(p);                                                   \
        wg_score<HEADS, 1, 1, WG_DECODE_WINDOW, false>(p);                          \
    }                                                                               \
    B12X_KERNEL void __launch_bounds__(WG_THREADS, WG_PREFILL_MIN_CTAS)             \
        b12x_indexer_wgmma_prefill_h##HEADS(const ScoreParams p) {                  \
        wg_score<HEADS, WG_PREFILL_ROWS, 2, WG_PREFILL_WINDOW, false>(p);           \
    }                                                                               \
    B12X_KERNEL void __launch_bounds__(WG_THREADS, 4)                               \
        b12x_indexer_wgmma_fp8_decode_h##HEADS(const ScoreParams p) {               \
        idx_zero_select_state(p);                                                   \
        wg_score<HEADS, 1, 1, WG_DECODE_WINDOW, true>(p);                           \
    }                                                                               \
    B12X_KERNEL void __launch_bounds__(WG_THREADS, WG_PREFILL_MIN_CTAS)             \
        b12x_indexer_wgmma_fp8_prefill_h##HEADS(const ScoreParams p) {              \
        wg_score<HEADS, WG_PREFILL_ROWS, 2, WG_PREFILL_WINDOW, true>(p);            \
    }

WGMMA_KERNELS(16)
WGMMA_KERNELS(32)
WGMMA_KERNELS(48)
WGMMA_KERNELS(64)
