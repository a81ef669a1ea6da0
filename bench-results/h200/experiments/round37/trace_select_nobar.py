"""(branch sel-nobar-gather: T[1] after pdl_wait, T[2] after the zeroing) Adds globaltimer stamps to select_cluster (kernels/indexer_select.cu) for a
diagnostic wheel: `python3 trace_select.py kernels/indexer_select.cu`, then
`./dev ptx && ./dev wheel`. Never for main. Thread 0 of each CTA prints
`SCTRACE lead|peer row R ... phase ns ...` (trace_summary.py reads them)."""
import sys

p = sys.argv[1]
s = open(p).read()


def sub(old, new):
    global s
    assert old in s, old
    s = s.replace(old, new, 1)


sub('#include "indexer_common.cuh"\n', '''#include "indexer_common.cuh"
extern "C" __device__ int vprintf(const char*, const char*);
__device__ __forceinline__ unsigned long long sc_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
    return t;
}
#define SC_STAMP(i) do { __syncthreads(); T[i] = sc_now(); } while (0)
''')
sub('''    const u32 K = p.topk;
    pdl_wait();''', '''    const u32 K = p.topk;
    unsigned long long T[10] = {};
    T[0] = sc_now();
    pdl_wait();
    T[1] = sc_now();''')
sub('''    // would wait for the logits' loads, 4 us of decode_r64's tail on an H100).
    __syncthreads();
''', '''    // would wait for the logits' loads, 4 us of decode_r64's tail on an H100).
    __syncthreads();
    T[2] = sc_now();
''')
sub('''            if (key[i] != 0u && (key[i] & pmask) == prefix) atomicAdd(&h[(key[i] >> shift) & (bins - 1)], 1u);
        cluster_sync();''', '''            if (key[i] != 0u && (key[i] & pmask) == prefix) atomicAdd(&h[(key[i] >> shift) & (bins - 1)], 1u);
        if (level == 0) SC_STAMP(3);
        cluster_sync();
        if (level == 0) T[4] = sc_now();''')
sub('''        if (level == 0 && total <= K) break;  // uniform: every candidate is selected
        take_digit''', '''        if (level == 0) T[5] = sc_now();
        if (level == 0 && total <= K) break;  // uniform: every candidate is selected
        take_digit''')
sub('''        cluster_sync();
        t.emit_above(p, above);
        if (rank != 0) return;
        u32* slot_counter = reinterpret_cast<u32*>(&counters);  // the low word
        t.emit_picked(p, pool, ties, need, prefix, pmask, total_hist, sums, found,
                      [&](u32 c) { return atomicAdd(slot_counter, c); });
        return;''', '''        SC_STAMP(6);
        cluster_sync();
        T[7] = sc_now();
        t.emit_above(p, above);
        SC_STAMP(8);
        const u32 need0 = need;
        if (rank == 0) {
        u32* slot_counter = reinterpret_cast<u32*>(&counters);  // the low word
        t.emit_picked(p, pool, ties, need, prefix, pmask, total_hist, sums, found,
                      [&](u32 c) { return atomicAdd(slot_counter, c); });
        SC_STAMP(9);
        }
        if (tid == 0) {
            struct { unsigned r, tot, ti, nd; unsigned long long t0, z, w, h, x, d, g, s, a, pk; } a =
                {row, total, ties, need0, T[0], T[1]-T[0], T[2]-T[1], T[3]-T[2], T[4]-T[3], T[5]-T[4],
                 T[6]-T[5], T[7]-T[6], T[8]-T[7], rank == 0 ? T[9]-T[8] : 0ull};
            vprintf(rank == 0 ? "SCTRACE lead row %u total %u ties %u need %u t0 %llu zero %llu wait %llu hist %llu xchg %llu digit %llu gather %llu sync %llu above %llu pick %llu\\n"
                              : "SCTRACE peer row %u total %u ties %u need %u t0 %llu zero %llu wait %llu hist %llu xchg %llu digit %llu gather %llu sync %llu above %llu pick %llu\\n", (const char*)&a);
        }
        return;''')
open(p, "w").write(s)
