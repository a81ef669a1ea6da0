"""One patch table for everything b12x changes in the real vLLM 0.33 (issue 20, item 5),
and the slot answering exactly what vLLM reads of it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import vllm
from b12x.comm.pcie import AllReduce
from b12x.integration.vllm import communicator, indexer_hooks, patches
from b12x.integration.vllm.communicator import VLLM_READS, B12xCustomAllreduce
from vllm.model_executor.custom_op import op_registry_oot

COMPONENTS = sorted({p.component for p in patches.PATCHES})


def current(patch):
    if patch.kind == "oot":
        return op_registry_oot.get(patch.attribute)
    return vars(patches._target(patch.owner)).get(patch.attribute)


@pytest.fixture
def gpu_ok(monkeypatch):
    monkeypatch.setattr(indexer_hooks, "_device_reason", lambda: None)


@pytest.mark.parametrize("component", COMPONENTS)
def test_each_component_installs_and_undoes_exactly_its_entries(component, gpu_ok):
    mine = [p for p in patches.PATCHES if p.component == component]
    others = [p for p in patches.PATCHES if p.component != component]
    before = {p: current(p) for p in patches.PATCHES}
    was_in = patches.installed(component)
    patches.uninstall(component)
    vllms = {p: current(p) for p in mine}
    patches.install(component)
    patches.install(component)  # idempotent
    assert patches.installed(component)
    for p in mine:
        assert current(p) is not vllms[p], p
        if vllms[p] is not None:
            assert patches.original(p.owner, p.attribute) is vllms[p]
    assert all(current(p) is before[p] for p in others)  # nothing else moved
    patches.uninstall(component)
    assert not patches.installed(component)
    assert all(current(p) is vllms[p] for p in mine)
    if was_in:
        patches.install(component)


def test_every_entry_says_why_and_the_components_use_the_table():
    assert all(len(p.why) > 40 for p in patches.PATCHES)
    assert {p.component for p in patches.PATCHES} == {"allreduce", "indexer", "plugin"}
    # the V3.2 op goes through vLLM's documented extension point, not a name swap
    (oot,) = [p for p in patches.PATCHES if p.kind == "oot"]
    assert oot.attribute == "SparseAttnIndexer"
    communicator.uninstall()
    communicator.install()
    assert patches.installed("allreduce") and communicator.installed()
    communicator.uninstall()
    assert not patches.installed("allreduce") and not communicator.installed()


def _names_vllm_reads_of_its_slot() -> set[str]:
    """``ca_comm.<name>`` (and ``comm.<name>`` where comm is the slot) in vLLM's sources."""
    root = Path(vllm.__file__).parent
    names: set[str] = set()
    for path in root.rglob("*.py"):
        text = path.read_text(errors="replace")
        if "ca_comm" not in text:
            continue
        names |= set(re.findall(r"\bca_comm\.(\w+)", text))
        if re.search(r"(?<!\w)comm = [^\n]*\.ca_comm\b", text):  # a local name for the slot
            names |= set(re.findall(r"\bcomm\.(\w+)", text))
    return names


def test_the_slot_answers_what_vllm_reads_and_forwards_nothing_else():
    read = _names_vllm_reads_of_its_slot()
    # the fused all-reduce path of ROCm's AITER slot is another object (aiter_ar_comm's)
    read -= {"effective_max_size", "supports_dynamic_hidden_dim", "supports_per_group_quant"}
    assert read <= set(VLLM_READS), sorted(read - set(VLLM_READS))

    class VllmOwn:
        disabled = True

        def close(self):
            pass

    slot = B12xCustomAllreduce.from_parts(VllmOwn(), AllReduce.host_stand_in(2))
    for name in VLLM_READS:
        assert hasattr(slot, name), name
    slot.close()
    assert "__getattr__" not in vars(B12xCustomAllreduce)
    assert all("__getattr__" not in vars(c) for c in B12xCustomAllreduce.__mro__[:-1])
