// Hopper (sm_90a) scorers fed by the tensor memory accelerator (TMA):
// persistent CTAs, one producer warp, four (exact decode) or two (fast decode,
// two CTAs an SM; prefill) consumer warpgroups.
//
// Same contract as the other scorers (ScoreParams, the logits chunk, the
// live-length rule, "not a candidate" for unmapped pages, page ids bounded by
// the cache); what differs is how the bytes move. The round-3/4 wgmma scorers
// (indexer_wgmma.cu) had every thread issue 16-byte cp.async copies and wait
// on a CTA barrier per page, one grid of short-lived CTAs: ncu put the FP8
// decode scorer at ~70% of HBM and the FP8 prefill one at 39% SM throughput.
// Here one producer warp keeps a deep ring of K pages in flight with TMA
// (one bulk tensor copy per page, completion counted on an mbarrier), the
// page table read 32 ids at a time, and the consumers never wait on each
// other except where they must:
//   * K pages land in shared memory already in the 128-byte-swizzled K-major
//     layout wgmma reads (tensor map {128 B, 64 tokens, pages}, page stride =
//     the cache's), so A (64 tokens x 128 dims) and B (the rows' Q, loaded by
//     TMA the same way) are both shared-memory operands: no register copy of
//     K, no conversion, natural dim order on both sides;
//   * FP8 wgmma m64nNk32 (precision="fast": Hopper's FP8 accumulation keeps
//     less than fp32, see indexer_wgmma.cu), four k-steps per page;
//   * decode (memory-bound) deals its consumer warpgroups the pages in turn
//     (exact: four; fast: two, in two CTAs an SM). Prefill (MMA-bound) has
//     two, each taking 4 of the block's 8 query rows on every page, its MMAs
//     in two parts of 2 rows (N = 2 x heads + 8, a commit group each) that
//     roll through runs of HP_PREFILL_RUN pages: each part's epilogue runs
//     while the next part's MMAs do. What bounded prefill was the warps' epilogue, two FP32
//     instructions an accumulator (relu, then times the weight: 1.66-1.76 ms
//     on one H200, round 18's notes). Prefill now takes relu as (x + |x|) /
//     2: one FFMA an accumulator, and each row's linear half from 8 more B
//     columns of the part (its "linear part", below): 218 SASS instructions
//     a page in each warp where there were 313 (1.56-1.74 ms, round 19's);
//     the 232 registers a consumer gets hold both parts' 136 accumulators and
//     the 64 weights;
//   * decode copies K under an L2 evict-first policy: the cache streams past
//     once and the logits the selection reads next stay in L2.
//
// Work: the chunk's live pages of every row block (decode: 1 row, prefill: 8
// rows sharing one page-table row) in units of UNIT pages, prefix-summed in
// shared memory by every CTA; CTA g takes units [g U / G, (g + 1) U / G), so
// the split follows the live lengths (device values) while the grid stays
// static (one or two CTAs per SM). The producer and the consumers walk the same
// segment list (block, page range); a block's Q (and the consumers' weights)
// is loaded once per segment, double-buffered.
#include "indexer_common.cuh"
#include "wgmma_f16.cuh"
#include "wgmma_f16_operands.cuh"
#include "wgmma_fp8_ss.cuh"

#define HP_DECODE_CONSUMERS 4
#define HP_PREFILL_CONSUMERS 2
// producer warpgroup (one warp works) + the consumer warpgroups
#define HP_DECODE_THREADS 640
#define HP_PREFILL_THREADS 384
#define HP_DECODE_STAGES 16
// The fast decode scorer's CTA: two consumer warpgroups, two CTAs an SM.
#define HP_FAST_DECODE_CONSUMERS 2
#define HP_FAST_DECODE_THREADS 384
#define HP_FAST_DECODE_STAGES 8
#define HP_FAST_DECODE_CTAS 2
#define HP_PREFILL_STAGES 8
#define HP_PREFILL_ROWS 8  // query rows of a prefill block (4 per consumer warpgroup)
#define HP_PREFILL_UNIT 8  // pages per prefill work unit
#define HP_PREFILL_RUN 8   // pages whose MMAs a prefill warpgroup keeps rolling
#define HP_PREFILL_PART_ROWS 2  // query rows of one part of a prefill page's MMAs
#define HP_LIN_LEVELS 4    // e4m3 vectors of a prefill row's linear part (below)
#define HP_MAX_BLOCKS 4096  // row blocks the work scan holds (plans above fall back)
#define HP_PAGE_K_BYTES (IDX_PAGE_ROWS * IDX_HEAD_DIM)  // 8 KiB of FP8 K per page
#define HP_PAGE_SCALE_BYTES (IDX_PAGE_ROWS * 4)
// Both decode scorers deal page k to consumer warpgroup k % CONSUMERS, which
// waits for its stage's phase by parity: that tells phases apart only one
// apart, so each stage must always go to the same warpgroup (else one can
// pass a wait two phases early and free the stage twice).
static_assert(HP_DECODE_STAGES % HP_DECODE_CONSUMERS == 0, "a decode stage, one warpgroup");
// A CTA's roles: its threads, and the registers per thread after the
// warpgroups' reallocation (setmaxnreg). The pool is what the CTA got at
// launch, THREADS x ENTRY_REGS (the most a multiple of 8 allows under 64 K
// shared by CTAS CTAs); asking for more than the producer gives back blocks
// the consumers for ever (seen on an H200 with 40 / 112 for 640 threads).
// The consumers share what the producer gives back (decode 112, fast decode
// at two CTAs an SM 104, prefill 232).
template <int CONSUMERS, int CTAS = 1>
struct HpRoles {
    static constexpr u32 THREADS = 128 * (1 + CONSUMERS);
    static constexpr u32 ENTRY_REGS = 65536 / CTAS / THREADS / 8 * 8;
    static constexpr u32 PRODUCER_REGS = CONSUMERS == 2 && CTAS == 1 ? 40 : 32;
    static constexpr u32 CONSUMER_REGS =
        ((1 + CONSUMERS) * ENTRY_REGS - PRODUCER_REGS) / CONSUMERS / 8 * 8;
    static_assert(CONSUMERS == 2 || CONSUMERS == 4, "the shapes");
    static_assert(CTAS == 1 || CONSUMERS == 2, "two CTAs an SM: two consumer warpgroups each");
    static_assert(PRODUCER_REGS + CONSUMERS * CONSUMER_REGS <= (1 + CONSUMERS) * ENTRY_REGS,
                  "the consumers' registers come from the producer's");
};
static_assert(HpRoles<HP_DECODE_CONSUMERS>::THREADS == HP_DECODE_THREADS, "decode CTA");
static_assert(HpRoles<HP_FAST_DECODE_CONSUMERS, HP_FAST_DECODE_CTAS>::THREADS ==
                  HP_FAST_DECODE_THREADS,
              "fast decode CTA");
static_assert(HP_FAST_DECODE_STAGES % HP_FAST_DECODE_CONSUMERS == 0,
              "a fast decode stage, one warpgroup");
static_assert(HpRoles<HP_PREFILL_CONSUMERS>::THREADS == HP_PREFILL_THREADS, "prefill CTA");

// A CUtensorMap (the driver encodes it on the host; opaque here).
struct alignas(64) TmaDesc {
    u64 bits[16];
};

