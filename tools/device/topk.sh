#!/usr/bin/env bash
# Top-k round on one H200 (device tool, kind nvidia-h200), from the repository
# root with .device/topk/ carried: topk_bench.py, its PTX or cubins
# (`python tools/device/topk_bench.py build .device/topk --old OLD.cu`) and,
# optionally, a b12x wheel. Each step stops at its own timeout and the next
# still runs; logs and JSON go to $OUT.
#   STEPS="checks timing pytest ncu" (default: all)
set -u
export PYTHONUNBUFFERED=1
D=.device/topk
TESTS=${TESTS:-$D/tests}  # the tests of the branch under test, carried beside the wheel
STEPS=${STEPS:-"checks timing pytest ncu"}
has() { [[ " $STEPS " == *" $1 "* ]]; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
if has checks; then
  echo "== exactness checks (harness)"
  timeout 60 python3 $D/topk_bench.py run $D --out $OUT --json topk-checks.json --no-timing \
    > $OUT/checks.log 2>&1
  echo "checks rc=$?"
  grep -E "FAIL|checks:|Error|error" $OUT/checks.log | cut -c1-400 | head -12
fi
if has timing; then
  echo "== timings (harness; graph replay, L2 flushed)"
  for c in decode_r64_L32768 decode_r1_L131072 prefill_r4096_L32768; do
    timeout 40 python3 $D/topk_bench.py run $D --out $OUT --json topk-timing-$c.json \
      --no-checks --cases $c 2>&1 | grep -vE "^(modules loaded|checks:|wrote)"
  done
fi
if has pytest && ls $D/b12x-*.whl > /dev/null 2>&1; then
  echo "== pytest (indexer GPU tests on the wheel)"
  python3 -m pip install -q --no-deps --force-reinstall $D/b12x-*.whl 2>&1 | tail -1
  (cd ${TESTS:-tests} && timeout ${PYTEST_TIMEOUT:-80} python3 -m pytest -q -p no:cacheprovider -ra \
    --maxfail=5 test_dsa_indexer_gpu.py test_dsa_indexer_run.py test_cli.py \
    > $OUT/pytest.txt 2>&1; echo "pytest rc=$?" >> $OUT/pytest.txt)
  grep -E "passed|failed|FAILED|^E |rc=" $OUT/pytest.txt | cut -c1-300 | head -20
fi
if has ncu; then
  echo "== ncu (one eager call of each product arm)"
  timeout ${NCU_TIMEOUT:-45} ncu --clock-control none --kernel-name regex:b12x_indexer_topk \
    --section SpeedOfLight --section WarpStateStats --section LaunchStats \
    python3 $D/topk_bench.py run $D --out $OUT --json topk-profile.json --no-checks --profile \
    > $OUT/ncu.txt 2>&1
  echo "ncu rc=$?"
  grep -E "b12x_indexer_topk|Duration|Memory Throughput|Warp Cycles Per Issued|Registers Per|Dynamic Shared" \
    $OUT/ncu.txt | head -40
fi
