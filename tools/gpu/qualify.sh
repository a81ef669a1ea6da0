#!/usr/bin/env bash
# Qualification on a GPU host: doctor, the whole test suite, memcheck and racecheck on
# small indexer cases, the demo on one GPU and on all of them.
#   tools/gpu/qualify.sh [WHEEL]        logs in $RESULTS (default gpu-results/)
source "$(dirname "$0")/common.sh" "$@"
step doctor 60 b12x doctor
# The real-vLLM tests need vLLM installed (CI installs it); a GPU host may not have it.
VLLM_TESTS=$(python3 -c 'import vllm' 2>/dev/null && echo "" || echo "--ignore=vllm_real")
TAIL=12 step pytest 330 bash -c "cd tests && python3 -m pytest -q -p no:cacheprovider -ra $VLLM_TESTS ."

step memcheck 120 compute-sanitizer --tool memcheck python3 tests/indexer/indexer_memcheck_case.py
step racecheck 120 compute-sanitizer --tool racecheck python3 tests/indexer/indexer_memcheck_case.py
step demo_1gpu 90 b12x demo --gpus 1
if [ "$GPUS" -ge 2 ]; then step demo_all 120 b12x demo; fi
