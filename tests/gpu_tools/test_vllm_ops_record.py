"""tools/gpu/vllm_ops_record.py, the pytest plugin that lists the vLLM ops a session ran.

Each test runs in a fresh interpreter (the plugin patches torch's op lookup
and Triton's launch for the whole process): ops registered under a recorded
namespace are counted when called, lookups of unregistered ones are listed
as absent, other namespaces are left alone, and a pytest session loaded with
``-p vllm_ops_record`` prints the record and writes it as JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parents[2] / "tools" / "gpu"


def run(code: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TOOLS), os.environ.get("PYTHONPATH", "")]),
    }
    argv = [sys.executable, *args, "-c", code] if code else [sys.executable, *args]
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


RECORD = """
import json, torch
import vllm_ops_record as r
lib = torch.library.Library("deep_gemm", "DEF")
lib.define("twice(Tensor x) -> Tensor")
lib.impl("twice", lambda x: x * 2, "CompositeExplicitAutograd")
other = torch.library.Library("b12x_test_other", "DEF")
other.define("same(Tensor x) -> Tensor")
other.impl("same", lambda x: x, "CompositeExplicitAutograd")
r._record_ops()  # as in a session: the libraries register before the tests call them
x = torch.ones(2)
assert torch.ops.deep_gemm.twice(x).tolist() == [2.0, 2.0]
torch.ops.deep_gemm.twice(x)
assert torch.ops.deep_gemm.twice.default(x).tolist() == [2.0, 2.0]  # the packet's own attributes
assert not hasattr(torch.ops._C, "cooperative_topk")  # a probe of an op no library registered
try:
    torch.ops._C_cache_ops.cp_gather_indexer_k_quant_cache
except AttributeError:
    pass
torch.ops.b12x_test_other.same(x)
print(json.dumps(r.report()))
"""


def test_calls_are_counted_and_absent_ops_listed_in_the_recorded_namespaces_only():
    doc = json.loads(run(RECORD).stdout.splitlines()[-1])
    assert doc["ops_called"] == {"torch.ops.deep_gemm.twice": 2}
    assert doc["ops_absent"] == {
        "torch.ops._C.cooperative_topk": 1,
        "torch.ops._C_cache_ops.cp_gather_indexer_k_quant_cache": 1,
    }
    assert doc["stand_ins_imported"] == [] and doc["vllm_triton_kernels"] == {}


def test_a_session_prints_the_record_and_writes_it(tmp_path):
    (tmp_path / "test_probe.py").write_text(
        "import sys, types, torch\n"
        "def test_probe():\n"
        "    sys.modules['fake_stand_in'] = types.SimpleNamespace(B12X_STAND_IN=True)\n"
        "    assert not hasattr(torch.ops._C, 'persistent_topk')\n"
    )
    out = tmp_path / "ops.json"
    os.environ["VLLM_OPS_JSON"] = str(out)
    try:
        done = run("", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "vllm_ops_record",
                   "test_probe.py", cwd=tmp_path)  # fmt: skip
    finally:
        del os.environ["VLLM_OPS_JSON"]
    assert "vLLM ops (tools/gpu/vllm_ops_record.py)" in done.stdout
    assert "torch.ops._C.persistent_topk x1" in done.stdout
    assert "stand-in modules imported: fake_stand_in" in done.stdout
    assert json.loads(out.read_text())["ops_absent"] == {"torch.ops._C.persistent_topk": 1}
