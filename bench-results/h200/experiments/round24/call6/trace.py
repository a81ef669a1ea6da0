"""Runs the fast decode_r1 call a few times (L2 flushed before each), then a
top-k-only call, so the trace build's grid-selection printf lines show each phase."""
import sys
import torch
sys.path.insert(0, "tools/gpu")
from b12x import _core
from b12x.attention import dsa_indexer as di
from indexer_profile import case_binding

b = case_binding("decode_r1_L131072", "fast")
l2 = int(_core.device_info(torch.cuda.current_device())["l2_bytes"])
flush = torch.zeros(2 * l2 // 4 + 1, dtype=torch.float32, device="cuda")
for i in range(4):
    flush.zero_()
    torch.cuda.synchronize()
    print(f"== call {i}", flush=True)
    di.run(b)
    torch.cuda.synchronize()