// Kernel parameters (mirrored by HopperParams in rust/cuda/src/indexer.rs).
struct HopperParams {
    TmaDesc k_map;      // u8 {128, 64, pages}, strides {128, page_stride}, box {128, 64, 1}, swizzle 128B
    TmaDesc scale_map;  // f32 {64, pages} at kcache + 8192, stride page_stride, box {64, 1}
    TmaDesc q_map;      // u8 {128, heads, rows}, strides {128, heads * 128}, box {128, HP, PART_ROWS}, swizzle 128B
    ScoreParams s;
};

// Shared-memory plan (dynamic, from a 1024-byte aligned base: TMA's 128-byte
// swizzle and the matrix descriptors repeat every 8 rows of 128 bytes). The
// host sizes the allocation with the same formula (hopper_shared_bytes).
// A Q stage is the block's B operand, one part after another: a part is the
// Q of PART_ROWS query rows (HP head rows each, by TMA) and, for prefill, the
// LIN rows of their linear parts (written by the consumers).
template <int HP, int RPB, int STAGES>
struct HpSmem {
    static constexpr u32 PART_ROWS = RPB == 1 ? 1 : HP_PREFILL_PART_ROWS;
    static constexpr u32 LIN = RPB == 1 ? 0 : HP_LIN_LEVELS * PART_ROWS;
    static constexpr u32 PART_N = PART_ROWS * HP + LIN;  // B rows of a part
    static constexpr u32 Q_PART = PART_N * IDX_HEAD_DIM;
    static constexpr u32 Q_BYTES = RPB / PART_ROWS * Q_PART;    // one Q stage
    static constexpr u32 Q_TMA_BYTES = RPB * HP * IDX_HEAD_DIM;  // what TMA writes of it
    static constexpr u32 K = 0;
    static constexpr u32 Q = K + STAGES * HP_PAGE_K_BYTES;
    static constexpr u32 SCALE = Q + 2 * Q_BYTES;
    // the linear parts' level scales, [Q stage][block row][level]
    static constexpr u32 LIN_SCALE = SCALE + STAGES * HP_PAGE_SCALE_BYTES;
    static constexpr u32 PID = LIN_SCALE + (LIN ? 2 * RPB * HP_LIN_LEVELS * 4 : 0);
    static constexpr u32 BAR = PID + STAGES * 4;  // 8-aligned: STAGES is even
    // full_k[STAGES], empty_k[STAGES], full_q[2], empty_q[2]
    static constexpr u32 PREFIX = BAR + (2 * STAGES + 4) * 8;
    static constexpr u32 WARP_SUMS = PREFIX + (HP_MAX_BLOCKS + 1) * 4;
    static constexpr u32 BYTES = WARP_SUMS + 32 * 4;
    static_assert(STAGES % 2 == 0, "decode warpgroups alternate stages");
    static_assert(Q_PART % 1024 == 0, "Q parts stay on the swizzle period");
    static_assert(RPB % PART_ROWS == 0, "whole parts");
};

// ---------------------------------------------------------------- PTX helpers

__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void mbar_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Waits until the phase of parity `parity` has completed (a fresh barrier
// counts the phase before its first as complete: producers start at parity 1).
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
    asm volatile(
        "{\n"
        " .reg .pred p;\n"
        "HP_WAIT:\n"
        " mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
        " @!p bra HP_WAIT;\n"
        "}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}

__device__ __forceinline__ void tma_load_3d(u32 dst, const TmaDesc* map, u32 bar, i32 c0, i32 c1,
                                            i32 c2) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
        "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
        : "memory");
}
// The same copy with an L2 eviction policy (createpolicy) for the bytes read.
__device__ __forceinline__ void tma_load_3d_hint(u32 dst, const TmaDesc* map, u32 bar, i32 c0,
                                                 i32 c1, i32 c2, u64 policy) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
        " [%0], [%1, {%2, %3, %4}], [%5], %6;\n" ::"r"(dst),
        "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(bar), "l"(policy)
        : "memory");
}
__device__ __forceinline__ void tma_load_2d(u32 dst, const TmaDesc* map, u32 bar, i32 c0, i32 c1) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
        "l"(map), "r"(c0), "r"(c1), "r"(bar)
        : "memory");
}


template <int REGS>
__device__ __forceinline__ void regs_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS));
}
template <int REGS>
__device__ __forceinline__ void regs_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS));
}

__device__ __forceinline__ void hp_wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void hp_wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void hp_wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// K-major operand, 128-byte swizzle, rows of 128 bytes, 8-row groups 1024
// bytes apart; a k32 step advances the start address by 32 bytes inside the
// swizzle atom (the hardware applies the XOR).
__device__ __forceinline__ u64 hp_desc(u32 smem_byte_addr) {
    return (u64)((smem_byte_addr & 0x3FFFF) >> 4) | ((u64)1 << 16) | ((u64)(1024 >> 4) << 32) |
           ((u64)1 << 62);
}

__device__ __forceinline__ u32 hp_dynamic_smem_bytes() {
    u32 v;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(v));
    return v;
}

template <int V>
struct Int {
    static constexpr int value = V;
};

// ---------------------------------------------------------------- work split

// Live tokens of row `row` inside this chunk (0 past the rows).
__device__ __forceinline__ u32 hp_chunk_tokens(const ScoreParams& p, u32 row) {
    if (row >= p.rows) return 0u;
    const u32 live = idx_live_tokens(p.lengths, p.active_width, row, p.width);
    return live > p.chunk_start ? min(live - p.chunk_start, p.chunk_len) : 0u;
}

template <int RPB>
struct BlockRows {
    u32 row0;
    u32 n[RPB];  // chunk tokens of each row
    u32 pages;   // pages of the longest row
};

template <int RPB>
__device__ __forceinline__ BlockRows<RPB> hp_block(const ScoreParams& p, u32 blk) {
    BlockRows<RPB> b;
    b.row0 = blk * RPB;
    u32 longest = 0;
#pragma unroll
    for (int rr = 0; rr < RPB; ++rr) {
        b.n[rr] = hp_chunk_tokens(p, b.row0 + rr);
        longest = max(longest, b.n[rr]);
    }
    b.pages = (longest + IDX_PAGE_ROWS - 1) / IDX_PAGE_ROWS;
    return b;
}

// prefix[b] = units of the blocks before b, prefix[blocks] = all units.
template <int RPB, int UNIT, u32 THREADS>
__device__ __forceinline__ void hp_scan_units(const ScoreParams& p, u32* prefix, u32* warp_sums,
                                              u32 blocks) {
    const u32 per = (blocks + THREADS - 1) / THREADS;
    const u32 b0 = min(threadIdx.x * per, blocks), b1 = min(b0 + per, blocks);
    u32 sum = 0;
    for (u32 b = b0; b < b1; ++b) {
        const u32 units = (hp_block<RPB>(p, b).pages + UNIT - 1) / UNIT;
        prefix[b] = units;
        sum += units;
    }
    u32 all;
    u32 run = block_exclusive_sum<THREADS>(sum, warp_sums, all);
    for (u32 b = b0; b < b1; ++b) {
        const u32 units = prefix[b];
        prefix[b] = run;
        run += units;
    }
    if (threadIdx.x == 0) prefix[blocks] = all;
    __syncthreads();
}

