"""The vLLM plugin's decisions on a real GPU, as ``b12x doctor`` reports them (GPU host).

A fresh process per switch value loads vLLM's plugins with vLLM's own loader on
its CUDA platform (as each vLLM process does), and ``b12x doctor`` runs with the
same environment: what doctor says the switch turns on is what the plugin
installed, and the indexer follows the speed rule (b12x only where the
committed benchmark shows it at least as fast as stock vLLM). With the rule
set aside, on Hopper the device check passes and b12x serves DeepSeek V4
layers; the configurations it does not serve go to vLLM's own indexer, each
with its reason logged once.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import gpu_support as g
import indexer_support as s
import pytest
import torch
from b12x.attention import dsa_indexer
from b12x.integration.vllm import _once, indexer_backend, indexer_hooks, plugin, speed_rule
from vllm.models.deepseek_v4.attention import DeepseekV4Attention
from vllm.utils.import_utils import has_deep_gemm

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("on_cuda")]
on_cuda = g.on_cuda
HOPPER = (9, 0)

# One vLLM process's view after its plugin loader ran: printed as one JSON line.
PROBE = """
import json, logging, warnings
warnings.simplefilter("ignore")
logging.basicConfig(level=logging.INFO, format="LOG %(name)s %(message)s")
import vllm.plugins
vllm.plugins.load_general_plugins()
from b12x.integration.vllm import communicator, indexer_hooks
from vllm.platforms import current_platform
print("PROBE " + json.dumps({
    "platform": current_platform.device_name,
    "indexer_hooks": indexer_hooks.installed(),
    "allreduce": communicator.installed(),
    "indexer_reason": indexer_hooks.unsupported_reason(),
}))
"""


def environment(switch: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != plugin.ENV}
    env.update(VLLM_PLUGINS="b12x", VLLM_TARGET_DEVICE="cuda")
    if switch is not None:
        env[plugin.ENV] = switch
    return env


def vllm_process(switch: str | None) -> tuple[dict, str]:
    done = subprocess.run([sys.executable, "-c", PROBE], env=environment(switch),
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("PROBE ")]
    return json.loads(line[len("PROBE ") :]), done.stdout + done.stderr


def doctor(switch: str | None) -> str:
    done = subprocess.run([sys.executable, "-m", "b12x", "doctor"], env=environment(switch),
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize(
    ("switch", "components"),
    [
        (None, []),
        ("indexer", ["indexer"]),
        ("allreduce", ["allreduce"]),
        ("on", ["allreduce", "indexer"]),
    ],
)
def test_what_doctor_says_is_on_is_what_vllms_plugin_loader_installs(switch, components):
    report = doctor(switch)
    probe, log = vllm_process(switch)
    assert probe["platform"] == "cuda"
    rule = this_gpus_rule()
    assert ("sparse indexer for DeepSeek" in report) is ("indexer" in components)
    assert probe["indexer_hooks"] is ("indexer" in components and rule.use_b12x)
    who = "b12x" if rule.use_b12x else "vLLM's own"
    assert f"vLLM indexer with B12X_VLLM=indexer: {who} ({rule.reason})" in report
    assert ("all-reduce in vLLM's custom all-reduce slot" in report) is ("allreduce" in components)
    assert probe["allreduce"] is ("allreduce" in components)
    # the plugin's one line: what is on, then what was asked for and left to vLLM
    on = [c for c in components if c != "indexer" or rule.use_b12x]
    if components:
        assert f"b12x vLLM plugin on: {', '.join(on) or 'nothing'}" in log
        declined = "indexer" in components and not rule.use_b12x
        assert ("; not used: indexer (" in log) is declined
    else:
        assert "unset: off, vLLM runs as stock" in report
    # this GPU runs the kernels: the only reason the hooks decline is the speed rule's
    assert probe["indexer_reason"] == (None if rule.use_b12x else rule.reason)
    if "indexer" in components and rule.use_b12x:
        assert "b12x indexer installed for DeepSeek V3.2 / V4" in log
        assert "b12x indexer not used" not in log
    elif "indexer" in components:
        assert f"b12x indexer not used: {rule.reason}" in log


def this_gpus_rule() -> speed_rule.Decision:
    capability = tuple(torch.cuda.get_device_capability(0))
    return speed_rule.decide(capability, speed_rule.PLAN_PRECISION, has_deep_gemm())


def test_doctor_reports_this_gpu_its_ptx_and_the_flavors_the_plans_resolve():
    report = doctor(None)
    major, minor = torch.cuda.get_device_capability(0)
    (gpu,) = [x for x in report.splitlines() if x.strip().startswith("cuda:0 ")]
    assert f"sm {major}.{minor}" in gpu and "PTX load: ok" in gpu

    def flavor(precision: str) -> str:
        caps = dsa_indexer.Caps(device=0, num_q_heads=64, max_q_rows=1, max_page_table_width=1,
                                topk=512, precision=precision)  # fmt: skip
        return str(dsa_indexer.plan(caps).mma_flavor)

    flavors = {p: flavor(p) for p in ("exact", "fast")}
    assert f"indexer MMA: exact {flavors['exact']}, fast {flavors['fast']}" in report


@pytest.fixture
def hooks(monkeypatch):
    # the rule set aside: what b12x does where it serves (the rule itself: above)
    monkeypatch.setattr(indexer_hooks, "_speed_reason", lambda capability: None)
    indexer_hooks.uninstall()
    monkeypatch.setattr(_once, "LOGGED", set())
    yield indexer_hooks
    indexer_hooks.uninstall()


DECLINED = [
    (lambda c: setattr(c.parallel_config, "decode_context_parallel_size", 2), "decode context"),
    (lambda c: setattr(c.parallel_config, "prefill_context_parallel_size", 2), "prefill context"),
    (lambda c: setattr(c.attention_config, "indexer_kv_dtype", "mxfp4"), "mxfp4"),
    (lambda c: setattr(c.speculative_config, "enable_adaptive_verification", True),
     "adaptive verification"),
]  # fmt: skip


def test_on_hopper_b12x_serves_v4_layers_and_leaves_the_rest_to_vllm(hooks, caplog):
    if torch.cuda.get_device_capability(0) != HOPPER:
        pytest.skip("the Hopper decisions: this GPU is not sm_90")
    vllm_own = DeepseekV4Attention.__dict__["_get_indexer_cls"]
    config = s.make_config(speculative_tokens=1)
    assert hooks.unsupported_reason(config) is None  # the real device check (rule aside)
    assert hooks.install(config)
    b12x_cls = indexer_backend.B12xDeepseekV4Indexer
    assert DeepseekV4Attention._get_indexer_cls(None, config) is b12x_cls
    with caplog.at_level(logging.INFO, logger="b12x.integration.vllm"):
        for change, reason in DECLINED:
            declined = s.make_config(speculative_tokens=1)
            change(declined)
            assert reason in hooks.unsupported_reason(declined)
            for _ in range(2):  # every layer asks; the reason is logged once
                got = DeepseekV4Attention._get_indexer_cls(None, declined)
                assert got is vllm_own(None, declined)
            logged = [r.getMessage() for r in caplog.records if reason in r.getMessage()]
            assert len(logged) == 1 and "vLLM's own indexer runs" in logged[0]
