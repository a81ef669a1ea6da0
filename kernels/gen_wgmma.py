#!/usr/bin/env python3
"""Write kernels/wgmma_{f16,fp8,fp8_ss}.cuh: the sm_90a wgmma wrappers, one per N and form.

An inline-asm wgmma names every accumulator register, N/2 of them per thread,
so the wrappers are generated rather than typed. `--check` exits 1 when a
committed header differs from a fresh one; kernels/build_ptx.py runs both.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

KERNELS = Path(__file__).resolve().parent
# N of the scorers' units: decode N = padded heads, prefill halves N = 2 * padded heads.
WIDTHS = (16, 32, 48, 64, 96, 128)
# N of the TMA-fed scorers (indexer_hopper.cu): decode N = padded heads, prefill
# N = 2 query rows * padded heads + 8 (a page's MMAs in two parts, each with
# the 2 rows' linear-part columns: HP_LIN_LEVELS of them a row).
SS_WIDTHS = (16, 32, 48, 64, 40, 72, 104, 136)


@dataclass(frozen=True)
class Flavor:
    struct: str  # C++ template name
    header: str
    k: int  # K of one MMA
    types: str  # .atype.btype
    tail: str  # immediates after scale-d: scale-a, scale-b[, trans-b]
    about: str


FLAVORS = (
    Flavor(
        "WgmmaF16",
        "wgmma_f16.cuh",
        16,
        ".f16.f16",
        "1, 1, 0",
        "f16 x f16 -> f32 warpgroup MMAs, m64nNk16: exact products, fp32 accumulation.",
    ),
    Flavor(
        "WgmmaFp8",
        "wgmma_fp8.cuh",
        32,
        ".e4m3.e4m3",
        "1, 1",
        "e4m3 x e4m3 -> f32 warpgroup MMAs, m64nNk32: Hopper's FP8 path, whose\n"
        '// accumulation keeps less than fp32 (the indexer\'s precision="fast").',
    ),
)


def wrapper(f: Flavor, n: int) -> str:
    regs = n // 2
    dlist = ", ".join(f"%{i}" for i in range(regs))
    fences = "".join(f' "+f"(d[{i}])' + ("," if i < regs - 1 else "") for i in range(regs))
    a = ", ".join(f"%{regs + i}" for i in range(4))

    def asm(scale_d: int) -> str:
        return (
            f'"wgmma.mma_async.sync.aligned.m64n{n}k{f.k}.f32{f.types} "\n'
            f'            "{{{dlist}}}, {{{a}}}, %{regs + 4}, {scale_d}, {f.tail};\\n"'
        )

    def operands(out: str) -> str:
        regs_out = ", ".join(f'"{out}"(d[{i}])' for i in range(regs))
        return f""": {regs_out}
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));"""

    return f"""
template <>
struct {f.struct}<{n}> {{
    static constexpr int REGS = {regs};
    // d = A . B^T over one k{f.k} step (scale-d is an immediate 0, so ptxas sees
    // d as written only). A is this thread's m16n8k{f.k}-style fragment (4
    // 32-bit words), B a shared-memory descriptor.
    static __device__ __forceinline__ void mma_first(float (&d)[{regs}], const u32 (&a)[4],
                                                     u64 desc_b) {{
        asm volatile(
            {asm(0)}
            {operands("=f")}
    }}
    // d += A . B^T over one k{f.k} step.
    static __device__ __forceinline__ void mma(float (&d)[{regs}], const u32 (&a)[4], u64 desc_b) {{
        asm volatile(
            {asm(1)}
            {operands("+f")}
    }}
    // Pins the accumulators at this point: no read or write of d moves across.
    static __device__ __forceinline__ void fence_operands(float (&d)[{regs}]) {{
        asm volatile("" :{fences} :: "memory");
    }}
}};
"""


def ss_wrapper(n: int) -> str:
    """e4m3 m64nNk32 with both operands in shared memory (two descriptors)."""
    regs = n // 2
    dlist = ", ".join(f"%{i}" for i in range(regs))
    fences = "".join(f' "+f"(d[{i}])' + ("," if i < regs - 1 else "") for i in range(regs))

    def asm(scale_d: int, out: str) -> str:
        regs_out = ", ".join(f'"{out}"(d[{i}])' for i in range(regs))
        return f"""asm volatile(
            "wgmma.mma_async.sync.aligned.m64n{n}k32.f32.e4m3.e4m3 "
            "{{{dlist}}}, %{regs}, %{regs + 1}, {scale_d}, 1, 1;\\n"
            : {regs_out}
            : "l"(desc_a), "l"(desc_b));"""

    return f"""
template <>
struct WgmmaFp8Ss<{n}> {{
    static constexpr int REGS = {regs};
    // d = A . B^T over one k32 step (scale-d 0: d is written only).
    static __device__ __forceinline__ void mma_first(float (&d)[{regs}], u64 desc_a, u64 desc_b) {{
        {asm(0, "=f")}
    }}
    // The same with d bound read-write, so that the compiler keeps each
    // accumulator in the registers it had: where accumulators alternate with
    // MMAs in flight, renamed ones would be registers in flight.
    static __device__ __forceinline__ void mma_first_in_place(float (&d)[{regs}], u64 desc_a,
                                                              u64 desc_b) {{
        {asm(0, "+f")}
    }}
    // d += A . B^T over one k32 step.
    static __device__ __forceinline__ void mma(float (&d)[{regs}], u64 desc_a, u64 desc_b) {{
        {asm(1, "+f")}
    }}
    // Pins the accumulators at this point: no read or write of d moves across.
    static __device__ __forceinline__ void fence_operands(float (&d)[{regs}]) {{
        asm volatile("" :{fences} :: "memory");
    }}
}};
"""


SS_HEADER = "wgmma_fp8_ss.cuh"


def render_ss() -> str:
    body = "".join(ss_wrapper(n) for n in SS_WIDTHS)
    return f"""// Generated by kernels/gen_wgmma.py; do not edit.
//
// e4m3 x e4m3 -> f32 warpgroup MMAs, m64nNk32, both operands in shared memory
// through matrix descriptors (the TMA-fed scorers; sm_90a only).
#pragma once

#include "common.cuh"

template <int N>
struct WgmmaFp8Ss;
{body}"""


def render(f: Flavor) -> str:
    body = "".join(wrapper(f, n) for n in WIDTHS)
    return f"""// Generated by kernels/gen_wgmma.py; do not edit.
//
// {f.about}
// A from registers and B from shared memory through a matrix descriptor
// (sm_90a only).
#pragma once

#include "common.cuh"

template <int N>
struct {f.struct};
{body}"""


def headers() -> dict[str, str]:
    """Every generated header by file name, freshly rendered."""
    out = {f.header: render(f) for f in FLAVORS}
    out[SS_HEADER] = render_ss()
    return out


def stale() -> list[str]:
    """Headers that differ from a fresh rendering."""
    return [
        name
        for name, text in headers().items()
        if not (KERNELS / name).exists() or (KERNELS / name).read_text() != text
    ]


def is_fresh() -> bool:
    return not stale()


def write() -> None:
    for name, text in headers().items():
        if name in stale():
            (KERNELS / name).write_text(text)
            print(f"wrote kernels/{name}")


def main() -> int:
    if "--check" in sys.argv[1:]:
        for name in stale():
            print(f"stale: {name}; run: python kernels/gen_wgmma.py", file=sys.stderr)
        return 1 if stale() else 0
    write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
