"""HBM read ceilings on a GPU host: a streaming read and the decode scorer's page gather.

    python3 tools/gpu/hbm_probe.py [OUT.json]

The indexer's decode case reads 32768 pages of 8448 bytes at random page ids
(`b12x bench indexer`'s decode_r64_L32768); its floor is those bytes over
what the memory system gives for that pattern, not over the streaming rate.
Both are timed here with plain 16-byte loads (CuPy kernels; CUDA events;
a 120 MiB buffer rewritten before every sample so the L2 holds nothing of
the inputs), medians of 20 samples, several grid sizes each.
"""

from __future__ import annotations

import json
import sys

import cupy as cp
import numpy as np

SOURCE = r"""
__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}
extern "C" __global__ void seq_read(const uint4* __restrict__ p, unsigned long long n16,
                                    unsigned* out) {
    unsigned acc = 0;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
         i < n16; i += (unsigned long long)gridDim.x * blockDim.x) {
        const uint4 v = ld_stream(p + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x12345678u) out[0] = acc;  // keeps the loads
}
// CTA b walks pages b, b + grid, ...; a page is 8448 bytes read as 528 uint4.
extern "C" __global__ void page_read(const unsigned char* __restrict__ base,
                                     const int* __restrict__ table, unsigned pages,
                                     unsigned long long stride, unsigned* out) {
    unsigned acc = 0;
    for (unsigned pg = blockIdx.x; pg < pages; pg += gridDim.x) {
        const uint4* src = reinterpret_cast<const uint4*>(
            base + (unsigned long long)table[pg] * stride);
        for (unsigned c = threadIdx.x; c < 528; c += blockDim.x) {
            const uint4 v = ld_stream(src + c);
            acc ^= v.x ^ v.y ^ v.z ^ v.w;
        }
    }
    if (acc == 0x12345678u) out[0] = acc;
}
"""
PAGE_BYTES = 8448


def median_us(fn, flush, reps: int = 20) -> tuple[float, list[float]]:
    start, end = cp.cuda.Event(), cp.cuda.Event()
    samples = []
    for _ in range(reps):
        flush.fill(1)
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(cp.cuda.get_elapsed_time(start, end) * 1e3)
    return float(np.median(samples)), samples


def report(results: dict[str, dict]) -> None:
    """Each probe's median and rate, and every sample to the JSON named on the
    command line (if any)."""
    for name, r in results.items():
        print(f"{name:28s} {r['median_us']:9.1f} us  {r['TBps']:.2f} TB/s")
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(results, f, indent=1)


def main() -> int:
    mod = cp.RawModule(code=SOURCE, options=("-arch=sm_90",))
    seq, page = mod.get_function("seq_read"), mod.get_function("page_read")
    out = cp.zeros(1, dtype=cp.uint32)
    flush = cp.empty(2 * 60 * 2**20 // 4, dtype=cp.uint32)
    results = {}
    buf = cp.random.randint(0, 255, size=4 * 2**30, dtype=cp.uint8)
    n16 = np.uint64(buf.size // 16)
    for grid, block in [(132 * 8, 256), (132 * 16, 256), (132 * 4, 512)]:
        us, samples = median_us(lambda g=grid, b=block: seq((g,), (b,), (buf, n16, out)), flush)
        results[f"seq_read_g{grid}_b{block}"] = {
            "median_us": us, "TBps": buf.size / us / 1e6, "samples_us": samples,
        }  # fmt: skip
    pages = 64 * 512
    cache = cp.random.randint(0, 255, size=pages * PAGE_BYTES, dtype=cp.uint8)
    table = cp.random.permutation(pages).astype(cp.int32)
    args = (cache, table, np.uint32(pages), np.uint64(PAGE_BYTES), out)
    for grid, block in [(132 * 4, 128), (132 * 8, 128), (132 * 16, 128), (132 * 8, 256)]:
        us, samples = median_us(lambda g=grid, b=block: page((g,), (b,), args), flush)
        results[f"page_read_g{grid}_b{block}"] = {
            "median_us": us, "TBps": pages * PAGE_BYTES / us / 1e6, "samples_us": samples,
        }  # fmt: skip
    report(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
