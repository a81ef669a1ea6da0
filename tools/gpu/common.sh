# Shared set-up of the GPU-host scripts: `source tools/gpu/common.sh [WHEEL]`.
# Installs WHEEL (an abi3 wheel from `./dev wheel`) into the host's python3 without
# touching its other packages, and sends every step's log to $RESULTS (default gpu-results/).
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export PYTHONUNBUFFERED=1
# NVLink multicast stays off: NCCL, torch SymmetricMemory and NVSHMEM all honour these.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
RESULTS=${RESULTS:-$PWD/gpu-results}
mkdir -p "$RESULTS"
if [ $# -ge 1 ] && [ -n "$1" ]; then
  python3 -m pip install -q --no-deps --force-reinstall "$1" 2>&1 | tail -1
fi
GPUS=$(python3 -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)

# step NAME SECONDS CMD...: run CMD under a time bound, log to $RESULTS/NAME.txt, print its tail.
step() {
  local name=$1 limit=$2
  shift 2
  echo "== $name"
  timeout -k 10 "$limit" "$@" >"$RESULTS/$name.txt" 2>&1
  local rc=$?
  tail -n "${TAIL:-6}" "$RESULTS/$name.txt"
  echo "$name rc=$rc"
}
