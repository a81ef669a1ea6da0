// Exact top-k of one-chunk rows by a cluster of CTAs per row (sm_90: thread
// block clusters and distributed shared memory).
//
// Same contract as indexer_topk.cu's fold on the last chunk: order value
// descending, ties to the lowest logical index, NaN below every number, -0
// equal to +0, tokens on unmapped pages ("not a candidate" logits) and past
// the row's live length skipped; n <= topk candidates are all emitted and the
// remaining slots padded with -1 / -inf. Output order is unspecified.
//
// Kernels by PER (4, 8, 16: up to 16 K logits per CTA; more would spill at
// 1024 threads). The launcher picks the cluster size CL (1..8) and PER so that
// CL * 1024 * PER covers the row.
//
// The round-4 selection (one 1024-thread CTA per row, or slices + a merge
// launch) cost 20-29 us per call on one H200 for 32768-131072 logits, most of
// it one CTA's serial passes. Here the CL CTAs of a cluster split the row
// (PER contiguous logits per thread, kept in registers as order-preserving
// keys) and agree on the k-th key by a radix select over 11 + 11 + 10 bits:
// each level, every CTA histograms the digit of its keys that match the
// prefix found so far, the cluster sums the CL histograms through
// distributed shared memory (one cluster barrier), and every CTA finds the
// same digit (the bin holding the k-th key). Keys above that bin are emitted
// at once (output slots from a counter in rank 0's shared memory); after the
// last level the k-th key's value is exact, and its ties go to the lowest
// indices (ranks hold ascending index ranges, threads ascending subranges).
#include "indexer_common.cuh"

#define SEL_THREADS 1024
#define SEL_WARPS (SEL_THREADS / 32)
#define SEL_BINS 2048  // 11-bit digits at most
#define SEL_MAX_RANKS 8  // CTAs per cluster (the portable limit)

struct SelectParams {
    const float* logits;   // chunk logits [rows, logits_row_stride] (the whole width)
    const i32* lengths;    // i32 [rows]
    const i32* active_width;
    const i32* page_table;  // for physical output; row r at r * pt_row_stride
    i32* out_indices;       // [rows, topk]
    float* out_scores;      // [rows, topk] or null
    u64 logits_row_stride;
    u64 pt_row_stride;
    u32 rows;
    u32 width;
    u32 topk;
    u32 physical;
    u32 pages;  // pages of the K cache, min(shape[0], 2^31)
    u32 pad_;
};

// Order-preserving key of a candidate's logit, never 0: NaN 1 (below -inf,
// whose key is 0x007fffff), -0 and +0 equal. 0 marks "not a candidate".
__device__ __forceinline__ u32 sel_key(float v) {
    u32 b = __float_as_uint(v);
    if (b == IDX_NOT_CANDIDATE_BITS) return 0u;
    if (v != v) return 1u;
    if (v == 0.0f) b = 0u;
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ u32 cluster_rank() {
    u32 r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
__device__ __forceinline__ u32 cluster_size() {
    u32 r;
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(r));
    return r;
}
// Every thread of every CTA of the cluster; orders shared-memory writes
// before it with the other CTAs' reads after it.
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n"
                 "barrier.cluster.wait.acquire.aligned;\n" ::
                     : "memory");
}
// The shared::cluster address of `p` (a shared variable) in CTA `rank`.
__device__ __forceinline__ u32 dsmem(const void* p, u32 rank) {
    u32 a;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(a) : "r"(smem_addr(p)), "r"(rank));
    return a;
}
__device__ __forceinline__ u32 dsmem_load(u32 addr) {
    u32 v;
    asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(v) : "r"(addr) : "memory");
    return v;
}
__device__ __forceinline__ u32 dsmem_add(u32 addr, u32 v) {
    u32 old;
    asm volatile("atom.shared::cluster.add.u32 %0, [%1], %2;" : "=r"(old) : "r"(addr), "r"(v)
                 : "memory");
    return old;
}

