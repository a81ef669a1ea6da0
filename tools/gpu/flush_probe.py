"""What the bench's L2 flush leaves behind costs the timed kernel (round 19).

`b12x bench indexer` rewrites a buffer of twice the L2 before every timed
replay (`bench.common.l2_flusher`), so L2 holds dirty lines when the timed
graph starts, and the first reads of the K cache evict them: HBM then carries
those write-backs beside the cache. This runs the bench twice, as it is and
with a flush that reads a second buffer of twice the L2 after the write (the
write-backs happen in the flush, untimed, and L2 holds clean lines), and prints
the arms side by side. Extra arguments go to the bench (e.g. --cases).

    python3 tools/gpu/flush_probe.py OUT_DIR [bench args...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from b12x import _core, cli
from b12x.bench import indexer as bench_indexer


def clean_flusher(device: int):
    l2 = int(_core.device_info(device)["l2_bytes"])
    dev = torch.device("cuda", device)
    dirty = torch.zeros(2 * l2 // 4 + 1, dtype=torch.float32, device=dev)
    clean = torch.ones(2 * l2 // 4 + 1, dtype=torch.float32, device=dev)
    sink = torch.zeros((), dtype=torch.float32, device=dev)

    def flush() -> None:
        dirty.add_(1)
        torch.sum(clean, dim=0, out=sink)

    return flush


def main() -> int:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    extra = sys.argv[2:]
    medians: dict[str, dict[tuple[str, str], float]] = {}
    for name in ("dirty", "clean"):
        if name == "clean":
            bench_indexer.l2_flusher = clean_flusher  # type: ignore[assignment]
        path = out / f"flush_{name}.json"
        rc = cli.main(
            ["bench", "indexer", "--no-torch", "--no-deepgemm", "--json", str(path), *extra]
        )
        if rc != 0:
            return rc
        res = json.loads(path.read_text())["results"]
        medians[name] = {(r["case"], r["arm"]): r["median_us"] for r in res if r.get("median_us")}
    print(f"{'case':24} {'arm':24} {'dirty L2':>9} {'clean L2':>9} {'diff':>7}")
    for key, dirty in medians["dirty"].items():
        clean = medians["clean"].get(key)
        if clean is not None:
            print(f"{key[0]:24} {key[1]:24} {dirty:9.1f} {clean:9.1f} {dirty - clean:7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
