// Exact top-k over supertile chunks, carried in a fixed double buffer.
//
// Order: value descending, ties to the lowest logical index, NaN below every
// number (-inf included), -0 equal to +0. Each candidate gets a unique 64-bit
// key (order-preserving value key << 32 | ~index), so the top-k set is unique
// and a radix select over that key finds it exactly: 12/12/8-bit digits of
// the value, then of the index when values tie. The first digit is counted
// over all candidates; the bin that holds the k-th key is buffered in shared
// memory when it fits (CAP), and the later digits only read that buffer. A
// bin that does not fit is refined by re-scanning the candidates: slower, but
// exact and allocation-free. The slice and merge kernels first try a window
// path (select_topk_window): one pass for the largest key, one histogram of
// the distance below it, direct ranking inside the k-th key's bin; it falls
// back to the radix path when the k-th key is outside the window.
//
// These are the general paths. In front of them every kernel runs the staged
// path (section "staged path" below: one read, a sampled threshold, shared
// memory only) when its launch gives it a stage; they take over what it cannot
// decide exactly.
//
// Kernels (one TOPK_THREADS = 1024-thread CTA per row, or per (slice, row);
// dynamic shared memory sized by topk_shared_bytes in rust/cuda/src/indexer.rs):
//   fold         carry + chunk logits           -> next carry, or the outputs on the last chunk
//   fold_prefix  the same, 16-bit prefix stage  (two CTAs per SM)
//   stream       the same for more rows than SMs: one read, no stage, a
//                running bound (TOPK_STREAM_THREADS-thread CTAs, two per SM)
//   slice        one slice of the chunk logits  -> that slice's top-k (partials)
//   merge        carry + every slice's partials -> next carry, or the outputs
// Logits of tokens on unmapped pages hold IDX_NOT_CANDIDATE_BITS and are
// skipped; a row with n <= topk candidates emits them all (in any order) and
// pads -1 / -inf. Carry and partial lists have a static length (from the
// lengths alone) and pad their unused slots with not-a-candidate entries.
#include "indexer_common.cuh"

typedef unsigned short u16;

#define TOPK_THREADS 1024
#define TOPK_WARPS (TOPK_THREADS / 32)
#define TOPK_CAP 3072
#define TOPK_MAX_BINS 4096
#define TOPK_UNROLL 2  // float4 groups in flight per thread and round (unrolled form)
#define TOPK_STREAM_THREADS 512  // the stream kernel's CTA
#define TOPK_STREAM_CTAS 2       // ... and how many share an SM (registers)
#define TOPK_STREAM_UNROLL 4

struct TopkParams {
    const float* logits;      // chunk logits [rows, logits_row_stride]
    const i32* lengths;       // i32 [rows]
    const i32* active_width;  // i32 [1]
    const i32* page_table;    // for physical output; row r at r * pt_row_stride
    float* carry_values;      // [2, rows_cap, topk]
    i32* carry_indices;
    float* part_values;       // [rows, slices, topk]
    i32* part_indices;
    i32* out_indices;         // [rows, topk]
    float* out_scores;        // [rows, topk] or null
    u64 logits_row_stride;
    u64 pt_row_stride;
    u64 carry_half_stride;  // rows_cap * topk
    u32 rows;
    u32 width;
    u32 topk;
    u32 chunk;
    u32 num_chunks;
    u32 chunk_len;
    u32 slices;
    u32 slice_len;
    u32 physical;
    u32 pages;      // pages of the K cache, min(shape[0], 2^31)
    u32 stage_cap;  // candidates the staged path can hold in shared memory (0: never staged);
                    // the stream kernel: STREAM_SUB_BINS where it counts level 1, or 0
    u32 hit_cap;    // positions the staged path may list at or above its threshold
};

// ---------------------------------------------------------------- keys

__device__ __forceinline__ u32 value_key(float v) {
    u32 b = __float_as_uint(v);
    if (v != v) return 0u;       // NaN: below every number
    if (v == 0.0f) b = 0u;       // -0 == +0
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ u64 cand_key(float v, u32 idx) {
    return ((u64)value_key(v) << 32) | (u64)(~idx);
}

// ---------------------------------------------------------------- row state

struct RowChunk {
    u32 live;      // live tokens of the row
    u32 n_chunk;   // live tokens in this chunk
    u32 n_carry;   // entries carried from earlier chunks
    u32 carry_in;  // half of the carry buffer holding them
    bool last;
    bool active;   // the chunk holds live tokens
};

__device__ __forceinline__ RowChunk row_chunk(const TopkParams& p, u32 r) {
    RowChunk c;
    i32 len = p.lengths[r];
    i32 aw = p.active_width[0];
    i64 cap = (i64)p.width * 64;
    i64 live = len < aw ? len : aw;
    if (live > cap) live = cap;
    c.live = live > 0 ? (u32)live : 0u;
    const u64 cs = (u64)p.chunk * p.chunk_len;
    c.active = c.live > cs;
    c.n_chunk = c.active ? (u32)min((u64)c.live - cs, (u64)p.chunk_len) : 0u;
    c.last = p.chunk + 1 == p.num_chunks;
    const u64 before = min((u64)c.live, cs);
    c.n_carry = (u32)min(before, (u64)p.topk);
    // Chunks done before this one: all earlier chunks while live, else the
    // live ones. None before the first, without the division (a one-chunk
    // plan's every warp of every row ran it).
    const u32 done_chunks =
        p.chunk == 0 ? 0u : (u32)min((u64)p.chunk, ((u64)c.live + p.chunk_len - 1) / p.chunk_len);
    c.carry_in = done_chunks > 0 ? (done_chunks - 1) & 1 : 0;
    return c;
}

// ---------------------------------------------------------------- sources

struct Cand {
    float v;
    u32 idx;
    bool ok;
};

__device__ __forceinline__ bool is_candidate(float v) {
    return __float_as_uint(v) != IDX_NOT_CANDIDATE_BITS;
}

// A source is a short scalar head (the carry) and a vector part read as
// float4 groups: head(i) for i < n_head(), group(g) -> 4 candidates for
// g < n_groups().

struct Cand4 {
    float v[4];
    u32 idx[4];
    bool ok[4];
};

// carry + contiguous chunk logits (fold) or one slice of them (slice: no carry).
// `logits` is 16-byte aligned and readable up to the next multiple of 4 of n.
struct DenseSource {
    const float* cv;
    const i32* ci;
    u32 n_carry;
    const float* logits;  // first candidate of the range
    u32 idx0;             // its logical index
    u32 n;                // logits in the range
    __device__ __forceinline__ u32 n_head() const { return n_carry; }
    __device__ __forceinline__ u32 n_groups() const { return (n + 3) / 4; }
    __device__ __forceinline__ Cand head(u32 i) const {
        Cand c;
        c.v = cv[i];
        c.idx = (u32)ci[i];
        c.ok = is_candidate(c.v);
        return c;
    }
    __device__ __forceinline__ Cand4 group(u32 g) const {
        const float4 v = __ldcg(reinterpret_cast<const float4*>(logits) + g);
        Cand4 c;
        c.v[0] = v.x;
        c.v[1] = v.y;
        c.v[2] = v.z;
        c.v[3] = v.w;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const u32 i = 4 * g + e;
            c.idx[e] = idx0 + i;
            c.ok[e] = i < n && is_candidate(c.v[e]);
        }
        return c;
    }
};

// carry + the slices' partial lists (slice s holds min(topk, its length) entries).
struct MergeSource {
    const float* cv;
    const i32* ci;
    u32 n_carry;
    const float* pv;  // [slices, topk] of this row
    const i32* pi;
    u32 topk_shift;   // log2(topk)
    u32 slices;
    u32 slice_len;
    u32 n_chunk;
    __device__ __forceinline__ u32 slice_count(u32 s) const {
        const u32 start = s * slice_len;
        const u32 len = n_chunk > start ? min(n_chunk - start, slice_len) : 0u;
        return min(len, 1u << topk_shift);
    }
    __device__ __forceinline__ u32 n_head() const { return n_carry; }
    __device__ __forceinline__ u32 n_groups() const { return (slices << topk_shift) / 4; }
    __device__ __forceinline__ Cand head(u32 i) const {
        Cand c;
        c.v = cv[i];
        c.idx = (u32)ci[i];
        c.ok = is_candidate(c.v);
        return c;
    }
    __device__ __forceinline__ Cand4 group(u32 g) const {
        const u32 j = 4 * g;
        const u32 e0 = j & ((1u << topk_shift) - 1);
        const u32 cnt = slice_count(j >> topk_shift);
        Cand4 c;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        int4 ix = make_int4(0, 0, 0, 0);
        if (e0 < cnt) {
            v = __ldcg(reinterpret_cast<const float4*>(pv) + g);
            ix = __ldcg(reinterpret_cast<const int4*>(pi) + g);
        }
        c.v[0] = v.x;
        c.v[1] = v.y;
        c.v[2] = v.z;
        c.v[3] = v.w;
        c.idx[0] = (u32)ix.x;
        c.idx[1] = (u32)ix.y;
        c.idx[2] = (u32)ix.z;
        c.idx[3] = (u32)ix.w;
#pragma unroll
        for (int e = 0; e < 4; ++e) c.ok[e] = e0 + e < cnt && is_candidate(c.v[e]);
        return c;
    }
};

// ---------------------------------------------------------------- sinks

struct ValueSink {  // carry or partial list: (value, logical index)
    float* v;
    i32* i;
    __device__ __forceinline__ void emit(u32 slot, float val, u32 idx) const {
        v[slot] = val;
        i[slot] = (i32)idx;
    }
    template <u32 NT = TOPK_THREADS>
    __device__ __forceinline__ void pad(u32 from, u32 to) const {
        for (u32 j = from + threadIdx.x; j < to; j += NT) {
            v[j] = idx_not_candidate();
            i[j] = -1;
        }
    }
};

struct OutputSink {  // the user's outputs, logical or physical indices
    i32* idx;
    float* scores;  // may be null
    const i32* pt_row;
    bool physical;
    u32 pages;
    __device__ __forceinline__ void emit(u32 slot, float val, u32 t) const {
        i32 out = (i32)t;
        if (physical) {
            // 64-bit: bind keeps pages * 64 <= 2^31, so an in-range id fits.
            const i32 pid = pt_row[t >> 6];
            out = idx_page_in_range(pid, pages) ? (i32)((i64)pid * 64 + (t & 63)) : -1;
        }
        idx[slot] = out;
        if (scores != nullptr) scores[slot] = val;
    }
    template <u32 NT = TOPK_THREADS>
    __device__ __forceinline__ void pad(u32 from, u32 to) const {
        for (u32 j = from + threadIdx.x; j < to; j += NT) {
            idx[j] = -1;
            if (scores != nullptr) scores[j] = b12x_neg_inf();
        }
    }
};

