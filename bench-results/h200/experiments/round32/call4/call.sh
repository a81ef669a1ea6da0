# Round 32 final, call B (carries part-01 and d3): the CLI GPU tests, then d4 (main) against d3 (main before round 32) on decode_r1, 3 rounds.
W=.device/wheels/d4/b12x-0.1.0-cp310-abi3-linux_x86_64.whl
R=/tmp/rB
nvidia-smi --query-gpu=name --format=csv,noheader; ls .device/vllm-ops/ .device/wheels/
RESULTS=$R bash -c "source tools/gpu/common.sh $W; TAIL=3 step test_cli 150 bash -c 'cd tests && python3 -m pytest -q -p no:cacheprovider -ra cli'"
TESTS=0 ROUNDS=3 CASES="decode_r1_L131072" RESULTS=$R/ab timeout 200 bash tools/gpu/variants.sh \
  d3=.device/wheels/d3/b12x-0.1.0-cp310-abi3-linux_x86_64.whl d4=$W
python3 -m pip install -q --no-deps --force-reinstall $W 2>&1 | tail -1
tar -C $R -cJf $OUT/callB.tar.xz .