// Exclusive scan of one value per thread over the CTA (every thread calls it;
// `sums` holds SEL_WARPS words); `total` gets the sum.
__device__ __forceinline__ u32 sel_exclusive_scan(u32 v, u32* sums, u32& total) {
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    u32 x = v;
#pragma unroll
    for (u32 o = 1; o < 32; o <<= 1) {
        const u32 y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) sums[warp] = x;
    __syncthreads();
    if (warp == 0) {
        u32 s = sums[lane];
#pragma unroll
        for (u32 o = 1; o < 32; o <<= 1) {
            const u32 y = __shfl_up_sync(0xffffffffu, s, o);
            if (lane >= o) s += y;
        }
        sums[lane] = s;
    }
    __syncthreads();
    total = sums[SEL_WARPS - 1];
    const u32 before = warp == 0 ? 0u : sums[warp - 1];
    __syncthreads();  // sums is reused by the next scan
    return before + x - v;
}

// Block-wide max and sum of one value per thread (every thread calls it).
__device__ __forceinline__ void sel_block_max_sum(u32& mx, u32& sum, u32* sums) {
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (u32 o = 16; o > 0; o >>= 1) {
        mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        sum += __shfl_xor_sync(0xffffffffu, sum, o);
    }
    if (lane == 0) {
        sums[warp] = mx;
        sums[SEL_WARPS + warp] = sum;
    }
    __syncthreads();
    mx = 0;
    sum = 0;
    for (u32 w = 0; w < SEL_WARPS; ++w) {
        mx = max(mx, sums[w]);
        sum += sums[SEL_WARPS + w];
    }
    __syncthreads();
}

// One radix level: digit (d >> shift) & (bins - 1) of the distances that
// match (prefix, pmask).
struct Level {
    u32 shift;
    u32 bins;
};

