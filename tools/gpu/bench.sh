#!/usr/bin/env bash
# Every GPU benchmark with its peers, JSON beside the logs in $RESULTS.
#   tools/gpu/bench.sh [WHEEL]
# CRITERION_BIN: a criterion binary (`cargo bench -p b12x-core --no-run`) to run too.
# The indexer bench's stock vLLM peer needs the DeepGEMM bundle carried in .device/deepgemm
# (tools/gpu/deepgemm_peer.py pack, here); without it those arms skip and say why.
source "$(dirname "$0")/common.sh" "$@"
# with the vLLM bundle and op library where carried: vLLM's own top-k then runs live
VLLM=${VLLM:-1} source tools/gpu/site.sh
step bench_extract 60 b12x bench extract --json "$RESULTS/extract.json"
# DeepGEMM compiles its kernels with nvcc on first use: the first run takes minutes longer
TAIL=40 step bench_indexer 480 b12x bench indexer --json "$RESULTS/indexer.json"
if [ "$GPUS" -ge 2 ]; then
  TAIL=20 step bench_allreduce 300 b12x bench allreduce --gpus 2 --json "$RESULTS/allreduce.json"
fi
if [ -n "${CRITERION_BIN:-}" ]; then step criterion 150 "$CRITERION_BIN" --bench; fi
