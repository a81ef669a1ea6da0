# Round 29 call 3 (from main): the probe (stages a multiple of the consumers), then eks
# (exact decode: K page as two TMA boxes) against main: its GPU tests, decode A/B.
W=b12x-0.1.0-cp310-abi3-linux_x86_64.whl
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 80 python3 tools/gpu/gather_order_probe.py $OUT/gather_order3.json > $OUT/probe.txt 2>&1
echo probe rc $?; grep -v "^gather_order_probe: [a-z_0-9]*$" $OUT/probe.txt | tail -8
TEST_LIMIT=200 TESTS="eks" ROUNDS=3 CASES="decode_r64_L32768 decode_r1_L131072" RESULTS=/tmp/r3 \
  timeout 420 bash tools/gpu/variants.sh d2=.device/wheels/d2/$W eks=.device/wheels/eks/$W 2>&1 | tail -12
tail -n 4 /tmp/r3/test_*.txt
cp /tmp/r3/variants.tar.xz $OUT/; ls -la $OUT
