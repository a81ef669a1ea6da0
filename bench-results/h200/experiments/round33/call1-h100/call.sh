# Round 33, call 1: decode_r1's start-up and selection entry. Candidates against d5 (main) on decode_r1 and decode_r64, 3 rounds:
# issue windows of 4, 6, 8 pages (dw4, dw6, dw8), dw6 + L2 prefetch of the inputs (dw6pt), the selections' early lengths read (el),
# two producer warps a decode CTA (dp); dw6's and dp's indexer GPU tests. First the bare gather with 1, 2, 4 issuing warps (tools/gpu/gather_order_probe.py).
W=b12x-0.1.0-cp310-abi3-linux_x86_64.whl
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
R=/tmp/r1; mkdir -p $R
# the bare gather: one CTA of 16 stages with 1, 2 or 4 issuing warps, against 2 CTAs of 8 (round 29: 75.6 against 78.1)
GATHER_PROBE_ONLY=random_s16,random_s16_i2,random_s16_i4,random_s8_c2_x1,identity_s16,identity_s16_i2 \
  timeout 60 python3 tools/gpu/gather_order_probe.py $R/gather_issuers.json > $R/probe.txt 2>&1
echo "probe rc=$?"; grep -v "^gather_order_probe: [a-z_0-9]*$" $R/probe.txt | tail -8
TESTS="dw6 dp" TEST_LIMIT=150 ROUNDS=3 CASES="decode_r1_L131072 decode_r64_L32768" RESULTS=$R \
  timeout 500 bash tools/gpu/variants.sh d5=.device/wheels/d5/$W dw4=.device/wheels/dw4/$W dw6=.device/wheels/dw6/$W \
    dw8=.device/wheels/dw8/$W dw6pt=.device/wheels/dw6pt/$W el=.device/wheels/el/$W dp=.device/wheels/dp/$W
tar -C $R -cJf $OUT/call1.tar.xz .
