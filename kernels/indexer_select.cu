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
// same digit (the bin holding the k-th key). Usually the first level's bin
// is small (a few hundred of 32768 logits): then every key above it is
// emitted (output slots from a counter in rank 0's shared memory), its keys
// go to rank 0's pool, and rank 0 picks the ones still needed there
// (pick_candidates) after one more cluster barrier instead of two more
// levels. Otherwise, after the last level the k-th key's value is exact:
// every key above it is emitted and its ties go to the lowest indices (ranks
// hold ascending index ranges, threads ascending subranges).
#include "indexer_common.cuh"

#define SEL_THREADS 1024
#define SEL_WARPS (SEL_THREADS / 32)
#define SEL_BINS 2048  // 11-bit digits (the last level: 10 bits)
#define SC_CAND_CAP 4096  // the cluster selection's candidates (rust: CLUSTER_SELECT_CANDIDATES)

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
    // 1 when this kernel's primary is the call's own scorer or clearing
    // kernel: launched without the programmatic attribute, it started after
    // every earlier write of the stream, so `lengths` and `active_width` are
    // final before pdl_wait (read there, their load overlaps the wait).
    u32 lengths_settled;
    u32* state;  // the grid selection's cross-CTA state, SG_STATE_WORDS per row (zeroed by the scorer)
    u64* cand;   // the grid selection's candidates, SG_CAND_CAP per row (never read before written)
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

