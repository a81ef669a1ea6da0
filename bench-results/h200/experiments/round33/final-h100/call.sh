# Round 33, final run of main @ aa517e8 (wheel d6: the two-CTA fast decode scorer merged), three chained calls on one warm machine (an H100: CARD= runs on any card):
export RESULTS=/tmp/fb CARD=; bash tools/gpu/final_run.sh bench .device/wheels/d6/b12x-0.1.0-cp310-abi3-linux_x86_64.whl   # carry .device/deepgemm .device/vllm .device/wheels/d6 .device/vllm-ops/{vllm_ops.json,part-00.xz}
export RESULTS=/tmp/fc CARD=; bash tools/gpu/final_run.sh cli .device/wheels/d6/b12x-0.1.0-cp310-abi3-linux_x86_64.whl     # carry .device/vllm-ops/part-01.xz
export RESULTS=/tmp/fs CARD=; bash tools/gpu/final_run.sh stock .device/wheels/d6/b12x-0.1.0-cp310-abi3-linux_x86_64.whl   # carry .device/vllm-ops/part-02.xz
