#!/usr/bin/env bash
# vLLM's own code driving b12x on a GPU: tests/vllm_real on vLLM's CUDA platform.
#   tools/gpu/vllm_real.sh [WHEEL]
# Build the bundles here first (tools/gpu/README.md): deepgemm_peer.py pack, vllm_bundle.py build,
# vllm_ops_lib.py pack. With VLLM_TARGET_DEVICE=cuda the test_gpu_* files run and the
# CPU-platform files are not collected
# (tests/vllm_real/conftest.py says why); vllm_ops_record lists the vLLM ops that ran.
# PYTEST_ARGS: more pytest arguments (e.g. -k graphs, or -x).
source "$(dirname "$0")/common.sh" "$@"
VLLM=1 source tools/gpu/site.sh  # common.sh left us in the repository root
export PYTHONPATH=$PWD/tools/gpu:$PYTHONPATH
export VLLM_TARGET_DEVICE=cuda VLLM_OPS_JSON=$RESULTS/vllm_ops.json
# shellcheck disable=SC2086
TAIL=${TAIL:-80} step vllm_real 540 python3 -m pytest -q -p no:cacheprovider -ra \
  -p vllm_ops_record tests/vllm_real ${PYTEST_ARGS:-}
