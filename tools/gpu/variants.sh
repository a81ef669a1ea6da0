#!/usr/bin/env bash
# Variant rounds of the indexer: wheels measured alternately in one call.
#   tools/gpu/variants.sh NAME=WHEEL [NAME=WHEEL ...]
# For each wheel in turn (TESTS=1, the default; TESTS=0: none; or the NAMEs
# whose tests run, e.g. TESTS="tp": the tests are the checked-out tree's, which
# only that wheel's branch may pass): install it and run the indexer's GPU
# tests (at most TEST_LIMIT seconds, default 300). Then ROUNDS times
# (default 2; 0: the tests alone) for each wheel, round r starting from the
# r-th wheel (in round 31's call 1 the first wheel of every round ran the
# unchanged top-k 4-6% slower): install it and run
# `b12x bench indexer --no-torch --no-deepgemm --cases $CASES --json`,
# with $BENCH_ARGS added (e.g. "--flavor-arms wgmma": a forced-flavor arm in
# the same interleaved run), and then $BENCH_ARGS_<NAME> for that name's runs
# only (e.g. asc=WHEEL with BENCH_ARGS_asc="--page-order ascending": one wheel
# under two settings).
# Logs and JSON go to $RESULTS (default gpu-results/), packed into
# $RESULTS/variants.tar.xz, also copied to $OUT where $OUT is set (call it with
# RESULTS outside $OUT: every file there counts against the tool's 8); the last lines are each arm's medians, a run a column, then each
# wheel's median over its rounds beside the first wheel's (tools/gpu/variants_summary.py).
source "$(dirname "$0")/common.sh" ""
CASES=${CASES:-prefill_r4096_L32768}
ROUNDS=${ROUNDS:-2}
declare -a NAMES WHEELS
for spec in "$@"; do
  NAMES+=("${spec%%=*}")
  WHEELS+=("${spec#*=}")
done
install() { python3 -m pip install -q --no-deps --force-reinstall "$1" 2>&1 | tail -1; }
tested() {  # whether wheel NAME's tests run (TESTS)
  case "${TESTS:-1}" in
    1) return 0 ;;
    0) return 1 ;;
    *) [[ " $TESTS " == *" $1 "* ]] ;;
  esac
}
for i in "${!NAMES[@]}"; do
  tested "${NAMES[$i]}" || continue
  install "${WHEELS[$i]}"
  TAIL=3 step "test_${NAMES[$i]}" "${TEST_LIMIT:-300}" bash -c \
    'cd tests && python3 -m pytest -q -p no:cacheprovider -ra indexer'
done
for r in $(seq 1 "$ROUNDS"); do
  for k in "${!NAMES[@]}"; do
    i=$(((k + r - 1) % ${#NAMES[@]}))
    install "${WHEELS[$i]}"
    own="BENCH_ARGS_${NAMES[$i]}"
    # shellcheck disable=SC2086  # CASES and BENCH_ARGS are word lists
    TAIL=1 step "bench_${NAMES[$i]}-$r" 300 b12x bench indexer --no-torch --no-deepgemm \
      --cases $CASES ${BENCH_ARGS:-} ${!own:-} --json "$RESULTS/${NAMES[$i]}-$r.json"
  done
done
# packed outside RESULTS (tar must not read the file it writes), then copied in;
# the device tool returns at most 8 files from $OUT, so the tarball goes there too
PACK=$(mktemp --suffix=.tar.xz)
tar -C "$RESULTS" -cJf "$PACK" --exclude variants.tar.xz .
cp "$PACK" "$RESULTS/variants.tar.xz"
if [ -n "${OUT:-}" ] && ! [ "$OUT" -ef "$RESULTS" ]; then cp "$PACK" "$OUT/variants.tar.xz"; fi
rm -f "$PACK"
python3 "$(dirname "$0")/variants_summary.py" "$RESULTS" "${NAMES[@]}"