// f(block, first page, end page) for every segment of this CTA's units, in
// order; the same list for every thread.
template <int RPB, int UNIT, class F>
__device__ __forceinline__ void hp_segments(const ScoreParams& p, const u32* prefix, u32 blocks,
                                            F&& f) {
    const u32 total = prefix[blocks];
    const u32 a = (u32)((u64)blockIdx.x * total / gridDim.x);
    const u32 b = (u32)((u64)(blockIdx.x + 1) * total / gridDim.x);
    if (a >= b) return;
    u32 lo = 0, hi = blocks;  // the first index whose prefix exceeds a (prefix[blocks] does)
    while (lo < hi) {
        const u32 mid = (lo + hi) >> 1;
        if (prefix[mid] > a)
            hi = mid;
        else
            lo = mid + 1;
    }
    for (u32 blk = lo - 1; blk < blocks && prefix[blk] < b; ++blk) {
        const u32 u0 = max(a, prefix[blk]) - prefix[blk];
        const u32 u1 = min(b, prefix[blk + 1]) - prefix[blk];
        if (u0 < u1) f(blk, u0 * UNIT, u1 * UNIT);
    }
}

// The logits a consumer lane stores in a segment: rows row0 + lane_out.row
// + 2 m (m < OUTS), token lane_out.token of each page; their chunk tokens
// bound the stores.
template <int OUTS, int R>
struct LaneRows {
    u32 n[OUTS];
    float* out[OUTS];
    __device__ __forceinline__ LaneRows(const ScoreParams& p, u32 row0, const QuadLogit<R>& lo) {
#pragma unroll
        for (int m = 0; m < OUTS; ++m) {
            const u32 my_row = row0 + lo.row + 2 * m;
            n[m] = hp_chunk_tokens(p, my_row);
            out[m] = p.logits + (u64)my_row * p.logits_row_stride + lo.token;
        }
    }
    // Page `page`'s logits val[m] times its token's scale, or "not a
    // candidate" on an unmapped page.
    __device__ __forceinline__ void store(const QuadLogit<R>& lo, u32 page,
                                          const float (&val)[OUTS], i32 pid, float sc,
                                          float skip) const {
        const u32 t = page * IDX_PAGE_ROWS + lo.token;  // chunk-local
#pragma unroll
        for (int m = 0; m < OUTS; ++m)
            if (lo.stores && t < n[m])
                out[m][page * IDX_PAGE_ROWS] = pid >= 0 ? val[m] * sc : skip;
    }
    // The same from this lane's shares x of the quad's 2 R sums.
    __device__ __forceinline__ void reduce_store(const QuadLogit<R>& lo, u32 tig, u32 page,
                                                 const float (&x)[2 * R], i32 pid, float sc,
                                                 float skip) const {
        float val[OUTS];
        if constexpr (R == 1)
            val[0] = quad_reduce_scatter<2>(x, tig);
        else
            quad_reduce_scatter(x, tig, val);
        store(lo, page, val, pid, sc, skip);
    }
};

// ---------------------------------------------------------------- prefill's linear part
//
// relu(x) = (x + |x|) / 2, so a row's sum_h w_h relu(q_h . k) is
// sum_h (w_h / 2) |q_h . k| + k . q_w, q_w = sum_h (w_h / 2) q_h: the prefill
// epilogue takes one FFMA an accumulator (|d| times the halved weight, the
// abs a free operand modifier) where relu then weight took two, and k . q_w
// comes out of the page's MMAs as extra B columns. q_w is no e4m3 vector: it
// goes in as HP_LIN_LEVELS of them, a_l with scales s_l, each level the e4m3
// rounding of what the levels before it left (after four, less than 2^-16 of
// max |q_w| is left), so the MMA's accumulation bounds the error as it does
// for the heads' own dots.

// e4m3 bytes of four floats (byte i from v[i]), rounded to nearest, finite.
__device__ __forceinline__ u32 e4m3x4_of(const float (&v)[4]) {
    u32 w;
    asm("{\n .reg .b16 l, h;\n"
        " cvt.rn.satfinite.e4m3x2.f32 l, %2, %1;\n"
        " cvt.rn.satfinite.e4m3x2.f32 h, %4, %3;\n"
        " mov.b32 %0, {l, h};\n}\n"
        : "=r"(w)
        : "f"(v[0]), "f"(v[1]), "f"(v[2]), "f"(v[3]));
    return w;
}

// The four e4m3 bytes of `w` as floats (byte i to v[i]; exact).
__device__ __forceinline__ void floats_of_e4m3x4(u32 w, float (&v)[4]) {
    u32 lo, hi;  // f16x2 of bytes (0, 1) and (2, 3), byte 0 / 2 in the low half
    cvt_e4m3x4(w, lo, hi);
    v[0] = __half2float(__ushort_as_half((unsigned short)(lo & 0xffffu)));
    v[1] = __half2float(__ushort_as_half((unsigned short)(lo >> 16)));
    v[2] = __half2float(__ushort_as_half((unsigned short)(hi & 0xffffu)));
    v[3] = __half2float(__ushort_as_half((unsigned short)(hi >> 16)));
}

