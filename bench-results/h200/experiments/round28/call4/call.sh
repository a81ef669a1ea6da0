# Round 28 call 4: decode warpgroup page overlap (xr4: runs of 4, xr2: runs of 2) against main (d2).
W=b12x-0.1.0-cp310-abi3-linux_x86_64.whl
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
TEST_LIMIT=150 TESTS="xr4 xr2" ROUNDS=3 CASES="decode_r64_L32768 decode_r1_L131072" RESULTS=/tmp/r4 \
  timeout 420 bash tools/gpu/variants.sh \
  d2=.device/wheels/d2/$W xr4=.device/wheels/xr4/$W xr2=.device/wheels/xr2/$W 2>&1 | tail -16
tail -n 4 /tmp/r4/test_*.txt
mkdir -p /tmp/r4/tl
for w in d2 xr4; do
  python3 -m pip install -q --no-deps --force-reinstall .device/wheels/$w/$W 2>&1 | tail -1
  for p in fast exact; do for c in decode_r64_L32768 decode_r1_L131072; do
    (cd tools/gpu && timeout 40 python3 call_timeline.py --precision $p --calls 20 $c) \
      > /tmp/r4/tl/$w-$p-$c.txt 2>&1
  done; done
done
tail -n 4 /tmp/r4/tl/*.txt | cut -c1-120
tar -C /tmp/r4 -cJf $OUT/r4.tar.xz --exclude variants.tar.xz .
