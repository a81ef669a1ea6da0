#!/usr/bin/env bash
# The landed tree's final indexer run beside stock vLLM, one STEP a device call:
#   tools/gpu/final_run.sh STEP WHEEL
# A call carries at most 64 MiB, so vLLM's op library (.device/vllm-ops, from
# vllm_ops_lib.py pack) travels in three parts, one a call, while the machine
# stays warm:
#   bench  carry .device/deepgemm, .device/vllm, the wheel's folder and
#          .device/vllm-ops/vllm_ops.json: `b12x bench indexer` with DeepGEMM
#          live (vLLM's top-k from the stored figures), then the indexer GPU tests
#   cli    carry part-00.xz and part-01.xz: the CLI GPU tests
#   stock  carry part-02.xz: the bench with vLLM's own top-k live too (the
#          run bench-results/<gpu>/indexer.json keeps), then tools/gpu/vllm_real.sh
# WHEEL `-`: keep the b12x an earlier step installed (the machine is still warm),
# so the cli and stock steps need not carry the wheel beside their parts.
# CARD (default H200): a step on a GPU whose name lacks it measures nothing and
# exits 0 saying so; CARD= runs on any. Logs and JSON go to $RESULTS (default
# gpu-results/); with $OUT set, the step's indexer.json and a tarball go there.
set -u
STEP=${1:?STEP: bench, cli or stock}
WHEEL=${2:?WHEEL: the b12x wheel}
case "$STEP" in
  bench | cli | stock) ;;
  *)
    echo "final_run.sh: STEP expected bench, cli or stock, got $STEP"
    exit 2
    ;;
esac
NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
echo "$NAME"
if [[ "$NAME" != *"${CARD-H200}"* ]]; then
  echo "final_run.sh: not a ${CARD-H200}: nothing measured"
  exit 0
fi
[ "$WHEEL" = - ] && WHEEL=""
source "$(dirname "$0")/common.sh" "$WHEEL"
case "$STEP" in
  bench | stock)
    # never through a pipe: site.sh sets PYTHONPATH in this shell
    VLLM=$([ "$STEP" = stock ] && echo 1 || echo 0) source tools/gpu/site.sh >"$RESULTS/site.txt" 2>&1
    tail -2 "$RESULTS/site.txt"
    TAIL=34 step bench_indexer 330 b12x bench indexer --no-torch --json "$RESULTS/indexer.json"
    if [ "$STEP" = bench ]; then
      TAIL=3 step test_indexer 200 bash -c 'cd tests && python3 -m pytest -q -p no:cacheprovider -ra indexer'
    else
      RESULTS=$RESULTS timeout 330 bash tools/gpu/vllm_real.sh 2>&1 | tail -14
    fi
    ;;
  cli)
    TAIL=3 step test_cli 150 bash -c 'cd tests && python3 -m pytest -q -p no:cacheprovider -ra cli'
    ;;
esac
if [ -n "${OUT:-}" ]; then
  [ -f "$RESULTS/indexer.json" ] && cp "$RESULTS/indexer.json" "$OUT/"
  tar -C "$RESULTS" -cJf "$OUT/final-$STEP.tar.xz" .
fi
