"""Scenarios run on both ranks of :class:`tp_harness.TpRanks` (a real vLLM TP group of 2).

Each function takes the rank and returns plain data for the test to assert
on. vLLM's own objects are real: its plugin loader, ``CudaCommunicator``
(built by its own ``__init__``), its TP ``GroupCoordinator`` and
``graph_capture``, its fallback chain (``CustomAllreduce``, then
``torch.distributed`` on the device group, where NCCL would be on a GPU:
``VLLM_DISABLE_PYNCCL`` as there is no NCCL here). The one stand-in is the
IPC runtime's device side (:func:`vllm_fakes.gloo_runtime`: b12x's own
runtime over its host stand-in, summing over gloo), put in through
``B12xCustomAllreduce.runtime_factory``. CUDA stream calls that
``graph_capture`` makes are no-ops here (no CUDA on the machine).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

HIDDEN = 256
MAX_TOKENS = 64
CAPTURE_SIZES = [1, 2, 4, 8, 128]  # 128 > MAX_TOKENS: declared because it is a capture size
WORLD = 2
_config_cache: dict[str, Any] = {}


def init_ranks(rank: int, world_size: int, init: str) -> None:
    os.environ["VLLM_DISABLE_PYNCCL"] = "1"  # no NCCL on a CPU machine
    os.environ["VLLM_PLUGINS"] = "b12x"  # only b12x's general plugin
    from vllm.config import set_current_vllm_config
    from vllm.distributed.parallel_state import (
        init_distributed_environment,
        initialize_model_parallel,
    )

    with set_current_vllm_config(vllm_config()):  # as vLLM's worker does in init_device
        init_distributed_environment(
            world_size=world_size,
            rank=rank,
            distributed_init_method=init,
            local_rank=rank,
            backend="gloo",
        )
        initialize_model_parallel(tensor_model_parallel_size=world_size)


# --- helpers -----------------------------------------------------------------------------


def vllm_config(dtype: str = "float32") -> Any:
    """A real VllmConfig of a tiny Llama (hidden 256), capture sizes and token budget set."""
    if dtype in _config_cache:
        return _config_cache[dtype]
    from vllm.config import ModelConfig, ParallelConfig, VllmConfig

    folder = Path(tempfile.mkdtemp(prefix="b12x-tiny-llama-"))
    (folder / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "hidden_size": HIDDEN,
                "intermediate_size": 512,
                "num_attention_heads": 4,
                "num_key_value_heads": 4,
                "num_hidden_layers": 2,
                "vocab_size": 1000,
                "max_position_embeddings": 2048,
                "rms_norm_eps": 1e-6,
            }
        )
    )
    model = ModelConfig(model=str(folder), skip_tokenizer_init=True, dtype=dtype)
    config = VllmConfig(
        model_config=model, parallel_config=ParallelConfig(tensor_parallel_size=WORLD)
    )
    # the CPU platform runs eager; set what a CUDA platform would have
    config.compilation_config.cudagraph_capture_sizes = list(CAPTURE_SIZES)
    config.scheduler_config.max_num_batched_tokens = MAX_TOKENS
    _config_cache[dtype] = config
    return config


def load_plugins(switch: str | None) -> None:
    """vLLM's plugin loader, as a fresh process would run it, with ``B12X_VLLM=switch``."""
    import vllm.plugins
    from b12x.integration.vllm import communicator

    communicator.uninstall()
    if switch is None:
        os.environ.pop("B12X_VLLM", None)
    else:
        os.environ["B12X_VLLM"] = switch
    vllm.plugins.plugins_loaded = False
    vllm.plugins.load_general_plugins()


def use_runtime(factory: Any) -> None:
    from b12x.integration.vllm.communicator import B12xCustomAllreduce

    B12xCustomAllreduce.runtime_factory = factory


def gloo_runtime(group: Any, device: Any, limits: Any) -> Any:
    import vllm_fakes

    return vllm_fakes.gloo_runtime(group, limits)


