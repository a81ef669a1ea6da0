"""Does the order of a page gather change what HBM gives it?

    python3 tools/gpu/gather_order_probe.py [OUT.json]
    GATHER_PROBE_ONLY=KEY[,KEY...] GATHER_PROBE_REPS=1 compute-sanitizer python3 \
        tools/gpu/gather_order_probe.py   (those runs, e.g. random_s8_c2_x1, once)

decode_r64_L32768 reads all 32768 pages of its cache (8448 bytes each),
every page once, at ids that `b12x bench indexer` draws as one random
permutation. round 5's `hbm_probe.py` put that gather at 3.50 TB/s against
4.3 TB/s for a streaming read; the scorer and DeepGEMM's logits run at
3.3-3.4. Which pages are read is fixed by the table; the order in which a CTA
reads its share of them is not. This probe reads the same pages in
different orders with the scorer's access pattern (one CTA an SM, each a
contiguous chunk of the row-major table, one warp issuing a bulk copy per
page into a ring of shared-memory stages, consumer warps releasing them),
so the difference between orders is what a scorer that reorders its
chunk could gain:

  random          the bench's table
  ascending       each table row sorted (`b12x bench indexer --page-order ascending`)
  segment_sorted  each CTA's segment (its chunk within one row) sorted: what
                  a producer that sorts the ids it loads would issue
  chunk_sorted    each CTA's whole chunk sorted across its rows: one sweep a
                  CTA (a scorer would switch Q rows page by page)
  bucketsN        each segment ordered by id * N / pages (stable): a
                  counting sort into N buckets, cheaper than a full sort
  identity        page i at entry i: a streaming read through the same kernel
  sweep           every CTA's k-th read within the same narrow window of ids
                  (pages k G .. k G + G - 1 for a grid of G): the whole grid
                  sweeps the cache once in address order, as a streaming read
                  does; a scorer would take pages of many rows (not one
                  row's chunk) to read this way

Then, on random, identity and sweep, other shapes of the same gather
(SHAPES): 2-4 CTAs an SM (more issuing warps, fewer stages each), one CTA
with 2 or 4 issuing warps sharing its ring (round 33: is it the issuers or
the CTAs that 2-4 CTAs an SM gain from?), and each page as 2 or 4 bulk
copies (smaller requests): whether the one-copy-a-page ring itself is what
caps the rate.

CuPy kernels, CUDA events, a 120 MiB buffer rewritten before every sample so
the L2 holds none of the cache; medians of 20 samples (every sample in the
JSON).
"""

from __future__ import annotations

import os
import sys
from functools import partial

import numpy as np

