"""``b12x demo``: the main job.

For now: the doctor report, then the launch chain on every GPU (fill a top-k
output with -1/-inf eagerly and under a CUDA graph replay) with a check.
"""

from __future__ import annotations


def run_demo(gpus: int | None = None) -> int:
    import torch

    from b12x import cuda
    from b12x.doctor import run_doctor

    run_doctor()
    if not cuda.is_available() or not torch.cuda.is_available():
        print("\nno CUDA GPU: CPU-only demo done")
        return 0
    count = torch.cuda.device_count() if gpus is None else min(gpus, torch.cuda.device_count())
    failures = 0
    for i in range(count):
        cuda.load_kernels(i)
        with torch.cuda.device(i):
            out = torch.zeros((64, 512), dtype=torch.int32, device=f"cuda:{i}")
            scores = torch.zeros((64, 512), dtype=torch.float32, device=f"cuda:{i}")
            cuda.fill_topk_padding(out, scores)
            eager_ok = bool((out == -1).all()) and bool(torch.isneginf(scores).all())
            out.zero_()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                cuda.fill_topk_padding(out, scores)
            out.zero_()
            graph.replay()
            torch.cuda.synchronize()
            graph_ok = bool((out == -1).all())
        failures += not (eager_ok and graph_ok)
        print(
            f"cuda:{i} fill_topk_padding eager={'ok' if eager_ok else 'FAIL'} "
            f"graph_replay={'ok' if graph_ok else 'FAIL'}"
        )
    return 1 if failures else 0