def build_communicator(config: Any = "default") -> Any:
    """vLLM's CudaCommunicator for the TP group, built by its own __init__."""
    from vllm.config import set_current_vllm_config
    from vllm.distributed.device_communicators.cuda_communicator import CudaCommunicator
    from vllm.distributed.parallel_state import get_tp_group

    tp = get_tp_group()
    config = vllm_config() if config == "default" else config
    scope = contextlib.nullcontext() if config is None else set_current_vllm_config(config)
    with scope:
        return CudaCommunicator(
            cpu_group=tp.cpu_group,
            device=torch.device("cpu"),
            device_group=tp.device_group,
            unique_name=tp.unique_name,
        )


def rank_input(rank: int, shape: tuple[int, ...], dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + rank * 7 + sum(shape))
    return torch.randn(shape, generator=g).to(dtype)


def expected_sum(shape: tuple[int, ...], dtype=torch.float32) -> torch.Tensor:
    return sum(rank_input(r, shape, dtype).float() for r in range(WORLD)).to(dtype)


@contextlib.contextmanager
def tp_communicator(comm: Any):
    """vLLM's TP GroupCoordinator with ``comm`` as its device communicator."""
    from vllm.distributed.parallel_state import get_tp_group

    tp = get_tp_group()
    previous = tp.device_communicator
    tp.device_communicator = comm
    try:
        yield tp
    finally:
        tp.device_communicator = previous


@contextlib.contextmanager
def cpu_streams():
    """torch.cuda's stream calls made by graph_capture, as no-ops (no CUDA here)."""
    stream = object()
    saved = torch.cuda.current_stream, torch.cuda.stream
    torch.cuda.current_stream = lambda *a, **k: stream
    torch.cuda.stream = lambda s: contextlib.nullcontext()
    try:
        yield stream
    finally:
        torch.cuda.current_stream, torch.cuda.stream = saved


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def b12x_logs():
    handler = Records()
    root = logging.getLogger("b12x")
    root.addHandler(handler)
    old = root.level
    root.setLevel(logging.INFO)
    try:
        yield handler.messages
    finally:
        root.removeHandler(handler)
        root.setLevel(old)


def slot_state(comm: Any) -> dict[str, Any]:
    slot = comm.ca_comm
    return {
        "slot": type(slot).__qualname__ if slot is not None else None,
        "slot_module": type(slot).__module__ if slot is not None else None,
        "disabled": None if slot is None else slot.disabled,
        "b12x_disabled": None if not hasattr(slot, "runtime") else slot.runtime is None,
        "routes": len(slot.plans.routes()) if hasattr(slot, "plans") else 0,
    }


# --- scenarios ---------------------------------------------------------------------------


def switch_off_is_stock(rank: int) -> dict[str, Any]:
    load_plugins(None)
    comm = build_communicator()
    state = slot_state(comm)
    comm.destroy()
    return state


def built_from_vllm_call(rank: int) -> dict[str, Any]:
    """Item 4: CudaCommunicator.__init__ builds b12x's slot from its own call."""
    load_plugins("allreduce")
    use_runtime(gloo_runtime)
    comm = build_communicator()
    state = slot_state(comm)
    runtime = comm.ca_comm.runtime
    state["runtime_world"] = runtime.world_size
    state["declared"] = [len(invocations) for invocations in runtime.declared]
    state["stock_type"] = type(comm.ca_comm.fallback).__module__
    state["fused_probe"] = comm.ca_comm.supports_fused_add_rms_norm()
    comm.destroy()
    return state


def dispatch(rank: int) -> dict[str, Any]:
    """CudaCommunicator.all_reduce: declared shapes on b12x, the rest on vLLM's chain."""
    load_plugins("allreduce")
    use_runtime(gloo_runtime)
    comm = build_communicator()
    runtime = comm.ca_comm.runtime
    results: dict[str, Any] = {}
    for label, shape in {
        "m1": (1, HIDDEN),
        "m64": (MAX_TOKENS, HIDDEN),
        "capture128": (128, HIDDEN),
        "eager200": (200, HIDDEN),
        "other_hidden": (4, 384),
        "three_d": (2, 4, HIDDEN),
    }.items():
        before, admissions = len(runtime.calls), runtime.admissions
        out = comm.all_reduce(rank_input(rank, shape))
        results[label] = {
            "b12x": len(runtime.calls) - before,
            "correct": bool(torch.equal(out, expected_sum(shape))),
            "admissions": runtime.admissions - admissions,
        }
    comm.destroy()
    return results


