# Round 30 first call (from main). On an H200 only: ess (short halves, exact decode) vs main,
# decode cases. On any card: pss (exact prefill stores part 0's rows before waiting on part 1),
# phb (both prefill scorers' warpgroup 1 starts 700 ns late) and pssph (both) vs main, prefill,
# with pssph's GPU tests.
W=b12x-0.1.0-cp310-abi3-linux_x86_64.whl
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "$gpu"
case "$gpu" in
  *H200*)
    TEST_LIMIT=120 TESTS="ess" ROUNDS=3 CASES="decode_r64_L32768 decode_r1_L131072" RESULTS=/tmp/r1 \
      timeout 300 bash tools/gpu/variants.sh d2=.device/wheels/d2/$W ess=.device/wheels/ess/$W 2>&1 | tail -12
    tail -n 4 /tmp/r1/test_*.txt; cp /tmp/r1/variants.tar.xz $OUT/decode.tar.xz ;;
  *) echo "not an H200: the decode A/B is skipped" ;;
esac
TEST_LIMIT=120 TESTS="pssph" ROUNDS=2 CASES="prefill_r4096_L32768" RESULTS=/tmp/r2 \
  timeout 280 bash tools/gpu/variants.sh d2=.device/wheels/d2/$W pss=.device/wheels/pss/$W \
  phb=.device/wheels/phb/$W pssph=.device/wheels/pssph/$W 2>&1 | tail -7
tail -n 4 /tmp/r2/test_*.txt; cp /tmp/r2/variants.tar.xz $OUT/prefill.tar.xz; ls -la $OUT
