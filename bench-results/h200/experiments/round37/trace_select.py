"""Globaltimer stamps in select_cluster (kernels/indexer_select.cu) for a
diagnostic wheel, never for main:

    python3 trace_select.py FORM kernels/indexer_select.cu && ./dev ptx && ./dev wheel

FORM is the source it patches: `sz2` (branch sel-early: the zeroing barrier
before pdl_wait; traced as `tz/`), `sy` (branch sel-nobar-gather: no first
cluster barrier, the gather split; `tsy/`, where the field named `zero` is
the wait for the scorer and `wait` the loads and zeroing) or `main` (main @
f728fc2; `tm/`), or `claim` (main, and thread 0's time to its gather
masks and to its claim's return; built, not yet run). Thread 0 of each CTA prints `SCTRACE lead|peer row R ...
phase ns ...` (tools/gpu/trace_summary.py reads them)."""
import sys

STAMPS = ('#include "indexer_common.cuh"\n', '''#include "indexer_common.cuh"
extern "C" __device__ int vprintf(const char*, const char*);
__device__ __forceinline__ unsigned long long sc_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
    return t;
}
#define SC_STAMP(i) do { __syncthreads(); T[i] = sc_now(); } while (0)
''')
# The first level's stamps, the same in every form.
LEVEL = [
    ('''            if (key[i] != 0u && (key[i] & pmask) == prefix) atomicAdd(&h[(key[i] >> shift) & (bins - 1)], 1u);
        cluster_sync();''', '''            if (key[i] != 0u && (key[i] & pmask) == prefix) atomicAdd(&h[(key[i] >> shift) & (bins - 1)], 1u);
        if (level == 0) SC_STAMP(3);
        cluster_sync();
        if (level == 0) T[4] = sc_now();'''),
    ('''        if (level == 0 && total <= K) break;  // uniform: every candidate is selected
        take_digit''', '''        if (level == 0) T[5] = sc_now();
        if (level == 0 && total <= K) break;  // uniform: every candidate is selected
        take_digit'''),
]
def report(*phases: tuple[str, str]) -> str:
    """Thread 0's line: the row's counts, then each (name, C expression) of
    the phases in ns."""
    names = " ".join(f"{name} %llu" for name, _ in phases)
    fields = ", ".join(f"f{i}" for i in range(len(phases)))
    values = ", ".join(expr for _, expr in phases)
    line = f"row %u total %u ties %u need %u t0 %llu {names}\\n"
    return f"""        if (tid == 0) {{
            struct {{ unsigned r, tot, ti, nd; unsigned long long t0, {fields}; }} a =
                {{row, total, ties, need0, T[0], {values}}};
            vprintf(rank == 0 ? "SCTRACE lead {line}" : "SCTRACE peer {line}", (const char*)&a);
        }}
        return;"""