SOURCE = r"""
typedef unsigned int u32;
typedef unsigned long long u64;

__device__ __forceinline__ u32 saddr(const void* p) {
    return (u32)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void bar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void bar_wait(u32 bar, u32 parity) {
    asm volatile(
        "{\n .reg .pred done;\n"
        "wait_%=:\n"
        " mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        " @!done bra wait_%=;\n}\n" :: "r"(bar), "r"(parity) : "memory");
}
__device__ __forceinline__ void bar_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(bar) : "memory");
}

// CTA g gathers table entries [g n / G, (g + 1) n / G): the issuing warps
// (the first `issuers`) load 32 ids at a time, and lane 0 of warp
// i % issuers copies page table[i] into ring stage i % stages (`split` bulk
// copies of page_bytes / split, completion counted on the stage's full
// barrier); consumer warp i % consumers waits for it, reads a word of it and
// frees the stage.
extern "C" __global__ void __launch_bounds__(256, 1)
ring_gather(const unsigned char* __restrict__ base, const int* __restrict__ table,
            u32 entries, u32 page_bytes, u32 stages, u32 split, u32 issuers, unsigned* out) {
    extern __shared__ __align__(128) unsigned char smem[];
    const u32 full0 = saddr(smem + stages * page_bytes), empty0 = full0 + 8 * stages;
    const u32 a = (u32)((u64)blockIdx.x * entries / gridDim.x);
    const u32 b = (u32)((u64)(blockIdx.x + 1) * entries / gridDim.x);
    const u32 warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const u32 consumers = blockDim.x / 32 - issuers;
    if (threadIdx.x == 0) {
        for (u32 s = 0; s < stages; ++s) {
            bar_init(full0 + 8 * s, 1);
            bar_init(empty0 + 8 * s, 1);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (warp < issuers) {
        for (u32 i0 = a; i0 < b; i0 += 32) {
            const int mine = i0 + lane < b ? table[i0 + lane] : 0;
            const u32 count = min(32u, b - i0);
            for (u32 j = 0; j < count; ++j) {
                const int pid = __shfl_sync(0xffffffffu, mine, j);
                const u32 k = i0 + j - a, s = k % stages;
                if (k % issuers != warp) continue;  // another issuer's page
                bar_wait(empty0 + 8 * s, ((k / stages) & 1) ^ 1);
                if (lane == 0) {
                    const u32 full = full0 + 8 * s, dst = saddr(smem + s * page_bytes);
                    const unsigned char* src = base + (u64)pid * page_bytes;
                    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                                 :: "r"(full), "r"(page_bytes) : "memory");
                    const u32 part = page_bytes / split;
                    for (u32 c = 0; c < split; ++c)
                        asm volatile(
                            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
                            " [%0], [%1], %2, [%3];"
                            :: "r"(dst + c * part), "l"(src + c * part), "r"(part), "r"(full)
                            : "memory");
                }
                __syncwarp();
            }
        }
        return;
    }
    unsigned acc = 0;
    for (u32 k = warp - issuers; k < b - a; k += consumers) {
        const u32 s = k % stages;
        bar_wait(full0 + 8 * s, (k / stages) & 1);
        acc ^= reinterpret_cast<const unsigned*>(smem + s * page_bytes)[lane];
        __syncwarp();
        if (lane == 0) bar_arrive(empty0 + 8 * s);
    }
    if (acc == 0x12345678u) out[0] = acc;  // keeps the reads
}
"""
PAGE_BYTES = 8448
ROWS, WIDTH = 64, 512  # decode_r64_L32768: 64 rows of 512 pages
GRID = 132  # one CTA an SM (H100 / H200)
# the orders also timed at 8 and 24 stages (the rest at 16 only)
DEPTH_ORDERS = ("random", "segment_sorted", "chunk_sorted", "identity", "sweep")
CONSUMERS = 4  # consumer warps (the decode scorer's four warpgroups), after the issuing warps
# (CTAs an SM, stages a CTA, bulk copies a page, issuing warps a CTA) also
# timed on random, identity and sweep: whether more issuers, or smaller
# copies, move more bytes than the scorer's one CTA an SM with one copy a page
SHAPES = ((1, 16, 2, 1), (1, 16, 4, 1), (2, 8, 1, 1), (2, 8, 2, 1), (3, 8, 1, 1), (4, 4, 1, 1),
          (1, 16, 1, 2), (1, 16, 1, 4))  # fmt: skip
SMEM_PER_SM = 228 * 1024  # H100 / H200; the runtime keeps 1 KiB of it a CTA


def smem_bytes(stages: int) -> int:
    """A CTA's dynamic shared memory: its ring, then a full and an empty barrier a stage."""
    return stages * PAGE_BYTES + 16 * stages


def threads(issuers: int) -> int:
    """A CTA's threads: its issuing warps, then the consumer warps."""
    return 32 * (issuers + CONSUMERS)