// The logit of key `k`, where the key alone gives it bit for bit; else NaN
// (key 1: the NaN's payload) or 0 (key 0x80000000: +0 or -0), which
// callers take from the logits instead.
__device__ __forceinline__ bool sel_key_is_exact(u32 k) { return k != 1u && k != 0x80000000u; }
__device__ __forceinline__ float sel_value(u32 k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// A row's live tokens (idx_live_tokens) in two steps around pdl_wait: its
// two words loaded first where p.lengths_settled says that is safe (the wait
// and whatever runs before it then hide the load), else after the wait.
struct RowLength {
    i32 len = 0, aw = 0;
    __device__ __forceinline__ void load(const SelectParams& p, u32 row) {
        len = p.lengths[row];
        aw = p.active_width[0];
    }
    __device__ __forceinline__ RowLength(const SelectParams& p, u32 row) {
        if (p.lengths_settled) load(p, row);
    }
    // Call in place of pdl_wait: the primary's writes (the logits, the row
    // state) are visible past it.
    __device__ __forceinline__ u32 wait_live(const SelectParams& p, u32 row) {
        pdl_wait();
        if (!p.lengths_settled) load(p, row);
        return idx_live_of(len, aw, p.width);
    }
};

// A candidate of a key gathered for a last selection step (pick_candidates):
// (key << 32 | ~position) is unique per row, and the larger the better (a
// higher key, then a lower position).
__device__ __forceinline__ u64 candidate(u32 k, u32 pos) { return (u64)k << 32 | (u32)~pos; }

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
__device__ __forceinline__ void dsmem_store_u64(u32 addr, u64 v) {
    asm volatile("st.shared::cluster.u64 [%0], %1;" ::"r"(addr), "l"(v) : "memory");
}
__device__ __forceinline__ u32 dsmem_add(u32 addr, u32 v) {
    u32 old;
    asm volatile("atom.shared::cluster.add.u32 %0, [%1], %2;" : "=r"(old) : "r"(addr), "r"(v)
                 : "memory");
    return old;
}

// The digit whose bin holds the need-th count from the top (bins descending
// over threads, one or two a thread): found = {digit, count above it, its
// count}. `counts(b)` reads bin b; need_of(total) gives `need` from the
// counts' total (1 <= need <= total, or no digit is found). Two CTA
// barriers: every warp scans the 32 warp sums itself, and only the warp
// holding the need-th count scans its threads' (block_exclusive_sum's three
// barriers and warp 0's serial scan between them were on every level's path).
template <class Counts, class Need>
__device__ __forceinline__ void find_digit(u32 bins, Counts&& counts, Need&& need_of, u32* sums,
                                           u32* found) {
    static_assert(SEL_WARPS == 32, "one warp sum a lane");
    const u32 per_bins = bins / SEL_THREADS;  // 2 or 1
    const u32 top = bins - 1 - threadIdx.x * per_bins;
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    u32 c[2];
#pragma unroll
    for (u32 j = 0; j < 2; ++j) c[j] = j < per_bins ? counts(top - j) : 0u;
    const u32 mine = c[0] + c[1];
    const u32 incl = warp_inclusive_sum(mine);
    if (lane == 31) sums[warp] = incl;
    __syncthreads();
    const u32 warp_sum = sums[lane];
    const u32 warps_incl = warp_inclusive_sum(warp_sum);  // lane w: warps 0..w
    const u32 all = __shfl_sync(0xffffffffu, warps_incl, 31);
    const u32 need = need_of(all);
    // The first warp whose running count reaches `need` holds the digit.
    const u32 reach = __ballot_sync(0xffffffffu, warps_incl >= need);
    if (reach != 0u && warp == (u32)(__ffs(reach) - 1)) {
        u32 above = __shfl_sync(0xffffffffu, warps_incl - warp_sum, warp) + incl - mine;
#pragma unroll
        for (u32 j = 0; j < 2; ++j) {
            if (j < per_bins && above < need && above + c[j] >= need) {
                found[0] = top - j;
                found[1] = above;
                found[2] = c[j];
            }
            above += c[j];
        }
    }
    __syncthreads();
}

// A level's `need` from its counts' total `all`: level 0 sets the row's
// candidate count and the keys it selects (at most K).
__device__ __forceinline__ u32 level_need(int level, u32 all, u32 K, u32& total, u32& need) {
    if (level == 0) {
        total = all;
        need = min(K, total);
    }
    return need;
}
// The found digit joins the k-th key's prefix; `need` and `ties` become
// what is left to take and how many keys share the prefix.
__device__ __forceinline__ void take_digit(const u32* found, int shift, u32 bins, u32& need,
                                           u32& ties, u32& prefix, u32& pmask) {
    need -= found[1];
    ties = found[2];
    prefix |= found[0] << shift;
    pmask |= (bins - 1) << shift;
}

// `need` of the `count` candidates in pool[],
// which share the bits `cmask` set to `cprefix`, by a radix select over the
// bits below the top 11 (levels of 11, 10, 11, 11, 10 bits) until a bin holds
// exactly the ones still needed; the last level's bins hold one candidate
// each. After it the chosen ones are those with (v & cmask) >= cprefix.
// The caller clears `hist` and writes pool[] before a CTA barrier (each
// level's find_digit clears the bins it reads, so no level clears or waits
// again).
#define SEL_CAND_LEVELS 5
__device__ __forceinline__ void pick_candidates(const u64* pool, u32 count, u32 need, u64& cprefix,
                                                u64& cmask, u32* hist, u32* sums, u32* found) {
    const u32 tid = threadIdx.x;
#pragma unroll 1
    for (int lv = 0; lv < SEL_CAND_LEVELS; ++lv) {
        const int shift = lv == 0 ? 42 : (lv == 1 ? 32 : (lv == 2 ? 21 : (lv == 3 ? 10 : 0)));
        const u32 bins = lv == 1 || lv == 4 ? 1024u : 2048u;
        for (u32 i = tid; i < count; i += SEL_THREADS) {
            const u64 v = pool[i];
            if ((v & cmask) == cprefix) atomicAdd(&hist[(u32)(v >> shift) & (bins - 1)], 1u);
        }
        __syncthreads();
        find_digit(bins,
                   [&](u32 b) {
                       const u32 c = hist[b];
                       hist[b] = 0u;  // only this thread reads bin b
                       return c;
                   },
                   [&](u32) { return need; }, sums, found);
        need -= found[1];
        cprefix |= (u64)found[0] << shift;
        cmask |= (u64)(bins - 1) << shift;
        if (found[2] == need) break;  // uniform: the whole bin is taken
    }
}

// One thread's PER consecutive logits of a row as keys (0 past the row's
// live length), and what emitting them needs.
template <int PER>
struct ThreadKeys {
    u32 key[PER];
    u32 first;  // the row position of key[0]
    u32 row;
    const float* lrow;
    i32* out_i;
    float* out_s;

    __device__ __forceinline__ ThreadKeys(const SelectParams& p, u32 r, u32 first_pos, u32 n)
        : first(first_pos), row(r), lrow(p.logits + (u64)r * p.logits_row_stride),
          out_i(p.out_indices + (u64)r * p.topk),
          out_s(p.out_scores ? p.out_scores + (u64)r * p.topk : nullptr) {
        // Vectors of 4 logits (PER 2: of 2), aligned as `first` is.
        constexpr int V = PER < 4 ? PER : 4;
#pragma unroll
        for (int i = 0; i < PER; i += V) {
            const u32 pos = first + i;
            float vs[4] = {0.f, 0.f, 0.f, 0.f};
            if (pos < n) {
                if constexpr (V == 4) {
                    const float4 v = *reinterpret_cast<const float4*>(lrow + pos);
                    vs[0] = v.x, vs[1] = v.y, vs[2] = v.z, vs[3] = v.w;
                } else {
                    const float2 v = *reinterpret_cast<const float2*>(lrow + pos);
                    vs[0] = v.x, vs[1] = v.y;
                }
            }
#pragma unroll
            for (int j = 0; j < V; ++j) key[i + j] = pos + j < n ? sel_key(vs[j]) : 0u;
        }
    }
    // The bit mask of the keys i for which sel(key[i]) holds.
    template <class Sel>
    __device__ __forceinline__ u32 mask(Sel&& sel) const {
        u32 m = 0;
#pragma unroll
        for (int i = 0; i < PER; ++i) m |= sel(key[i]) ? 1u << i : 0u;
        return m;
    }
    // How many of the keys equal `k`.
    __device__ __forceinline__ u32 count(u32 k) const {
        u32 c = 0;
#pragma unroll
        for (int i = 0; i < PER; ++i) c += key[i] == k ? 1u : 0u;
        return c;
    }
    // The keys equal to `k` among the first `take` of the row's, given
    // `ahead` of them in lower positions (ascending, the lowest indices).
    __device__ __forceinline__ u32 first_equal(u32 k, u32 ahead, u32 take) const {
        u32 seen = ahead, m = 0;
#pragma unroll
        for (int i = 0; i < PER; ++i) {
            if (key[i] == k) {
                m |= seen < take ? 1u << i : 0u;
                ++seen;
            }
        }
        return m;
    }
    // Calls store(slot, i) for each key i of `m`; lane 31 claims the warp's
    // slots with claim(count), which returns the first (one atomic per warp).
    template <class Claim, class Store>
    __device__ __forceinline__ void each(u32 m, Claim&& claim, Store&& store) const {
        const u32 mine = __popc(m);
        const u32 incl = warp_inclusive_sum(mine);
        const u32 warp_total = __shfl_sync(0xffffffffu, incl, 31);
        u32 base = 0;
        if (warp_total != 0) {
            if ((threadIdx.x & 31) == 31) base = claim(warp_total);
            base = __shfl_sync(0xffffffffu, base, 31);
        }
        u32 slot = base + incl - mine;
        for (; m != 0; m &= m - 1, ++slot) store(slot, (u32)(__ffs(m) - 1));
    }
    // Output slot `slot` gets row position `pos` (as a K-cache row when the
    // output is physical) and its logit.
    __device__ __forceinline__ void put(const SelectParams& p, u32 slot, u32 pos) const {
        put_index(p, slot, pos);
        if (out_s) out_s[slot] = lrow[pos];
    }
    // put() of a candidate, whose logit its key gives (no load from the
    // logits, which another CTA read: an L2 round trip on the pick's path).
    __device__ __forceinline__ void put_candidate(const SelectParams& p, u32 slot, u64 v) const {
        const u32 pos = ~(u32)v, k = (u32)(v >> 32);
        put_index(p, slot, pos);
        if (out_s) out_s[slot] = sel_key_is_exact(k) ? sel_value(k) : lrow[pos];
    }
    __device__ __forceinline__ void put_index(const SelectParams& p, u32 slot, u32 pos) const {
        i32 idx = (i32)pos;
        if (p.physical) {
            const i32 pid = p.page_table[(u64)row * p.pt_row_stride + pos / IDX_PAGE_ROWS];
            idx = (i32)((u32)pid * IDX_PAGE_ROWS + pos % IDX_PAGE_ROWS);
        }
        out_i[slot] = idx;
    }
    // Writes the positions of `m` to output slots from claim(count).
    template <class Claim>
    __device__ __forceinline__ void emit(const SelectParams& p, u32 m, Claim&& claim) const {
        each(m, claim, [&](u32 slot, u32 i) { put(p, slot, first + i); });
    }
    // Emits the keys whose first digit (top 11 bits) is above `prefix`'s
    // and gathers those that share it as candidates (store(slot,
    // candidate)), with one atomic per warp for both kinds of slot: claim(n)
    // adds n = (bin count << 32 | above count) and returns the counts before.
    template <class Claim, class Store>
    __device__ __forceinline__ void emit_and_gather(const SelectParams& p, u32 prefix, Claim&& claim,
                                                    Store&& store) const {
        // Bin d holds the keys lo..hi (lo >= 1: key 0 is no candidate); one
        // compare a key for each mask, as the key's top 11 bits need two.
        const u32 hi = prefix | 0x1fffffu, lo = max(prefix, 1u), span = hi - lo;
        u32 above = mask([&](u32 x) { return x > hi; });
        u32 bin = mask([&](u32 x) { return x - lo <= span; });
        const u32 a = __popc(above), b = __popc(bin);
        const u32 incl = warp_inclusive_sum(a | b << 16);  // a warp holds at most 32 * PER of each
        const u32 warp_total = __shfl_sync(0xffffffffu, incl, 31);
        u64 base = 0;
        if (warp_total != 0) {
            if ((threadIdx.x & 31) == 31) base = claim((u64)(warp_total >> 16) << 32 | (warp_total & 0xffffu));
            base = __shfl_sync(0xffffffffu, base, 31);
        }
        u32 sa = (u32)base + (incl & 0xffffu) - a;
        u32 sb = (u32)(base >> 32) + (incl >> 16) - b;
        for (; above != 0; above &= above - 1, ++sa) put(p, sa, first + (__ffs(above) - 1));
        // The candidates from the keys in registers (unrolled: key[i] at a
        // run-time i would go to local memory), not reloaded from the logits.
#pragma unroll
        for (int i = 0; i < PER; ++i) {
            if (bin >> i & 1u) store(sb++, candidate(key[i], first + i));
        }
    }
    // The `need` best of the `count` candidates in pool[] (gathered by
    // emit_and_gather for the first digit of `prefix`, `pmask`), written to
    // output slots from claim(count); any thread of the CTA may hold any.
    // `hist` clear and pool[] written before a CTA barrier (pick_candidates).
    template <class Claim>
    __device__ __forceinline__ void emit_picked(const SelectParams& p, const u64* pool, u32 count,
                                                u32 need, u32 prefix, u32 pmask, u32* hist,
                                                u32* sums, u32* found, Claim&& claim) const {
        u64 cprefix = (u64)prefix << 32, cmask = (u64)pmask << 32;
        pick_candidates(pool, count, need, cprefix, cmask, hist, sums, found);
        for (u32 b = 0; b < count; b += SEL_THREADS) {
            const u32 i = b + threadIdx.x;
            const u64 v = i < count ? pool[i] : 0u;
            const u32 m = i < count && (v & cmask) >= cprefix ? 1u : 0u;
            each(m, claim, [&](u32 slot, u32) { put_candidate(p, slot, v); });
        }
    }
    // Slots from..K-1 (fewer candidates than K): -1 / -inf, slot s by the
    // thread at s - from - start modulo stride.
    __device__ __forceinline__ void pad(u32 from, u32 start, u32 stride, u32 K) const {
        for (u32 s = from + start; s < K; s += stride) {
            out_i[s] = -1;
            if (out_s) out_s[s] = b12x_neg_inf();
        }
    }
};

template <int PER>
__device__ __forceinline__ void select_cluster(const SelectParams& p) {
    extern __shared__ u64 pool[];      // rank 0's holds the cluster's candidates
    __shared__ u32 hist[2][SEL_BINS];  // this CTA's digit counts, by level parity
    __shared__ u32 total_hist[SEL_BINS];
    __shared__ u32 sums[SEL_WARPS];
    // Rank 0's are the cluster's: the output slots taken, and the gather's
    // claims as (candidates << 16 | keys above), a 32-bit word (a 64-bit add
    // on a CTA's own shared memory is a compare-and-swap loop, which 32 warps
    // contended for).
    __shared__ u32 slots_taken, gathered;
    __shared__ u32 found[3];      // the level's digit, the count above it, its own count

    const u32 tid = threadIdx.x;
    const u32 rank = cluster_rank(), ranks = cluster_size();
    const u32 row = blockIdx.y;
    const u32 K = p.topk;
    RowLength length(p, row);
    // Own shared memory, cleared while the scorer drains.
    for (u32 b = tid; b < SEL_BINS; b += SEL_THREADS) hist[0][b] = hist[1][b] = 0u;
    if (tid == 0) slots_taken = 0u, gathered = 0u;
    const u32 n = length.wait_live(p, row);  // the scorer's logits are complete past here
    const ThreadKeys<PER> t(p, row, (rank * SEL_THREADS + tid) * PER, n);
    const u32* key = t.key;
    const u32 counter = dsmem(&slots_taken, 0);
    // Output slots from the counter in rank 0's shared memory.
    auto slots = [&](u32 c) { return dsmem_add(counter, c); };
    auto emit = [&](u32 m) { t.emit(p, m, slots); };

    // This CTA's zeroing before its own counts: the first access to another
    // CTA's shared memory (and to rank 0's slot words) comes after the level's
    // cluster barrier below, so none is needed here (its GPU-scope fence
    // would wait for the logits' loads, 4 us of decode_r64's tail on an H100).
    __syncthreads();
    u32 prefix = 0, pmask = 0, need = K, total = 0, ties = 0;
    bool gather = false;
    // Levels: digits of bits 31..21, 20..10, 9..0 (the last two only when
    // the first's bin is too big to gather).
#pragma unroll
    for (int level = 0; level < 3; ++level) {
        const int shift = level == 0 ? 21 : (level == 1 ? 10 : 0);
        const u32 bins = level == 2 ? 1024u : 2048u;
        u32* h = hist[level & 1];
#pragma unroll
        for (int i = 0; i < PER; ++i)
            if (key[i] != 0u && (key[i] & pmask) == prefix) atomicAdd(&h[(key[i] >> shift) & (bins - 1)], 1u);
        cluster_sync();
        // The cluster's counts, summed from every rank's histogram.
        for (u32 b = tid; b < bins; b += SEL_THREADS) {
            u32 s = 0;
#pragma unroll 8
            for (u32 r = 0; r < ranks; ++r) s += dsmem_load(dsmem(&h[b], r));
            total_hist[b] = s;
        }
        __syncthreads();
        find_digit(bins, [&](u32 b) { return total_hist[b]; },
                   [&](u32 all) { return level_need(level, all, K, total, need); }, sums, found);
        if (level == 0 && total <= K) break;  // uniform: every candidate is selected
        take_digit(found, shift, bins, need, ties, prefix, pmask);
        if (level == 0 && ties <= SC_CAND_CAP) {
            gather = true;
            break;
        }
        // The other parity's histogram is free (every rank read it last
        // level, before this level's cluster barrier): clear it for the next.
        for (u32 b = tid; b < SEL_BINS; b += SEL_THREADS) hist[(level + 1) & 1][b] = 0u;
        __syncthreads();
    }

    if (total <= K) {
        // Every candidate, then the padding.
        emit(t.mask([](u32 x) { return x != 0u; }));
        t.pad(total, rank * SEL_THREADS + tid, ranks * SEL_THREADS, K);
    } else if (gather) {
        // Keys above bin d go in; those in it go to rank 0's pool, which
        // picks `need` of them after one more cluster barrier (instead of two
        // more levels). No CTA reads another's shared memory after it.
        const u32 pool0 = dsmem(pool, 0);
        // Keys above bin d: at most K; candidates: at most SC_CAND_CAP.
        static_assert(IDX_TOPK_MAX < 65536 && SC_CAND_CAP < 65536, "the gather's counts share a word");
        const u32 gather_counter = dsmem(&gathered, 0);
        t.emit_and_gather(p, prefix,
                          [&](u64 c) {
                              const u32 old = dsmem_add(gather_counter, (u32)(c >> 32) << 16 | (u32)c);
                              return (u64)(old >> 16) << 32 | (old & 0xffffu);
                          },
                          [&](u32 slot, u64 v) { dsmem_store_u64(pool0 + slot * 8u, v); });
        // The pick's histogram (the level's sums, read before find_digit's
        // last barrier), cleared under this barrier.
        if (rank == 0)
            for (u32 b = tid; b < SEL_BINS; b += SEL_THREADS) total_hist[b] = 0u;
        cluster_sync();
        if (rank != 0) return;
        if (tid == 0) slots_taken = K - need;  // the keys above bin d took slots 0..K-need-1
        t.emit_picked(p, pool, ties, need, prefix, pmask, total_hist, sums, found,
                      [&](u32 c) { return atomicAdd(&slots_taken, c); });
        return;
    } else {
        // `prefix` is the k-th key: every key above it, then `need` of its
        // ties, the lowest indices. (Emitting each level's keys as the level
        // found them put global stores before every cluster barrier.) The
        // last level's histogram (parity 0) counts the ties per rank.
        emit(t.mask([&](u32 x) { return x > prefix; }));
        const u32 d = prefix & 1023u;
        u32 before = 0;
        for (u32 r = 0; r < rank; ++r) before += dsmem_load(dsmem(&hist[0][d], r));
        const u32 here = hist[0][d];
        const u32 take = need > before ? min(need - before, here) : 0u;
        u32 all;
        const u32 ahead = block_exclusive_sum<SEL_THREADS>(t.count(prefix), sums, all);
        emit(t.first_equal(prefix, ahead, take));
    }
    cluster_sync();  // no CTA leaves while another may still read its shared memory
}

// The entry points b12x_indexer_<NAME>_p{4,8,16} of selection FN<PER>.
#define SELECT_KERNELS(NAME, FN)                                                        \
    SELECT_KERNEL(NAME, FN, 4)                                                          \
    SELECT_KERNEL(NAME, FN, 8)                                                          \
    SELECT_KERNEL(NAME, FN, 16)
#define SELECT_KERNEL(NAME, FN, PER)                                                    \
    B12X_KERNEL void __launch_bounds__(SEL_THREADS, 1)                                  \
        b12x_indexer_##NAME##_p##PER(const SelectParams p) {                            \
        FN<PER>(p);                                                                     \
    }