// ---------------------------------------------------------------- block helpers

struct TopkSmem {
    u32 hist[TOPK_MAX_BINS];
    u32 buf_v[TOPK_CAP];
    u32 buf_i[TOPK_CAP];
    u32 warp_sum[TOPK_WARPS];
    u32 warp_max[TOPK_WARPS];
    u32 buf_n;
    u32 out_n;
    u32 res_bin;
    u32 res_above;
    u32 res_cnt;
    u32 res_total;
};

// Exclusive prefix sum of x over the block in thread order; returns it and
// sets *total. Contains two barriers; every thread must call it.
template <u32 NT = TOPK_THREADS, class Smem>
__device__ __forceinline__ u32 block_exclusive_scan(u32 x, u32* total, Smem& sm) {
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    u32 inc = x;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        const u32 y = __shfl_up_sync(0xffffffffu, inc, d);
        if (lane >= (u32)d) inc += y;
    }
    if (lane == 31) sm.warp_sum[warp] = inc;
    __syncthreads();
    u32 before = 0, all = 0;
#pragma unroll
    for (int w = 0; w < (int)(NT / 32); ++w) {
        const u32 s = sm.warp_sum[w];
        before += (u32)w < warp ? s : 0u;
        all += s;
    }
    __syncthreads();
    *total = all;
    return before + inc - x;
}

// Bin holding the need-th largest key (bins counted from the top): writes
// res_bin, res_above (keys in higher bins), res_cnt and res_total (all
// counted keys; when need > res_total no bin is written). Barriers inside.
template <u32 NT = TOPK_THREADS, class Smem>
__device__ __forceinline__ void find_bin(Smem& sm, u32 nbins, u32 need) {
    const u32 per = (nbins + NT - 1) / NT;
    const u32 t = threadIdx.x;
    // Thread t owns bins [hi - per, hi), hi = nbins - t * per, scanned downwards.
    const i32 hi = (i32)nbins - (i32)(t * per);
    u32 local = 0;
    for (u32 j = 0; j < per; ++j) {
        const i32 b = hi - 1 - (i32)j;
        if (b >= 0) local += sm.hist[b];
    }
    u32 total;
    const u32 before = block_exclusive_scan<NT>(local, &total, sm);
    if (t == 0) sm.res_total = total;
    if (before < need && need <= before + local) {
        u32 acc = before;
        for (u32 j = 0; j < per; ++j) {
            const i32 b = hi - 1 - (i32)j;
            const u32 c = sm.hist[b];
            if (acc + c >= need) {
                sm.res_bin = (u32)b;
                sm.res_above = acc;
                sm.res_cnt = c;
                break;
            }
            acc += c;
        }
    }
    __syncthreads();
}

__device__ __forceinline__ Cand4 no_cand4() {
    Cand4 c;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        c.ok[e] = false;
        c.v[e] = 0.0f;
        c.idx[e] = 0;
    }
    return c;
}

// Element e (0..3) of a group, by selects (a dynamic index would put the
// arrays in local memory).
template <class T>
__device__ __forceinline__ T pick4(const T (&a)[4], int e) {
    return e == 0 ? a[0] : (e == 1 ? a[1] : (e == 2 ? a[2] : a[3]));
}

// Calls f(ok, v, idx) for every candidate slot: the head one per thread and
// round, the vector part U float4 groups per thread and round (NT threads).
// Every thread makes the same number of calls (warp collectives are safe in f).
template <u32 NT = TOPK_THREADS, int U = TOPK_UNROLL, class Src, class F>
__device__ __forceinline__ void for_each_cand(const Src& src, F&& f) {
    const u32 nh = src.n_head();
    for (u32 base = 0; base < nh; base += NT) {
        const u32 i = base + threadIdx.x;
        Cand c;
        c.ok = false;
        c.v = 0.0f;
        c.idx = 0;
        if (i < nh) c = src.head(i);
        f(c.ok, c.v, c.idx);
    }
    const u32 ng = src.n_groups();
    for (u32 base = 0; base < ng; base += NT * U) {
        Cand4 c[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const u32 g = base + u * NT + threadIdx.x;
            c[u] = g < ng ? src.group(g) : no_cand4();
        }
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int e = 0; e < 4; ++e) f(c[u].ok[e], c[u].v[e], c[u].idx[e]);
    }
}

// for_each_cand's small-code form: the vector part one float4 group per
// thread and round, the next round's group loaded before this one is
// processed, and f once in the loop (rolled over the group's four elements).
// A single CTA runs through this code once per pass, so its size costs
// instruction fetches: the merge measured faster this way, the dense slice
// and fold slower.
// Every thread makes the same number of calls (warp collectives are safe in f).
template <class Src, class F>
__device__ __forceinline__ void for_each_cand_rolled(const Src& src, F&& f) {
    const u32 nh = src.n_head();
    for (u32 base = 0; base < nh; base += TOPK_THREADS) {
        const u32 i = base + threadIdx.x;
        Cand c;
        c.ok = false;
        c.v = 0.0f;
        c.idx = 0;
        if (i < nh) c = src.head(i);
        f(c.ok, c.v, c.idx);
    }
    const u32 ng = src.n_groups();
    // Round r loads group round r and processes round r - 1 (one load site).
    Cand4 cur = no_cand4();
    for (u32 r = 0; r * TOPK_THREADS < ng + TOPK_THREADS; ++r) {
        const u32 g = r * TOPK_THREADS + threadIdx.x;
        const Cand4 nxt = g < ng ? src.group(g) : no_cand4();
        if (r > 0) {
#pragma unroll 1
            for (int e = 0; e < 4; ++e) f(pick4(cur.ok, e), pick4(cur.v, e), pick4(cur.idx, e));
        }
        cur = nxt;
    }
}

// Either form, chosen per kernel (the unrolled one streams long dense rows
// faster; the rolled one keeps the merge's heavier group loads short).
template <bool kRolled, class Src, class F>
__device__ __forceinline__ void each_cand(const Src& src, F&& f) {
    if (kRolled)
        for_each_cand_rolled(src, f);
    else
        for_each_cand(src, f);
}

// Shared-memory atomics sent by one lane of a warp (a warp's reservation, its
// tallies). ptxas wraps an atomic on a warp-uniform address in its own warp
// aggregation (a vote, a leader pick, a multiply and a rank: 13 instructions
// the warp issues for its one active lane). Offsetting the
// address by (%laneid - lane), zero in the sending lane, makes it non-uniform
// to ptxas and leaves a plain ATOMS.
__device__ __forceinline__ u32 lane_offset_addr(u32* ctr, u32 lane) {
    u32 a;
    asm("{\n .reg .u32 l;\n mov.u32 l, %%laneid;\n sub.u32 l, l, %2;\n mad.lo.u32 %0, l, 4, %1;\n}"
        : "=r"(a)
        : "r"(smem_addr(ctr)), "r"(lane));
    return a;
}
__device__ __forceinline__ u32 shared_fetch_add(u32* ctr, u32 v, u32 lane) {
    u32 old;
    asm volatile("atom.shared.add.u32 %0, [%1], %2;"
                 : "=r"(old)
                 : "r"(lane_offset_addr(ctr, lane)), "r"(v)
                 : "memory");
    return old;
}
__device__ __forceinline__ void shared_add(u32* ctr, u32 v, u32 lane) {
    asm volatile("red.shared.add.u32 [%0], %1;" ::"r"(lane_offset_addr(ctr, lane)), "r"(v) : "memory");
}
__device__ __forceinline__ void shared_max(u32* ctr, u32 v, u32 lane) {
    asm volatile("red.shared.max.u32 [%0], %1;" ::"r"(lane_offset_addr(ctr, lane)), "r"(v) : "memory");
}

// Warp-aggregated append: slot for this lane when sel, from the shared-memory counter *ctr.
__device__ __forceinline__ u32 warp_append(bool sel, u32* ctr) {
    const u32 lane = threadIdx.x & 31;
    const u32 mask = __ballot_sync(0xffffffffu, sel);
    u32 base = 0;
    if (lane == 0 && mask != 0) base = shared_fetch_add(ctr, (u32)__popc(mask), 0);
    base = __shfl_sync(0xffffffffu, base, 0);
    return base + (u32)__popc(mask & ((1u << lane) - 1u));
}

__constant__ u32 kLevelShift[6] = {52, 40, 32, 20, 8, 0};
__constant__ u32 kLevelWidth[6] = {12, 12, 8, 12, 12, 8};

// The k best candidates of src to sink slots [0, k) when there are more
// than k, else all of them; then padding up to pad_to.
// The first digit (top 12 bits of the value key) over the whole source, in
// 32-bit arithmetic: one shared atomic per candidate.
template <u32 NT, int U, class Src>
__device__ __forceinline__ void count_top_digit(const Src& src, TopkSmem& sm) {
    for (u32 b = threadIdx.x; b < TOPK_MAX_BINS; b += NT) sm.hist[b] = 0;
    __syncthreads();
    for_each_cand<NT, U>(src, [&](bool ok, float v, u32) {
        if (ok) atomicAdd(&sm.hist[value_key(v) >> 20], 1u);
    });
    __syncthreads();
}

// Appends (v, idx) for the lanes with sel; one vote when no lane has one.
template <class Sink>
__device__ __forceinline__ void emit_if(bool sel, float v, u32 idx, const Sink& sink,
                                        TopkSmem& sm) {
    if (__any_sync(0xffffffffu, sel)) {
        const u32 slot = warp_append(sel, &sm.out_n);
        if (sel) sink.emit(slot, v, idx);
    }
}

