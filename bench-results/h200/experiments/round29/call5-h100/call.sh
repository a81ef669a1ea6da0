# Round 29 call 5 (from main): ss (decode CTAs with few pages copy halves) and ess (the same,
# exact decode only) vs main: ess's GPU tests, then decode A/B.
W=b12x-0.1.0-cp310-abi3-linux_x86_64.whl
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
TEST_LIMIT=120 TESTS="ess" ROUNDS=3 CASES="decode_r64_L32768 decode_r1_L131072" RESULTS=/tmp/r5 \
  timeout 270 bash tools/gpu/variants.sh d2=.device/wheels/d2/$W ss=.device/wheels/ss/$W ess=.device/wheels/ess/$W 2>&1 | tail -12
tail -n 4 /tmp/r5/test_*.txt
cp /tmp/r5/variants.tar.xz $OUT/; ls -la $OUT