SELECT_KERNELS(select, select_cluster)

// ---------------------------------------------------------------------------
// Exact top-k of a few long rows by a grid of CTAs per row (sm_90).
//
// A cluster holds at most 8 SMs (16 measured slower), and one row's selection
// on 8 SMs is a chain of CTA barriers over 16 keys per thread: 21 us for
// 131072 logits on one H200 while 124 SMs idle. Here G CTAs (4 to 128) split
// the row instead. They agree on the k-th key's top 11 bits first: every CTA
// histograms that digit of its keys in shared memory, adds the nonzero counts
// to the row's global histogram, and waits at the row's barrier (one counter,
// G arrivals); then every CTA reads the sums from L2 and finds the same digit
// d, with `above` keys in higher bins and `ties` in bin d.
//
// Usually bin d is small (a few hundred keys of 131072: the top of a row is
// its sparse tail). Then every CTA emits its keys above d (slots from the
// row's global counter), appends those in d to the row's candidates, and
// counts itself done; the row's last CTA picks the K - above best candidates
// by a radix select in shared memory over (key, lowest index first), without
// another row barrier. (The round before had three barriers of about 2 us
// each; both rounds are in bench-results/h200/indexer-round14-notes.md.)
//
// When bin d holds more than SG_CAND_CAP keys (many equal logits), the row
// goes on as before: two more levels of 11 and 10 bits give the k-th key
// exactly, every key above it is emitted, then the ties it needs, lowest
// indices first (one more barrier, and only when some ties are left out).
//
// The scorer before this kernel zeroed the row's state (histograms and
// counters, in the scratch) and this kernel reads it only past pdl_wait, so
// nothing persists between calls. All G CTAs of a row must be resident at
// once: the launcher keeps rows * G <= SMs, and the candidates' dynamic
// shared memory (with the static, more than half an SM's) keeps one CTA per
// SM; at 32 registers two fitted, which measured 2 us slower.
#define SG_LEVELS 3
#define SG_MAX_PARTS 128
#define SG_ARRIVE (SG_LEVELS * SEL_BINS)  // barrier arrivals
#define SG_DONE (SG_ARRIVE + 1)           // CTAs done with the candidates
#define SG_SLOTS (SG_ARRIVE + 2)          // output slots taken; with the next word a u64
#define SG_CANDS (SG_ARRIVE + 3)          // candidates gathered (the high word)
#define SG_TIES (SG_ARRIVE + 128)         // per-CTA counts of the k-th key
#define SG_STATE_WORDS 6400  // rust/core SELECT_STATE_WORDS
static_assert(SG_STATE_WORDS == SG_TIES + SG_MAX_PARTS, "the row state's layout");
#define SG_CAND_CAP 14336  // rust/core SELECT_CANDIDATES; x 8 bytes of dynamic shared memory