// One warp writes the linear part of query row `row`: q_w over this lane's
// dims 4 lane .. 4 lane + 3 from the Q rows of its part (`part`, B rows
// row_in_part * HP + h, TMA's 128-byte swizzle: 16-byte chunk c of B row n at
// n * 128 + (c ^ n % 8) * 16), its levels to B rows PART_ROWS * HP +
// row_in_part * HP_LIN_LEVELS + l the same way, their scales to scales[l].
// Rows past p.rows and heads past p.heads weigh 0.
template <int HP, int PART_ROWS>
__device__ __forceinline__ void hp_write_linear_part(const ScoreParams& p, u32 row, u8* part,
                                                     u32 row_in_part, float* scales, u32 lane) {
    const u32 chunk = lane >> 2, byte = 4 * (lane & 3);
    auto word = [&](u32 n) {
        return reinterpret_cast<u32*>(part + n * IDX_HEAD_DIM + ((chunk ^ (n & 7)) << 4) + byte);
    };
    const float* wrow = p.weights + (u64)row * p.heads;
    float qw[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 4
    for (u32 h = 0; h < HP; ++h) {
        const float w = row < p.rows && h < p.heads ? 0.5f * __ldg(wrow + h) : 0.0f;
        float q[4];
        floats_of_e4m3x4(*word(row_in_part * HP + h), q);
#pragma unroll
        for (int i = 0; i < 4; ++i) qw[i] = fmaf(w, q[i], qw[i]);
    }
#pragma unroll
    for (u32 l = 0; l < HP_LIN_LEVELS; ++l) {
        float m = fmaxf(fmaxf(fabsf(qw[0]), fabsf(qw[1])), fmaxf(fabsf(qw[2]), fabsf(qw[3])));
#pragma unroll
        for (u32 o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        // a_l = what is left / s_l, |a_l| <= 448; what it misses goes to the next level
        const float s = m * (1.0f / 448.0f);
        // (clamped: 448 / m overflows for a subnormal m; a_l stays within 448)
        const float inv = m > 0.0f ? fminf(448.0f / m, 3.0e38f) : 0.0f;
        float a[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) a[i] = qw[i] * inv;
        const u32 bytes = e4m3x4_of(a);
        floats_of_e4m3x4(bytes, a);
#pragma unroll
        for (int i = 0; i < 4; ++i) qw[i] = fmaf(-s, a[i], qw[i]);
        *word(PART_ROWS * HP + row_in_part * HP_LIN_LEVELS + l) = bytes;
        if (lane == 0) scales[l] = s;
    }
}

// ---------------------------------------------------------------- the kernel

// The ring's mbarriers at `at` (shared address): full_k[STAGES],
// empty_k[STAGES], then, for TMA-loaded Q, full_q[2] and empty_q[2].
template <int STAGES>
struct HpBars {
    u32 at;
    __device__ __forceinline__ u32 full_k(u32 s) const { return at + 8 * s; }
    __device__ __forceinline__ u32 empty_k(u32 s) const { return at + 8 * (STAGES + s); }
    __device__ __forceinline__ u32 full_q(u32 s) const { return at + 8 * (2 * STAGES + s); }
    __device__ __forceinline__ u32 empty_q(u32 s) const { return at + 8 * (2 * STAGES + 2 + s); }
};

// Thread 0 sets up the ring's barriers at `bar`: full_k[STAGES] (the
// producer's one arrival and the copies' bytes), empty_k[STAGES]
// (`k_releasers` consumer threads), then, where `q_releasers` is not 0,
// full_q[2] and empty_q[2] for the TMA-loaded Q stages.
template <int STAGES>
__device__ __forceinline__ void hp_init_barriers(u32 bar, u32 k_releasers, u32 q_releasers) {
    if (threadIdx.x != 0) return;
    const HpBars<STAGES> bars{bar};
    for (u32 s = 0; s < STAGES; ++s) {
        mbar_init(bars.full_k(s), 1);
        mbar_init(bars.empty_k(s), k_releasers);
    }
    for (u32 s = 0; q_releasers != 0 && s < 2; ++s) {
        mbar_init(bars.full_q(s), 1);
        mbar_init(bars.empty_q(s), q_releasers);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// What every TMA scorer CTA starts with: its shared memory (1024-byte
// aligned), the selection allowed to launch, the ring's barriers
// (hp_init_barriers) and the work scan over the chunk's row blocks.
struct HpCta {
    u8* smem;
    u32* prefix;  // hp_scan_units
    u32 blocks;   // row blocks of RPB rows
};

template <class L, int RPB, int UNIT, int STAGES, u32 THREADS>
__device__ __forceinline__ HpCta hp_prologue(const ScoreParams& p, u32 k_releasers,
                                             u32 q_releasers) {
    extern __shared__ __align__(16) u8 smem_raw[];
    u8* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
    if (hp_dynamic_smem_bytes() < L::BYTES + 1024) __trap();  // host/kernel layout drift
    // The selection after this kernel may launch now: its CTAs take SMs as
    // this grid's leave and wait for the logits there (pdl_wait).
    pdl_launch_dependents();
    hp_init_barriers<STAGES>(smem_addr(smem) + L::BAR, k_releasers, q_releasers);
    u32* prefix = reinterpret_cast<u32*>(smem + L::PREFIX);
    const u32 blocks = (p.rows + RPB - 1) / RPB;
    hp_scan_units<RPB, UNIT, THREADS>(p, prefix, reinterpret_cast<u32*>(smem + L::WARP_SUMS),
                                      blocks);
    return {smem, prefix, blocks};
}

// The CTA's roles: the first warpgroup gives its registers back and its warp
// 0 runs `produce`; the consumers take theirs and go on (true).
template <class Roles, class F>
__device__ __forceinline__ bool hp_consumer(u32 warp, F&& produce) {
    if (warp < 4) {
        regs_dec<Roles::PRODUCER_REGS>();
        if (warp == 0) produce();
        return false;
    }
    regs_inc<Roles::CONSUMER_REGS>();
    return true;
}

// The producer warp: for each segment of this CTA, the block's Q (LOAD_Q: by
// TMA, into the Q stage the consumers released; full_q / empty_q follow the
// K ring's barriers) and then its K pages and their scales into the ring, a
// TMA copy each, as the consumers free the stages.
template <class L, int RPB, int UNIT, int STAGES, bool PREFILL, bool LOAD_Q>
__device__ __forceinline__ void hp_produce(const HopperParams& hp, u8* smem, const u32* prefix,
                                           u32 blocks, u32 lane) {
    const ScoreParams& p = hp.s;
    const u32 base = smem_addr(smem);
    const HpBars<STAGES> bars{base + L::BAR};
    i32* pids = reinterpret_cast<i32*>(smem + L::PID);
    const i32* pt_base = p.page_table + p.chunk_start / IDX_PAGE_ROWS;
    // Decode streams each K page once: evict it first, so the logits the
    // selection reads next stay in L2. Prefill reads each page again for
    // every row block, from L2.
    const u64 k_policy = l2_evict_first_policy();
    u32 kit = 0, sit = 0;
    hp_segments<RPB, UNIT>(p, prefix, blocks, [&](u32 blk, u32 pb, u32 pe) {
        const BlockRows<RPB> br = hp_block<RPB>(p, blk);
        pe = min(pe, br.pages);
        if constexpr (LOAD_Q) {
            const u32 qs = sit & 1;
            mbar_wait(bars.empty_q(qs), ((sit >> 1) & 1) ^ 1);
            if (lane == 0) {
                mbar_expect_tx(bars.full_q(qs), L::Q_TMA_BYTES);
                for (u32 part = 0; part < RPB / L::PART_ROWS; ++part)
                    tma_load_3d(base + L::Q + qs * L::Q_BYTES + part * L::Q_PART, &hp.q_map,
                                bars.full_q(qs), 0, 0, (i32)(br.row0 + part * L::PART_ROWS));
            }
        }
        const i32* pt = pt_base + (u64)br.row0 * p.pt_row_stride;
        for (u32 i0 = pb; i0 < pe; i0 += 32) {
            const i32 mine = i0 + lane < pe ? pt[i0 + lane] : -1;
            const u32 count = min(32u, pe - i0);
            for (u32 j = 0; j < count; ++j) {
                i32 pid = __shfl_sync(0xffffffffu, mine, j);
                const u32 page = i0 + j;
                if (pid >= 0 && !idx_page_in_range(pid, p.pages)) {
                    if (lane == 0) {
                        // The first row that reaches this page (lengths
                        // read again: a cold path, kept out of registers).
                        u32 first = 0;
                        while (first + 1 < RPB &&
                               hp_chunk_tokens(p, br.row0 + first) <= page * IDX_PAGE_ROWS)
                            ++first;
                        idx_report_bad_page(p.status, br.row0 + first,
                                            p.chunk_start / IDX_PAGE_ROWS + page, pid, p.pages);
                    }
                    pid = -1;
                }
                const u32 st = kit % STAGES;
                mbar_wait(bars.empty_k(st), ((kit / STAGES) & 1) ^ 1);
                if (lane == 0) {
                    pids[st] = pid;
                    if (pid >= 0) {
                        mbar_expect_tx(bars.full_k(st), HP_PAGE_K_BYTES + HP_PAGE_SCALE_BYTES);
                        if (PREFILL)
                            tma_load_3d(base + L::K + st * HP_PAGE_K_BYTES, &hp.k_map,
                                        bars.full_k(st), 0, 0, pid);
                        else
                            tma_load_3d_hint(base + L::K + st * HP_PAGE_K_BYTES, &hp.k_map,
                                             bars.full_k(st), 0, 0, pid, k_policy);
                        tma_load_2d(base + L::SCALE + st * HP_PAGE_SCALE_BYTES, &hp.scale_map,
                                    bars.full_k(st), 0, pid);
                    } else {
                        mbar_arrive(bars.full_k(st));  // nothing to copy: stale bytes, no stores
                    }
                }
                ++kit;
            }
        }
        ++sit;
    });
}

// HP: padded heads; RPB: rows per block; QR: rows per consumer tile
// (decode 1: the warpgroups on one row, pages in turn; prefill 4: the two
// warpgroups split the block's 8 rows, every page).
template <int HP, int RPB, int QR, int UNIT, int STAGES, int CONSUMERS, int CTAS = 1>
__device__ __forceinline__ void hp_score(const HopperParams& hp) {
    using L = HpSmem<HP, RPB, STAGES>;
    using Roles = HpRoles<CONSUMERS, CTAS>;
    constexpr bool PREFILL = QR > 1;
    static_assert(PREFILL ? RPB == CONSUMERS * QR : RPB == 1, "tiles per block");
    const ScoreParams& p = hp.s;
    // Consumers release a K stage: decode one warpgroup (128 threads),
    // prefill all of them; a Q stage: all of them.
    constexpr u32 K_RELEASERS = PREFILL ? 128 * CONSUMERS : 128;
    const HpCta cta = hp_prologue<L, RPB, UNIT, STAGES, Roles::THREADS>(p, K_RELEASERS,
                                                                        128 * CONSUMERS);
    u8* smem = cta.smem;
    const u32* prefix = cta.prefix;
    const u32 blocks = cta.blocks;
    const u32 base = smem_addr(smem);
    const HpBars<STAGES> bars{base + L::BAR};
    const u32 warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const i32* pids = reinterpret_cast<const i32*>(smem + L::PID);
    const float* scales = reinterpret_cast<const float*>(smem + L::SCALE);

    // ---------------- producer (warp 0), then the consumers
    if (!hp_consumer<Roles>(warp, [&] {
            hp_produce<L, RPB, UNIT, STAGES, PREFILL, true>(hp, smem, prefix, blocks, lane);
        }))
        return;
    // Warp-uniform by construction (lane 0's value): the compiler keeps what
    // follows from it (descriptors, stages) in uniform registers.
    const u32 wg = __shfl_sync(0xffffffffu, warp / 4 - 1, 0);  // consumer warpgroup
    const u32 cw = warp & 3;      // warp within it: tokens 16 cw .. 16 cw + 15 of a page
    const u32 gid = lane >> 2, tig = lane & 3;
    const u32 t_lo = 16 * cw + gid;  // this lane's tokens: t_lo and t_lo + 8
    const float skip = idx_not_candidate();
    constexpr int N = QR * HP;
    constexpr int J = N / 8;  // n8 groups of the tile's heads in a thread's accumulators
    // Prefill issues a page's MMAs in two parts (rows 0-1 and 2-3 of its tile),
    // each its own commit group, and takes each row's linear part from it.
    constexpr int PARTS = QR / L::PART_ROWS;
    static_assert(!PREFILL || QR == 4, "a consumer warp writes one row's linear part");
    constexpr int JP = J / PARTS;  // n8 groups of a part's heads (then LIN / 8 more)
    using Mma = WgmmaFp8Ss<L::PART_N>;
    float d[PARTS][Mma::REGS];
    float wreg[J][2];  // halved weights (below)
    // prefill: the scales of this lane's linear-part columns (part P, n8 group
    // JP: 2 tig, 2 tig + 1, levels 2 (tig & 1) + e of the part's row tig / 2)
    float lin_s[PARTS][2];
    const QuadLogit<QR> lane_out(tig, t_lo);  // the logits this lane stores from each page
    constexpr int OUTS = QR == 4 ? 2 : 1;     // rows lane_out.row + 2 m, m < OUTS
    // Descriptors advance by address / 16 (the start field): K stage st and
    // k32 step s are k_desc + st * HP_PAGE_K_BYTES / 16 + 2 s.
    const u64 k_desc = hp_desc(base + L::K);
    u32 kit = 0, sit = 0;
    hp_segments<RPB, UNIT>(p, prefix, blocks, [&](u32 blk, u32 pb, u32 pe) {
        const BlockRows<RPB> br = hp_block<RPB>(p, blk);
        pe = min(pe, br.pages);
        const u32 tile = PREFILL ? wg * QR : 0;  // first row of this warpgroup's tile in the block
        const u32 row0 = br.row0 + tile;
        const LaneRows<OUTS, QR> mine(p, row0, lane_out);
        // Half the weights of this lane's columns 8j + 2 tig + e (row j / (HP / 8)):
        // the epilogue multiplies them by twice relu (decode) or |d| (prefill).
#pragma unroll
        for (int j = 0; j < J; ++j) {
            const u32 row = row0 + j / (HP / 8), hd = 8 * (j % (HP / 8)) + 2 * tig;
#pragma unroll
            for (int e = 0; e < 2; ++e)
                wreg[j][e] = row < p.rows && hd + e < p.heads
                                 ? 0.5f * __ldg(p.weights + (u64)row * p.heads + hd + e)
                                 : 0.0f;
        }
        const u32 qs = sit & 1;
        mbar_wait(bars.full_q(qs), (sit >> 1) & 1);
        u8* q_stage = smem + L::Q + qs * L::Q_BYTES;
        if constexpr (PREFILL) {
            // warp cw: the linear part of the tile's row cw; the warpgroup's
            // MMAs read it after the barrier.
            float* lin_scales = reinterpret_cast<float*>(smem + L::LIN_SCALE) + qs * RPB * HP_LIN_LEVELS;
            const u32 r = tile + cw;
            hp_write_linear_part<HP, L::PART_ROWS>(p, br.row0 + r, q_stage + r / L::PART_ROWS * L::Q_PART,
                                                   r % L::PART_ROWS, lin_scales + r * HP_LIN_LEVELS, lane);
            fence_proxy_async_shared();
            group_barrier(1 + wg, 128);
#pragma unroll
            for (int P = 0; P < PARTS; ++P) {
                const float* sc = lin_scales + (tile + P * L::PART_ROWS + (tig >> 1)) * HP_LIN_LEVELS + 2 * (tig & 1);
                lin_s[P][0] = sc[0];
                lin_s[P][1] = sc[1];
            }
        }
        const u64 q_desc = hp_desc(smem_addr(q_stage) + tile / L::PART_ROWS * L::Q_PART);
        // Part P's MMAs over K stage st (one commit group) into d[P].
        auto issue = [&](auto part, u32 st) {
            constexpr int P = decltype(part)::value;
            hp_wgmma_fence();
            const u64 a = k_desc + st * (HP_PAGE_K_BYTES / 16);
            const u64 b = q_desc + P * (L::Q_PART / 16);
            if constexpr (PREFILL)
                Mma::mma_first_in_place(d[P], a, b);
            else
                Mma::mma_first(d[P], a, b);
#pragma unroll
            for (int s = 1; s < 4; ++s) Mma::mma(d[P], a + 2 * s, b + 2 * s);
            hp_wgmma_commit();
            Mma::fence_operands(d[P]);
        };
        // relu * weight over part P's heads (its MMAs complete): this lane's
        // share. Decode: 2 relu times the halved weight; prefill: |d| times it,
        // plus the rows' linear parts.
        auto accumulate = [&](auto part, float (&x)[2 * QR]) {
            constexpr int P = decltype(part)::value;
            Mma::fence_operands(d[P]);
            auto term = [](float v) { return PREFILL ? fabsf(v) : relu_nan_x2(v); };
#pragma unroll
            for (int jp = 0; jp < JP; ++jp) {
                const int j = P * JP + jp, r = j / (HP / 8);
                const float* dj = d[P] + 4 * jp;
                x[2 * r] = fmaf(term(dj[0]), wreg[j][0], x[2 * r]);
                x[2 * r] = fmaf(term(dj[1]), wreg[j][1], x[2 * r]);
                x[2 * r + 1] = fmaf(term(dj[2]), wreg[j][0], x[2 * r + 1]);
                x[2 * r + 1] = fmaf(term(dj[3]), wreg[j][1], x[2 * r + 1]);
            }
            if constexpr (PREFILL) {
                // k . q_w of the part's row tig / 2 (tile row r0 or r0 + 1), tokens
                // t_lo and t_lo + 8; added by a select, so a NaN stays in its row
                const float* dl = d[P] + 4 * JP;
                const float l0 = fmaf(lin_s[P][0], dl[0], lin_s[P][1] * dl[1]);
                const float l1 = fmaf(lin_s[P][0], dl[2], lin_s[P][1] * dl[3]);
                const bool second = tig & 2;
                constexpr int r0 = P * L::PART_ROWS;
                x[2 * r0] += second ? 0.0f : l0;
                x[2 * r0 + 1] += second ? 0.0f : l1;
                x[2 * r0 + 2] += second ? l0 : 0.0f;
                x[2 * r0 + 3] += second ? l1 : 0.0f;
            }
        };
        auto store = [&](u32 page, const float (&x)[2 * QR], i32 pid, float sc) {
            mine.reduce_store(lane_out, tig, page, x, pid, sc, skip);
        };
        if constexpr (!PREFILL) {
            // Pages round-robin over the warpgroups, one at a time.
            for (u32 page = pb; page < pe; ++page, ++kit) {
                if (kit % CONSUMERS != wg) continue;
                const u32 st = kit % STAGES;
                mbar_wait(bars.full_k(st), (kit / STAGES) & 1);
                const i32 pid = pids[st];
                const float sc = scales[st * IDX_PAGE_ROWS + lane_out.token];
                issue(Int<0>{}, st);
                hp_wgmma_wait<0>();
                mbar_arrive(bars.empty_k(st));
                float x[2 * QR] = {};
                accumulate(Int<0>{}, x);
                store(page, x, pid, sc);
            }
        } else {
            // Every page, in runs of R pages whose parts roll: each part's
            // epilogue but the run's last runs while the next part's MMAs do
            // (this page's second, the next page's first). No MMA is in
            // flight from one run to the next: where one is, across a loop's
            // back edge, ptxas serialises them all.
            auto run = [&](auto pages, u32 page0) {
                constexpr int R = decltype(pages)::value;
                mbar_wait(bars.full_k(kit % STAGES), (kit / STAGES) & 1);
                issue(Int<0>{}, kit % STAGES);
                issue(Int<1>{}, kit % STAGES);
#pragma unroll
                for (int i = 0; i < R; ++i) {
                    const u32 k = kit + i, st = k % STAGES, next = (k + 1) % STAGES;
                    const i32 pid = pids[st];
                    const float sc = scales[st * IDX_PAGE_ROWS + lane_out.token];
                    float x[2 * QR] = {};
                    hp_wgmma_wait<1>();  // part 0 (part 1 in flight)
                    accumulate(Int<0>{}, x);
                    if (i + 1 < R) {
                        mbar_wait(bars.full_k(next), ((k + 1) / STAGES) & 1);
                        issue(Int<0>{}, next);
                        hp_wgmma_wait<1>();  // part 1 (the next page's part 0 in flight)
                    } else {
                        hp_wgmma_wait<0>();
                    }
                    mbar_arrive(bars.empty_k(st));
                    accumulate(Int<1>{}, x);
                    if (i + 1 < R) issue(Int<1>{}, next);
                    store(page0 + i, x, pid, sc);
                }
                kit += R;
            };
            u32 page = pb;
            for (; page + HP_PREFILL_RUN <= pe; page += HP_PREFILL_RUN)
                run(Int<HP_PREFILL_RUN>{}, page);
            for (; page < pe; ++page) run(Int<1>{}, page);
        }
        mbar_arrive(bars.empty_q(qs));
        ++sit;
    });
}


// ---------------------------------------------------------------- the exact scorers
//
// precision="exact" on the same pipeline: the producer streams the K pages
// as for the fast scorers; the consumers score them with f16 wgmma (exact
// FP8 products, fp32 accumulation: the exact flavors' logits) where the fast
// ones use FP8 wgmma. TMA cannot widen bytes, so:
//   * K is A, from registers: each warp widens its 16 tokens of the page
//     (f16_lane_words, the permutation of wgmma_f16_operands.cuh), then
//     releases the stage; its MMAs never read the ring;
//   * the consumers stage the block's Q as f16 B in that permutation
//     themselves, once a segment, with its rows' halved weights: prefill
//     each warpgroup its 4 rows (a "group" of 128 threads, its own buffers),
//     decode all four warpgroups the one row (one group of 512 threads);
//   * prefill: every page by both warpgroups, in two parts of 2 rows
//     (N = 2 x heads, eight k16 MMAs, a commit group each) that roll through
//     runs of HP_PREFILL_RUN pages: part 0's epilogue (relu * weight) under
//     part 1's MMAs, part 1's under the next page's part 0; decode: the pages
//     round-robin over the warpgroups, one part of N = heads, as the fast
//     decode scorer.
// Every page ends with no MMA in flight (ptxas serialises a group pending
// across a loop's back edge).
template <int HP, int RPB, int QR, int STAGES, int CONSUMERS>
struct HpExactSmem {
    static constexpr bool PREFILL = QR > 1;
    static constexpr u32 GROUPS = PREFILL ? CONSUMERS : 1;  // Q and weight buffers
    static constexpr u32 GROUP_THREADS = 128 * CONSUMERS / GROUPS;
    static constexpr u32 N = QR * HP;                // B rows of a group
    static constexpr u32 PARTS = PREFILL ? QR / 2 : 1;
    static constexpr u32 UN = N / PARTS;             // B rows of a part
    static constexpr u32 Q_HALF = N * IDX_HEAD_DIM;  // 64 dims (128 bytes of f16) of each
    static constexpr u32 Q_GROUP = 2 * Q_HALF;
    // Weights by lane: lane t's columns 8j + 2t + e at [t][j][e], rows padded
    // by 2 pairs so the 4 lanes of a quad read distinct banks.
    static constexpr u32 W_ROW = N / 8 + 2;  // (j, e) pairs per lane row
    static constexpr u32 W_GROUP = 4 * W_ROW * 2 * 4;
    static constexpr u32 K = 0;
    static constexpr u32 Q = K + STAGES * HP_PAGE_K_BYTES;
    static constexpr u32 SCALE = Q + GROUPS * Q_GROUP;
    static constexpr u32 W = SCALE + STAGES * HP_PAGE_SCALE_BYTES;
    static constexpr u32 PID = W + GROUPS * W_GROUP;
    static constexpr u32 BAR = PID + STAGES * 4;  // full_k[STAGES], empty_k[STAGES]
    static constexpr u32 PREFIX = BAR + 2 * STAGES * 8;
    static constexpr u32 WARP_SUMS = PREFIX + (HP_MAX_BLOCKS + 1) * 4;
    static constexpr u32 BYTES = WARP_SUMS + 32 * 4;
    static_assert(PREFILL ? RPB == CONSUMERS * QR : RPB == 1, "tiles per block");
    static_assert(!PREFILL || QR == 4, "prefill: two parts of two rows");
    static_assert(Q_HALF % 1024 == 0 && (UN * IDX_HEAD_DIM) % 1024 == 0,
                  "Q halves and parts stay on the swizzle period");
    static_assert(W % 16 == 0 && W_GROUP % 16 == 0 && W_ROW % 2 == 0, "float4 weight pairs");
    static_assert(BAR % 8 == 0, "mbarriers");
};

template <int HP, int RPB, int QR, int UNIT, int STAGES, int CONSUMERS, int CTAS = 1>
__device__ __forceinline__ void hp_score_exact(const HopperParams& hp) {
    using L = HpExactSmem<HP, RPB, QR, STAGES, CONSUMERS>;
    using Roles = HpRoles<CONSUMERS, CTAS>;
    constexpr bool PREFILL = L::PREFILL;
    constexpr int UN = L::UN, PARTS = L::PARTS;
    constexpr int JP = UN / 8;               // n8 groups of a part
    constexpr int OUTS = QR == 4 ? 2 : 1;    // this lane's rows lane_out.row + 2 m
    using Mma = WgmmaF16<UN>;
    const ScoreParams& p = hp.s;
    // consumers release a K stage: prefill all of them, decode the one
    // warpgroup that scored it; no Q stages (the consumers stage Q)
    const HpCta cta = hp_prologue<L, RPB, UNIT, STAGES, Roles::THREADS>(
        p, PREFILL ? 128 * CONSUMERS : 128, 0);
    u8* smem = cta.smem;
    const HpBars<STAGES> bars{smem_addr(smem) + L::BAR};
    const u32 warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const i32* pids = reinterpret_cast<const i32*>(smem + L::PID);
    const float* scales = reinterpret_cast<const float*>(smem + L::SCALE);
    if (!hp_consumer<Roles>(warp, [&] {
            hp_produce<L, RPB, UNIT, STAGES, PREFILL, false>(hp, smem, cta.prefix, cta.blocks,
                                                             lane);
        }))
        return;

    const u32 wg = __shfl_sync(0xffffffffu, warp / 4 - 1, 0);  // consumer warpgroup (uniform)
    const u32 group = PREFILL ? wg : 0;                         // its Q and weights
    const u32 gtid = threadIdx.x - 128 - group * L::GROUP_THREADS;  // thread within the group
    const u32 cw = warp & 3, gid = lane >> 2, tig = lane & 3;
    const u32 t_lo = 16 * cw + gid;  // this lane's tokens: t_lo and t_lo + 8
    const float skip = idx_not_candidate();
    const QuadLogit<QR> lane_out(tig, t_lo);
    u8* q_group = smem + L::Q + group * L::Q_GROUP;
    float* ws = reinterpret_cast<float*>(smem + L::W + group * L::W_GROUP);
    const u32 q_base = smem_addr(q_group);
    float d[PARTS][Mma::REGS];
    u32 a[8][4];  // the page's A fragments, live until its last MMA is done

    // Part P's eight k16 MMAs (B rows [P UN, + UN) of both halves) into d[P].
    auto issue = [&](auto part) {
        constexpr int P = decltype(part)::value;
        hp_wgmma_fence();
        const u32 b = q_base + P * UN * IDX_HEAD_DIM;
        Mma::mma_first(d[P], a[0], hp_desc(b));
#pragma unroll
        for (int s = 1; s < 8; ++s)
            Mma::mma(d[P], a[s], hp_desc(b + (s >> 2) * L::Q_HALF + 32 * (s & 3)));
        hp_wgmma_commit();
    };
    // relu * weight over part P's heads (its MMAs complete): this lane's
    // share of the part's rows, tokens t_lo and t_lo + 8. (x's extent from
    // L: NVRTC 12.8 crashes on a local constexpr there.)
    auto accumulate = [&](auto part, float (&x)[2 * L::N / HP]) {
        constexpr int P = decltype(part)::value;
        Mma::fence_operands(d[P]);
        const float* wrow = ws + tig * L::W_ROW * 2 + P * JP * 2;
#pragma unroll
        for (int jp = 0; jp < JP; jp += 2) {
            const float4 w = *reinterpret_cast<const float4*>(wrow + 2 * jp);
            const int r0 = (P * JP + jp) / (HP / 8), r1 = (P * JP + jp + 1) / (HP / 8);
            const float* dj = d[P] + 4 * jp;
            x[2 * r0] = fmaf(relu_nan_x2(dj[0]), w.x, x[2 * r0]);
            x[2 * r0] = fmaf(relu_nan_x2(dj[1]), w.y, x[2 * r0]);
            x[2 * r0 + 1] = fmaf(relu_nan_x2(dj[2]), w.x, x[2 * r0 + 1]);
            x[2 * r0 + 1] = fmaf(relu_nan_x2(dj[3]), w.y, x[2 * r0 + 1]);
            x[2 * r1] = fmaf(relu_nan_x2(dj[4]), w.z, x[2 * r1]);
            x[2 * r1] = fmaf(relu_nan_x2(dj[5]), w.w, x[2 * r1]);
            x[2 * r1 + 1] = fmaf(relu_nan_x2(dj[6]), w.z, x[2 * r1 + 1]);
            x[2 * r1 + 1] = fmaf(relu_nan_x2(dj[7]), w.w, x[2 * r1 + 1]);
        }
    };

    u32 kit = 0;
    hp_segments<RPB, UNIT>(p, cta.prefix, cta.blocks, [&](u32 blk, u32 pb, u32 pe) {
        const BlockRows<RPB> br = hp_block<RPB>(p, blk);
        pe = min(pe, br.pages);
        const u32 row0 = br.row0 + group * QR;  // the group's rows of the block
        const LaneRows<OUTS, QR> mine(p, row0, lane_out);
        // prefill: each part's two rows stored on their own (the same lanes,
        // tokens and rows as `mine`), part 0's before the wait for part 1
        const QuadLogit<2> lane_part(tig, t_lo);
        const LaneRows<1, 2> mine_part[2] = {LaneRows<1, 2>(p, row0, lane_part),
                                             LaneRows<1, 2>(p, row0 + 2, lane_part)};
        // The group is done with the last segment's Q (its MMAs waited for)
        // and weights; then its threads restage both.
        group_barrier(1 + group, L::GROUP_THREADS);
        f16_stage_q<HP, L::N>(p, q_group, L::Q_HALF, row0, gtid, L::GROUP_THREADS);
        for (u32 c = gtid; c < L::N; c += L::GROUP_THREADS) {
            const u32 rr = c / HP, h = c % HP, row = row0 + rr;
            const u32 lane_t = (c % 8) / 2, j = c / 8, e = c % 2;
            // halved: the epilogue multiplies them by twice relu (relu_nan_x2)
            ws[(lane_t * L::W_ROW + j) * 2 + e] =
                row < p.rows && h < p.heads ? 0.5f * __ldg(p.weights + (u64)row * p.heads + h)
                                            : 0.0f;
        }
        fence_proxy_async_shared();  // Q, read by wgmma after the barrier
        group_barrier(1 + group, L::GROUP_THREADS);
        // Page k's stage: its A fragments (the stage released), id and scale.
        auto load_page = [&](u32 k, i32& pid, float& sc) {
            const u32 st = k % STAGES;
            mbar_wait(bars.full_k(st), (k / STAGES) & 1);
            u32 w0[8], w1[8];
            f16_lane_words(smem + L::K + st * HP_PAGE_K_BYTES, t_lo, tig, w0, w1);
            pid = pids[st];
            sc = scales[st * IDX_PAGE_ROWS + lane_out.token];
            mbar_arrive(bars.empty_k(st));  // the stage is read: A lives in registers
#pragma unroll
            for (int s = 0; s < 8; ++s) f16_a_fragment(w0, w1, s, a[s]);
        };
        // a[] is read by MMAs in flight until a wait says they are done: keep
        // its registers from being reused before that.
        auto keep_a = [&] {
#pragma unroll
            for (int s = 0; s < 8; ++s)
                asm volatile("" : "+r"(a[s][0]), "+r"(a[s][1]), "+r"(a[s][2]), "+r"(a[s][3])
                             :: "memory");
        };
        // Part P's two rows of the page (x[4 P .. 4 P + 3]), reduced over the quad and stored.
        auto store_part = [&](auto part, u32 page, const float (&x)[2 * L::N / HP], i32 pid,
                              float sc) {
            constexpr int P = decltype(part)::value;
            const float xp[4] = {x[4 * P], x[4 * P + 1], x[4 * P + 2], x[4 * P + 3]};
            mine_part[P].reduce_store(lane_part, tig, page, xp, pid, sc, skip);
        };
        if constexpr (PREFILL) {
            // Runs of R pages whose parts roll: part 0's epilogue under part
            // 1's MMAs, part 1's under the next page's part 0 (its A loaded
            // once part 1 is done). No MMA is in flight from one run to the
            // next: where one is, across a loop's back edge, ptxas
            // serialises them all.
            auto run = [&](auto pages, u32 page0) {
                constexpr int R = decltype(pages)::value;
                i32 pid;
                float sc;
                load_page(kit, pid, sc);
                issue(Int<0>{});
                issue(Int<1>{});
#pragma unroll
                for (int i = 0; i < R; ++i) {
                    float x[2 * QR] = {};
                    hp_wgmma_wait<1>();  // part 0 (part 1 in flight)
                    accumulate(Int<0>{}, x);
                    // part 0's rows stored now: its epilogue ends in the
                    // stores, before the wait for part 1, instead of where
                    // ptxas had moved half of it, between that wait and the
                    // next page's MMAs
                    store_part(Int<0>{}, page0 + i, x, pid, sc);
                    hp_wgmma_wait<0>();  // part 1: a[] is free
                    keep_a();
                    const i32 pid_i = pid;
                    const float sc_i = sc;
                    if (i + 1 < R) {
                        load_page(kit + i + 1, pid, sc);
                        issue(Int<0>{});
                    }
                    accumulate(Int<1>{}, x);
                    store_part(Int<1>{}, page0 + i, x, pid_i, sc_i);
                    if (i + 1 < R) issue(Int<1>{});
                }
                kit += R;
            };
            u32 page = pb;
            for (; page + HP_PREFILL_RUN <= pe; page += HP_PREFILL_RUN)
                run(Int<HP_PREFILL_RUN>{}, page);
            for (; page < pe; ++page) run(Int<1>{}, page);
        } else {
            // Pages round-robin over the warpgroups, one at a time.
            for (u32 page = pb; page < pe; ++page, ++kit) {
                if (kit % CONSUMERS != wg) continue;
                i32 pid;
                float sc;
                load_page(kit, pid, sc);
                issue(Int<0>{});
                float x[2 * QR] = {};
                hp_wgmma_wait<0>();
                keep_a();
                accumulate(Int<0>{}, x);
                mine.reduce_store(lane_out, tig, page, x, pid, sc, skip);
            }
        }
    });
}

// The decode and prefill entries of one flavor (fp8: hp_score, f16:
// hp_score_exact) at HEADS padded heads, decode CTAs of THREADS threads with
// CONSUMERS consumer warpgroups, STAGES stages and CTAS an SM.
#define HOPPER_FLAVOR(NAME, SCORE, HEADS, THREADS, STAGES, CONSUMERS, CTAS)                  \
    B12X_KERNEL void __launch_bounds__(THREADS, CTAS)                                        \
        b12x_indexer_tma_##NAME##_decode_h##HEADS(const __grid_constant__ HopperParams hp) { \
        idx_zero_select_state(hp.s);                                                         \
        SCORE<HEADS, 1, 1, 1, STAGES, CONSUMERS, CTAS>(hp);                                  \
    }                                                                                        \
    B12X_KERNEL void __launch_bounds__(HP_PREFILL_THREADS, 1)                                \
        b12x_indexer_tma_##NAME##_prefill_h##HEADS(const __grid_constant__ HopperParams hp) {\
        SCORE<HEADS, HP_PREFILL_ROWS, HP_PREFILL_ROWS / HP_PREFILL_CONSUMERS, HP_PREFILL_UNIT, \
              HP_PREFILL_STAGES, HP_PREFILL_CONSUMERS, 1>(hp);                               \
    }

// The fast decode scorer (memory-bound) runs two CTAs an SM, each with two
// consumer warpgroups and 8 stages: round 29's bare gather ran 2.5 us faster
// with two issuing CTAs an SM than with one. The exact one keeps one CTA of
// four consumer warpgroups: its consumers fit the two-CTA shape's 104
// registers, but they are bound by their own work per page, not by the
// gather, and that shape measured +1.6 us on decode_r1 for -0.5 on decode_r64
// (round 34, H100).
#define HOPPER_KERNELS(HEADS)                                                                 \
    HOPPER_FLAVOR(fp8, hp_score, HEADS, HP_FAST_DECODE_THREADS, HP_FAST_DECODE_STAGES,        \
                  HP_FAST_DECODE_CONSUMERS, HP_FAST_DECODE_CTAS)                              \
    HOPPER_FLAVOR(f16, hp_score_exact, HEADS, HP_DECODE_THREADS, HP_DECODE_STAGES,            \
                  HP_DECODE_CONSUMERS, 1)

// Clears the grid selection's row state in a call that scores nothing (a
// top-k-only call; otherwise the scorer clears it). The selection is this
// grid's programmatic dependent: it starts at once and reads the state only
// past its pdl_wait. Small CTAs (ZERO_STATE_THREADS in
// rust/cuda/src/indexer.rs).
#define IDX_ZERO_STATE_THREADS 128
B12X_KERNEL void __launch_bounds__(IDX_ZERO_STATE_THREADS) b12x_indexer_zero_state(const ScoreParams p) {
    pdl_launch_dependents();
    idx_zero_select_state(p);
}

HOPPER_KERNELS(16)
HOPPER_KERNELS(32)
HOPPER_KERNELS(48)
HOPPER_KERNELS(64)