template <int PER>
__device__ __forceinline__ void select_cluster(const SelectParams& p) {
    __shared__ u32 hist[2][SEL_BINS];  // this CTA's digit counts, by level parity
    __shared__ u32 total_hist[SEL_BINS];
    __shared__ u32 sums[2 * SEL_WARPS];
    __shared__ u32 slot_counter;  // rank 0's is the cluster's
    __shared__ u32 found[2];      // the level's digit and the count before it
    __shared__ u32 cta_max, cta_count;

    const u32 tid = threadIdx.x, lane = tid & 31;
    const u32 rank = cluster_rank(), ranks = cluster_size();
    const u32 row = blockIdx.y;
    const u32 K = p.topk;
    const u32 n = idx_live_tokens(p.lengths, p.active_width, row, p.width);
    const u32 first = (rank * SEL_THREADS + tid) * PER;  // this thread's first position
    const float* lrow = p.logits + (u64)row * p.logits_row_stride;

    u32 key[PER];
#pragma unroll
    for (int i = 0; i < PER; i += 4) {
        const u32 pos = first + i;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (pos < n) v = *reinterpret_cast<const float4*>(lrow + pos);
        const float vs[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) key[i + j] = pos + j < n ? sel_key(vs[j]) : 0u;
    }
    for (u32 b = tid; b < SEL_BINS; b += SEL_THREADS) hist[0][b] = hist[1][b] = 0u;
    if (tid == 0) slot_counter = 0u;
    const u32 counter = dsmem(&slot_counter, 0);
    // The row's largest key and candidate count, agreed over the cluster.
    u32 mx = 0, count = 0;
#pragma unroll
    for (int i = 0; i < PER; ++i) {
        mx = max(mx, key[i]);
        count += key[i] != 0u ? 1u : 0u;
    }
    sel_block_max_sum(mx, count, sums);
    if (tid == 0) {
        cta_max = mx;
        cta_count = count;
    }
    cluster_sync();  // also orders the zeroed histograms and counter before any use
    u32 top = 0, total = 0;
    for (u32 r = 0; r < ranks; ++r) {
        top = max(top, dsmem_load(dsmem(&cta_max, r)));
        total += dsmem_load(dsmem(&cta_count, r));
    }
    // Distances below the largest key (0: the largest); ~0 for non-candidates
    // (a candidate's distance is at most top - 1 < ~0).
    u32 dist[PER];
#pragma unroll
    for (int i = 0; i < PER; ++i) dist[i] = key[i] != 0u ? top - key[i] : 0xffffffffu;
    auto live = [&](int i) { return dist[i] != 0xffffffffu; };

    i32* out_i = p.out_indices + (u64)row * K;
    float* out_s = p.out_scores ? p.out_scores + (u64)row * K : nullptr;
    // The bit mask of this thread's keys for which sel(i) holds.
    auto mask_of = [&](auto&& sel) {
        u32 m = 0;
#pragma unroll
        for (int i = 0; i < PER; ++i) m |= sel(i) ? 1u << i : 0u;
        return m;
    };
    // Writes the positions of `m` to output slots from the cluster's counter
    // (one atomic per warp).
    auto emit = [&](u32 m) {
        const u32 mine = __popc(m);
        u32 incl = mine;
#pragma unroll
        for (u32 o = 1; o < 32; o <<= 1) {
            const u32 y = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o) incl += y;
        }
        const u32 warp_total = __shfl_sync(0xffffffffu, incl, 31);
        u32 base = 0;
        if (warp_total != 0) {
            if (lane == 31) base = dsmem_add(counter, warp_total);
            base = __shfl_sync(0xffffffffu, base, 31);
        }
        u32 slot = base + incl - mine;
        for (; m != 0; m &= m - 1, ++slot) {
            const u32 pos = first + (__ffs(m) - 1);
            i32 idx = (i32)pos;
            if (p.physical) {
                const i32 pid = p.page_table[(u64)row * p.pt_row_stride + pos / IDX_PAGE_ROWS];
                idx = (i32)((u32)pid * IDX_PAGE_ROWS + pos % IDX_PAGE_ROWS);
            }
            out_i[slot] = idx;
            if (out_s) out_s[slot] = lrow[pos];
        }
    };

    if (total <= K) {
        // Every candidate, then the padding.
        emit(mask_of(live));
        for (u32 s = total + rank * SEL_THREADS + tid; s < K; s += ranks * SEL_THREADS) {
            out_i[s] = -1;
            if (out_s) out_s[s] = b12x_neg_inf();
        }
        cluster_sync();  // no CTA leaves while another may still add to rank 0's counter
        return;
    }

    // Counts this level's digits into hist[par] and sums them over the
    // cluster into total_hist; returns the digit holding the need-th
    // smallest distance (found[1]: how many come before it), or bins when
    // fewer than `need` match.
    u32 par = 0;
    auto level = [&](u32 prefix, u32 pmask, const Level lv, u32 need) -> u32 {
        u32* h = hist[par];
#pragma unroll
        for (int i = 0; i < PER; ++i)
            if ((dist[i] & pmask) == prefix && live(i))
                atomicAdd(&h[(dist[i] >> lv.shift) & (lv.bins - 1)], 1u);
        cluster_sync();
        for (u32 b = tid; b < lv.bins; b += SEL_THREADS) {
            u32 c[SEL_MAX_RANKS];
#pragma unroll
            for (u32 r = 0; r < SEL_MAX_RANKS; ++r)
                c[r] = r < ranks ? dsmem_load(dsmem(&h[b], r)) : 0u;
            u32 s = 0;
#pragma unroll
            for (u32 r = 0; r < SEL_MAX_RANKS; ++r) s += c[r];
            total_hist[b] = s;
        }
        if (tid == 0) found[0] = lv.bins;
        __syncthreads();
        // Thread t owns bins [t per, (t + 1) per): counts before them, ascending.
        const u32 per = (lv.bins + SEL_THREADS - 1) / SEL_THREADS;
        const u32 b0 = min(tid * per, lv.bins), b1 = min(b0 + per, lv.bins);
        u32 mine = 0;
        for (u32 b = b0; b < b1; ++b) mine += total_hist[b];
        u32 all;
        u32 before = sel_exclusive_scan(mine, sums, all);
        for (u32 b = b0; b < b1; ++b) {
            const u32 c = total_hist[b];
            if (before < need && before + c >= need) {
                found[0] = b;
                found[1] = before;
            }
            before += c;
        }
        __syncthreads();
        // The other parity's histogram is free (every rank read it a level
        // ago, before this level's cluster barrier): clear it for the next.
        par ^= 1;
        for (u32 b = tid; b < SEL_BINS; b += SEL_THREADS) hist[par][b] = 0u;
        return found[0];
    };

    // First try a window of 2^24 key units below the largest key (its top
    // digit is bits 23..13 of the distance: the few keys near the top spread
    // over 2048 bins, where a digit of the key's own top bits would pile most
    // of them into a few); if the need-th key lies further down, the whole
    // 32-bit range (digits 31..21, 20..10, 9..0).
    const Level window[3] = {{13, 2048}, {2, 2048}, {0, 4}};
    const Level full[3] = {{21, 2048}, {10, 2048}, {0, 1024}};
    u32 prefix = 0, pmask = 0xff000000u, need = K;
    const Level* plan = window;
    u32 digit = level(prefix, pmask, window[0], need);
    __syncthreads();
    if (digit == window[0].bins) {  // uniform: the window holds fewer than K
        plan = full;
        pmask = 0;
        digit = level(prefix, pmask, full[0], need);
        __syncthreads();
    }
    for (int l = 0;; ++l) {
        const Level lv = plan[l];
        const u32 count_before = found[1];
        const u32 want = prefix, wmask = pmask;
        emit(mask_of([&](int i) {
            return live(i) && (dist[i] & wmask) == want &&
                   ((dist[i] >> lv.shift) & (lv.bins - 1)) < digit;
        }));
        need -= count_before;
        prefix |= digit << lv.shift;
        pmask |= (lv.bins - 1) << lv.shift;
        if (l == 2) break;
        digit = level(prefix, pmask, plan[l + 1], need);
        __syncthreads();
    }

    // Ties at the need-th distance (`prefix` now, exact): the lowest indices.
    // The last level's histogram (parity par ^ 1) counts them per rank.
    const u32 d = prefix & (plan[2].bins - 1);
    const u32* last = hist[par ^ 1];
    u32 before = 0;
    for (u32 r = 0; r < rank; ++r) before += dsmem_load(dsmem(&last[d], r));
    const u32 here = last[d];
    const u32 take = need > before ? min(need - before, here) : 0u;
    u32 mine = 0;
#pragma unroll
    for (int i = 0; i < PER; ++i) mine += live(i) && dist[i] == prefix ? 1u : 0u;
    u32 all;
    const u32 ahead = sel_exclusive_scan(mine, sums, all);
    u32 seen = ahead, m = 0;
#pragma unroll
    for (int i = 0; i < PER; ++i) {
        if (live(i) && dist[i] == prefix) {
            m |= seen < take ? 1u << i : 0u;
            ++seen;
        }
    }
    emit(m);
    cluster_sync();  // no CTA leaves while another may still read its shared memory
}

#define SELECT_KERNEL(PER)                                                              \
    B12X_KERNEL void __launch_bounds__(SEL_THREADS, 1)                                  \
        b12x_indexer_select_p##PER(const SelectParams p) {                              \
        select_cluster<PER>(p);                                                         \
    }

SELECT_KERNEL(4)
SELECT_KERNEL(8)
SELECT_KERNEL(16)