// The k best candidates of src to sink slots [0, k) when there are more
// than k, else all of them; then padding up to pad_to. The general radix
// path: a 12-bit first digit from the top of the value key.
template <u32 NT = TOPK_THREADS, int U = TOPK_UNROLL, class Src, class Sink>
__device__ void select_topk_radix(const Src& src, u32 k, u32 pad_to, const Sink& sink,
                                  TopkSmem& sm) {
    if (threadIdx.x == 0) {
        sm.out_n = 0;
        sm.buf_n = 0;
    }
    count_top_digit<NT, U>(src, sm);  // (its first barrier publishes the counters' reset)
    find_bin<NT>(sm, TOPK_MAX_BINS, k);
    if (sm.res_total <= k) {
        // Not more candidates than slots: all of them, then padding.
        const u32 total = sm.res_total;
        for_each_cand<NT, U>(src, [&](bool ok, float v, u32 idx) { emit_if(ok, v, idx, sink, sm); });
        sink.template pad<NT>(total, pad_to);
        return;
    }
    const u32 bin0 = sm.res_bin;
    u32 need = k - sm.res_above;
    if (sm.res_cnt == need) {  // the whole bin is in
        for_each_cand<NT, U>(src, [&](bool ok, float v, u32 idx) {
            emit_if(ok && (value_key(v) >> 20) >= bin0, v, idx, sink, sm);
        });
        return;
    }
    // Refine with the 64-bit key (value key << 32 | ~index), digits below the
    // first: in shared memory when the bin fits the buffer, else by
    // re-scanning the source (exact either way).
    const bool buffered = sm.res_cnt <= TOPK_CAP;
    if (buffered) {
        for_each_cand<NT, U>(src, [&](bool ok, float v, u32 idx) {
            const u32 top = ok ? value_key(v) >> 20 : 0u;
            emit_if(ok && top > bin0, v, idx, sink, sm);
            const bool keep = ok && top == bin0;
            if (__any_sync(0xffffffffu, keep)) {
                const u32 j = warp_append(keep, &sm.buf_n);
                if (keep) {
                    sm.buf_v[j] = __float_as_uint(v);
                    sm.buf_i[j] = idx;
                }
            }
        });
        __syncthreads();
    }
    u64 prefix = bin0;  // key >> shift of the bin chosen so far
    u32 shift = kLevelShift[0];
    for (int lvl = 1; lvl < 6; ++lvl) {
        shift = kLevelShift[lvl];
        const u32 width = kLevelWidth[lvl];
        const u32 nbins = 1u << width;
        for (u32 b = threadIdx.x; b < nbins; b += NT) sm.hist[b] = 0;
        __syncthreads();
        const u32 above_shift = shift + width;  // prefix bits above this digit
        auto count = [&](bool ok, float v, u32 idx) {
            const u64 key = cand_key(v, idx);
            if (ok && (key >> above_shift) == prefix)
                atomicAdd(&sm.hist[(u32)(key >> shift) & (nbins - 1)], 1u);
        };
        if (!buffered) {
            for_each_cand<NT, U>(src, count);
        } else {
            const u32 nb = sm.buf_n;
            for (u32 j = threadIdx.x; j < nb; j += NT)
                count(true, __uint_as_float(sm.buf_v[j]), sm.buf_i[j]);
        }
        __syncthreads();
        find_bin<NT>(sm, nbins, need);
        prefix = (prefix << width) | sm.res_bin;
        need -= sm.res_above;
        if (sm.res_cnt == need) break;  // every key of this bin is in: done
        // (res_* are read before the next level's find_bin rewrites them:
        //  the histogram clear and its barrier sit in between)
    }
    // Selected: key >> shift >= prefix (within the buffer if one was made; the
    // keys above the buffered bin were emitted when it was filled).
    const u64 pre = prefix;
    const u32 sh = shift;
    auto emit_sel = [&](bool ok, float v, u32 idx) {
        emit_if(ok && (cand_key(v, idx) >> sh) >= pre, v, idx, sink, sm);
    };
    if (!buffered) {
        for_each_cand<NT, U>(src, emit_sel);
    } else {
        const u32 nb = sm.buf_n;
        for (u32 base = 0; base < nb; base += NT) {
            const u32 j = base + threadIdx.x;
            const bool ok = j < nb;
            emit_sel(ok, ok ? __uint_as_float(sm.buf_v[j]) : 0.0f, ok ? sm.buf_i[j] : 0u);
        }
    }
}

// Window path. Top-k values sit in a narrow range of the key's top bits, so
// a fixed first digit piles them into a few bins (many levels and passes to
// resolve; the merge's candidates, all from the top tail, most of all).
// Instead: the largest key first, then a histogram of the
// distance below it in WIN_BINS bins of 2^WIN_SHIFT keys (8 octaves of the
// float exponent); keys further down are not counted. The bin holding the
// k-th key goes to the buffer and its keys are ranked by direct comparison.
// When the k-th key lies below the window, or its bin is large, the radix
// path runs instead (exact either way).
#define WIN_BINS 4096u
#define WIN_SHIFT 14u
#define WIN_RANK_MAX 512u

// The radix path as a call: out of the window path's straight code.
template <class Src, class Sink>
__device__ __noinline__ void select_topk_radix_cold(const Src& src, u32 k, u32 pad_to,
                                                   const Sink& sink, TopkSmem& sm) {
    select_topk_radix(src, k, pad_to, sink, sm);
}

template <bool kRolled, class Src, class Sink>
__device__ void select_topk_window(const Src& src, u32 k, u32 pad_to, const Sink& sink,
                                   TopkSmem& sm) {
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (threadIdx.x == 0) {
        sm.out_n = 0;
        sm.buf_n = 0;
    }
    for (u32 b = threadIdx.x; b < WIN_BINS; b += TOPK_THREADS) sm.hist[b] = 0;
    // Pass 1: candidates and their largest key.
    u32 cnt = 0, mx = 0;
    each_cand<kRolled>(src, [&](bool ok, float v, u32) {
        cnt += ok ? 1u : 0u;
        if (ok) mx = max(mx, value_key(v));
    });
    cnt = __reduce_add_sync(0xffffffffu, cnt);
    mx = __reduce_max_sync(0xffffffffu, mx);
    if (lane == 0) {
        sm.warp_sum[warp] = cnt;
        sm.warp_max[warp] = mx;
    }
    __syncthreads();
    u32 total = 0, hi = 0;
#pragma unroll
    for (int w = 0; w < TOPK_WARPS; ++w) {
        total += sm.warp_sum[w];
        hi = max(hi, sm.warp_max[w]);
    }
    if (total <= k) {
        each_cand<kRolled>(src, [&](bool ok, float v, u32 idx) { emit_if(ok, v, idx, sink, sm); });
        sink.pad(total, pad_to);
        return;
    }
    // Pass 2: distance histogram, bin WIN_BINS - 1 at the top.
    const u32 span = WIN_BINS << WIN_SHIFT;
    each_cand<kRolled>(src, [&](bool ok, float v, u32) {
        const u32 d = hi - value_key(v);
        if (ok && d < span) atomicAdd(&sm.hist[WIN_BINS - 1 - (d >> WIN_SHIFT)], 1u);
    });
    __syncthreads();
    find_bin(sm, WIN_BINS, k);
    if (sm.res_total < k || sm.res_cnt > WIN_RANK_MAX) {
        __syncthreads();  // every thread has read res_* before the radix path rewrites them
        select_topk_radix_cold(src, k, pad_to, sink, sm);
        return;
    }
    const u32 j = WIN_BINS - 1 - sm.res_bin;
    const u32 need = k - sm.res_above;
    const u32 lo_d = j << WIN_SHIFT, hi_d = (j + 1) << WIN_SHIFT;
    if (sm.res_cnt == need) {  // the whole bin is in
        each_cand<kRolled>(src, [&](bool ok, float v, u32 idx) {
            emit_if(ok && hi - value_key(v) < hi_d, v, idx, sink, sm);
        });
        return;
    }
    // Pass 3: emit the keys above the bin, buffer the bin.
    each_cand<kRolled>(src, [&](bool ok, float v, u32 idx) {
        const u32 d = hi - value_key(v);
        emit_if(ok && d < lo_d, v, idx, sink, sm);
        const bool keep = ok && d >= lo_d && d < hi_d;
        if (__any_sync(0xffffffffu, keep)) {
            const u32 s = warp_append(keep, &sm.buf_n);
            if (keep) {
                sm.buf_v[s] = __float_as_uint(v);
                sm.buf_i[s] = idx;
            }
        }
    });
    __syncthreads();
    // The bin's keys are unique: a key is in when fewer than need keys beat it.
    const u32 nb = sm.buf_n;
    const u32 t = threadIdx.x;
    bool sel = false;
    float v = 0.0f;
    u32 idx = 0;
    if (t < nb) {
        v = __uint_as_float(sm.buf_v[t]);
        idx = sm.buf_i[t];
        const u64 key = cand_key(v, idx);
        u32 beat = 0;
        for (u32 i = 0; i < nb; ++i)
            beat += cand_key(__uint_as_float(sm.buf_v[i]), sm.buf_i[i]) > key ? 1u : 0u;
        sel = beat < need;
    }
    emit_if(sel, v, idx, sink, sm);
}

// Selection per kernel: the fold keeps the radix path (its long rows spread
// over many first-digit bins and stream fastest through the unrolled loop;
// the window's extra pass measured slower there); the slice takes the window
// path, unrolled; the merge, whose candidates all sit in the top tail, the
// window path rolled.
enum SelectPath { kRadix, kWindowUnrolled, kWindowRolled };

template <int kPath, class Src, class Sink>
__device__ __forceinline__ void select_topk(const Src& src, u32 k, u32 pad_to, const Sink& sink,
                                            TopkSmem& sm) {
    if (kPath == kRadix)
        select_topk_radix(src, k, pad_to, sink, sm);
    else
        select_topk_window<kPath == kWindowRolled>(src, k, pad_to, sink, sm);
}

__device__ __forceinline__ u32 log2_pow2(u32 x) { return (u32)(__ffs((int)x) - 1); }


// ---------------------------------------------------------------- staged path
//
// The fast path of the fold kernels: the candidates are read from global
// memory once and staged in shared memory (raw fp32 bits, or the top 16 bits of
// their keys where shared memory is short) while every one is counted in a
// 4096-bin histogram of the top 12 key bits. The bin b0 holding the k-th key
// comes from that histogram; one scan of the stage lists the positions at or
// above b0. Keys above b0 are in, and b0's keys (a few hundred) are refined on
// the 64-bit key (value key << 32 | ~index) with the radix path's 12/8-bit
// digits. What the staged path cannot decide exactly -- fewer than k numbers,
// +inf or a positive NaN present, a list or stage too small -- goes to the
// general paths above, out of line (same results, slower). Variants measured
// and dropped (a 1/8 sample for the threshold, warp-aggregated increments,
// fp16-value bins): bench-results/h200/topk-notes.md, round 3.

#define STAGED_BINS 4096u
#define STAGED_HIT_MAX 8192u
#define STAGED_FIRST_NUMBER_BIN 8u       // bins below: negative NaNs, non-candidates
#define STAGED_FIRST_SPECIAL_BIN 0xff8u  // +inf, positive NaNs

