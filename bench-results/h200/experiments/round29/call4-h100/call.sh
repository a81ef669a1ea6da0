# Round 29 call 4 (from main): ss (a decode CTA whose pages fit its ring copies halves) vs main:
# its GPU tests, then decode A/B.
W=b12x-0.1.0-cp310-abi3-linux_x86_64.whl
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
TEST_LIMIT=150 TESTS="ss" ROUNDS=3 CASES="decode_r64_L32768 decode_r1_L131072" RESULTS=/tmp/r4 \
  timeout 400 bash tools/gpu/variants.sh d2=.device/wheels/d2/$W ss=.device/wheels/ss/$W 2>&1 | tail -12
tail -n 4 /tmp/r4/test_*.txt
cp /tmp/r4/variants.tar.xz $OUT/; ls -la $OUT