def graph_capture(rank: int, declared: bool) -> dict[str, Any]:
    """Item 5: GroupCoordinator.graph_capture enters ca_comm.capture(), declared or not."""
    from vllm.distributed.parallel_state import GraphCaptureContext

    load_plugins("allreduce")
    use_runtime(gloo_runtime)
    comm = build_communicator(vllm_config() if declared else None)
    runtime = comm.ca_comm.runtime
    seen: dict[str, Any] = {}
    with tp_communicator(comm) as tp, cpu_streams() as stream:
        with tp.graph_capture(GraphCaptureContext(stream)) as context:
            seen["context_stream"] = context.stream is stream
            seen["capturing"] = runtime.in_capture
            out = tp.all_reduce(rank_input(rank, (8, HIDDEN)))
            seen["correct"] = bool(torch.equal(out, expected_sum((8, HIDDEN))))
        with comm.ca_comm.capture(stream=stream):  # the fork passes the stream
            seen["capturing_with_stream"] = runtime.in_capture
    seen["after"] = runtime.in_capture
    seen["runtime_captures"] = runtime.captures
    seen["b12x_calls"] = len(runtime.calls)
    comm.destroy()
    return seen


def teardown(rank: int) -> dict[str, Any]:
    """Item 6: CudaCommunicator.destroy drops ca_comm; the slot closes b12x's runtime."""
    import gc

    from b12x.integration.vllm import communicator

    load_plugins("allreduce")
    use_runtime(gloo_runtime)
    comm = build_communicator()
    runtime = comm.ca_comm.runtime
    live_before = len(communicator.live_slots())
    comm.destroy()
    gc.collect()
    return {
        "live_before": live_before,
        "live_after": len(communicator.live_slots()),
        "closed": runtime.closed,
        "ca_comm": comm.ca_comm,
    }


def gather_scatter(rank: int) -> dict[str, Any]:
    """Item 6: custom all-gather / reduce-scatter decline; vLLM's fallback all-gather runs.

    (vLLM's own reduce-scatter fallback needs NCCL, so only the decline is
    checked for it.)
    """
    from vllm.models.common.ops.sequence_parallel import sp_all_gather

    load_plugins("allreduce")
    use_runtime(gloo_runtime)
    comm = build_communicator()
    runtime = comm.ca_comm.runtime
    x = rank_input(rank, (4, HIDDEN))
    seen = {
        "gather": comm.custom_all_gather(x),
        "scatter": comm.custom_reduce_scatter(x),
    }
    with tp_communicator(comm):
        gathered = sp_all_gather(x)  # sequence parallelism: custom first, then vLLM's
    seen["gather_fallback"] = bool(
        torch.equal(gathered, torch.cat([rank_input(r, (4, HIDDEN)) for r in range(WORLD)]))
    )
    seen["b12x_calls"] = len(runtime.calls)
    comm.destroy()
    return seen


