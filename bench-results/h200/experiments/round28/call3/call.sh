W=b12x-0.1.0-cp310-abi3-linux_x86_64.whl
TESTS=0 ROUNDS=2 CASES="prefill_r4096_L32768" RESULTS=/tmp/r3 timeout 300 bash tools/gpu/variants.sh \
  d2=.device/wheels/d2/$W wr=.device/wheels/wr/$W wb1=.device/wheels/wb1/$W 2>&1 | tail -7
python3 -m pip install -q --no-deps --force-reinstall .device/wheels/st/$W 2>&1 | tail -1
mkdir -p /tmp/r3/tr
for c in decode_r1_L131072 decode_r64_L32768; do for p in fast exact; do
  (cd tools/gpu && timeout 60 python3 trace_call.py $c --precision $p --calls 3) > /tmp/r3/tr/$c-$p.txt 2>&1
  (cd tools/gpu && timeout 30 python3 trace_summary.py /tmp/r3/tr/$c-$p.txt) > /tmp/r3/tr/$c-$p.sum 2>&1
done; done
tail -n 25 /tmp/r3/tr/*.sum | cut -c1-160
tar -C /tmp/r3 -cJf $OUT/r3.tar.xz --exclude variants.tar.xz .
