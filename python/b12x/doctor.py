"""``b12x doctor``: what b12x sees on this machine. Always exits 0."""

from __future__ import annotations

import platform
import sys
from typing import Any

from b12x import _core
from b12x.errors import B12xError


def _line(key: str, value: object) -> None:
    print(f"  {key:<22} {value}")


def _indexer_flavors(ordinal: int) -> dict[str, str]:
    """The indexer scorers' MMA flavor per precision, as the plans resolve it."""
    from b12x.attention import dsa_indexer as di

    def flavor(precision: str) -> str:
        caps = di.Caps(device=ordinal, num_q_heads=64, max_q_rows=1, max_page_table_width=1,
                       topk=512, precision=precision)  # fmt: skip
        return str(di.plan(caps).mma_flavor)

    return {p: flavor(p) for p in ("exact", "fast")}


def report() -> dict[str, Any]:
    """Everything doctor prints, as a dict (also used by benchmark metadata)."""
    info: dict[str, Any] = {"b12x": _core.__version__, "python": platform.python_version()}
    info["build"] = _core.build_info()
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_cuda"] = torch.version.cuda
        # one read makes the fast metadata path check itself against torch's getters
        try:
            _core.tensor_meta(torch.zeros(2))
            info["torch_metadata_path"] = {
                "trusted": "torch C shim (checked against torch's getters)",
                "off": "attribute reads (C shim off or unavailable)",
            }.get(_core.torch_shim_state(), _core.torch_shim_state())
        except B12xError as e:  # a bad B12X_TORCH_SHIM value
            info["torch_metadata_path"] = f"error: {e}"
    except ImportError:
        info["torch"] = None
    info["vllm_plugin"] = _vllm_plugin()
    info["driver_present"] = _core.driver_present()
    info["gpus"] = []
    if not info["driver_present"]:
        return info
    try:
        info["driver_cuda"] = "{}.{}".format(*_core.driver_version())
        count = _core.device_count()
    except Exception as e:  # a broken driver install is a finding, not a crash
        info["driver_error"] = str(e)
        return info
    for i in range(count):
        gpu = dict(_core.device_info(i))
        try:
            _core.load_kernels(i)
            gpu["ptx_load"] = "ok"
            gpu["indexer_mma"] = _indexer_flavors(i)
        except Exception as e:
            gpu["ptx_load"] = f"FAILED: {e}"
        if info["vllm_plugin"].get("vllm"):
            gpu["vllm_indexer"] = _vllm_indexer_rule(tuple(gpu["compute_capability"]))
        info["gpus"].append(gpu)
    info["peer_access"] = [
        [None if a == b else _core.can_access_peer(a, b) for b in range(count)]
        for a in range(count)
    ]
    return info


def _vllm_indexer_rule(capability: tuple[int, int]) -> dict[str, Any]:
    """Whether the vLLM plugin's indexer would be b12x's on this GPU, and why
    (the speed rule, with the committed figures); never imports vLLM."""
    from b12x.integration.vllm import speed_rule

    decision = speed_rule.decide(
        capability, speed_rule.PLAN_PRECISION, speed_rule.stock_fast_path(inside_vllm=False)
    )
    return {"use_b12x": decision.use_b12x, "reason": decision.reason}


def _vllm_plugin() -> dict[str, Any]:
    from b12x.integration.vllm import plugin

    try:  # reads metadata and the switch; never imports vLLM
        return plugin.status()
    except Exception as e:  # doctor reports, never fails
        return {"error": f"{type(e).__name__}: {e}"}


def run_doctor() -> int:
    info = report()
    build = info["build"]
    print("b12x doctor")
    _line("b12x", info["b12x"])
    _line("python", f"{info['python']} ({sys.executable})")
    _line("torch", f"{info.get('torch')} (CUDA {info.get('torch_cuda')})")
    _line(
        "embedded PTX",
        f"ISA {build['ptx_isa']} for {build['ptx_target']}, needs driver >= {build['min_driver']}",
    )
    # arch-specific modules name their target; they load only where it runs
    targets = build["module_targets"]
    names = [
        n if targets[n] == build["ptx_target"] else f"{n} ({targets[n]})"
        for n, _ in build["modules"]
    ]
    _line("PTX modules", ", ".join(names))
    _line("bindings", build["cudarc_bindings"])
    if "torch_metadata_path" in info:
        _line("tensor metadata", info["torch_metadata_path"])
    from b12x.integration.vllm.plugin import status_lines

    for key, value in status_lines(info["vllm_plugin"]):
        _line(key, value)
    if not info["driver_present"]:
        _line("driver", "not found (libcuda.so): CPU paths only")
        return 0
    if "driver_error" in info:
        _line("driver", f"error: {info['driver_error']}")
        return 0
    _line("driver CUDA version", info["driver_cuda"])
    _line("GPUs", len(info["gpus"]))
    for gpu in info["gpus"]:
        cc = "{}.{}".format(*gpu["compute_capability"])
        print(
            f"    cuda:{gpu['ordinal']}  {gpu['name']}  sm {cc}  {gpu['multiprocessors']} SMs  "
            f"{gpu['total_memory'] / 2**30:.0f} GiB  L2 {gpu['l2_bytes'] >> 20} MiB  "
            f"PTX load: {gpu['ptx_load']}"
        )
        if "indexer_mma" in gpu:
            flavors = ", ".join(f"{p} {f}" for p, f in gpu["indexer_mma"].items())
            print(f"      indexer MMA: {flavors}")
        if "vllm_indexer" in gpu:
            rule = gpu["vllm_indexer"]
            who = "b12x" if rule["use_b12x"] else "vLLM's own"
            print(f"      vLLM indexer with B12X_VLLM=indexer: {who} ({rule['reason']})")
    peers = info.get("peer_access") or []
    if len(peers) > 1:
        print("  peer access (row can map column):")
        for a, row in enumerate(peers):
            cells = " ".join("  -" if v is None else ("yes" if v else " no") for v in row)
            print(f"    cuda:{a}  {cells}")
    return 0