def fused_op(rank: int, compiled: bool) -> dict[str, Any]:
    """Item 6: torch.ops.b12x.fused_all_reduce_add_rms_norm, eager and under torch.compile.

    Two norms, as a model's layers call them: first a profile-sized batch
    (above the fused ceiling: vLLM's two calls, the norms only recorded),
    then decode-sized ones (one declaration for both norms, then fused).
    Every result is compared with vLLM's own RMSNorm of the summed input.
    """
    from b12x.integration.vllm import fused_op as fused
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.layernorm import RMSNorm

    load_plugins("allreduce")
    use_runtime(gloo_runtime)
    comm = build_communicator()
    runtime = comm.ca_comm.runtime
    with set_current_vllm_config(vllm_config()):  # vLLM's CustomOps read it when built
        norms = {"a": RMSNorm(HIDDEN, eps=1e-6), "b": RMSNorm(HIDDEN, eps=1e-6)}
    with torch.no_grad():
        norms["a"].weight.copy_(torch.linspace(0.5, 1.5, HIDDEN))
        norms["b"].weight.copy_(torch.linspace(1.5, 0.5, HIDDEN))

    def step(x, residual, weight):
        return torch.ops.b12x.fused_all_reduce_add_rms_norm(x, residual, weight, 1e-6)

    call = torch.compile(step, backend="aot_eager", fullgraph=True) if compiled else step
    results: dict[str, Any] = {}
    profile_rows = comm.ca_comm.limits.fused_max // (HIDDEN * 4) + 1
    with tp_communicator(comm):
        results["probe"] = fused.supports_fused_add_rms_norm()
        for label, name, rows in [
            ("profile_a", "a", profile_rows),
            ("profile_b", "b", profile_rows),
            ("decode_a", "a", 4),
            ("decode_b", "b", 4),
            ("decode_a_again", "a", 4),
            ("beyond_budget", "a", 200),
        ]:
            norm = norms[name]
            x = rank_input(rank, (rows, HIDDEN))
            residual = rank_input(99, (rows, HIDDEN))  # the residual stream is replicated
            want_normed, want_residual = norm.forward_native(
                expected_sum((rows, HIDDEN)), residual.clone()
            )
            calls, declares = len(runtime.calls), len(runtime.declared)
            # vLLM's RMSNorm hands its kernels weight.data: a new alias per call
            normed = call(x, residual, norm.weight.data)
            results[label] = {
                "fused_calls": sum(c[0] == "fused" for c in runtime.calls[calls:]),
                "declares": len(runtime.declared) - declares,
                "normed": bool(torch.allclose(normed, want_normed, atol=1e-5, rtol=1e-5)),
                "residual": bool(torch.allclose(residual, want_residual, atol=1e-6, rtol=1e-6)),
                "x_untouched": bool(torch.equal(x, rank_input(rank, (rows, HIDDEN)))),
            }
    results["norms_declared"] = comm.ca_comm._auto.norm_count
    comm.destroy()
    return results


def declines(rank: int, case: str) -> dict[str, Any]:
    """A multi-node group, a failed set-up, an unsupported GPU: b12x declines, vLLM runs."""
    import vllm.distributed.parallel_state as parallel_state
    import vllm_fakes

    load_plugins("allreduce")
    restore = contextlib.ExitStack()
    if case == "multi_node":
        # the topology is the stand-in here: vLLM's node probe answers "rank 1 elsewhere"
        real = parallel_state.in_the_same_node_as
        parallel_state.in_the_same_node_as = lambda group, source_rank=0: [True, False]
        restore.callback(setattr, parallel_state, "in_the_same_node_as", real)
        use_runtime(gloo_runtime)
    elif case == "setup_failed":

        def failing(group, device, limits):
            raise RuntimeError("setup step 'open peers' failed on rank(s) [1]")

        use_runtime(failing)
    elif case == "unsupported_gpu":
        use_runtime(
            lambda group, device, limits: vllm_fakes.gloo_runtime(
                group,
                enabled=False,
                disabled_reason="setup step 'allocate' failed on rank(s) [0, 1] "
                "(KernelLoadError: compute_89 PTX cannot run on sm_80)",
            )
        )
    with restore, b12x_logs() as logs:
        first = build_communicator()
        second = build_communicator()  # a second group: the reason is not logged again
    out = first.all_reduce(rank_input(rank, (4, HIDDEN)))
    state = slot_state(first)
    state["correct"] = bool(torch.equal(out, expected_sum((4, HIDDEN))))
    state["warnings"] = [m for m in logs if "declined" in m or "disabled" in m]
    first.destroy()
    second.destroy()
    return state