// Order-preserving key: +x -> bits | 2^31, -x -> -bits (mod 2^32), so -0 and +0
// share 0x80000000, -inf -> 0x00800000, +inf -> 0xff800000. Positive NaNs land
// above +inf, negative NaNs and IDX_NOT_CANDIDATE_BITS (-> 1, prefix 0) below
// -inf: the staged path never selects from those bins. Three instructions.
__device__ __forceinline__ u32 staged_key(u32 bits) {
    const u32 s = (u32)((i32)bits >> 31);
    return (bits ^ (s | 0x80000000u)) - s;
}

__device__ __forceinline__ u32 staged_prefix(u32 bits) { return staged_key(bits) >> 16; }

__device__ __forceinline__ u64 staged_key64(u32 bits, u32 idx) {
    return ((u64)staged_key(bits) << 32) | (u64)(~idx);
}

#define STAGED_KEY_NEG_INF 0x00800000u
#define STAGED_KEY_POS_INF 0xff800000u

// The bits of the number whose key is k (k in [key(-inf), key(+inf)]; +0 for 0x80000000).
__device__ __forceinline__ u32 staged_bits_of_key(u32 k) {
    return k >= 0x80000000u ? k ^ 0x80000000u : 0u - k;
}

// The histogram bin of raw bits: the top 12 bits of their key.
__device__ __forceinline__ u32 staged_bin(u32 bits) { return staged_prefix(bits) >> 4; }

struct alignas(16) StagedSmem {  // the stage and lists after it take 16-byte accesses
    u32 hist[STAGED_BINS];
    u32 warp_sum[TOPK_WARPS];
    u32 res_bin;
    u32 res_above;
    u32 res_cnt;
    u32 res_total;
    u32 special;  // +inf or a positive NaN was counted
    u32 n_hits;
    u32 n_cand;  // the staged path's candidates; both paths' list of b0's keys
    u32 out_n;
    u32 top_bin;    // the stream path: the highest bin counted so far
    u32 n_counted;  // the stream path: the keys counted so far, bin 0's too
    u32 bound;      // the stream path: the latest bound published between barriers
};

static_assert(sizeof(StagedSmem) == 16560, "mirrored by rust/cuda/src/indexer.rs");
static_assert(sizeof(TopkSmem) == 41240, "mirrored by rust/cuda/src/indexer.rs");

// Dynamic shared memory: StagedSmem, hits / cand_val / cand_idx [hit_cap], then
// the stage: u32 [stage_cap] raw bits or u16 [stage_cap] key prefixes.
// TopkSmem overlays it for the general paths. Mirrored by topk_shared_bytes
// in rust/cuda/src/indexer.rs.
template <bool kRaw>
__device__ __forceinline__ u32 staged_bytes(u32 hit_cap, u32 stage_cap) {
    const u32 staged = (u32)sizeof(StagedSmem) + 12u * hit_cap + (kRaw ? 4u : 2u) * stage_cap;
    return max(staged, (u32)sizeof(TopkSmem));
}

struct StagedLayout {
    StagedSmem* sm;
    u32* hits;
    u32* cand_val;
    u32* cand_idx;
    void* stage;
    u32 hit_cap;
};

__device__ __forceinline__ u32 dynamic_smem_bytes() {
    u32 r;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(r));
    return r;
}

template <bool kRaw>
__device__ __forceinline__ StagedLayout staged_layout(u8* dsm, const TopkParams& p) {
    if (dynamic_smem_bytes() < staged_bytes<kRaw>(p.hit_cap, p.stage_cap) ||
        p.hit_cap > STAGED_HIT_MAX || (p.hit_cap & 3u) != 0)
        __trap();  // the launcher sized the shared memory wrong
    StagedLayout l;
    l.sm = reinterpret_cast<StagedSmem*>(dsm);
    l.hits = reinterpret_cast<u32*>(dsm + sizeof(StagedSmem));
    l.cand_val = l.hits + p.hit_cap;
    l.cand_idx = l.cand_val + p.hit_cap;
    l.stage = l.cand_idx + p.hit_cap;
    l.hit_cap = p.hit_cap;
    return l;
}

// Where a kernel's selection goes, chosen at run time so the staged path is
// compiled once per kernel: the outputs, or a (value, index) list.
struct DestSink {
    OutputSink out;
    ValueSink val;
    bool to_output;
    __device__ __forceinline__ void emit(u32 slot, float v, u32 idx) const {
        if (to_output)
            out.emit(slot, v, idx);
        else
            val.emit(slot, v, idx);
    }
    template <u32 NT>
    __device__ __forceinline__ void pad(u32 from, u32 to) const {
        if (to_output)
            out.template pad<NT>(from, to);
        else
            val.template pad<NT>(from, to);
    }
};

extern __shared__ __align__(16) u8 topk_dsm[];

// The general paths, out of the staged path's code. Their TopkSmem overlays the
// dynamic shared memory; it is named here, not passed, so the compiler keeps
// shared-memory instructions (a pointer argument would make them generic).
template <int kPath, class GSrc>
__device__ __noinline__ void select_general(const GSrc& g, u32 k, u32 pad_to, const DestSink& d) {
    TopkSmem& sm = *reinterpret_cast<TopkSmem*>(topk_dsm);
    if (d.to_output)
        select_topk<kPath>(g, k, pad_to, d.out, sm);
    else
        select_topk<kPath>(g, k, pad_to, d.val, sm);
}

// Slots for the lanes with sel from the shared-memory counter *ctr; mask =
// __ballot_sync(sel) != 0.
__device__ __forceinline__ u32 warp_reserve(bool sel, u32 mask, u32* ctr) {
    const u32 lane = threadIdx.x & 31;
    const u32 leader = (u32)__ffs((int)mask) - 1;
    u32 base = 0;
    if (lane == leader) base = shared_fetch_add(ctr, (u32)__popc(mask), leader);
    base = __shfl_sync(0xffffffffu, base, leader);
    (void)sel;
    return base + (u32)__popc(mask & ((1u << lane) - 1u));
}

// Staged sources: a scalar head (the carry) at stage positions [0, n_head),
// padded to a multiple of 4, then float4 groups; value_at / index_at re-read
// one staged position.

// carry + contiguous chunk logits (fold), or one slice of them (slice: no carry).
struct StagedDense {
    const float* cv;
    const i32* ci;
    u32 nh;
    const float* logits;
    u32 idx0;
    u32 n;
    __device__ __forceinline__ u32 n_head() const { return nh; }
    __device__ __forceinline__ u32 head_pad() const { return (nh + 3u) & ~3u; }
    __device__ __forceinline__ float head(u32 i) const { return cv[i]; }
    __device__ __forceinline__ u32 n_groups() const { return (n + 3u) / 4u; }
    __device__ __forceinline__ float4 group(u32 g) const {
        return __ldcg(reinterpret_cast<const float4*>(logits) + g);
    }
    __device__ __forceinline__ bool valid(u32 j) const { return j < n; }
    __device__ __forceinline__ float value_at(u32 pos) const {
        const u32 hp = head_pad();
        return pos < hp ? cv[pos] : __ldcg(logits + (pos - hp));
    }
    __device__ __forceinline__ u32 index_at(u32 pos) const {
        const u32 hp = head_pad();
        return pos < hp ? (u32)ci[pos] : idx0 + (pos - hp);
    }
};

// Pass 1: stage every candidate (padding as IDX_NOT_CANDIDATE_BITS, prefix 0)
// and count every key outside bin 0 (which holds no number) into the
// histogram. U float4 groups per thread in flight.
template <int U, bool kRaw, class Src>
__device__ __forceinline__ void staged_load(const Src& src, const StagedLayout& l) {
    StagedSmem& sm = *l.sm;
    const u32 t = threadIdx.x;
    for (u32 b = t; b < STAGED_BINS; b += TOPK_THREADS) sm.hist[b] = 0;
    if (t == 0) {
        sm.n_hits = 0;
        sm.n_cand = 0;
        sm.out_n = 0;
    }
    __syncthreads();
    u32* st32 = static_cast<u32*>(l.stage);
    u16* st16 = static_cast<u16*>(l.stage);
    const u32 nh = src.n_head(), hp = src.head_pad();
    for (u32 base = 0; base < hp; base += TOPK_THREADS) {
        const u32 i = base + t;
        const u32 bits = i < nh ? __float_as_uint(src.head(i)) : IDX_NOT_CANDIDATE_BITS;
        const u32 code = staged_prefix(bits);
        if (i < hp) {
            if (kRaw)
                st32[i] = bits;
            else
                st16[i] = (u16)code;
        }
        if ((code >> 4) != 0) atomicAdd(&sm.hist[code >> 4], 1u);
    }
    const u32 ng = src.n_groups();
    for (u32 base = 0; base < ng; base += TOPK_THREADS * U) {
        float4 v[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const u32 g = base + u * TOPK_THREADS + t;
            if (g < ng) v[u] = src.group(g);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const u32 g = base + u * TOPK_THREADS + t;
            const bool in = g < ng;
            u32 b[4] = {IDX_NOT_CANDIDATE_BITS, IDX_NOT_CANDIDATE_BITS, IDX_NOT_CANDIDATE_BITS,
                        IDX_NOT_CANDIDATE_BITS};
            if (in) {
                b[0] = __float_as_uint(v[u].x);
                b[1] = __float_as_uint(v[u].y);
                b[2] = __float_as_uint(v[u].z);
                b[3] = __float_as_uint(v[u].w);
                if (!src.valid(4 * g + 3)) {  // a group's live slots are a prefix of it
#pragma unroll
                    for (int j = 0; j < 3; ++j)
                        if (!src.valid(4 * g + j)) b[j] = IDX_NOT_CANDIDATE_BITS;
                    b[3] = IDX_NOT_CANDIDATE_BITS;
                }
            }
            u32 c[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) c[j] = staged_prefix(b[j]);
            if (in) {
                if (kRaw)
                    reinterpret_cast<uint4*>(st32 + hp)[g] = make_uint4(b[0], b[1], b[2], b[3]);
                else
                    reinterpret_cast<uint2*>(st16 + hp)[g] =
                        make_uint2(c[0] | (c[1] << 16), c[2] | (c[3] << 16));
            }
#pragma unroll
            for (int j = 0; j < 4; ++j)
                if ((c[j] >> 4) != 0) atomicAdd(&sm.hist[c[j] >> 4], 1u);
        }
    }
    __syncthreads();
}

