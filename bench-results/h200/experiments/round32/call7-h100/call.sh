# Round 32, call 7: main's indexer GPU tests (the bit-for-bit score test added) on d4 (main's kernels).
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
R=/tmp/r7; mkdir -p $R
RESULTS=$R bash -c "source tools/gpu/common.sh .device/wheels/d4/b12x-0.1.0-cp310-abi3-linux_x86_64.whl; TAIL=4 step test_indexer 200 bash -c 'cd tests && python3 -m pytest -q -p no:cacheprovider -ra indexer'"
cp $R/test_indexer.txt $OUT/
