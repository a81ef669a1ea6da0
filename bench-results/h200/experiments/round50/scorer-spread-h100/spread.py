"""When each CTA of the fast decode scorer finishes, from a trace build's
output (`patches/scorer-trace.patch` on `main`; `tools/gpu/trace_call.py CASE
--precision fast --calls 5` on the GPU, saved as tr_*.txt.xz here).

Each `TR cta sm warpgroup start_ns end_ns pages` line is one consumer
warpgroup; a CTA ends with its later warpgroup, an SM when its last CTA ends.
Times are from the call's first start. The first call (module load) is left
out. Prints, per call, the spread of CTA ends; then the SMs by their mean end
over the calls. Run: python3 spread.py tr_r64.txt.xz tr_r1.txt.xz"""

import collections
import lzma
import statistics
import sys


def calls_of(path):
    calls = []
    with lzma.open(path, "rt") as f:
        for line in f:
            if line.startswith("== call"):
                calls.append([])
            elif line.startswith("TR"):
                cta, sm, _wg, t0, t1, pages = (int(v) for v in line.split()[1:])
                calls[-1].append((cta, sm, t0, t1, pages))
    return calls[1:]


def ends(call, key):
    start = min(r[2] for r in call)
    out = {}
    for r in call:
        k = r[0] if key == "cta" else r[1]
        out[k] = max(out.get(k, 0.0), (r[3] - start) / 1000)
    return out


def sm_list(per_sm, sms):
    return ", ".join(f"{sm}: {statistics.mean(per_sm[sm]):.1f}" for sm in sms)


def quantile(sorted_values, q):
    return sorted_values[int(q * (len(sorted_values) - 1))]


for path in sys.argv[1:]:
    calls = calls_of(path)
    print(path)
    per_sm = collections.defaultdict(list)
    for i, call in enumerate(calls, 1):
        e = sorted(ends(call, "cta").values())
        pages = [r[4] for r in call]
        print(
            f"  call {i}: CTA ends (us) min {e[0]:.1f} p10 {quantile(e, 0.1):.1f}"
            f" median {quantile(e, 0.5):.1f} p90 {quantile(e, 0.9):.1f} max {e[-1]:.1f}"
            f" mean {statistics.mean(e):.1f}; pages a warpgroup {min(pages)}-{max(pages)}"
        )
        for sm, t in ends(call, "sm").items():
            per_sm[sm].append(t)
    by_end = sorted(per_sm, key=lambda sm: statistics.mean(per_sm[sm]))
    print(f"  SMs ending first (mean over calls): {sm_list(per_sm, by_end[:16])}")
    print(f"  SMs ending last: {sm_list(per_sm, by_end[-6:])}")
