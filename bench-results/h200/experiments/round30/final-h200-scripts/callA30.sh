# Round 30 final, call A of three (carries DeepGEMM, the vLLM bundle, the wheel, part-00): the wheel's indexer GPU tests.
W=.device/wheels/d3/b12x-0.1.0-cp310-abi3-linux_x86_64.whl
R=/tmp/rA
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
case "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" in *H200*) ;; *) echo "not an H200: stop"; exit 0 ;; esac
RESULTS=$R bash -c "source tools/gpu/common.sh $W; TAIL=3 step test_indexer 240 bash -c 'cd tests && python3 -m pytest -q -p no:cacheprovider -ra indexer'"
tar -C $R -cJf $OUT/callA.tar.xz .
