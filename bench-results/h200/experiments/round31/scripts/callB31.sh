# Round 31, call B (carries part-01): the CLI GPU tests.
W=.device/wheels/${WHEEL:-d3}/b12x-0.1.0-cp310-abi3-linux_x86_64.whl
R=/tmp/rB
nvidia-smi --query-gpu=name --format=csv,noheader; ls .device/vllm-ops/ .device/wheels/
RESULTS=$R bash -c "source tools/gpu/common.sh $W; TAIL=3 step test_cli 150 bash -c 'cd tests && python3 -m pytest -q -p no:cacheprovider -ra cli'"
tar -C $R -cJf $OUT/callB.tar.xz .
