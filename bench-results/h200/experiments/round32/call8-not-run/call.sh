# Round 32 review, call 8: tools/gpu/final_run.sh's bench and cli steps on any card (CARD=), with d5 (main after the review mend).
W=.device/wheels/d5/b12x-0.1.0-cp310-abi3-linux_x86_64.whl
export RESULTS=/tmp/r8 CARD=
bash tools/gpu/final_run.sh bench $W
bash tools/gpu/final_run.sh cli $W
echo "wrong step:"; bash tools/gpu/final_run.sh nope $W; echo "rc=$?"