# The gather path of sz2 and sy (the gather split from the above keys' stores).
SPLIT_GATHER = [
    ('''        cluster_sync();
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
''' + report(
        ("zero", "T[1]-T[0]"), ("wait", "T[2]-T[1]"), ("hist", "T[3]-T[2]"), ("xchg", "T[4]-T[3]"),
        ("digit", "T[5]-T[4]"), ("gather", "T[6]-T[5]"), ("sync", "T[7]-T[6]"), ("above", "T[8]-T[7]"),
        ("pick", "rank == 0 ? T[9]-T[8] : 0ull"),
    )),
]
SZ2 = [
    ('''    const u32 K = p.topk;
    // Behind this call's scorer''', '''    const u32 K = p.topk;
    unsigned long long T[10] = {};
    T[0] = sc_now();
    // Behind this call's scorer'''),
    ('''    cluster_sync();  // zeroed histograms and counters before any CTA counts or adds
    pdl_wait();  // the scorer's logits are complete past here
''', '''    cluster_sync();  // zeroed histograms and counters before any CTA counts or adds
    T[1] = sc_now();
    pdl_wait();  // the scorer's logits are complete past here
    T[2] = sc_now();
'''),
] + LEVEL + SPLIT_GATHER
# sy and main: past pdl_wait, then the zeroing and its CTA barrier (main's trace
# `tm/` was built with T[11]; 10 stamps are all it takes).
NO_FIRST_BARRIER = [
    ('''    const u32 K = p.topk;
    pdl_wait();''', '''    const u32 K = p.topk;
    unsigned long long T[10] = {};
    T[0] = sc_now();
    pdl_wait();
    T[1] = sc_now();'''),
    ('''    // would wait for the logits' loads, 4 us of decode_r64's tail on an H100).
    __syncthreads();
''', '''    // would wait for the logits' loads, 4 us of decode_r64's tail on an H100).
    __syncthreads();
    T[2] = sc_now();
'''),
]
SY = NO_FIRST_BARRIER + LEVEL + SPLIT_GATHER
def main_gather(*phases: tuple[str, str]) -> tuple[str, str]:
    """main's gather path with stamps, reporting `phases`."""
    return (
        '''                          [&](u32 slot, u64 v) { dsmem_store_u64(pool0 + slot * 8u, v); });
        cluster_sync();
        if (rank != 0) return;
        u32* slot_counter = reinterpret_cast<u32*>(&counters);  // the low word, unused so far
        if (tid == 0) *slot_counter = K - need;  // the keys above bin d took slots 0..K-need-1
        t.emit_picked(p, pool, ties, need, prefix, pmask, total_hist, sums, found,
                      [&](u32 c) { return atomicAdd(slot_counter, c); });
        return;''', '''                          [&](u32 slot, u64 v) { dsmem_store_u64(pool0 + slot * 8u, v); });
        T[6] = sc_now();
        SC_STAMP(7);
        cluster_sync();
        T[8] = sc_now();
        const u32 need0 = need;
        if (rank == 0) {
        u32* slot_counter = reinterpret_cast<u32*>(&counters);  // the low word, unused so far
        if (tid == 0) *slot_counter = K - need;  // the keys above bin d took slots 0..K-need-1
        t.emit_picked(p, pool, ties, need, prefix, pmask, total_hist, sums, found,
                      [&](u32 c) { return atomicAdd(slot_counter, c); });
        SC_STAMP(9);
        }
'''
        + report(*phases),
    )


MAIN = NO_FIRST_BARRIER + LEVEL + [
    main_gather(
        ("wait", "T[1]-T[0]"), ("load", "T[2]-T[1]"), ("hist", "T[3]-T[2]"), ("xchg", "T[4]-T[3]"),
        ("digit", "T[5]-T[4]"), ("gather0", "T[6]-T[5]"), ("gather", "T[7]-T[5]"), ("sync", "T[8]-T[7]"),
        ("pick", "rank == 0 ? T[9]-T[8] : 0ull"),
    )
]
# main, and thread 0's time from the digit to its gather masks and to its
# claim's return (stamps that wait on those values; built, not yet run).
CLAIM = NO_FIRST_BARRIER + LEVEL + [
    (
        "#define SC_STAMP(i)",
        """__shared__ unsigned long long sc_claim_t, sc_mask_t;
__device__ __forceinline__ unsigned long long sc_now_after(unsigned long long dep) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t) : "l"(dep) : "memory");
    return t;
}
#define SC_STAMP(i)""",
    ),
    (
        """        const u32 a = __popc(above), b = __popc(bin);
        const u32 incl""",
        """        const u32 a = __popc(above), b = __popc(bin);
        if (threadIdx.x == 0) sc_mask_t = sc_now_after((u64)above << 32 | bin);
        const u32 incl""",
    ),
    (
        """            base = __shfl_sync(0xffffffffu, base, 31);
        }
        u32 sa""",
        """            base = __shfl_sync(0xffffffffu, base, 31);
        }
        if (threadIdx.x == 0) sc_claim_t = sc_now_after(base);  // after the claim returned
        u32 sa""",
    ),
    main_gather(
        ("wait", "T[1]-T[0]"), ("load", "T[2]-T[1]"), ("hist", "T[3]-T[2]"), ("xchg", "T[4]-T[3]"),
        ("digit", "T[5]-T[4]"), ("mask", "sc_mask_t-T[5]"), ("claim", "sc_claim_t-T[5]"),
        ("sync", "T[8]-T[7]"), ("pick", "rank == 0 ? T[9]-T[8] : 0ull"),
    ),
]


def main() -> None:
    form, path = sys.argv[1], sys.argv[2]
    s = open(path).read()
    for old, new in [STAMPS, *{"sz2": SZ2, "sy": SY, "main": MAIN, "claim": CLAIM}[form]]:
        assert old in s, old
        s = s.replace(old, new, 1)
    open(path, "w").write(s)


if __name__ == "__main__":
    main()