// Lists the staged positions whose key is in bin `bin` or above (raw stage: a
// float compare against the bin's lowest value, so NaNs never list; prefix
// stage: the 16-bit code). The list stops at hit_cap; n_hits keeps counting.
template <bool kRaw>
__device__ __forceinline__ void staged_list(const StagedLayout& l, u32 npos, u32 bin) {
    StagedSmem& sm = *l.sm;
    const u32 lane = threadIdx.x & 31, lt = (1u << lane) - 1u;
    // bin is a number's (>= the first number bin): tf is a number
    const float tf = __uint_as_float(staged_bits_of_key(bin << 20));
    const u32 pt = bin << 4;
    const u32 nq = npos / 4;
    for (u32 base = 0; base < nq; base += TOPK_THREADS) {
        const u32 q = base + threadIdx.x;
        u32 m0, m1, m2, m3;
        if (kRaw) {
            const float nan = __uint_as_float(0x7fffffffu);  // lists nothing
            float4 w = make_float4(nan, nan, nan, nan);
            if (q < nq) w = reinterpret_cast<const float4*>(l.stage)[q];
            m0 = __ballot_sync(0xffffffffu, w.x >= tf);
            m1 = __ballot_sync(0xffffffffu, w.y >= tf);
            m2 = __ballot_sync(0xffffffffu, w.z >= tf);
            m3 = __ballot_sync(0xffffffffu, w.w >= tf);
        } else {
            uint2 w = make_uint2(0u, 0u);  // prefix 0 is below every number's
            if (q < nq) w = reinterpret_cast<const uint2*>(l.stage)[q];
            m0 = __ballot_sync(0xffffffffu, (w.x & 0xffffu) >= pt);
            m1 = __ballot_sync(0xffffffffu, (w.x >> 16) >= pt);
            m2 = __ballot_sync(0xffffffffu, (w.y & 0xffffu) >= pt);
            m3 = __ballot_sync(0xffffffffu, (w.y >> 16) >= pt);
        }
        if ((m0 | m1 | m2 | m3) == 0) continue;  // (warp-uniform)
        const u32 c0 = (u32)__popc(m0), c1 = (u32)__popc(m1), c2 = (u32)__popc(m2);
        u32 slot = 0;
        if (lane == 0) slot = shared_fetch_add(&sm.n_hits, c0 + c1 + c2 + (u32)__popc(m3), 0);
        slot = __shfl_sync(0xffffffffu, slot, 0);
        const u32 pos = 4 * q;
        u32 at = slot + (u32)__popc(m0 & lt);
        if (((m0 >> lane) & 1u) && at < l.hit_cap) l.hits[at] = pos;
        slot += c0;
        at = slot + (u32)__popc(m1 & lt);
        if (((m1 >> lane) & 1u) && at < l.hit_cap) l.hits[at] = pos + 1;
        slot += c1;
        at = slot + (u32)__popc(m2 & lt);
        if (((m2 >> lane) & 1u) && at < l.hit_cap) l.hits[at] = pos + 2;
        slot += c2;
        at = slot + (u32)__popc(m3 & lt);
        if (((m3 >> lane) & 1u) && at < l.hit_cap) l.hits[at] = pos + 3;
    }
    __syncthreads();
}

// Sets sm.special when a bin at or above +inf's is counted; the next barrier
// publishes it (call right before find_bin).
__device__ __forceinline__ void staged_flag_special(StagedSmem& sm) {
    if (threadIdx.x < 32) {
        bool s = false;
        for (u32 b = STAGED_FIRST_SPECIAL_BIN + threadIdx.x; b < STAGED_BINS; b += 32) s |= sm.hist[b] != 0;
        const u32 any = __ballot_sync(0xffffffffu, s);
        if (threadIdx.x == 0) sm.special = any;
    }
}

// Every staged key counted: the bin b0 of the k-th key (sm.res_*) and the
// list of positions at or above it; false when the staged path cannot decide.
template <bool kRaw>
__device__ __forceinline__ bool staged_threshold(const StagedLayout& l, u32 npos, u32 k) {
    StagedSmem& sm = *l.sm;
    staged_flag_special(sm);
    find_bin(sm, STAGED_BINS, k);
    if (sm.special != 0 || sm.res_total < k || sm.res_bin < STAGED_FIRST_NUMBER_BIN ||
        sm.res_above + sm.res_cnt > l.hit_cap)
        return false;
    staged_list<kRaw>(l, npos, sm.res_bin);
    return true;
}

// The refine's digits below b0's 12 bits: level 1 is bits 51..40 of the key.
__host__ __device__ constexpr u32 refine_width(int lvl) { return (lvl == 2 || lvl == 5) ? 8u : 12u; }

// Levels lvl0.. of the refine over (vals, idxs)[0, m): narrows (prefix, shift)
// until the need best keys are exactly those with key >> shift >= prefix.
// Barriers inside.
template <u32 NT>
__device__ __forceinline__ void staged_refine_levels(const u32* vals, const u32* idxs, u32 m,
                                                     int lvl0, u32 need, u64& prefix, u32& shift,
                                                     StagedSmem& sm) {
    for (int lvl = lvl0; lvl < 6; ++lvl) {
        const u32 width = refine_width(lvl);
        shift -= width;
        const u32 above = shift + width;
        const u32 nbins = 1u << width;
        for (u32 b = threadIdx.x; b < nbins; b += NT) sm.hist[b] = 0;
        __syncthreads();
        for (u32 j = threadIdx.x; j < m; j += NT) {
            const u64 key = staged_key64(vals[j], idxs[j]);
            if ((key >> above) == prefix)
                atomicAdd(&sm.hist[(u32)(key >> shift) & (nbins - 1)], 1u);
        }
        __syncthreads();
        find_bin<NT>(sm, nbins, need);
        prefix = (prefix << width) | sm.res_bin;
        need -= sm.res_above;
        if (sm.res_cnt == need) break;  // every key of this bin is in
    }
}

// Sends the keys of (vals, idxs)[0, m) with key >> shift >= prefix out.
template <u32 NT>
__device__ __forceinline__ void staged_emit_selected(const u32* vals, const u32* idxs, u32 m,
                                                     u64 prefix, u32 shift,
                                                     const DestSink& dest, StagedSmem& sm) {
    for (u32 base = 0; base < m; base += NT) {
        const u32 j = base + threadIdx.x;
        const bool in = j < m;
        const u32 bits = in ? vals[j] : 0u, idx = in ? idxs[j] : 0u;
        const u64 key = staged_key64(bits, idx);
        const bool sel = in && (key >> shift) >= prefix;
        const u32 ms = __ballot_sync(0xffffffffu, sel);
        if (ms != 0) {
            const u32 slot = warp_reserve(sel, ms, &sm.out_n);
            if (sel) dest.emit(slot, __uint_as_float(bits), idx);
        }
    }
}

// Refines bin b0 on the 64-bit key (value key << 32 | ~index) with the radix
// path's digits below the bin's, over (vals, idxs)[0, m), b0's keys, and sends
// the need best of them out. Barriers inside.
template <u32 NT = TOPK_THREADS>
__device__ __forceinline__ void staged_refine(const u32* vals, const u32* idxs, u32 m, u32 b0,
                                              u32 need, const DestSink& dest, StagedSmem& sm) {
    // Selected: key >> shift >= prefix (shift 52 with prefix b0: every key of b0).
    u64 prefix = b0;
    u32 shift = 52u;
    if (m != need) staged_refine_levels<NT>(vals, idxs, m, 1, need, prefix, shift, sm);
    staged_emit_selected<NT>(vals, idxs, m, prefix, shift, dest, sm);
}

// One round over n listed keys (load(j, bits, idx) reads the j-th): the keys
// above bin b0 go out, b0's to (b0_bits, b0_idx)[0, cap) (counted in
// sm.n_cand; on_b0(bits) sees each one stored). No barrier.
template <u32 NT, class Load, class OnB0>
__device__ __forceinline__ void staged_split(u32 n, u32 b0, Load load, u32* b0_bits, u32* b0_idx,
                                             u32 cap, const DestSink& dest, StagedSmem& sm,
                                             OnB0 on_b0) {
    for (u32 base = 0; base < n; base += NT) {
        const u32 j = base + threadIdx.x;
        const bool in = j < n;
        u32 bits = 0, idx = 0, bin = 0;
        if (in) {
            load(j, bits, idx);
            bin = staged_bin(bits);
        }
        const bool above = in && bin > b0;
        const bool cand = in && bin == b0;
        const u32 ma = __ballot_sync(0xffffffffu, above);
        if (ma != 0) {
            const u32 slot = warp_reserve(above, ma, &sm.out_n);
            if (above) dest.emit(slot, __uint_as_float(bits), idx);
        }
        const u32 mc = __ballot_sync(0xffffffffu, cand);
        if (mc != 0) {
            const u32 c = warp_reserve(cand, mc, &sm.n_cand);
            if (cand && c < cap) {
                b0_bits[c] = bits;
                b0_idx[c] = idx;
                on_b0(bits);
            }
        }
    }
}

// staged_split, then staged_refine picks the selected ones of b0's keys.
template <u32 NT, class Load>
__device__ __forceinline__ void staged_split_refine(u32 n, u32 b0, u32 need, Load load,
                                                    u32* b0_bits, u32* b0_idx, u32 cap,
                                                    const DestSink& dest, StagedSmem& sm) {
    staged_split<NT>(n, b0, load, b0_bits, b0_idx, cap, dest, sm, [](u32) {});
    __syncthreads();  // b0's list is complete
    staged_refine<NT>(b0_bits, b0_idx, min(sm.n_cand, cap), b0, need, dest, sm);
}

// The k best from the list (sm.res_* describe b0).
template <bool kRaw, class Src>
__device__ __forceinline__ void staged_finish(const Src& src, u32 k, const DestSink& dest,
                                              const StagedLayout& l) {
    StagedSmem& sm = *l.sm;
    const u32 nhits = min(sm.n_hits, l.hit_cap);
    staged_split_refine<TOPK_THREADS>(
        nhits, sm.res_bin, k - sm.res_above,
        [&](u32 j, u32& bits, u32& idx) {
            const u32 pos = l.hits[j];
            bits = kRaw ? static_cast<const u32*>(l.stage)[pos] : __float_as_uint(src.value_at(pos));
            idx = src.index_at(pos);
        },
        l.cand_val, l.cand_idx, l.hit_cap, dest, sm);
}

// The k best of src to dest slots [0, k) when the staged path decides them;
// otherwise the general path kPath over gsrc (the same candidates read from
// global memory), which also covers k >= candidates and padding to pad_to.
template <int U, bool kRaw, int kPath, class Src, class GSrc>
__device__ void select_staged(const Src& src, const GSrc& gsrc, u32 k, u32 pad_to,
                              const DestSink& dest, const TopkParams& p, u8* dsm) {
    const StagedLayout l = staged_layout<kRaw>(dsm, p);
    const u32 npos = src.head_pad() + 4 * src.n_groups();
    bool decided = false;
    if (npos <= p.stage_cap) {
        staged_load<U, kRaw>(src, l);
        decided = staged_threshold<kRaw>(l, npos, k);
    }
    if (decided) {
        staged_finish<kRaw>(src, k, dest, l);
    } else {
        __syncthreads();  // every thread is done with the staged state the general path overlays
        select_general<kPath>(gsrc, k, pad_to, dest);
    }
}