def shape_fits(per_sm: int, stages: int, split: int, issuers: int = 1) -> bool:
    """Whether `per_sm` CTAs of `stages` stages share one SM, each stage always
    freed by the same consumer warp and filled by the same issuing warp, and a
    page cuts into `split` bulk copies of a multiple of 16 bytes (else the
    barrier's expected bytes are never met and the kernel hangs).

    The stages must be a multiple of the consumers: a consumer waits for its
    stage's phase by parity, which only tells phases apart one apart. With a
    stage shared by two consumers (6 stages, 4 consumers), one can reach the
    stage two phases ahead, pass the wait at once, free the stage a second
    time and break the ring (an H100 run of 4 CTAs of 6 stages failed so)."""
    return (
        stages % CONSUMERS == 0
        and stages % issuers == 0
        and threads(issuers) <= 256  # the kernel's launch bound
        and per_sm * (smem_bytes(stages) + 1024) <= SMEM_PER_SM
        and PAGE_BYTES % split == 0
        and (PAGE_BYTES // split) % 16 == 0
    )


def segments(entries: int, grid: int, width: int) -> list[tuple[int, int]]:
    """[start, end) of each CTA's chunk cut at the table's row boundaries."""
    out = []
    for g in range(grid):
        a, b = g * entries // grid, (g + 1) * entries // grid
        while a < b:
            end = min(b, (a // width + 1) * width)
            out.append((a, end))
            a = end
    return out


def orders(rng: np.random.Generator, grid: int = GRID) -> dict[str, np.ndarray]:
    pages = ROWS * WIDTH
    rand = rng.permutation(pages).astype(np.int32)
    out = {"random": rand, "ascending": np.sort(rand.reshape(ROWS, WIDTH), axis=1).ravel()}
    segs = segments(pages, grid, WIDTH)
    seg = rand.copy()
    for a, b in segs:
        seg[a:b] = np.sort(seg[a:b])
    out["segment_sorted"] = seg
    chunk = rand.copy()
    for g in range(grid):
        a, b = g * pages // grid, (g + 1) * pages // grid
        chunk[a:b] = np.sort(chunk[a:b])
    out["chunk_sorted"] = chunk
    for n in (16, 64, 256):
        bucketed = rand.copy()
        for a, b in segs:
            part = bucketed[a:b]
            bucketed[a:b] = part[np.argsort(part.astype(np.int64) * n // pages, kind="stable")]
        out[f"buckets{n}"] = bucketed
    out["identity"] = np.arange(pages, dtype=np.int32)
    out["sweep"] = sweep(pages, grid)
    return out


def sweep(pages: int, grid: int) -> np.ndarray:
    """A table whose CTA g (chunk [g n / G, (g + 1) n / G)) reads, at its k-th
    entry, the page ranked (k, g) among all (entry within chunk, CTA) pairs:
    at step k the grid reads ids k G .. k G + G - 1 (about)."""
    pos = np.arange(pages, dtype=np.int64)
    cta = np.searchsorted(np.arange(1, grid + 1) * pages // grid, pos, side="right")
    k = pos - cta * pages // grid
    table = np.empty(pages, dtype=np.int32)
    table[pos[np.lexsort((cta, k))]] = np.arange(pages, dtype=np.int32)
    return table


def main() -> int:
    # here, not at the top: the orders above are checked without a GPU
    import cupy as cp
    from hbm_probe import median_us, report  # beside this script

    kernel = cp.RawModule(code=SOURCE, options=("-arch=sm_90",)).get_function("ring_gather")
    out = cp.zeros(1, dtype=cp.uint32)
    flush = cp.empty(2 * 60 * 2**20 // 4, dtype=cp.uint32)
    pages = ROWS * WIDTH
    cache = cp.random.randint(0, 255, size=pages * PAGE_BYTES, dtype=cp.uint8)
    results: dict[str, dict] = {}
    tables = {k: cp.asarray(v) for k, v in orders(np.random.default_rng(1234)).items()}
    runs = [(name, 1, stages, 1, 1) for stages in (8, 16, 24) for name in tables
            if stages == 16 or name in DEPTH_ORDERS]  # fmt: skip
    runs += [(name, *shape) for shape in SHAPES for name in ("random", "identity", "sweep")]
    only = os.environ.get("GATHER_PROBE_ONLY")
    reps = int(os.environ.get("GATHER_PROBE_REPS", "20"))
    for name, per_sm, stages, split, issuers in runs:
        key = f"{name}_s{stages}" + (f"_c{per_sm}_x{split}" if (per_sm, split) != (1, 1) else "")
        key += f"_i{issuers}" if issuers != 1 else ""
        if only is not None and not any(key == k for k in only.split(",")):
            continue
        if not shape_fits(per_sm, stages, split, issuers):
            shape = (per_sm, stages, split, issuers)
            raise SystemExit(f"gather_order_probe: shape {shape} does not fit an SM")
        smem = smem_bytes(stages)
        kernel.max_dynamic_shared_size_bytes = smem
        table = tables[name] if name != "sweep" else cp.asarray(sweep(pages, GRID * per_sm))
        args = (cache, table, np.uint32(pages), np.uint32(PAGE_BYTES), np.uint32(stages),
                np.uint32(split), np.uint32(issuers), out)  # fmt: skip
        launch = partial(kernel, (GRID * per_sm,), (threads(issuers),), args, shared_mem=smem)
        print(f"gather_order_probe: {key}", file=sys.stderr, flush=True)
        try:
            launch()  # warm: the module's load and the first touch stay out of the samples
            cp.cuda.runtime.deviceSynchronize()
            us, samples = median_us(launch, flush, reps)
        except cp.cuda.runtime.CUDARuntimeError as e:
            # the context is lost: keep what was measured, name the run that failed
            report(results)
            raise SystemExit(f"gather_order_probe: {key} failed: {e}") from e
        results[key] = {
            "order": name, "stages": stages, "ctas_per_sm": per_sm, "copies_per_page": split,
            "issuers": issuers,
            "median_us": us, "TBps": pages * PAGE_BYTES / us / 1e6, "samples_us": samples,
        }  # fmt: skip
    report(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