// Waits until `target` arrivals (every CTA of the row, once per barrier so
// far) at the row's counter: this CTA's global writes and atomics before it
// happen before every CTA's reads after it (the CTA barrier, then one
// thread's release add and acquire polls at GPU scope).
__device__ __forceinline__ void row_barrier(u32* arrive, u32 target) {
    __syncthreads();
    if (threadIdx.x == 0) {
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(arrive) : "memory");
        u32 seen;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(arrive) : "memory");
        } while (seen < target);
    }
    __syncthreads();
}

// Whether this CTA is the last of `parts` to arrive at `done`; the others'
// global writes before their arrival happen before its reads after it.
__device__ __forceinline__ bool last_to_arrive(u32* done, u32 parts, u32* flag) {
    __syncthreads();
    if (threadIdx.x == 0) {
        u32 old;
        asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(old) : "l"(done) : "memory");
        *flag = old == parts - 1;
    }
    __syncthreads();
    return *flag != 0u;
}

template <int PER>
__device__ __forceinline__ void select_grid(const SelectParams& p) {
    extern __shared__ u64 pool[];   // the last CTA's copy of the candidates
    __shared__ u32 hist[SEL_BINS];  // this CTA's counts of the level
    __shared__ u32 sums[SEL_WARPS];
    __shared__ u32 found[3];  // the level's digit, the count above it, its own count
    __shared__ u32 flag;
    __shared__ u32 picked;  // the last CTA's output slots

    const u32 tid = threadIdx.x;
    const u32 part = blockIdx.x, parts = gridDim.x, row = blockIdx.y;
    const u32 K = p.topk;
    u32* st = p.state + (u64)row * SG_STATE_WORDS;
    RowLength length(p, row);
    for (u32 b = tid; b < SEL_BINS; b += SEL_THREADS) hist[b] = 0u;
    // The scorer's logits and its zeroing of `st` are complete past here.
    const u32 n = length.wait_live(p, row);
    const ThreadKeys<PER> t(p, row, (part * SEL_THREADS + tid) * PER, n);
    const u32* key = t.key;
    auto slots = [&](u32 c) { return atomicAdd(&st[SG_SLOTS], c); };  // the row's output slots
    auto emit = [&](u32 m) { t.emit(p, m, slots); };

    u32 prefix = 0, pmask = 0, need = K, total = 0, ties = 0;
    bool gather = false;
    // Levels: digits of bits 31..21, 20..10, 9..0 (the last two only when
    // the first's bin is too big to gather).
#pragma unroll
    for (int level = 0; level < SG_LEVELS; ++level) {
        const int shift = level == 0 ? 21 : (level == 1 ? 10 : 0);
        const u32 bins = level == 2 ? 1024u : 2048u;
        u32* gh = st + level * SEL_BINS;
        if (level == 0) __syncthreads();  // `hist` zeroed (later levels: before the barrier)
#pragma unroll
        for (int i = 0; i < PER; ++i)
            if (key[i] != 0u && (key[i] & pmask) == prefix)
                atomicAdd(&hist[(key[i] >> shift) & (bins - 1)], 1u);
        __syncthreads();
        for (u32 b = tid; b < bins; b += SEL_THREADS) {
            const u32 c = hist[b];
            if (c != 0u) atomicAdd(&gh[b], c);
            hist[b] = 0u;  // for the next level (past this level's barrier)
        }
        row_barrier(&st[SG_ARRIVE], (level + 1) * parts);
        find_digit(bins, [&](u32 b) { return __ldcg(&gh[b]); },
                   [&](u32 all) { return level_need(level, all, K, total, need); }, sums, found);
        if (level == 0 && total <= K) break;  // uniform over the row: every candidate goes in
        take_digit(found, shift, bins, need, ties, prefix, pmask);
        if (level == 0 && ties <= SG_CAND_CAP) {
            gather = true;
            break;
        }
    }

    if (total <= K) {
        // Every candidate, then the padding.
        emit(t.mask([](u32 x) { return x != 0u; }));
        t.pad(total, part * SEL_THREADS + tid, parts * SEL_THREADS, K);
        return;
    }
    if (gather) {
        // Keys above bin d go in; those in it (candidates as (key, ~index),
        // the larger the better) wait for the row's last CTA.
        u64* cand = p.cand + (u64)row * SG_CAND_CAP;
        static_assert(SG_SLOTS % 2 == 0 && SG_CANDS == SG_SLOTS + 1 && SG_STATE_WORDS % 2 == 0, "one u64");
        auto* counts = reinterpret_cast<unsigned long long*>(&st[SG_SLOTS]);
        t.emit_and_gather(p, prefix, [&](u64 c) { return (u64)atomicAdd(counts, (unsigned long long)c); },
                          [&](u32 slot, u64 v) { cand[slot] = v; });
        if (!last_to_arrive(&st[SG_DONE], parts, &flag)) return;
        for (u32 i = tid; i < ties; i += SEL_THREADS) pool[i] = __ldcg(&cand[i]);
        if (tid == 0) picked = K - need;  // the keys above bin d took slots 0..K-need-1
        __syncthreads();  // the pool written; `hist` is clear since level 0 moved its counts
        t.emit_picked(p, pool, ties, need, prefix, pmask, hist, sums, found,
                      [&](u32 c) { return atomicAdd(&picked, c); });
        return;
    }
    // `prefix` is the k-th key: every key above it goes in, and `need` of the
    // `ties` keys equal to it. When that is all of them every CTA takes its
    // own; otherwise the lowest indices: CTAs hold ascending ranges, so each
    // learns how many the lower ones hold (one more barrier).
    emit(t.mask([&](u32 x) { return x > prefix; }));
    u32 count;
    const u32 ahead = block_exclusive_sum<SEL_THREADS>(t.count(prefix), sums, count);
    u32 take = count;
    if (need < ties) {
        if (tid == 0) st[SG_TIES + part] = count;
        row_barrier(&st[SG_ARRIVE], (SG_LEVELS + 1) * parts);
        const u32 lower = tid < part ? __ldcg(&st[SG_TIES + tid]) : 0u;  // the lower CTAs' counts
        u32 all_lower;
        (void)block_exclusive_sum<SEL_THREADS>(lower, sums, all_lower);
        take = need > all_lower ? min(need - all_lower, count) : 0u;
    }
    emit(t.first_equal(prefix, ahead, take));
}

SELECT_KERNELS(gselect, select_grid)
// Rows over the most CTAs (decode_r1: 131072 logits over 64; at 1 a thread
// over 128 measured no faster, bench-results/h200/indexer-round32-notes.md).
SELECT_KERNEL(gselect, select_grid, 2)
