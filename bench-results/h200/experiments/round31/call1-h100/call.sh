# Round 31 first call (any card; the H200 for the final figures): exact prefill ping-pong (ppg: each
# consumer warpgroup's 4 rows in one m64n256k16 chain, turns by named barriers) and n256 (the same
# chain without the turns) against main (d3), prefill, 2 rounds alternated, with ppg's and n256's GPU
# tests (run from the checked-out branch prefill-pingpong, whose tests are main's).
W=b12x-0.1.0-cp310-abi3-linux_x86_64.whl
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
TEST_LIMIT=120 TESTS="ppg n256" ROUNDS=2 CASES="prefill_r4096_L32768" RESULTS=/tmp/r1 timeout 420 \
  bash tools/gpu/variants.sh d3=.device/wheels/d3/$W ppg=.device/wheels/ppg/$W n256=.device/wheels/n256/$W 2>&1 | tail -7
tail -n 3 /tmp/r1/test_*.txt; cp /tmp/r1/variants.tar.xz $OUT/prefill.tar.xz