// Where a fold/merge writes: the next carry half, or the outputs on the last chunk.
__device__ __forceinline__ DestSink fold_dest(const TopkParams& p, u32 r, const RowChunk& rc,
                                              u32* pad_to) {
    DestSink d;
    d.to_output = rc.last;
    d.out.idx = p.out_indices + (u64)r * p.topk;
    d.out.scores = p.out_scores != nullptr ? p.out_scores + (u64)r * p.topk : nullptr;
    d.out.pt_row = p.page_table + (u64)r * p.pt_row_stride;
    d.out.physical = p.physical != 0;
    d.out.pages = p.pages;
    const u64 off = (u64)(p.chunk & 1) * p.carry_half_stride + (u64)r * p.topk;
    d.val.v = p.carry_values + off;
    d.val.i = p.carry_indices + off;
    // The next chunk reads min(topk, live tokens so far) carry slots.
    const u64 through = min((u64)rc.live, (u64)(p.chunk + 1) * p.chunk_len);
    *pad_to = rc.last ? p.topk : (u32)min(through, (u64)p.topk);
    return d;
}

// The row of a fold CTA: what it reads (its carry, then this chunk's logits)
// and where its k best go. False when this chunk brings the row nothing new:
// the carry stays where it is.
__device__ __forceinline__ bool fold_row(const TopkParams& p, DenseSource& g, DestSink& d,
                                         u32& pad_to) {
    const u32 r = blockIdx.x;
    const RowChunk rc = row_chunk(p, r);
    if (!rc.active && !rc.last) return false;
    const u64 cin = (u64)rc.carry_in * p.carry_half_stride + (u64)r * p.topk;
    g.cv = p.carry_values + cin;
    g.ci = p.carry_indices + cin;
    g.n_carry = rc.n_carry;
    g.logits = p.logits + (u64)r * p.logits_row_stride;
    g.idx0 = p.chunk * p.chunk_len;
    g.n = rc.n_chunk;
    d = fold_dest(p, r, rc, &pad_to);
    return true;
}

// Grid (rows): carry + this chunk's logits.
template <int U, bool kRaw>
__device__ __forceinline__ void topk_fold(const TopkParams& p) {
    DenseSource g;
    DestSink d;
    u32 pad_to;
    if (!fold_row(p, g, d, pad_to)) return;
    const StagedDense s{g.cv, g.ci, g.n_carry, g.logits, g.idx0, g.n};
    select_staged<U, kRaw, kRadix>(s, g, p.topk, pad_to, d, p, topk_dsm);
}

// ---------------------------------------------------------------- stream path
//
// The fold for many long rows (more rows than SMs): one read of the row, no
// stage, and most keys neither counted nor kept. The row streams in rounds of
// NT * U float4 groups. The first two rounds are counted in the 4096-bin
// histogram of the top 12 key bits; the bin of the k-th key counted so far is a
// bound below the k-th key of the whole row. Their keys at or above it are kept
// in a shared-memory buffer of (bits, index); from then on only keys at or
// above the bound are counted and kept, about k * (1 + 1/2 + 1/3 + ...) of them
// on iid rows. After every later round one warp (a different one each round)
// raises the bound without a barrier: the counts it reads mid-round are each at
// most the row's, so the bound stays below the k-th key. Keys below a bound can
// never be selected, and every key at or above the final k-th bin b0 was
// counted, so the histogram's counts from b0 up are exact: b0, the keys above
// it and its own count come out as from a full count. The buffer's keys above
// b0 are in; b0's are copied behind them and refined as the staged path refines
// them, except that where shared memory allows (stream_counts_level1), the
// first refine level is counted during that copy and found without its
// barriers. The shared memory is the histogram, those level-1 counts and the
// buffer (44.2 KiB for top-512 without the counts, 60.7 KiB with them), so two
// CTAs share an SM (the register file's limit at 64 registers) and one's reads
// overlap the other's barriers. What the buffer cannot decide (a full buffer,
// +inf or a positive NaN, fewer than k numbers) goes to the radix path over the
// same candidates, from global memory. Variants measured:
// bench-results/h200/indexer-round17-notes.md.

struct StreamLayout {
    StagedSmem* sm;
    u32* bits;  // [cap]
    u32* idx;   // [cap]
    u32 cap;
    // sm->hist, bits and idx as shared-space addresses, formed once a row:
    // through the generic pointers (64 registers leave no room to keep the
    // base) the compiler rebuilt the shared window's base at every count and
    // store. Forming them once took 7.7 us off prefill's top-k alone on an
    // H100 (bench-results/h200/indexer-round39-notes.md).
    u32 hist_at;
    u32 bits_at;
    u32 idx_at;
};

// Buffer entry j: (bits, idx).
__device__ __forceinline__ void stream_store(const StreamLayout& l, u32 j, u32 bits, u32 idx) {
    asm volatile("st.shared.u32 [%0], %1;" ::"r"(l.bits_at + 4u * j), "r"(bits) : "memory");
    asm volatile("st.shared.u32 [%0], %1;" ::"r"(l.idx_at + 4u * j), "r"(idx) : "memory");
}

// One more key in bin `bin` of the histogram at hist_at, when `on`.
__device__ __forceinline__ void stream_count(u32 hist_at, u32 bin, bool on) {
    asm volatile(
        "{\n .reg .pred q;\n setp.ne.u32 q, %1, 0;\n @q red.shared.add.u32 [%0], 1;\n}"
        ::"r"(hist_at + 4u * bin), "r"((u32)on)
        : "memory");
}

// Level 1 of b0's refine (key bits 51..40, a 12-bit digit), where shared
// memory leaves room for its counts (p.stage_cap == STREAM_SUB_BINS): counted
// as b0's keys are copied, in its own bins and their sums by 32 (groups).
#define STREAM_SUB_BINS 4096u
#define STREAM_SUB_GROUPS (STREAM_SUB_BINS / 32u)
#define STREAM_SUB_BYTES (4u * (STREAM_SUB_BINS + STREAM_SUB_GROUPS))
// The 64-bit key's shift below level 1's digit (52: below b0's 12 bits).
#define STREAM_SUB_SHIFT (52u - refine_width(1))
static_assert(STREAM_SUB_BINS == 1u << refine_width(1), "level 1's digit fills the bins");

// Whether the launcher gave the stream kernel the level-1 counts.
__device__ __forceinline__ bool stream_counts_level1(const TopkParams& p) {
    return p.stage_cap != 0;
}

// Dynamic shared memory: StagedSmem, the level-1 bins and groups where sub,
// then the buffer's bits and indices [hit_cap] each; TopkSmem overlays it for
// the radix path. Mirrored by topk_stream_shared_bytes in rust/cuda/src/indexer.rs.
__device__ __forceinline__ u32 stream_bytes(u32 cap, bool sub) {
    return max((u32)sizeof(StagedSmem) + (sub ? STREAM_SUB_BYTES : 0u) + 8u * cap,
               (u32)sizeof(TopkSmem));
}

__device__ __forceinline__ u32* stream_sub(u8* dsm) {
    return reinterpret_cast<u32*>(dsm + sizeof(StagedSmem));
}

__device__ __forceinline__ StreamLayout stream_layout(u8* dsm, const TopkParams& p) {
    const bool sub = stream_counts_level1(p);
    if (dynamic_smem_bytes() < stream_bytes(p.hit_cap, sub) || (sub && p.stage_cap != STREAM_SUB_BINS))
        __trap();  // sized wrong by the launcher
    StreamLayout l;
    l.sm = reinterpret_cast<StagedSmem*>(dsm);
    l.bits = stream_sub(dsm) + (sub ? STREAM_SUB_BINS + STREAM_SUB_GROUPS : 0u);
    l.idx = l.bits + p.hit_cap;
    l.cap = p.hit_cap - 1;  // the last entry is spare: slots past the end write it
    l.hist_at = smem_addr(l.sm->hist);
    l.bits_at = smem_addr(l.bits);
    l.idx_at = smem_addr(l.idx);
    return l;
}

// Notes a warp's counted keys: n of them (per lane), the highest in bin top.
__device__ __forceinline__ void stream_counted(StagedSmem& sm, u32 top, u32 n) {
    top = __reduce_max_sync(0xffffffffu, top);
    n = __reduce_add_sync(0xffffffffu, n);
    if ((threadIdx.x & 31) == 0 && n != 0) {
        shared_max(&sm.top_bin, top, 0);
        shared_add(&sm.n_counted, n, 0);
    }
}

// Buffers (bits, idx) and counts bits when keep is set; the buffer's count
// runs past cap when it is full.
__device__ __forceinline__ void stream_keep(const StreamLayout& l, bool keep, u32 bits, u32 idx) {
    const u32 mk = __ballot_sync(0xffffffffu, keep);
    if (mk != 0) {
        const u32 j = warp_reserve(keep, mk, &l.sm->n_hits);
        const u32 bin = staged_bin(bits);
        stream_count(l.hist_at, bin, keep);
        if (keep && j < l.cap) stream_store(l, j, bits, idx);
        stream_counted(*l.sm, keep ? bin : 0u, keep ? 1u : 0u);
    }
}

// v[Lo + s] for s < N by the bits of s, a tree of selects (a dynamic index
// would put v in local memory). N is a power of two.
template <int Lo, int N, int M>
__device__ __forceinline__ u32 pick_by_bits(const u32 (&v)[M], u32 s) {
    if constexpr (N == 1) {
        return v[Lo];
    } else {
        const u32 lo = pick_by_bits<Lo, N / 2>(v, s), hi = pick_by_bits<Lo + N / 2, N / 2>(v, s);
        return (s & (N / 2)) ? hi : lo;
    }
}

