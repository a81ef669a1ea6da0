#!/usr/bin/env bash
# Top-k round on one GPU host, from the repository root, with D (default
# .device/topk) holding topk_bench.py's PTX or cubins (`python tools/gpu/topk_bench.py
# build D --old OLD.cu --ptxas PTXAS` here), optionally a b12x wheel and a tests/
# folder to run. Each step stops at its own timeout and a step is skipped once the
# round has run past BUDGET seconds; logs and JSON go to $OUT (default gpu-results/);
# the last lines are the table of every timing and the checks' counts.
#   STEPS="pytest checks timing bench memcheck racecheck ncu" (default: checks timing)
# The default round fits a 240 s call: checks <= 80 s, timings <= the rest of BUDGET.
set -u
export PYTHONUNBUFFERED=1
D=${D:-.device/topk}
OUT=${OUT:-gpu-results}
mkdir -p "$OUT"
TESTS=${TESTS:-$D/tests}
STEPS=${STEPS:-"checks timing"}
BUDGET=${BUDGET:-200}
has() { [[ " $STEPS " == *" $1 "* ]] && ((SECONDS < BUDGET)); }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
if ls $D/b12x-*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-deps --force-reinstall $D/b12x-*.whl 2>&1 | tail -1
fi
if has pytest; then
  echo "== pytest (indexer GPU tests on the wheel) @${SECONDS}s"
  (cd $TESTS && timeout ${PYTEST_TIMEOUT:-60} python3 -m pytest -q -p no:cacheprovider -ra \
    --maxfail=5 indexer/test_dsa_indexer_gpu.py indexer/test_dsa_indexer_run.py cli/test_cli.py \
    > $OUT/pytest.txt 2>&1; echo "pytest rc=$?" >> $OUT/pytest.txt)
  grep -E "passed|failed|FAILED|^E |rc=" $OUT/pytest.txt | cut -c1-300 | head -12
fi
if has checks; then
  echo "== exactness checks (harness) @${SECONDS}s"
  timeout ${CHECKS_TIMEOUT:-80} python3 $D/topk_bench.py run $D --out $OUT \
    --json topk-checks.json --no-timing > $OUT/checks.log 2>&1
  echo "checks rc=$?"
  grep -E "FAIL|checks:|Error|error" $OUT/checks.log | cut -c1-300 | head -8
fi
if has timing; then
  echo "== timings (b12x's scorer logits when b12x is installed; graph replay, L2 flushed) @${SECONDS}s"
  # one process for every case (its JSON is rewritten after each case)
  timeout $((BUDGET - SECONDS > 30 ? BUDGET - SECONDS : 30)) python3 $D/topk_bench.py run $D \
    --out $OUT --json topk-timing.json --no-checks --b12x-logits ${CASES:+--cases $CASES} \
    > $OUT/timing.log 2>&1
  echo "timing rc=$?"
  grep -vE "^(modules loaded|checks:|wrote)" $OUT/timing.log | cut -c1-200 | tail -40
fi
if has bench; then
  echo "== b12x bench indexer @${SECONDS}s"
  timeout 45 b12x bench indexer --no-torch --iters 30 --json $OUT/indexer.json 2>&1 | tail -8
fi
if has memcheck; then
  echo "== memcheck @${SECONDS}s"
  timeout 40 compute-sanitizer --tool memcheck python3 $TESTS/indexer/indexer_memcheck_case.py \
    > $OUT/memcheck.txt 2>&1
  echo "memcheck rc=$?"; tail -2 $OUT/memcheck.txt
fi
if has racecheck; then
  echo "== racecheck (harness, small cases) @${SECONDS}s"
  timeout $((BUDGET - SECONDS > 10 ? BUDGET - SECONDS : 10)) compute-sanitizer --tool racecheck \
    python3 $D/topk_bench.py run $D --out $OUT --json topk-racecheck.json --no-timing --small \
    > $OUT/racecheck.txt 2>&1
  echo "racecheck rc=$?"; grep -E "RACECHECK SUMMARY|hazard|checks:" $OUT/racecheck.txt | head -4
fi
if has ncu; then
  echo "== ncu (one eager call of each product arm) @${SECONDS}s"
  timeout ${NCU_TIMEOUT:-45} ncu --clock-control none --kernel-name regex:b12x_indexer_topk \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
    --section SourceCounters --section LaunchStats \
    python3 $D/topk_bench.py run $D --out $OUT --json topk-profile.json --no-checks --profile \
    > $OUT/ncu.txt 2>&1
  echo "ncu rc=$?"
  grep -E "b12x_indexer_topk|Duration|Warp Cycles Per Issued|Issued Warp|No Eligible|Stall" \
    $OUT/ncu.txt | cut -c1-160 | head -60
fi
echo "== summary @${SECONDS}s"
python3 $D/topk_bench.py summary $OUT
echo "== done @${SECONDS}s"
