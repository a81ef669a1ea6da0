# Round 30 final in one call (H200 only): the landed tree's bench with DeepGEMM live; vLLM's top-k from
# the stored H200 figures (its op library needs three chained calls, which H100 draws made too costly).
W=.device/wheels/d3/b12x-0.1.0-cp310-abi3-linux_x86_64.whl
R=/tmp/rF
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
case "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" in *H200*) ;; *) echo "not an H200: stop"; exit 0 ;; esac
RESULTS=$R bash -c "source tools/gpu/common.sh $W; source tools/gpu/site.sh > \$RESULTS/site.txt 2>&1; tail -3 \$RESULTS/site.txt; TAIL=34 step bench_indexer 400 b12x bench indexer --no-torch --json \$RESULTS/indexer.json"
cp $R/indexer.json $OUT/indexer.json
tar -C $R -cJf $OUT/callF.tar.xz .