// A round's keys (v[s], s < 4 U) with value >= tf (a float compare: NaNs and
// non-candidates never pass) to the buffer, counted when `count`. One
// reservation a warp; then each lane writes its own kept keys, one a step,
// for as many steps as the warp's fullest lane needs (a slot past the
// buffer's end writes the spare last entry). index(s) is v[s]'s logical index.
template <int S, class Index>
__device__ __forceinline__ void stream_keep_round(const StreamLayout& l, const u32 (&v)[S],
                                                  float tf, bool count, Index index) {
    // A compare and a predicated OR a key, into two words whose chains run
    // side by side (the plain `if (v >= tf) m |= bit` compiled to a select
    // and an add a key).
    u32 mw[2] = {0u, 0u};
#pragma unroll
    for (int s = 0; s < S; ++s)
        asm("{\n .reg .pred p;\n setp.ge.f32 p, %1, %2;\n @p or.b32 %0, %0, %3;\n}"
            : "+r"(mw[s % 2])
            : "f"(__uint_as_float(v[s])), "f"(tf), "r"(1u << s));
    u32 m = mw[0] | mw[1];
    const u32 c = (u32)__popc(m);
    const u32 steps = __reduce_max_sync(0xffffffffu, c);
    if (steps == 0) return;
    const u32 lane = threadIdx.x & 31;
    u32 inc = c;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        const u32 y = __shfl_up_sync(0xffffffffu, inc, d);
        if (lane >= (u32)d) inc += y;
    }
    u32 base = 0;
    if (lane == 31) base = shared_fetch_add(&l.sm->n_hits, inc, 31);
    u32 j = __shfl_sync(0xffffffffu, base, 31) + inc - c;
    u32 top = 0;
    for (u32 i = 0; i < steps; ++i) {
        const bool has = m != 0;
        const u32 s = (u32)__ffs((int)m) - 1u;
        m &= m - 1u;
        if (has) {
            const u32 bits = pick_by_bits<0, S>(v, s);
            const u32 at = min(j, l.cap);
            stream_store(l, at, bits, index(s));
            if (count) {
                const u32 bin = staged_bin(bits);
                stream_count(l.hist_at, bin, true);
                top = max(top, bin);
            }
        }
        ++j;
    }
    if (count) stream_counted(*l.sm, top, c);
}

// One step of a warp's search down the histogram, bins hi .. hi - 31 (lane l
// reads bin hi - l; bins below 0 count nothing): c is the lane's count, inc
// the step's inclusive sum through it, and the result the lanes at which acc
// (the keys above the step) plus inc reaches k. Hist: u32* or volatile u32*.
template <class Hist>
__device__ __forceinline__ u32 warp_bins_step(Hist hist, i32 hi, u32 acc, u32 k, u32& c,
                                              u32& inc) {
    const u32 lane = threadIdx.x & 31;
    const i32 b = hi - (i32)lane;
    c = b >= 0 ? hist[b] : 0u;
    inc = c;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        const u32 y = __shfl_up_sync(0xffffffffu, inc, d);
        if (lane >= (u32)d) inc += y;
    }
    return __ballot_sync(0xffffffffu, acc + inc >= k);
}

// The bound after a round: the bin of the k-th key counted so far, or the
// first number bin while fewer than k are counted. Sets sm.res_* as find_bin
// does (res_total: every key counted) and sm.special. One warp searches down
// from the highest counted bin, 32 bins a step: the k-th key's bin is a few
// steps below it on real rows, where a scan of all 4096 bins took four
// barriers. Every thread calls it.
template <u32 NT>
__device__ __forceinline__ u32 stream_bound(StagedSmem& sm, u32 k) {
    __syncthreads();  // the round's counts are in
    if (threadIdx.x < 32) {
        const u32 lane = threadIdx.x;
        const u32 top = sm.top_bin;
        // Only the rounds counted in full count into bin 0: their non-candidates.
        u32 total = sm.n_counted - sm.hist[0];
        if (total >= k) {
            bool found = false;
            u32 acc = 0;  // keys in the bins above this step's
            for (i32 hi = (i32)top; hi >= 0 && !found; hi -= 32) {
                u32 c, inc;
                const u32 hit = warp_bins_step(sm.hist, hi, acc, k, c, inc);
                if (hit != 0) {
                    found = true;
                    if (lane == (u32)__ffs((int)hit) - 1u) {
                        sm.res_bin = (u32)(hi - (i32)lane);
                        sm.res_above = acc + inc - c;
                        sm.res_cnt = c;
                    }
                }
                acc += __shfl_sync(0xffffffffu, inc, 31);
            }
            if (!found) total = 0;  // the counts disagree: let the radix path decide
        }
        if (lane == 0) {
            sm.res_total = total;
            sm.special = top >= STAGED_FIRST_SPECIAL_BIN;
        }
    }
    __syncthreads();
    return sm.res_total >= k ? max(sm.res_bin, STAGED_FIRST_NUMBER_BIN) : STAGED_FIRST_NUMBER_BIN;
}

// A bound between barriers: one warp searches the histogram while the others
// go on counting (at most kSteps steps of 32 bins down from the highest
// counted bin) and publishes a higher bound in sm.bound. Counts read mid-round
// are each at most the row's: the bin where they reach k is still at or below
// the k-th key's. Returns the warp's new bound (at least `bound`).
__device__ __forceinline__ u32 stream_raise_bound(StagedSmem& sm, u32 k, u32 bound) {
    constexpr int kSteps = 4;
    const u32 lane = threadIdx.x & 31;
    volatile u32* hist = sm.hist;
    i32 hi = (i32)*(volatile u32*)&sm.top_bin;
    u32 acc = 0;  // keys in the bins above this step's
    for (int step = 0; step < kSteps && hi >= (i32)bound; ++step, hi -= 32) {
        u32 c, inc;
        const u32 hit = warp_bins_step(hist, hi, acc, k, c, inc);
        if (hit != 0) {
            const u32 bin = (u32)(hi - (i32)__ffs((int)hit) + 1);
            if (bin > bound) {
                bound = bin;
                if (lane == 0) shared_max(&sm.bound, bin, 0);
            }
            break;
        }
        acc += __shfl_sync(0xffffffffu, inc, 31);
    }
    return bound;
}

// The bin of the need-th largest key counted in sub (STREAM_SUB_BINS bins,
// their sums by 32 in groups), as one warp finds it: down the groups from the
// top, 32 a step, then once down the 32 bins of the group found. found is
// false only when the counts hold fewer than need keys.
struct SubHit {
    u32 bin;
    u32 above;  // keys in higher bins
    u32 cnt;
    bool found;
};

__device__ __forceinline__ SubHit warp_find_sub(const u32* sub, const u32* groups, u32 need) {
    u32 acc = 0;  // keys in the groups above this step's
    for (i32 hi = (i32)STREAM_SUB_GROUPS - 1; hi >= 0; hi -= 32) {
        u32 c, inc;
        const u32 hit = warp_bins_step(groups, hi, acc, need, c, inc);
        if (hit != 0) {
            const u32 at = (u32)__ffs((int)hit) - 1u;
            const u32 grp = (u32)(hi - (i32)at);
            acc += __shfl_sync(0xffffffffu, inc - c, at);
            // the group holds the need-th key, so one of its 32 bins reaches it
            const u32 hit2 = warp_bins_step(sub, (i32)(32u * grp + 31u), acc, need, c, inc);
            const u32 at2 = (u32)__ffs((int)hit2) - 1u;
            return {32u * grp + 31u - at2, __shfl_sync(0xffffffffu, acc + inc - c, at2),
                    __shfl_sync(0xffffffffu, c, at2), hit2 != 0};
        }
        acc += __shfl_sync(0xffffffffu, inc, 31);
    }
    return {0u, 0u, 0u, false};
}

// The stream path's finish over the buffer's nbuf keys: those above bin b0 go
// out and b0's (cnt of them) are copied behind the buffer. Without the
// level-1 counts they are refined as the staged path refines them. With them,
// the copy counts each in sub by level 1's digit; after the one barrier every
// warp finds level 1's bin on its own (the radix-style level took five
// barriers), and the levels below run only when that bin does not decide the
// need best.
template <u32 NT>
__device__ __forceinline__ void stream_finish(const StreamLayout& l, const TopkParams& p, u32 nbuf,
                                              u32 b0, u32 need, u32 cnt, const DestSink& dest) {
    StagedSmem& sm = *l.sm;
    u32* const b0_bits = l.bits + nbuf;
    u32* const b0_idx = l.idx + nbuf;
    const auto load = [&](u32 j, u32& bits, u32& idx) {
        bits = l.bits[j];
        idx = l.idx[j];
    };
    if (!stream_counts_level1(p)) {
        staged_split_refine<NT>(nbuf, b0, need, load, b0_bits, b0_idx, cnt, dest, sm);
        return;
    }
    u32* const sub = stream_sub(topk_dsm);
    const u32 sub_at = smem_addr(sub), groups_at = sub_at + 4u * STREAM_SUB_BINS;
    staged_split<NT>(
        nbuf, b0, load, b0_bits, b0_idx, cnt, dest, sm,
        [&](u32 bits) {
            const u32 digit = (staged_key(bits) >> (STREAM_SUB_SHIFT - 32u)) & (STREAM_SUB_BINS - 1u);
            stream_count(sub_at, digit, true);
            stream_count(groups_at, digit >> 5, true);
        });
    __syncthreads();  // b0's list and its level-1 counts are complete
    const u32 m = min(sm.n_cand, cnt);
    u64 prefix = b0;  // selected: key >> shift >= prefix
    u32 shift = 52u;
    if (m != need) {
        const SubHit h = warp_find_sub(sub, sub + STREAM_SUB_BINS, need);
        if (h.found) {
            prefix = ((u64)b0 << refine_width(1)) | h.bin;
            shift = STREAM_SUB_SHIFT;
            need -= h.above;
            if (h.cnt != need)
                staged_refine_levels<NT>(b0_bits, b0_idx, m, 2, need, prefix, shift, sm);
        } else {
            staged_refine_levels<NT>(b0_bits, b0_idx, m, 1, need, prefix, shift, sm);
        }
    }
    staged_emit_selected<NT>(b0_bits, b0_idx, m, prefix, shift, dest, sm);
}

// Zeroes N words from p (16-byte aligned, N a multiple of 4) in 16-byte
// stores, a fixed number a thread (the loop over b += NT compiled to a
// 4-word-a-thread loop with its remainder, a 4-byte store a word).
template <u32 NT, u32 N>
__device__ __forceinline__ void stream_zero(u32* p) {
    static_assert(N % 4 == 0, "whole 16-byte stores");
    uint4* q = reinterpret_cast<uint4*>(p);
#pragma unroll
    for (u32 j = 0; j < (N / 4 + NT - 1) / NT; ++j) {
        const u32 i = j * NT + threadIdx.x;
        if ((N / 4) % NT == 0 || i < N / 4) q[i] = make_uint4(0u, 0u, 0u, 0u);
    }
}

