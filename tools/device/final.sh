#!/usr/bin/env bash
# Lead's final round on the merged tree: whole suite, demo on 2 GPUs, Rust-native lookup bench.
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m pip install -q --no-deps --force-reinstall .device/lead/b12x-*.whl 2>&1 | tail -1
git log --oneline -1 2>/dev/null
echo "== pytest (whole suite)"
(cd tests && timeout 300 python3 -m pytest -q -p no:cacheprovider -ra . > $OUT/pytest.txt 2>&1; echo "pytest rc=$?" >> $OUT/pytest.txt)
grep -E "passed|failed|FAILED|^E |rc=|SKIPPED" $OUT/pytest.txt | tail -20
echo "== demo (2 GPUs)"
timeout 120 b12x demo 2>&1 | tee $OUT/demo_2gpu.txt | tail -9; echo "demo rc=${PIPESTATUS[0]}"
echo "== cargo bench binary (criterion), host CPU: $(grep -m1 'model name' /proc/cpuinfo)"
cd .device/lead && timeout 150 ./bench_main --bench 2>&1 | grep -E "time:|^declared" | tee $OUT/criterion.txt
