#!/usr/bin/env bash
# Indexer round: the indexer GPU tests, memcheck, the benchmark (with the f16
# flavor as a second b12x arm) and one ncu pass over every kernel of each case.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --force-reinstall .device/lead/b12x-*.whl 2>&1 | tail -1
echo "== pytest (scorer logits per flavor)"
(cd tests && timeout 120 python3 -m pytest -q -p no:cacheprovider -ra test_dsa_indexer_gpu.py -k scorer_logits > $OUT/pytest_logits.txt 2>&1; echo "pytest rc=$?" >> $OUT/pytest_logits.txt)
grep -E "passed|failed|^E  .*(flavor|differ)|rc=" $OUT/pytest_logits.txt | head -20
echo "== pytest (indexer GPU tests)"
(cd tests && timeout 240 python3 -m pytest -q -p no:cacheprovider -x -ra test_dsa_indexer_gpu.py test_dsa_indexer_run.py > $OUT/pytest_indexer.txt 2>&1; echo "pytest rc=$?" >> $OUT/pytest_indexer.txt)
grep -E "passed|failed|FAILED|^E |rc=" $OUT/pytest_indexer.txt | head -30
echo "== memcheck"
timeout 90 compute-sanitizer --tool memcheck python3 tests/indexer_memcheck_case.py > $OUT/memcheck.txt 2>&1; echo "memcheck rc=$?"; tail -3 $OUT/memcheck.txt
echo "== bench"
timeout 200 b12x bench indexer --flavor-arms ${FLAVOR_ARMS:-f16} --json $OUT/indexer.json 2>&1 | tail -20
echo "== ncu"
timeout 150 ncu --clock-control none --kernel-name regex:b12x_indexer \
  --section SpeedOfLight --section Occupancy --section LaunchStats \
  python3 tools/device/indexer_profile.py > $OUT/ncu.txt 2>&1; echo "ncu rc=$?"
grep -E "b12x_indexer|Duration|DRAM Throughput|Compute \(SM\) Throughput|Registers Per|Achieved Occupancy|^  [a-z_0-9]+:" $OUT/ncu.txt | head -60