// The loads of round `it` (groups it * NT * U + u * NT + this thread's),
// zeros past the row's groups.
template <u32 NT, int U>
__device__ __forceinline__ void stream_load_round(const float4* src, u32 ng, u32 it, float4 (&f)[U]) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const u32 gi = it * NT * U + u * NT + threadIdx.x;
        f[u] = gi < ng ? __ldcg(src + gi) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
}

// The keys of round `it` from its loads f (key q: group q / 4, element
// q % 4); keys past the row's end (and the zeros of loads never issued)
// become non-candidates.
template <u32 NT, int U>
__device__ __forceinline__ void stream_round_keys(const float4 (&f)[U], u32 it, u32 n,
                                                  u32 (&w)[4 * U]) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
        w[4 * u + 0] = __float_as_uint(f[u].x);
        w[4 * u + 1] = __float_as_uint(f[u].y);
        w[4 * u + 2] = __float_as_uint(f[u].z);
        w[4 * u + 3] = __float_as_uint(f[u].w);
    }
    if (4 * (it + 1) * NT * U > n) {  // the row ends in this round
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const u32 gi = it * NT * U + u * NT + threadIdx.x;
#pragma unroll
            for (int e = 0; e < 4; ++e)
                if (4 * gi + e >= n) w[4 * u + e] = IDX_NOT_CANDIDATE_BITS;
        }
    }
}

// Counts every key of w; returns the highest bin. Non-candidates count too,
// in bin 0, which stream_bound takes off the total (every bound is at least
// STAGED_FIRST_NUMBER_BIN, so none lands on bin 0): an unpredicated increment
// leaves ptxas one ATOMS, where the predicated one took a branch around it,
// and counting the candidates a key took three instructions.
template <int S>
__device__ __forceinline__ u32 stream_count_all(const StreamLayout& l, const u32 (&w)[S]) {
    u32 top = 0;
#pragma unroll
    for (int q = 0; q < S; ++q) {
        const u32 bin = staged_bin(w[q]);
        stream_count(l.hist_at, bin, true);
        top = max(top, bin);
    }
    return top;
}

template <u32 NT, int U>
__device__ __forceinline__ void topk_stream(const TopkParams& p) {
    DenseSource g;
    DestSink d;
    u32 pad_to;
    if (!fold_row(p, g, d, pad_to)) return;
    const StreamLayout l = stream_layout(topk_dsm, p);
    StagedSmem& sm = *l.sm;
    const u32 k = p.topk, t = threadIdx.x;
    // The chunk, in rounds of NT * U groups; the next round's loads are issued
    // before this round is looked at. Rounds 0 and 1 are asked for first, so
    // that the zeroing and its barrier run under their latency.
    const u32 ng = g.n_groups();
    const float4* src = reinterpret_cast<const float4*>(g.logits);
    const u32 rounds = max((ng + NT * U - 1) / (NT * U), 1u);
    float4 cur[U], nxt[U];
    stream_load_round<NT, U>(src, ng, 0, cur);
    stream_load_round<NT, U>(src, ng, 1, nxt);
    stream_zero<NT, STAGED_BINS>(sm.hist);
    if (stream_counts_level1(p)) stream_zero<NT, STREAM_SUB_BINS + STREAM_SUB_GROUPS>(stream_sub(topk_dsm));
    if (t == 0) {
        sm.n_hits = 0;
        sm.out_n = 0;
        sm.n_cand = 0;
        sm.top_bin = 0;
        sm.n_counted = 0;
        sm.bound = 0;
    }
    __syncthreads();
    // The carry (at most k entries): counted and buffered, no bound yet.
    for (u32 base = 0; base < g.n_carry; base += NT) {
        const u32 i = base + t;
        const u32 bits = i < g.n_carry ? __float_as_uint(g.cv[i]) : IDX_NOT_CANDIDATE_BITS;
        const u32 idx = i < g.n_carry ? (u32)g.ci[i] : 0u;
        stream_keep(l, staged_bin(bits) >= STAGED_FIRST_NUMBER_BIN, bits, idx);
    }
    // The carry's k-th key bounds the chunk's (a number's bin, or the first).
    u32 bound = g.n_carry != 0 ? stream_bound<NT>(sm, k) : STAGED_FIRST_NUMBER_BIN;
    for (u32 it = 0; it < rounds; ++it) {
        // Round 1 is in nxt already. (Loading round it + 2 after the copy at
        // the loop's end instead, with no first-round test, spills 16 bytes
        // where this spills 4: ptxas 12.8.)
        if (it != 0) stream_load_round<NT, U>(src, ng, it + 1, nxt);
        u32 w[4 * U];
        stream_round_keys<NT, U>(cur, it, g.n, w);
        // The first two rounds are counted in full before the first bound
        // (the second's loads are already in nxt), then kept above it: with
        // only the first counted, the second kept as many keys as the first.
        const bool counted = g.n_carry == 0 && it < 2;
        if (g.n_carry == 0 && it == 0) {
            u32 w1[4 * U];
            stream_round_keys<NT, U>(nxt, 1, g.n, w1);
            const u32 top = max(stream_count_all(l, w), stream_count_all(l, w1));
            stream_counted(sm, top, 8u * U);
            bound = stream_bound<NT>(sm, k);
        } else {
            bound = max(bound, *(volatile u32*)&sm.bound);  // the latest published
        }
        const float tf = __uint_as_float(staged_bits_of_key(bound << 20));  // bin's lowest
        // Key q's index from one base a round (rebuilding g.idx0 from the
        // parameters at every keep step cost the step four instructions).
        const u32 round_idx = g.idx0 + 4 * (it * NT * U + t);
        stream_keep_round<4 * U>(l, w, tf, !counted, [&](u32 q) {
            return round_idx + (q / 4) * (4 * NT) + (q % 4);
        });
        // Later rounds take turns searching for a bound, which the others
        // take up when they next keep.
        if (!counted && it + 1 < rounds && (threadIdx.x >> 5) == it % (NT / 32))
            bound = stream_raise_bound(sm, k, bound);
#pragma unroll
        for (int u = 0; u < U; ++u) cur[u] = nxt[u];
    }
    stream_bound<NT>(sm, k);  // every count and the whole buffer are in: the exact b0
    const u32 nbuf = sm.n_hits, cnt = sm.res_cnt;
    // (b0's keys are gathered after the buffer: cnt more entries)
    if (sm.special != 0 || sm.res_total < k || sm.res_bin < STAGED_FIRST_NUMBER_BIN ||
        nbuf + cnt > l.cap) {
        __syncthreads();  // every thread is done with the state the radix path overlays
        select_topk_radix<NT, U>(g, k, pad_to, d, *reinterpret_cast<TopkSmem*>(topk_dsm));
        return;
    }
    // b0 = res_bin over every key; the buffer holds every key at or above it,
    // and b0's (exactly cnt: every key of b0 was kept) are copied behind it.
    stream_finish<NT>(l, p, nbuf, sm.res_bin, k - sm.res_above, cnt, d);
}

// Grid (rows, slices): the top-k of one slice of this chunk's logits. The
// two-stage kernels run the general paths alone, inlined in the entry: the
// staged form (and the staged code beside an out-of-line general call) measured
// slower there (bench-results/h200/topk-notes.md, round 3).
__device__ __forceinline__ void topk_slice(const TopkParams& p) {
    TopkSmem& sm = *reinterpret_cast<TopkSmem*>(topk_dsm);
    const u32 r = blockIdx.x, sl = blockIdx.y;
    const RowChunk rc = row_chunk(p, r);
    const u32 start = sl * p.slice_len;
    if (rc.n_chunk <= start) return;
    DenseSource g;
    g.cv = nullptr;
    g.ci = nullptr;
    g.n_carry = 0;
    g.logits = p.logits + (u64)r * p.logits_row_stride + start;
    g.idx0 = p.chunk * p.chunk_len + start;
    g.n = min(rc.n_chunk - start, p.slice_len);
    ValueSink sink;
    const u64 off = ((u64)r * p.slices + sl) * p.topk;
    sink.v = p.part_values + off;
    sink.i = p.part_indices + off;
    select_topk<kWindowUnrolled>(g, p.topk, min(g.n, p.topk), sink, sm);
}

// Grid (rows): carry + the slices' partial lists of this chunk.
__device__ __forceinline__ void topk_merge(const TopkParams& p) {
    TopkSmem& sm = *reinterpret_cast<TopkSmem*>(topk_dsm);
    const u32 r = blockIdx.x;
    const RowChunk rc = row_chunk(p, r);
    if (!rc.active && !rc.last) return;
    const u64 cin = (u64)rc.carry_in * p.carry_half_stride + (u64)r * p.topk;
    MergeSource g;
    g.cv = p.carry_values + cin;
    g.ci = p.carry_indices + cin;
    g.n_carry = rc.n_carry;
    g.pv = p.part_values + (u64)r * p.slices * p.topk;
    g.pi = p.part_indices + (u64)r * p.slices * p.topk;
    g.topk_shift = log2_pow2(p.topk);
    g.slices = p.slices;
    g.slice_len = p.slice_len;
    g.n_chunk = rc.n_chunk;
    u32 pad_to;
    const DestSink d = fold_dest(p, r, rc, &pad_to);
    if (d.to_output)
        select_topk<kWindowRolled>(g, p.topk, pad_to, d.out, sm);
    else
        select_topk<kWindowRolled>(g, p.topk, pad_to, d.val, sm);
}

// One 1024-thread CTA per row / (row, slice); dynamic shared memory from
// topk_shared_bytes (rust/cuda/src/indexer.rs). The fold and the slice stage
// raw fp32 bits (one CTA per SM on a long row); fold_prefix stages 16-bit key
// prefixes, so two CTAs share an SM and one's reads overlap the other's work.
B12X_KERNEL void __launch_bounds__(TOPK_THREADS, 1) b12x_indexer_topk_fold(const TopkParams p) {
    topk_fold<8, true>(p);
}

B12X_KERNEL void __launch_bounds__(TOPK_THREADS, 2)
    b12x_indexer_topk_fold_prefix(const TopkParams p) {
    topk_fold<2, false>(p);
}

B12X_KERNEL void __launch_bounds__(TOPK_STREAM_THREADS, TOPK_STREAM_CTAS)
    b12x_indexer_topk_stream(const TopkParams p) {
    topk_stream<TOPK_STREAM_THREADS, TOPK_STREAM_UNROLL>(p);
}

B12X_KERNEL void __launch_bounds__(TOPK_THREADS, 1) b12x_indexer_topk_slice(const TopkParams p) {
    topk_slice(p);
}

B12X_KERNEL void __launch_bounds__(TOPK_THREADS, 1) b12x_indexer_topk_merge(const TopkParams p) {
    topk_merge(p);
}
